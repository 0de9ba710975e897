// The operator console's other panels: each route's pause and window (with pause and resume),
// the workers holding jobs, and the operators' log.
import { $, announce, api, el } from "./api.js";
import { jobLink, seconds, table, when } from "./ops_table.js";

const PAUSE_DEFAULT_S = 300;
// NOTE: the seconds typed for each route survive the panel's refresh.
const typed = new Map();

async function routeAction(action, route, body, refresh) {
  $("action-error").textContent = "";
  try {
    await api("POST", `/ops/routes/${action}`, { body: { route, ...body } });
    announce(action === "pause" ? `Route ${route} paused.` : `Route ${route} resumed.`);
  } catch (err) {
    if (err.status === 401) { location.reload(); return; }
    $("action-error").textContent = `The ${action} of route ${route} failed: ${err.message}`;
  }
  refresh();
}

function use(count, limit) {
  return limit ? `${count} / ${limit}` : `${count} (no limit)`;
}

export function renderRoutes(routes, refresh) {
  // NOTE: not redrawn while the operator is typing in it (the refresh would take the focus away).
  const focused = document.activeElement;
  if (focused && focused.tagName === "INPUT" && $("routes").contains(focused)) return;
  table("routes", ["route", "models", "calls this window", "tokens this window", "state", ""],
    routes.map((r) => {
      const input = el("input", { type: "number", min: "1", max: "86400", class: "act",
        "aria-label": `seconds to pause route ${r.name}`, "data-route": r.name,
        value: typed.get(r.name) || String(PAUSE_DEFAULT_S) });
      input.addEventListener("input", () => typed.set(r.name, input.value));
      const actions = el("span", { class: "acts" },
        input,
        el("button", { type: "button", class: "quiet act", "data-route": r.name, text: "Pause",
          "aria-label": `Pause route ${r.name}`,
          onclick: () => routeAction("pause", r.name, { seconds: Number(input.value) }, refresh) }),
        r.paused_seconds > 0 ? el("button", { type: "button", class: "quiet act", "data-route": r.name,
          text: "Resume", "aria-label": `Resume route ${r.name}`,
          onclick: () => routeAction("resume", r.name, {}, refresh) }) : null);
      const state = r.paused_seconds > 0
        ? `paused ${seconds(r.paused_seconds)} more (${r.reason || "no reason"})` : "running";
      return [r.name, r.models.join(", ") || "–", use(r.requests, r.rpm), use(r.tokens, r.tpm),
        el("span", { class: "route-state", "data-route": r.name, text: state }),
        r.configured ? actions : "not configured"];
    }));
}

export function renderWorkers(workers) {
  const ago = (at) => (at ? `${seconds((Date.now() - Date.parse(at)) / 1000)} ago` : "–");
  table("workers", ["worker", "host", "slots in use", "last seen", "last job heartbeat",
    "oldest claim", "orgs"],
    workers.map((w) => [w.worker_id, w.host, `${w.slots_in_use} / ${w.slots}`, ago(w.seen_at),
      ago(w.last_heartbeat), when(w.oldest_claim), w.orgs.join(", ") || "–"]));
}

function target(entry) {
  const t = entry.target || {};
  if (t.filter) {
    const parts = Object.entries(t.filter).map(([k, v]) => `${k}=${Array.isArray(v) ? v.join(",") : v}`);
    return `filter ${parts.join(" ") || "(all jobs)"}, at most ${t.max_jobs}`;
  }
  if (t.ids) return `${t.ids.length} selected`;
  if (t.route) return `route ${t.route}${t.seconds ? ` for ${seconds(t.seconds)}` : ""}`;
  return "";
}

export function renderAudit(entries) {
  table("audit", ["when", "who", "action", "what", "jobs", "batches"], entries.map((a) => {
    const jobs = el("span", { class: "audit-jobs" }, `${a.job_count}`);
    for (const id of a.job_ids.slice(0, 5)) jobs.append(" ", jobLink(id));
    return [when(a.at), `org ${a.org_id} · user ${a.user_id}`, a.action, target(a), jobs,
      a.finished_at ? a.batches : `${a.batches} (running)`];
  }));
}
