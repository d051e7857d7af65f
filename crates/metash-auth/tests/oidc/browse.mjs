// The person's browser for the auth tests: `metash auth login` runs `$BROWSER URL`, and this
// opens URL in Debian's Chromium (headless, through Playwright's core library) and does what a
// person would: for a device code, confirms the code shown; for a sign-in, follows the
// redirects back to metash's loopback callback. Args: tools chromium url (the tests set
// BROWSER to a wrapper that passes the first two).
import { createRequire } from "node:module";

const [, , tools, chromiumPath, url] = process.argv;
const require = createRequire(tools + "/package.json");
const { chromium } = require("playwright-core");

const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage();
  await page.goto(url);
  // The device flow's pages: the code (prefilled from verification_uri_complete), then confirm.
  for (let i = 0; i < 4; i++) {
    const text = await page.textContent("body");
    if (/sign-in success|was successful|you can close/i.test(text)) break;
    // The confirming button, never the one that aborts.
    const submit = page.locator('button[type="submit"]:not([name="abort"]), input[type="submit"]:not([name="abort"])').first();
    if ((await submit.count()) === 0) break;
    const before = page.url();
    await Promise.all([page.waitForURL((u) => u.href !== before, { timeout: 15000 }), submit.click()]);
    await page.waitForLoadState("load");
  }
  process.stdout.write(`browsed: ${(await page.textContent("body")).trim().slice(0, 200)}\n`);
} catch (e) {
  process.stderr.write(`browse.mjs: ${e.stack || e}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
