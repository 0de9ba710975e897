// The operator console: queue depth by state and org (oldest due job, wait and run p95), running
// jobs and failures with cancel and retry, the jobs explorer (ops_jobs.js), routes with pause and
// resume, workers and the operators' log (ops_panels.js). Needs a token with the `ops` scope, or
// `ops:read` to look only (the actions are then hidden, and the server refuses them anyway).
// The panels refresh every REFRESH_MS, and at once after an action.
import { $, announce, api, el, setConnection, setupSession } from "./api.js";
import { setupJobs, showJobFromHash } from "./ops_jobs.js";
import { renderCharts } from "./ops_charts.js";
import { renderAudit, renderRoutes, renderWorkers } from "./ops_panels.js";
import { jobLink, seconds, table } from "./ops_table.js";

const REFRESH_MS = 3000;
const CHARTS_EVERY = 5;   // refreshes: the charts are redrawn every 15 s (a minute per point)
const STATES = ["queued", "running", "succeeded", "failed", "cancelled", "superseded"];
let timer = null;
let refreshes = 0;

function action(label, job, path) {
  return el("button", { type: "button", class: "quiet act", "data-job-id": job.id,
    "aria-label": `${label} job ${job.id}`, text: label, onclick: () => act(label, job, path) });
}

async function act(label, job, path) {
  $("action-error").textContent = "";
  try {
    await api("POST", `/ops/jobs/${job.id}/${path}`);
    announce(`${label}: job ${job.id.slice(0, 8)} of org ${job.org_id}.`);
  } catch (err) {
    if (err.status === 401) { location.reload(); return; }
    $("action-error").textContent = `${label} failed: ${err.message}`;
  }
  refresh();
}

function latencyText(all) {
  const wait = all.wait_seconds; const run = all.run_seconds;
  if (!all.claims && !all.attempts) return "Last hour: no job claimed or finished.";
  const rate = all.error_rate === null ? "–" : `${(all.error_rate * 100).toFixed(1)} %`;
  return `Last hour: wait p95 ${seconds(wait.p95)} (mean ${seconds(wait.mean)}) over ${all.claims} claims`
    + ` · run p95 ${seconds(run.p95)} (mean ${seconds(run.mean)}) over ${all.attempts} attempts`
    + ` · errored attempts ${rate}`;
}

function render(view) {
  const metrics = view.metrics;
  const all = metrics.all;
  const orgs = [{ ...all, org_id: "all" }, ...metrics.orgs];
  table("depth", ["org", ...STATES, "oldest due queued", "wait p95", "run p95"], orgs.map((o) => [
    o.org_id, ...STATES.map((s) => o.jobs_by_state[s]), o.queued_due ? seconds(o.oldest_queued_seconds) : "–",
    seconds(o.wait_seconds.p95), seconds(o.run_seconds.p95)]));
  // NOTE: only due jobs count: a job scheduled later, or waiting on its predecessor, is not late.
  const notDue = all.jobs_by_state.queued - all.queued_due;
  $("oldest").textContent = (all.queued_due
    ? `Oldest due job waiting: ${seconds(all.oldest_queued_seconds)} · due now: ${all.queued_due}`
    : "No queued job is due now")
    + (notDue > 0 ? ` · ${notDue} queued for later (scheduled, backing off or after another job)` : "");
  $("latency").textContent = latencyText(all);
  table("running", ["job", "org", "attempt", "worker", "last change", ""], view.running.map((j) => [
    jobLink(j.id), j.org_id, `${j.attempt}/${j.max_attempts}`, j.worker_claim || "–",
    new Date(j.updated_at).toLocaleTimeString(), action("Cancel", j, "cancel")]));
  const kinds = Object.entries(all.errors_by_kind);
  $("kinds").textContent = kinds.length
    ? `Errored attempts in the last hour by kind: ${kinds.map(([k, v]) => `${k} ${v.errors}`).join(", ")}`
    : "No errored attempts in the last hour.";
  table("failures", ["job", "org", "kind", "attempts", "failed at", ""], view.failures.map((j) => [
    jobLink(j.id), j.org_id, j.error_kind || "–", `${j.attempt}/${j.max_attempts}`,
    new Date(j.finished_at || j.updated_at).toLocaleString(), action("Retry", j, "retry")]));
}

async function refresh() {
  clearTimeout(timer);
  try {
    const [view, routes, workers, audit] = await Promise.all([
      api("GET", "/ops/overview"), api("GET", "/ops/routes"), api("GET", "/ops/workers"),
      api("GET", "/ops/actions?limit=20")]);
    render(view);
    renderRoutes(routes.items, refresh);
    renderWorkers(workers.items);
    renderAudit(audit.items);
    if (refreshes++ % CHARTS_EVERY === 0) renderCharts((await api("GET", "/ops/charts")).minutes);
    $("app").hidden = false;
    setConnection("live", true);
    $("conn").textContent = `Refreshed ${new Date().toLocaleTimeString()} (every ${REFRESH_MS / 1000} s)`;
  } catch (err) {
    if (err.status === 401) { location.reload(); return; }
    if (err.status === 403) {
      $("app").hidden = true;
      $("refused").hidden = false;
      $("refused-text").textContent = `${err.message} This view shows every org's jobs.`;
      setConnection("signedout");
      return;
    }
    setConnection("polling", false);
  }
  // NOTE: an action's refresh may overlap the timer's; one timer stays.
  clearTimeout(timer);
  timer = setTimeout(refresh, REFRESH_MS);
}

let started = false;

setupSession((who) => {
  const readOnly = !who.scopes.includes("ops");
  document.body.classList.toggle("readonly", readOnly);
  $("readonly-note").hidden = !readOnly;
  if (!started) {
    started = true;
    setupJobs(refresh);
    window.addEventListener("hashchange", showJobFromHash);
  }
  refresh();
  showJobFromHash();
});
