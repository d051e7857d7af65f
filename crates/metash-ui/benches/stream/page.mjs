// The stream bench's browser half: opens the run view in Debian's Chromium (headless, driven by
// Playwright's core library), notes when each flood chunk reaches the page's own EventSource
// (performance.timeOrigin + now(), ms since the epoch) and when the page has drawn it (its
// `metash-rendered` event), and prints them as JSON once `n` are drawn.
// Args: tools url chromium n. Prints `ready` when the page is live.
import { createRequire } from "node:module";

const [, , tools, url, chromiumPath, nArg] = process.argv;
const n = Number(nArg);
const require = createRequire(tools + "/package.json");
const { chromium } = require("playwright-core");

const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage();
  // Every EventSource the page makes also reports each flood chunk's arrival here, before the
  // page's own handler draws it.
  await page.addInitScript(() => {
    window.__got = [];
    window.__drawn = [];
    const pending = [];
    document.addEventListener("metash-rendered", (e) => {
      const at = performance.timeOrigin + performance.now();
      while (pending.length && pending[0][0] <= e.detail) {
        window.__drawn.push([pending.shift()[1], at]);
      }
    });
    const ES = window.EventSource;
    window.EventSource = function (u, o) {
      const es = new ES(u, o);
      es.addEventListener("message", (e) => {
        const at = performance.timeOrigin + performance.now();
        const d = JSON.parse(e.data);
        const x = d && d.data && typeof d.data.data === "string" && /^b(\d+)$/.exec(d.data.data);
        if (x) {
          window.__got.push([Number(x[1]), at]);
          pending.push([d.seq, Number(x[1])]);
        }
      });
      return es;
    };
  });
  await page.goto(url);
  await page.waitForSelector("#live.on", { timeout: 20000 });
  process.stdout.write("ready\n");
  await page.waitForFunction((m) => window.__drawn.length >= m, n, { timeout: 120000, polling: 200 });
  const got = await page.evaluate(() => window.__got);
  const drawn = await page.evaluate(() => window.__drawn);
  const cards = await page.evaluate(() => (document.querySelector("#card-flood .body") || { textContent: "" }).textContent.length);
  process.stdout.write(JSON.stringify({ got, drawn, cards }) + "\n");
} catch (e) {
  process.stderr.write(`page.mjs: ${e.stack || e}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
  process.exit();
}
