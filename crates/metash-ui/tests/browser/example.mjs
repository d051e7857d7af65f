// The example project (`examples/greetings`) under `metash run`'s loop, watched in Chromium (run
// by tests/browser.rs, which runs the orchestrator at each `step`): the planner's checkpoint is
// answered from the page, then the plan fills the graph and the agents' cards stream while the
// loop executes, verifies and merges phase 1. Screenshot: example.png.
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const [, , tools, url, shots, chromiumPath] = process.argv;
const require = createRequire(tools + "/package.json");
const { chromium } = require("playwright-core");

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function step(name) {
  process.stderr.write(`example.mjs: step ${name}\n`);
  process.stdout.write(`step ${name}\n`);
  const { value, done } = await lines.next();
  if (done || value.trim() !== "ok") throw new Error(`the test did not answer step ${name}: ${value}`);
}
function expect(cond, what) {
  if (!cond) throw new Error(`expected: ${what}`);
}
const T = { timeout: 120000 };

const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  await page.goto(url);
  await page.waitForSelector("#live.on", T);

  // `metash run` (in-process, as the CLI runs it): the planner asks which language.
  await step("run");
  await page.waitForSelector("#checkpoint", T);
  expect((await page.locator("#checkpoint").textContent()).includes("language"), "the planner's question");
  const [answer] = await Promise.all([
    page.waitForResponse((r) => new URL(r.url()).pathname === "/checkpoint"),
    page.click('#checkpoint button[value="french"]'),
  ]);
  expect(answer.status() === 303, `the answer is accepted (${answer.status()})`);
  await page.waitForURL((u) => u.pathname === "/");

  // The run again: the answer reaches the planner, and phase 1 runs while the page watches.
  await step("answered");
  await page.waitForFunction(() => document.querySelectorAll("svg.dag .node").length === 3, null, T);
  await page.waitForFunction(() => document.querySelectorAll("svg.dag .node.complete").length === 3, null, T);
  for (const role of ["planner", "executor", "verifier"]) {
    await page.waitForSelector(`#card-${role} .body`, T);
  }
  await page.waitForFunction(() => document.querySelector("#card-executor").textContent.includes("wrote"), null, T);
  expect((await page.locator("svg.dag .edge").count()) === 2, "readme depends on hello and bye");
  await page.screenshot({ path: `${shots}/example.png`, fullPage: true });
  await step("phase-done");
  process.stdout.write("done\n");
} catch (e) {
  process.stderr.write(`example.mjs: ${e.stack || e}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
  process.exit();
}
