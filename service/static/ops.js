// The operator view: queue depth by state and org, oldest queued, running jobs and their workers,
// failures by kind, with cancel and retry. Needs a token with the `ops` scope; refreshed every
// REFRESH_MS (and at once after an action).
import { $, announce, api, el, setConnection, setupSession } from "./api.js";

const REFRESH_MS = 3000;
const STATES = ["queued", "running", "succeeded", "failed", "cancelled", "superseded"];
let timer = null;

function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 60) return `${value.toFixed(1)} s`;
  if (value < 3600) return `${(value / 60).toFixed(1)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

function table(id, headers, rows) {
  const head = el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { scope: "col", text: h }))));
  const body = el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) =>
    (c instanceof Node ? el("td", {}, c) : el("td", { text: String(c) }))))));
  const caption = $(id).querySelector("caption");
  $(id).replaceChildren(...(caption ? [caption] : []), head, body);
  if (!rows.length) $(id).append(el("tbody", {}, el("tr", {}, el("td", { colspan: String(headers.length), text: "none" }))));
}

function action(label, job, path) {
  return el("button", { type: "button", class: "quiet", "data-job-id": job.id,
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

function render(view) {
  const metrics = view.metrics;
  const orgs = [{ ...metrics.all, org_id: "all" }, ...metrics.orgs];
  table("depth", ["org", ...STATES, "oldest due queued"], orgs.map((o) => [
    o.org_id, ...STATES.map((s) => o.jobs_by_state[s]), o.queued_due ? seconds(o.oldest_queued_seconds) : "–"]));
  $("oldest").textContent = `Oldest queued job waiting: ${seconds(metrics.all.oldest_queued_seconds)}`
    + ` · due now: ${metrics.all.queued_due}`;
  table("running", ["job", "org", "attempt", "worker", "last change", ""], view.running.map((j) => [
    j.id.slice(0, 8), j.org_id, `${j.attempt}/${j.max_attempts}`, j.worker_claim || "–",
    new Date(j.updated_at).toLocaleTimeString(), action("Cancel", j, "cancel")]));
  const kinds = Object.entries(metrics.all.errors_by_kind);
  $("kinds").textContent = kinds.length
    ? `Errored attempts in the last hour by kind: ${kinds.map(([k, v]) => `${k} ${v.errors}`).join(", ")}`
    : "No errored attempts in the last hour.";
  table("failures", ["job", "org", "kind", "attempts", "failed at", ""], view.failures.map((j) => [
    j.id.slice(0, 8), j.org_id, j.error_kind || "–", `${j.attempt}/${j.max_attempts}`,
    new Date(j.finished_at || j.updated_at).toLocaleString(), action("Retry", j, "retry")]));
}

async function refresh() {
  clearTimeout(timer);
  try {
    render(await api("GET", "/ops/overview"));
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

setupSession(() => refresh());
