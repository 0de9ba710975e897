// A prompt's detail view on the mission page: every job of the prompt and every attempt of each
// (outcome, model, route, status, latency, tokens, cost), its options and timings, with an
// address of its own (#prompt=<id>) that opens it again after a reload.
import { $, api, el } from "./api.js";
import { short } from "./text.js";

const HASH = /^#prompt=([0-9a-f-]{36})$/;

function when(at) {
  return at ? new Date(at).toLocaleString() : "—";
}

// NOTE: an attempt was retried when a later one exists, or its job waits to run again.
function retried(job, index) {
  if (index < job.usage.length - 1) return "retried";
  if (job.usage[index].outcome === "succeeded") return "";
  return job.state === "queued" ? `retried at ${when(job.scheduled_for)}` : "not retried";
}

function attemptRow(job, usage, index) {
  const tokens = usage.tokens_in === null ? "—" : `${usage.tokens_in} in, ${usage.tokens_out} out`;
  return el("tr", {},
    el("td", { text: String(usage.attempt) }),
    el("td", { text: usage.outcome }),
    el("td", { text: retried(job, index) }),
    el("td", { text: usage.model }),
    el("td", { text: usage.route || "—" }),
    el("td", { text: usage.http_status === null ? "—" : String(usage.http_status) }),
    el("td", { text: `${usage.latency_ms} ms` }),
    el("td", { text: tokens }),
    el("td", { text: usage.cost === null ? "—" : `$${Number(usage.cost).toFixed(6)}` }),
    el("td", { text: when(usage.at) }));
}

function jobSection(job) {
  const options = Object.entries(job.execution_options || {})
    .map(([name, value]) => `${name}: ${typeof value === "string" ? value : JSON.stringify(value)}`);
  const headers = ["Attempt", "Outcome", "Retried", "Model", "Route", "HTTP", "Latency", "Tokens",
    "Cost", "Ended"];
  return el("section", { class: "detail-job", "data-job-id": job.id },
    el("h3", { text: `Job ${job.id.slice(0, 8)}: ${job.state}, attempt ${job.attempt} of ${job.max_attempts}` }),
    el("p", { class: "hint", text: `created ${when(job.created_at)} · started ${when(job.started_at)} · `
      + `finished ${when(job.finished_at)}` }),
    job.error_kind
      ? el("p", { class: "error-text" }, el("strong", { text: job.error_kind }),
        job.error_message ? `: ${job.error_message}` : "")
      : null,
    options.length ? el("p", { class: "detail-options", text: `Options: ${options.join(", ")}` }) : null,
    job.usage.length
      ? el("table", { class: "detail-attempts" },
        el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { scope: "col", text: h })))),
        el("tbody", {}, ...job.usage.map((usage, i) => attemptRow(job, usage, i))))
      : el("p", { class: "hint", text: "No provider call yet." }));
}

export function detailView({ drops }) {
  let open = null;

  async function render(promptId) {
    const found = await api("GET", `/prompts/${promptId}?limit=20`);
    if (open !== promptId) return;
    $("detail-title").textContent = `Details of “${short(found.prompt.content, 40)}”`;
    const older = found.has_more ? [el("p", { class: "hint", text: "Older jobs are not shown." })] : [];
    $("detail-body").replaceChildren(...found.jobs.map(jobSection), ...older);
  }

  const view = {
    async show(promptId) {
      open = promptId;
      history.replaceState(null, "", `#prompt=${promptId}`);
      $("detail").hidden = false;
      try {
        await render(promptId);
      } catch {
        $("detail-body").replaceChildren(el("p", { class: "error", text: "This prompt could not be read." }));
      }
      $("detail").focus();
    },
    close() {
      if (open === null) return;
      const from = open;
      open = null;
      $("detail").hidden = true;
      history.replaceState(null, "", location.pathname + location.search);
      if (drops.has(from)) drops.get(from).focus();
    },
    refresh(promptId) {
      if (open === promptId) render(promptId).catch(() => {});
    },
    // NOTE: a link to a prompt's details opens them once the page is signed in.
    fromAddress() {
      const match = HASH.exec(location.hash);
      if (match) view.show(match[1]);
    },
  };
  return view;
}
