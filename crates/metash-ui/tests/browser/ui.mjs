// The UI in a real Chromium (Debian's, headless), driven by Playwright's core library. Run by
// tests/browser.rs, which owns the project: at each `step NAME` line printed here it changes the
// project (an agent's output, a checkpoint, a grant) and answers `ok` on stdin. Screenshots go to
// argv[4]. Any failed expectation exits non-zero with the reason on stderr.
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const [, , tools, url, shots, chromiumPath] = process.argv;
const require = createRequire(tools + "/package.json");
const { chromium } = require("playwright-core");

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function step(name) {
  process.stderr.write(`ui.mjs: step ${name}\n`);
  process.stdout.write(`step ${name}\n`);
  const { value, done } = await lines.next();
  if (done || value.trim() !== "ok") throw new Error(`the test did not answer step ${name}: ${value}`);
}
function expect(cond, what) {
  if (!cond) throw new Error(`expected: ${what}`);
}

process.stderr.write("ui.mjs: launching chromium\n");
const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
  const scripts = [];
  page.on("dialog", (d) => { scripts.push(d.message()); d.dismiss(); });
  await page.goto(url);
  expect(new URL(page.url()).pathname === "/", "the token URL lands on the run view");
  await page.waitForSelector("#live.on", { timeout: 10000 });

  // An agent's output streams into its card, as text.
  await step("agent-output");
  await page.waitForFunction(() => {
    const pre = document.querySelector("#card-writer pre");
    return pre && pre.textContent.includes("hello <script>alert(1)</script>");
  }, null, { timeout: 10000 });
  expect((await page.locator("#cards script").count()) === 0, "no script element from agent output");
  // The plan, drawn as a graph once the session changed (no reload).
  await page.waitForFunction(() => document.querySelectorAll("svg.dag .node").length === 4, null, { timeout: 10000 });
  expect((await page.locator("svg.dag .edge").count()) === 4, "one arrow per dependency");
  await page.screenshot({ path: `${shots}/run.png`, fullPage: true });

  // A checkpoint appears without a reload, says so in the title, and is answered from the page.
  await step("checkpoint");
  await page.waitForSelector("#checkpoint", { timeout: 10000 });
  await page.waitForFunction(() => document.title.startsWith("(needs you)"), null, { timeout: 10000 });
  await page.screenshot({ path: `${shots}/checkpoint.png`, fullPage: true });
  const [answer] = await Promise.all([
    page.waitForResponse((r) => new URL(r.url()).pathname === "/checkpoint"),
    page.click('#checkpoint button[value="german"]'),
  ]);
  if (answer.status() !== 303) throw new Error(`the answer was refused (${answer.status()}): ${await answer.text()}`);
  await page.waitForURL((u) => u.pathname === "/");
  await page.waitForFunction(() => !document.getElementById("checkpoint"), null, { timeout: 10000 });
  await step("answered");

  // An agent's question waiting for any client: a card with a countdown, allowed from the page.
  await step("consent");
  await page.waitForSelector(".consent", { timeout: 10000 });
  await page.waitForFunction(() => /\d+ s/.test(document.querySelector(".consent .countdown").textContent), null, { timeout: 5000 });
  await page.screenshot({ path: `${shots}/consent.png`, fullPage: true });
  const [allowed] = await Promise.all([
    page.waitForResponse((r) => new URL(r.url()).pathname === "/consent"),
    page.click('.consent button[value="once"]'),
  ]);
  if (allowed.status() !== 303) throw new Error(`the consent answer was refused (${allowed.status()})`);
  await page.waitForFunction(() => !document.querySelector(".consent"), null, { timeout: 10000 });
  await step("consent-answered");

  // The ledger: a live grant revoked with its button.
  await step("grant");
  await page.goto(new URL("/ledger", url).href);
  await page.screenshot({ path: `${shots}/ledger.png`, fullPage: true });
  const [revoked] = await Promise.all([
    page.waitForResponse((r) => new URL(r.url()).pathname === "/revoke"),
    page.click('form[action="revoke"] button'),
  ]);
  expect(revoked.status() === 303, `the revocation is accepted (${revoked.status()})`);
  await page.waitForURL((u) => u.pathname === "/ledger");
  expect((await page.locator('form[action="revoke"]').count()) === 0, "no live grant left to revoke");
  await step("revoked");
  expect(scripts.length === 0, `no dialog from injected script (${scripts.join(", ")})`);
  process.stdout.write("done\n");
} catch (e) {
  process.stderr.write(`ui.mjs: ${e.stack || e}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
  // stdin (the test's answers) would keep node running.
  process.exit();
}
