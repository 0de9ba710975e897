// How the pages show texts: answers as a safe subset of Markdown, long texts collapsed.
//
// Only DOM nodes built from text (textContent), never markup parsed from it: nothing in a prompt
// or an answer can run or load anything, whatever it holds.
import { el } from "./api.js";

const LONG_CHARS = 1200;
const LONG_LINES = 14;

// A text on one line, cut to `n` characters: for labels and announcements.
export function short(text, n = 60) {
  const flat = (text || "").replace(/\s+/g, " ").trim();
  return flat.length > n ? `${flat.slice(0, n - 1)}…` : flat;
}

// Inline `code` within one run of plain text.
function inline(text) {
  const nodes = [];
  const parts = text.split(/`([^`\n]+)`/);
  parts.forEach((part, i) => {
    if (i % 2 === 1) nodes.push(el("code", { text: part }));
    else if (part) nodes.push(document.createTextNode(part));
  });
  return nodes;
}

// An answer: fenced code blocks (```lang ... ```) in monospace, inline code, the rest as written.
// An unclosed fence runs to the end, as Markdown renderers do.
export function answerNode(text, className) {
  const box = el("div", { class: className });
  let prose = [];
  let code = null;
  const flushProse = () => {
    if (prose.length) box.append(el("p", {}, ...inline(prose.join("\n"))));
    prose = [];
  };
  for (const line of text.split("\n")) {
    const fence = /^\s*```\s*([\w+-]*)/.exec(line);
    if (fence && code === null) {
      flushProse();
      code = { lang: fence[1], lines: [] };
    } else if (fence) {
      box.append(el("pre", { "data-lang": code.lang || null }, el("code", { text: code.lines.join("\n") })));
      code = null;
    } else if (code !== null) {
      code.lines.push(line);
    } else {
      prose.push(line);
    }
  }
  if (code !== null) box.append(el("pre", {}, el("code", { text: code.lines.join("\n") })));
  flushProse();
  return box;
}

export function isLong(text) {
  return text.length > LONG_CHARS || text.split("\n").length > LONG_LINES;
}

// A long text's node collapsed to a few lines, with a button that shows it all; `open` keeps
// the reader's choice across redraws (a Set of keys).
export function collapsible(node, text, key, open) {
  if (!isLong(text)) return [node];
  const expanded = open.has(key);
  node.classList.add("long");
  if (!expanded) node.classList.add("collapsed");
  const toggle = el("button", { type: "button", class: "more quiet", "aria-expanded": String(expanded),
                                text: expanded ? "Show less" : "Show all" });
  toggle.addEventListener("click", () => {
    const now = !open.has(key);
    if (now) open.add(key); else open.delete(key);
    node.classList.toggle("collapsed", !now);
    toggle.setAttribute("aria-expanded", String(now));
    toggle.textContent = now ? "Show less" : "Show all";
  });
  return [node, toggle];
}
