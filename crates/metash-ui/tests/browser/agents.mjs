// Real native agents answered from a real Chromium (run by tests/browser.rs, which starts the
// agents at each `step NAME` and answers `ok`): consent granted and denied from the page, a
// preview shown only for an agent holding media.preview, a revoke in the ledger view, a task's
// diff commented on, a flood streamed across reconnects. Screenshots go to argv[4].
import { createRequire } from "node:module";
import { createInterface } from "node:readline";

const [, , tools, url, shots, chromiumPath] = process.argv;
const require = createRequire(tools + "/package.json");
const { chromium } = require("playwright-core");

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function step(name) {
  process.stderr.write(`agents.mjs: step ${name}\n`);
  process.stdout.write(`step ${name}\n`);
  const { value, done } = await lines.next();
  if (done || value.trim() !== "ok") throw new Error(`the test did not answer step ${name}: ${value}`);
}
function expect(cond, what) {
  if (!cond) throw new Error(`expected: ${what}`);
}
const T = { timeout: 30000 };

async function cardSays(page, agent, text) {
  await page.waitForFunction(([a, t]) => {
    const c = document.getElementById("card-" + a);
    return c && c.textContent.includes(t);
  }, [agent, text], T);
}

// Answers the waiting question for `capability` with the button `answer`.
async function answer(page, capability, answer, seconds) {
  const card = page.locator("section.consent", { has: page.locator("code", { hasText: capability }) });
  await card.waitFor(T);
  if (seconds) await card.locator('input[name="seconds"]').fill(String(seconds));
  const [res] = await Promise.all([
    page.waitForResponse((r) => new URL(r.url()).pathname === "/consent"),
    card.locator(`button[value="${answer}"]`).click(),
  ]);
  expect(res.status() === 303, `the answer ${answer} to ${capability} is accepted (${res.status()})`);
  await page.waitForURL((u) => u.pathname === "/");
}

async function revoke(page, agent, capability) {
  await page.goto(new URL("/ledger", url).href);
  const row = page.locator("table.grants tr", { has: page.locator("td", { hasText: agent }) })
    .filter({ has: page.locator("td", { hasText: capability }) })
    .filter({ has: page.locator('form[action="revoke"]') });
  const [res] = await Promise.all([
    page.waitForResponse((r) => new URL(r.url()).pathname === "/revoke"),
    row.first().locator("button").click(),
  ]);
  expect(res.status() === 303, `revoking ${agent} ${capability} is accepted (${res.status()})`);
  await page.goto(new URL("/", url).href);
  await page.waitForSelector("#live.on", T);
}

const status = (page, path) => page.evaluate((p) => fetch(p).then((r) => r.status), path);

const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  const dialogs = [];
  page.on("dialog", (d) => { dialogs.push(d.message()); d.dismiss(); });
  await page.goto(url);
  await page.waitForSelector("#live.on", T);

  await step("painter");
  // At the spawn: running natively is itself a question (seed 002: `native` is sensitive),
  // allowed once; the declared media.preview and codegen are asked too, and denied.
  await answer(page, "native", "once");
  await answer(page, "media.preview", "deny");
  await answer(page, "codegen", "deny");
  // Then the agent itself asks, mid-run: media.preview allowed for 10 minutes (it goes on, and
  // its chart is previewed), codegen denied (it is told so).
  await answer(page, "media.preview", "for", 600);
  await page.waitForFunction(() => {
    const img = document.querySelector("#card-painter img.preview");
    return img && img.complete && img.naturalWidth === 96 && img.naturalHeight === 64;
  }, null, T);
  await answer(page, "codegen", "deny");
  await cardSays(page, "painter", "codegen: refused consent_denied");
  await cardSays(page, "painter", "waiting for files.read to be revoked");
  // Its cards, by content type: the log's ANSI colour, the markdown heading, highlighted code.
  expect(await page.locator("#card-painter .seg.log .f32", { hasText: "ok" }).count() > 0, "ANSI green rendered");
  expect(await page.locator("#card-painter .seg.markdown h4", { hasText: "Report" }).count() === 1, "markdown heading");
  expect(await page.locator("#card-painter .seg.markdown strong", { hasText: "chart" }).count() === 1, "markdown bold");
  expect(await page.locator("#card-painter .seg.code .tk", { hasText: "fn" }).count() > 0, "code keywords highlighted");
  expect(await page.locator("#card-painter .hint", { hasText: "preview" }).count() === 1, "ui.hints shown");
  await page.screenshot({ path: `${shots}/cards.png`, fullPage: true });

  // Its files.read grant revoked in the ledger view: its next read is refused.
  await revoke(page, "painter", "files.read");
  await cardSays(page, "painter", "read after: refused");
  await step("painter-done");

  // An agent that does not hold media.preview: its chart is not shown, nor served.
  await step("sketcher");
  await answer(page, "native", "once");
  await page.waitForFunction(() => {
    const p = document.querySelector("#card-sketcher .no-preview");
    return p && p.textContent.includes("does not hold media.preview");
  }, null, T);
  expect(await page.locator("#card-sketcher img").count() === 0, "no image for sketcher");
  await step("sketcher-done");
  expect(await status(page, "/artifact/chart-sketcher.png") === 403, "sketcher's chart is not served");
  expect(await status(page, "/artifact/chart-painter.png") === 200, "painter's chart is served");
  // Revoking media.preview stops the next view of painter's chart.
  await revoke(page, "painter", "media.preview");
  expect(await status(page, "/artifact/chart-painter.png") === 403, "a revoked media.preview stops the preview");

  // A task's change in its worktree, as a diff card; a line commented on for the agent.
  await step("diff");
  // The run view names who works on the task.
  await page.goto(new URL("/", url).href);
  await page.waitForFunction(() => {
    const row = document.querySelector('tr[data-task="api"]');
    return row && row.textContent.includes("executor (attempt 1)");
  }, null, T);
  await page.goto(new URL("/diff?task=api", url).href);
  await page.waitForSelector('.file[data-file="src/api.rs"]', T);
  expect(await page.locator("td.add", { hasText: "/users" }).count() > 0, "the added line");
  expect(await page.locator("td.del", { hasText: "vec![\"/health\"]" }).count() > 0, "the removed line");
  expect(await page.locator("td.add", { hasText: "<b>users</b>" }).count() === 1, "markup in code is text");
  await page.click('.file[data-file="src/api.rs"] td.c[data-line="2"]');
  await page.fill("tr.new-comment textarea", "use a constant for the paths");
  const [commented] = await Promise.all([
    page.waitForResponse((r) => new URL(r.url()).pathname === "/comment"),
    page.click("tr.new-comment button"),
  ]);
  expect(commented.status() === 303, `the comment is accepted (${commented.status()})`);
  await page.waitForSelector("tr.comment", T);
  expect((await page.locator("tr.comment").textContent()).includes("waiting for the task's next step"), "the comment waits for the agent");
  await page.screenshot({ path: `${shots}/diff.png`, fullPage: true });
  await step("commented");
  await page.goto(new URL("/diff?task=api&view=split", url).href);
  await page.waitForSelector("table.lines.split", T);
  expect(await page.locator("table.split td.add", { hasText: "/users" }).count() > 0, "side by side");

  // A flood of output across reconnects (each stream lasts 1 s): every chunk once, in order.
  await page.goto(new URL("/", url).href);
  await page.waitForSelector("#live.on", T);
  const opened = Number(await page.evaluate(() => document.body.dataset.opened || "0"));
  await step("flood");
  await cardSays(page, "flood", "#2999;");
  const text = await page.evaluate(() => document.querySelector("#card-flood .body").textContent);
  let want = "";
  for (let i = 0; i < 3000; i++) want += `#${i};`;
  expect(text === want, `every chunk once, in order (got ${text.length} chars, want ${want.length})`);
  const reopened = Number(await page.evaluate(() => document.body.dataset.opened || "0"));
  expect(reopened >= opened + 2, `the stream reconnected (${opened} -> ${reopened})`);
  expect(!(await page.evaluate(() => document.body.dataset.dups)), "no record delivered twice");
  expect(dialogs.length === 0, `no dialog from agent output (${dialogs.join(", ")})`);
  process.stdout.write("done\n");
} catch (e) {
  process.stderr.write(`agents.mjs: ${e.stack || e}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
  process.exit();
}
