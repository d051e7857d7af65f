// metash ui: how an agent's output is drawn, chosen by the chunk's content_type (seed 002 §8:
// log, markdown, code, diff). Everything is built as DOM nodes with textContent: an agent's text
// never becomes markup, whatever it holds. Loaded before app.js, which calls window.metashRender.
"use strict";
(function () {
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // Which renderer a content type gets.
  function kindOf(type) {
    const t = (type || "text/plain").split(";")[0].trim().toLowerCase();
    if (t === "text/markdown" || t === "text/x-markdown") return "markdown";
    if (t === "text/x-diff" || t === "text/x-patch") return "diff";
    if (t === "text/x-ansi" || t === "text/x-log") return "log";
    if (t.startsWith("text/x-") || t === "application/json" || t === "text/javascript" || t === "application/javascript") return "code";
    return "log";
  }

  // ANSI SGR colours and bold, carried across chunks in `state`.
  const SGR = /\u001b\[([0-9;]*)m/g;
  function ansi(pre, text, state) {
    let last = 0;
    const put = (s) => {
      s = s.replace(/\u001b\[[0-9;?]*[A-Za-z]/g, "");
      if (!s) return;
      const cls = state.cls.join(" ");
      // A chunk in the same colours as the last one continues its text node.
      const last = pre.lastChild;
      if (last && last.className === cls && last.firstChild) last.firstChild.appendData(s);
      else pre.append(el("span", cls, s));
    };
    text.replace(SGR, (m, codes, at) => {
      put(text.slice(last, at));
      last = at + m.length;
      for (const c of (codes || "0").split(";").map((x) => parseInt(x || "0", 10))) {
        if (c === 0) state.cls = [];
        else if (c === 1) state.cls.push("b");
        else if ((c >= 30 && c <= 37) || (c >= 90 && c <= 97)) {
          state.cls = state.cls.filter((k) => !k.startsWith("f")).concat("f" + c);
        } else if (c === 39) state.cls = state.cls.filter((k) => !k.startsWith("f"));
      }
      return m;
    });
    put(text.slice(last));
  }

  // Inline markdown: `code`, **bold**, *em*, [text](http…) links; the rest is text.
  function inline(parent, s) {
    const re = /(`[^`]+`)|(\*\*[^*]+\*\*)|(\*[^*]+\*)|(\[[^\]]+\]\((https?:\/\/[^)\s]+)\))/;
    while (s.length) {
      const m = re.exec(s);
      if (!m) { parent.append(document.createTextNode(s)); return; }
      if (m.index) parent.append(document.createTextNode(s.slice(0, m.index)));
      if (m[1]) parent.append(el("code", "", m[1].slice(1, -1)));
      else if (m[2]) parent.append(el("strong", "", m[2].slice(2, -2)));
      else if (m[3]) parent.append(el("em", "", m[3].slice(1, -1)));
      else {
        const a = el("a", "", m[4].slice(1, m[4].indexOf("](")));
        a.href = m[5];
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        parent.append(a);
      }
      s = s.slice(m.index + m[0].length);
    }
  }

  // Block markdown: headings, lists, fenced code (highlighted), paragraphs.
  function markdown(box, text) {
    box.replaceChildren();
    const lines = text.split("\n");
    let list = null, para = null;
    for (let i = 0; i < lines.length; i++) {
      const l = lines[i];
      const fence = /^```\s*([\w+-]*)/.exec(l);
      if (fence) {
        const body = [];
        for (i++; i < lines.length && !/^```/.test(lines[i]); i++) body.push(lines[i]);
        const pre = el("pre", "code");
        code(pre, body.join("\n"), fence[1]);
        box.append(pre);
        list = para = null;
        continue;
      }
      const h = /^(#{1,6})\s+(.*)$/.exec(l);
      const li = /^\s*(?:[-*+]|\d+\.)\s+(.*)$/.exec(l);
      if (h) {
        const e = el("h" + Math.min(6, h[1].length + 2));
        inline(e, h[2]);
        box.append(e);
        list = para = null;
      } else if (li) {
        if (!list) { list = el("ul"); box.append(list); }
        const e = el("li");
        inline(e, li[1]);
        list.append(e);
        para = null;
      } else if (!l.trim()) {
        list = para = null;
      } else {
        if (!para) { para = el("p"); box.append(para); } else para.append(document.createTextNode(" "));
        inline(para, l);
        list = null;
      }
    }
  }

  // Code: keywords, strings, comments and numbers coloured; one tokenizer for the C-like and
  // script languages agents write most.
  const KEYWORDS = new Set(("as async await break case catch class const continue def default do elif else enum export " +
    "extends false fn for from func function if impl import in interface let loop match mod mut new nil None null " +
    "package pub return self Self static struct super switch this throw true True False try type use var while with yield").split(" "));
  const TOKEN = /(\/\/[^\n]*|#[^\n]*|\/\*[\s\S]*?\*\/)|("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)|(\b\d[\d_.xa-fA-F]*\b)|([A-Za-z_][A-Za-z0-9_]*)/g;
  function code(pre, text, lang) {
    pre.replaceChildren();
    if (lang) pre.dataset.lang = lang;
    let last = 0;
    text.replace(TOKEN, (m, comment, str, num, word, at) => {
      if (at > last) pre.append(document.createTextNode(text.slice(last, at)));
      last = at + m.length;
      const cls = comment ? "tc" : str ? "ts" : num ? "tn" : KEYWORDS.has(word) ? "tk" : null;
      pre.append(cls ? el("span", cls, m) : document.createTextNode(m));
      return m;
    });
    if (last < text.length) pre.append(document.createTextNode(text.slice(last)));
  }

  function diff(pre, text) {
    pre.replaceChildren();
    for (const l of text.split("\n")) {
      const cls = l.startsWith("+") && !l.startsWith("+++") ? "add" : l.startsWith("-") && !l.startsWith("---") ? "del" : l.startsWith("@@") ? "hunk" : "";
      pre.append(el("span", cls, l + "\n"));
    }
  }

  // Appends `text` of `type` to the card body `box`: a chunk of the same kind as the last one
  // continues it (streamed output), another kind, or `fresh` (a new spawn), starts a new block.
  function append(box, type, text, hints, fresh) {
    let kind = kindOf(type);
    if (kind === "log" && hints.includes("diff") && /^(diff --git|--- )/m.test(text)) kind = "diff";
    let seg = box.lastElementChild;
    if (fresh || !seg || seg.dataset.kind !== kind || seg.dataset.type !== type) {
      seg = el(kind === "markdown" ? "div" : "pre", "seg " + kind);
      seg.dataset.kind = kind;
      seg.dataset.type = type;
      seg.metashText = "";
      seg.metashAnsi = { cls: [] };
      box.append(seg);
    }
    seg.metashText += text;
    if (kind === "log") ansi(seg, text, seg.metashAnsi);
    else if (kind === "markdown") markdown(seg, seg.metashText);
    else if (kind === "diff") diff(seg, seg.metashText);
    else code(seg, seg.metashText, type.replace(/^text\/x-/, ""));
    return seg;
  }

  window.metashRender = { append, kindOf, el };
})();
