// What a drop says about its state besides the state itself: why a queued prompt waits (with a
// countdown on the server's clock), and the announcements of changes, batched.
import { announce, el } from "./api.js";
import { short } from "./text.js";

const NEWS_MS = 1000;

// NOTE: the server's clock, as the last /mission/recent page gave it, so a countdown does not
// depend on the browser's clock being right.
let skewMs = 0;

export function setServerClock(asOf) {
  skewMs = Date.parse(asOf) - Date.now();
}

// `itemOfJob` finds the page's item whose latest job is the one given (undefined: not shown).
export function waitsFor(item, itemOfJob) {
  if (item.waiting) {
    const before = item.after_job_id && itemOfJob(item.after_job_id);
    return el("span", { class: "why", text: before
      ? `waits for “${short(before.text, 30)}” to succeed` : "waits for an earlier prompt to succeed" });
  }
  if (item.held === "running_cap") {
    return el("span", { class: "why", text: "waits for a free place: your org runs its most prompts at once" });
  }
  if (item.held === "budget") {
    return el("span", { class: "why", text: "waits for your org's spent budget to reset" });
  }
  const due = Date.parse(item.scheduled_for);
  if (!(due > Date.now() + skewMs + 1000)) return null;
  // NOTE: a 429 puts the job back, its attempt kept, until the route's pause ends.
  const label = item.error_kind === "rate_limit" ? "route throttled, resumes in"
    : item.error_kind ? "retrying in" : "starts in";
  return el("span", { class: "why due", "data-due": String(due), "data-label": label,
                      text: dueText(label, due) });
}

function dueText(label, due) {
  const seconds = Math.max(0, Math.ceil((due - Date.now() - skewMs) / 1000));
  if (seconds < 120) return `${label} ${seconds} s`;
  if (seconds < 7200) return `${label} ${Math.round(seconds / 60)} min`;
  return `${label} ${new Date(due).toLocaleString()}`;
}

setInterval(() => {
  for (const node of document.querySelectorAll(".why.due")) {
    node.textContent = dueText(node.dataset.label, Number(node.dataset.due));
  }
}, 1000);

// NOTE: state changes are announced at most once a NEWS_MS, as one sentence: a burst of prompts
// would otherwise queue dozens of announcements for a screen reader.
const news = new Map();   // prompt_id -> item, the changes not yet announced
let newsTimer = null;

export function tell(item) {
  news.set(item.prompt_id, item);
  if (newsTimer === null) newsTimer = setTimeout(flushNews, NEWS_MS);
}

function flushNews() {
  newsTimer = null;
  const changed = [...news.values()];
  news.clear();
  if (changed.length === 1) {
    const [item] = changed;
    announce(`“${short(item.text, 40)}” is now ${item.state}${item.error_kind ? ` (${item.error_kind})` : ""}.`);
    return;
  }
  const counts = new Map();
  for (const item of changed) counts.set(item.state, (counts.get(item.state) || 0) + 1);
  announce(`${changed.length} prompts changed: ${[...counts].map(([state, n]) => `${n} ${state}`).join(", ")}.`);
}
