// metash ui: the live parts of a server-rendered page. One EventSource per page; each record's
// seq is its event id, so the browser's reconnect resumes exactly after the last one it got.
// Agent text is only ever set as textContent: it is never markup.
"use strict";
(function () {
  const meta = (name) => {
    const m = document.querySelector('meta[name="' + name + '"]');
    return m ? m.content : "";
  };
  const live = document.getElementById("live");
  const cards = document.getElementById("cards");
  let refreshTimer = null;

  // What each agent's manifest asks of its card (`ui.hints`).
  const hintsOf = {};
  for (const li of document.querySelectorAll("#agents li")) {
    hintsOf[li.dataset.agent] = (li.dataset.hints || "").split(" ").filter(Boolean);
  }
  const R = window.metashRender;

  function card(agent) {
    const id = "card-" + agent.replace(/[^A-Za-z0-9_-]/g, "_");
    let c = document.getElementById(id);
    if (!c) {
      const hints = hintsOf[agent] || [];
      c = R.el("section", "card agent");
      c.id = id;
      c.dataset.hints = hints.join(" ");
      const h = R.el("h3", "", agent);
      for (const x of hints) h.append(" ", R.el("span", "hint", x));
      c.append(h, R.el("div", "body"));
      cards.append(c);
    }
    return c;
  }

  function output(agent, type, text) {
    const c = card(agent);
    const body = c.querySelector(".body");
    // Each spawn's output starts a block of its own.
    const fresh = c.dataset.fresh === "1";
    delete c.dataset.fresh;
    R.append(body, type || "text/plain", text, (c.dataset.hints || "").split(" "), fresh);
    return body;
  }

  // An artifact: previewed (image or video) only when the server says its agent holds
  // media.preview now; otherwise the reason. Without the `preview` hint, on request.
  function artifact(agent, id) {
    const c = card(agent);
    const fig = R.el("figure", "artifact");
    fig.dataset.artifact = id;
    fig.append(R.el("figcaption", "", "artifact " + id));
    c.querySelector(".body").append(fig);
    const show = () => fetch("preview/" + encodeURIComponent(id), { credentials: "same-origin" })
      .then((r) => r.json())
      .then((p) => {
        const src = "artifact/" + encodeURIComponent(id);
        if (p.content_type && p.content_type.startsWith("image/")) {
          const img = R.el("img", "preview");
          img.alt = id;
          img.src = src;
          fig.append(img);
        } else if (p.content_type && p.content_type.startsWith("video/")) {
          const v = R.el("video", "preview");
          v.controls = true;
          v.src = src;
          fig.append(v);
        } else {
          fig.append(R.el("p", "no-preview", "no preview: " + (p.refused || "not an image or video")));
        }
      })
      .catch(() => fig.append(R.el("p", "no-preview", "no preview: the server did not answer")));
    if ((c.dataset.hints || "").split(" ").includes("preview")) show();
    else {
      const b = R.el("button", "", "preview");
      b.addEventListener("click", () => { b.remove(); show(); }, { once: true });
      fig.append(b);
    }
  }

  // Each consent card's time left, every second.
  function countdowns() {
    for (const el of document.querySelectorAll(".countdown[data-deadline]")) {
      const left = Math.max(0, Math.round((Date.parse(el.dataset.deadline) - Date.now()) / 1000));
      el.textContent = left + " s";
    }
  }
  setInterval(countdowns, 1000);

  let wasWaiting = false;
  function needsYou() {
    countdowns();
    const waiting = document.getElementById("checkpoint") !== null || document.querySelector(".consent") !== null;
    const base = document.title.replace(/^\(needs you\) /, "");
    document.title = waiting ? "(needs you) " + base : base;
    // Once per wait, not at every refresh.
    const fresh = waiting && !wasWaiting;
    wasWaiting = waiting;
    if (fresh && window.Notification && Notification.permission === "granted") {
      const m = document.querySelector("#checkpoint .message, .consent h2");
      new Notification("metash needs you", { body: m ? m.textContent : "" });
    }
  }

  // The run view's server-rendered part, fetched again when the session changes.
  function refresh() {
    const main = document.getElementById("main");
    if (!main) return;
    fetch(location.pathname, { credentials: "same-origin" })
      .then((r) => r.text())
      .then((html) => {
        const doc = new DOMParser().parseFromString(html, "text/html");
        const fresh = doc.getElementById("main");
        if (fresh) main.replaceWith(document.adoptNode(fresh));
        document.title = doc.title;
        needsYou();
      })
      .catch(() => {});
  }

  // Records are drawn in batches (at most one per 16 ms), so a flooding agent costs the page one
  // layout per batch, not one per chunk; `metash-rendered` tells who cares what is on screen.
  let dups = 0, lastSeq = 0, flushTimer = null;
  const queue = [];
  function onRecord(rec) {
    // The server sends records in order: one at or before the last is a duplicate.
    if (rec.seq <= lastSeq) { dups++; document.body.dataset.dups = String(dups); return; }
    lastSeq = rec.seq;
    queue.push(rec);
    if (!flushTimer) flushTimer = setTimeout(flush, 16);
  }

  function flush() {
    flushTimer = null;
    const batch = queue.splice(0, queue.length);
    const touched = new Set();
    let refreshNeeded = false;
    for (const rec of batch) {
      const d = rec.data || {};
      if (cards && rec.kind === "agent_event" && d.type === "output") {
        touched.add(output(rec.agent || "?", d.content_type, String(d.data || "")));
      } else if (cards && rec.kind === "artifact" && rec.agent && d.id) {
        artifact(rec.agent, String(d.id));
      } else if (cards && rec.kind === "spawn" && rec.agent && document.getElementById("card-" + rec.agent.replace(/[^A-Za-z0-9_-]/g, "_"))) {
        card(rec.agent).dataset.fresh = "1";
      }
      if (rec.kind !== "agent_event") refreshNeeded = true;
    }
    for (const body of touched) body.scrollTop = body.scrollHeight;
    document.body.dataset.seq = String(lastSeq);
    if (refreshNeeded) {
      clearTimeout(refreshTimer);
      refreshTimer = setTimeout(refresh, 100);
    }
    document.dispatchEvent(new CustomEvent("metash-rendered", { detail: lastSeq }));
  }

  // The diff card: a click on a line number opens a comment form under that line.
  for (const cell of document.querySelectorAll("td.c[data-line]")) {
    cell.addEventListener("click", () => {
      const row = cell.parentElement;
      if (row.nextElementSibling && row.nextElementSibling.classList.contains("new-comment")) return;
      const form = document.getElementById("comment-form").content.firstElementChild.cloneNode(true);
      form.querySelector('input[name="file"]').value = cell.closest(".file").dataset.file;
      form.querySelector('input[name="line"]').value = cell.dataset.line;
      row.after(form);
      form.querySelector("textarea").focus();
    });
  }

  // Only pages with cards follow the log.
  if (!cards) { live.textContent = ""; needsYou(); return; }
  const after = meta("after");
  let opened = 0;
  const es = new EventSource("events" + (after ? "?after=" + encodeURIComponent(after) : ""));
  es.onopen = () => {
    opened++;
    document.body.dataset.opened = String(opened);
    live.textContent = "live"; live.className = "live on";
  };
  es.onerror = () => { live.textContent = "reconnecting…"; live.className = "live"; };
  es.onmessage = (e) => {
    try { onRecord(JSON.parse(e.data)); } catch (_) { /* a line we cannot read is skipped */ }
  };
  document.addEventListener("click", () => {
    if (window.Notification && Notification.permission === "default") Notification.requestPermission();
  }, { once: true });
  needsYou();
})();
