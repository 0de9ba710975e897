// Small helpers of the operator console: durations and tables of cells (text or nodes).
import { $, el } from "./api.js";

export function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 60) return `${value.toFixed(1)} s`;
  if (value < 3600) return `${(value / 60).toFixed(1)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "–";
}

export function table(id, headers, rows) {
  const head = el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { scope: "col", text: h }))));
  const body = el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) =>
    (c instanceof Node ? el("td", {}, c) : el("td", { text: c === null || c === undefined ? "–" : String(c) }))))));
  const caption = $(id).querySelector("caption");
  $(id).replaceChildren(...(caption ? [caption] : []), head, body);
  if (!rows.length) $(id).append(el("tbody", {}, el("tr", {}, el("td", { colspan: String(headers.length), text: "none" }))));
  return body;
}

// A job's id as a link to its history on this page (#job=<uuid>): the address can be shared.
export function jobLink(id) {
  return el("a", { href: `#job=${id}`, class: "job-link", "data-job-id": id, title: id,
    "aria-label": `job ${id}`, text: id.slice(0, 8) });
}
