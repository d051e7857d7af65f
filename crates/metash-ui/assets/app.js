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
  const seen = new Set();
  let refreshTimer = null;

  function card(agent) {
    const id = "card-" + agent.replace(/[^A-Za-z0-9_-]/g, "_");
    let c = document.getElementById(id);
    if (!c) {
      c = document.createElement("section");
      c.className = "card agent";
      c.id = id;
      const h = document.createElement("h3");
      h.textContent = agent;
      const pre = document.createElement("pre");
      c.append(h, pre);
      cards.append(c);
    }
    return c.querySelector("pre");
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

  function onRecord(rec) {
    if (seen.has(rec.seq)) return; // never twice
    seen.add(rec.seq);
    document.body.dataset.seq = String(rec.seq);
    const d = rec.data || {};
    if (rec.kind === "agent_event" && d.type === "output" && cards) {
      const pre = card(rec.agent || "?");
      pre.textContent += d.data;
      pre.scrollTop = pre.scrollHeight;
    }
    if (rec.kind !== "agent_event") {
      clearTimeout(refreshTimer);
      refreshTimer = setTimeout(refresh, 100);
    }
  }

  const after = meta("after");
  const es = new EventSource("/events" + (after ? "?after=" + encodeURIComponent(after) : ""));
  es.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  es.onerror = () => { live.textContent = "reconnecting…"; live.className = "live"; };
  es.onmessage = (e) => {
    try { onRecord(JSON.parse(e.data)); } catch (_) { /* a line we cannot read is skipped */ }
  };
  document.addEventListener("click", () => {
    if (window.Notification && Notification.permission === "default") Notification.requestPermission();
  }, { once: true });
  needsYou();
})();
