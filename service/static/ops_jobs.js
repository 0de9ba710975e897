// The jobs explorer of the operator console: every org's jobs a filter reaches, newest first, a
// page at a time (keyset: "Older" follows next_cursor); a selection or the whole filter can be
// cancelled or retried once its count is shown; a job's history opens at #job=<uuid>.
import { $, announce, api, el } from "./api.js";
import { jobLink, table, when } from "./ops_table.js";

const KINDS = ["timeout", "rate_limit", "provider_5xx", "provider_4xx", "parse", "auth", "worker_crash",
  "stuck", "unknown", "invalid_options", "dependency_failed"];
const FIELDS = { state: "f-state", org: "f-org", model: "f-model", route: "f-route", error_kind: "f-kind",
  since: "f-since",
  until: "f-until", q: "f-q" };

let applied = new URLSearchParams();   // the filter the table shows
let cursors = [];                       // the cursors of the pages before this one
let cursor = null;                      // this page's cursor (null: the newest)
let selected = new Set();
let counted = null;                     // the last count of the applied filter
let changed = () => {};
let loads = 0;                          // NOTE: only the latest load may draw (an earlier one may answer last)

function readFilter() {
  const params = new URLSearchParams();
  for (const [name, id] of Object.entries(FIELDS)) {
    const value = $(id).value.trim();
    if (value) params.set(name, value);
  }
  return params;
}

function resetBulk() {
  counted = null;
  $("bulk-summary").textContent = "";
  $("bulk-cancel").hidden = true;
  $("bulk-retry").hidden = true;
}

function showSelection() {
  for (const id of ["selected-cancel", "selected-retry"]) $(id).disabled = selected.size === 0;
  $("selected-cancel").textContent = `Cancel selected (${selected.size})`;
  $("selected-retry").textContent = `Retry selected (${selected.size})`;
}

function pick(job) {
  const box = el("input", { type: "checkbox", class: "act", "aria-label": `select job ${job.id}`,
    "data-job-id": job.id });
  box.checked = selected.has(job.id);
  box.addEventListener("change", () => {
    if (box.checked) selected.add(job.id); else selected.delete(job.id);
    showSelection();
  });
  return box;
}

export async function loadJobs() {
  $("jobs-error").textContent = "";
  const params = new URLSearchParams(applied);
  if (cursor) params.set("cursor", cursor);
  const mine = ++loads;
  try {
    const page = await api("GET", `/ops/jobs?${params}`);
    if (mine !== loads) return;
    // NOTE: says which filter the table shows (the page's tests wait for it).
    $("jobs").dataset.filter = applied.toString();
    table("jobs", ["", "job", "state", "org", "model", "kind", "attempts", "created", "text"],
      page.items.map((j) => [pick(j), jobLink(j.id), j.state, j.org_id, j.model || "default",
        j.error_kind || "–", `${j.attempt}/${j.max_attempts}`, when(j.created_at), j.text || ""]));
    for (const row of $("jobs").querySelectorAll("tbody tr")) {
      const last = row.lastElementChild;
      if (last) last.className = "text";
    }
    $("jobs-older").hidden = !page.next_cursor;
    $("jobs-older").dataset.cursor = page.next_cursor || "";
    $("jobs-newest").hidden = cursor === null;
  } catch (err) {
    if (err.status === 401) { location.reload(); return; }
    $("jobs-error").textContent = `The jobs could not be read: ${err.message}`;
  }
}

async function countMatching() {
  resetBulk();
  try {
    const found = await api("GET", `/ops/jobs/count?${applied}`);
    counted = found;
    const more = (n) => (n > found.max ? `more than ${found.max}` : String(n));
    $("bulk-summary").textContent = `${more(found.jobs)} jobs match: ${more(found.cancellable)} can be `
      + `cancelled, ${more(found.retryable)} retried.`;
    const cancel = Math.min(found.cancellable, found.max);
    const retry = Math.min(found.retryable, found.max);
    $("bulk-cancel").textContent = `Cancel these ${cancel} jobs`;
    $("bulk-cancel").dataset.count = String(cancel);
    $("bulk-cancel").hidden = cancel === 0;
    $("bulk-retry").textContent = `Retry these ${retry} jobs`;
    $("bulk-retry").dataset.count = String(retry);
    $("bulk-retry").hidden = retry === 0;
  } catch (err) {
    if (err.status === 401) { location.reload(); return; }
    $("jobs-error").textContent = `The jobs could not be counted: ${err.message}`;
  }
}

async function bulk(action, { ids, maxJobs }) {
  $("jobs-error").textContent = "";
  try {
    const path = ids ? `/ops/bulk/${action}` : `/ops/bulk/${action}?${applied}&max_jobs=${maxJobs}`;
    const done = await api("POST", path, ids ? { body: { ids } } : {});
    announce(`${action === "cancel" ? "Cancelled" : "Retried"} ${done.changed} jobs in ${done.batches}`
      + ` batches (operator action ${done.action_id}).`);
    $("bulk-summary").textContent = `${action === "cancel" ? "Cancelled" : "Retried"} ${done.changed} jobs.`;
  } catch (err) {
    if (err.status === 401) { location.reload(); return; }
    $("jobs-error").textContent = `The ${action} failed: ${err.message}`;
  }
  $("bulk-cancel").hidden = true;
  $("bulk-retry").hidden = true;
  selected = new Set();
  showSelection();
  await loadJobs();
  // NOTE: an open history may be of a job the action changed.
  if (!$("job").hidden) await showJobFromHash();
  changed();
}

function apply() {
  applied = readFilter();
  cursor = null;
  cursors = [];
  selected = new Set();
  showSelection();
  resetBulk();
  loadJobs();
}

function fieldRow(dl, name, value) {
  dl.append(el("dt", { text: name }), el("dd", {}, value instanceof Node ? value : String(value ?? "–")));
}

async function act(label, job, path) {
  try {
    await api("POST", `/ops/jobs/${job.id}/${path}`);
    announce(`${label}: job ${job.id.slice(0, 8)}.`);
  } catch (err) {
    $("action-error").textContent = `${label} failed: ${err.message}`;
  }
  await showJobFromHash();
  changed();
}

export async function showJobFromHash() {
  const match = /^#job=([0-9a-fA-F-]{36})$/.exec(location.hash);
  if (!match) { $("job").hidden = true; return; }
  try {
    const found = await api("GET", `/ops/jobs/${match[1]}`);
    const job = found.job;
    const dl = $("job-fields");
    dl.replaceChildren();
    for (const name of ["id", "state", "org_id", "created_by", "prompt_id", "attempt", "max_attempts",
      "priority", "worker_claim", "error_kind", "error_message", "supersedes", "superseded_by"]) {
      fieldRow(dl, name, name === "supersedes" || name === "superseded_by"
        ? (job[name] ? jobLink(job[name]) : "–") : job[name]);
    }
    fieldRow(dl, "model", (job.execution_options || {}).model || "default");
    for (const name of ["created_at", "scheduled_for", "claimed_at", "finished_at", "archived_at"]) {
      if (job[name]) fieldRow(dl, name, when(job[name]));
    }
    const actions = el("span", { class: "acts" });
    if (job.state === "queued" || job.state === "running") {
      actions.append(el("button", { type: "button", class: "quiet act", text: "Cancel",
        onclick: () => act("Cancel", job, "cancel") }));
    } else if (job.state !== "superseded" && !job.archived_at) {
      actions.append(el("button", { type: "button", class: "quiet act", text: "Retry",
        onclick: () => act("Retry", job, "retry") }));
    }
    fieldRow(dl, "actions", actions);
    $("job-text").textContent = found.prompt ? found.prompt.content : "";
    table("job-transitions", ["#", "from", "to", "attempt", "worker", "error kind", "at"],
      found.transitions.map((t) => [t.id, t.from_state || "(created)", t.to_state, t.attempt,
        t.worker_claim || "–", t.error_kind || "–", when(t.at)]));
    table("job-calls", ["attempt", "route", "model", "outcome", "HTTP status", "error", "latency",
      "tokens in/out", "cost (USD)", "at"],
      found.provider_calls.map((c) => [c.attempt, c.route ?? "–", c.model, c.outcome, c.http_status ?? "–",
        c.error_message ?? "–", `${c.latency_ms} ms`, `${c.tokens_in ?? "–"}/${c.tokens_out ?? "–"}`,
        c.cost === null || c.cost === undefined ? "–" : c.cost.toFixed(6), when(c.created_at)]));
    for (const row of $("job-calls").querySelectorAll("tbody tr")) {
      if (row.children[5]) row.children[5].className = "text";
    }
    $("job-title").textContent = `Job ${job.id}`;
    const wasHidden = $("job").hidden;
    $("job").hidden = false;
    if (wasHidden) $("job").focus();
  } catch (err) {
    if (err.status === 401) { location.reload(); return; }
    $("job").hidden = false;
    $("job-title").textContent = "Job";
    $("job-fields").replaceChildren();
    $("job-text").textContent = err.status === 404 ? "No such job." : `The job could not be read: ${err.message}`;
    for (const id of ["job-transitions", "job-calls"]) $(id).replaceChildren();
  }
}

export function setupJobs(onChanged) {
  changed = onChanged;
  for (const kind of KINDS) $("f-kind").append(el("option", { value: kind, text: kind }));
  $("job-filter").addEventListener("submit", (event) => { event.preventDefault(); apply(); });
  $("job-filter").addEventListener("input", resetBulk);
  $("f-clear").addEventListener("click", () => { $("job-filter").reset(); apply(); });
  $("jobs-older").addEventListener("click", () => {
    cursors.push(cursor);
    cursor = $("jobs-older").dataset.cursor || null;
    loadJobs();
  });
  $("jobs-newest").addEventListener("click", () => { cursor = null; cursors = []; loadJobs(); });
  $("bulk-count").addEventListener("click", countMatching);
  $("select-page").addEventListener("click", () => {
    for (const box of $("jobs").querySelectorAll("input[type=checkbox][data-job-id]")) {
      box.checked = true;
      selected.add(box.dataset.jobId);
    }
    showSelection();
  });
  $("bulk-cancel").addEventListener("click", () => counted && bulk("cancel",
    { maxJobs: Number($("bulk-cancel").dataset.count) }));
  $("bulk-retry").addEventListener("click", () => counted && bulk("retry",
    { maxJobs: Number($("bulk-retry").dataset.count) }));
  $("selected-cancel").addEventListener("click", () => bulk("cancel", { ids: [...selected] }));
  $("selected-retry").addEventListener("click", () => bulk("retry", { ids: [...selected] }));
  $("job-close").addEventListener("click", (event) => {
    event.preventDefault();
    history.replaceState(null, "", location.pathname);
    $("job").hidden = true;
  });
  showSelection();
  loadJobs();
}
