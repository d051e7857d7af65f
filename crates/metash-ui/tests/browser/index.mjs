// `metash ui --under DIR` in Chromium: the index lists the projects, says which one waits on a
// person, and leads to that project's page, where its checkpoint card is. Screenshot: projects.png.
import { createRequire } from "node:module";

const [, , tools, url, shots, chromiumPath] = process.argv;
const require = createRequire(tools + "/package.json");
const { chromium } = require("playwright-core");
function expect(cond, what) {
  if (!cond) throw new Error(`expected: ${what}`);
}

const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 500 } });
  await page.goto(url);
  expect(new URL(page.url()).pathname === "/", "the token URL lands on the index");
  expect((await page.locator("table.projects a").count()) === 2, "two projects");
  expect((await page.title()).startsWith("(needs you)"), "the title says a project waits");
  expect((await page.locator("tr.needs-you").count()) === 1, "one project waits");
  await page.screenshot({ path: `${shots}/projects.png`, fullPage: true });
  await page.click("tr.needs-you a");
  await page.waitForSelector("#checkpoint", { timeout: 10000 });
  await page.waitForSelector("#live.on", { timeout: 10000 });
  expect(new URL(page.url()).pathname === "/p/team/beta/", `the project's page (${page.url()})`);
  // Its links stay inside the project.
  expect(new URL(await page.locator('nav a[href="ledger"]').evaluate((a) => a.href)).pathname === "/p/team/beta/ledger", "relative links");
  process.stdout.write("done\n");
} catch (e) {
  process.stderr.write(`index.mjs: ${e.stack || e}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
  process.exit();
}
