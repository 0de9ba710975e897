// The console's charts of the last hour, a point per minute, drawn as inline SVG (no library):
// jobs enqueued, succeeded and failed; wait p50 and p95; run p50 and p95. Each chart says what it
// shows in its caption and, for screen readers, its latest values.
import { $, el } from "./api.js";
import { seconds } from "./ops_table.js";

const NS = "http://www.w3.org/2000/svg";
const W = 300;
const H = 110;
const PAD = { left: 30, right: 6, top: 8, bottom: 16 };

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

function chart(id, title, minutes, series, format) {
  const values = series.flatMap((s) => minutes.map((m) => m[s.key])).filter((v) => v !== null);
  const top = Math.max(1e-9, ...values);
  const x = (i) => PAD.left + (i * (W - PAD.left - PAD.right)) / Math.max(1, minutes.length - 1);
  const y = (v) => H - PAD.bottom - (v / top) * (H - PAD.top - PAD.bottom);
  const last = minutes[minutes.length - 1] || {};
  const summary = series.map((s) => `${s.label} ${last[s.key] === null || last[s.key] === undefined
    ? "none" : format(last[s.key])}`).join(", ");
  const image = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-labelledby": `${id}-t` });
  image.append(svg("title", { id: `${id}-t` }, `${title}; this minute: ${summary}`));
  image.append(svg("line", { class: "axis", x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right,
    y2: H - PAD.bottom }));
  image.append(svg("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom }));
  image.append(svg("text", { x: 2, y: PAD.top + 8 }, format(top)));
  image.append(svg("text", { x: 2, y: H - PAD.bottom }, "0"));
  image.append(svg("text", { x: PAD.left, y: H - 3 }, "−60 min"));
  image.append(svg("text", { x: W - PAD.right - 24, y: H - 3 }, "now"));
  series.forEach((s, index) => {
    // NOTE: a minute that measured nothing breaks the line instead of drawing a zero.
    let points = [];
    const flush = () => {
      if (points.length === 1) {
        // NOTE: a lone minute is a dot: a line through one point draws nothing.
        const [cx, cy] = points[0].split(",");
        image.append(svg("circle", { class: `s${index} dot`, cx, cy, r: 1.8 }));
      } else if (points.length) {
        image.append(svg("polyline", { class: `s${index}`, points: points.join(" ") }));
      }
      points = [];
    };
    minutes.forEach((m, i) => {
      if (m[s.key] === null || m[s.key] === undefined) { flush(); return; }
      points.push(`${x(i).toFixed(1)},${y(m[s.key]).toFixed(1)}`);
    });
    flush();
  });
  const legend = series.map((s, index) => el("span", { class: `legend s${index}`, text: s.label }));
  return el("figure", { class: "chart", id }, image,
    el("figcaption", {}, `${title}: `, ...legend.flatMap((node, i) => (i ? [", ", node] : [node]))));
}

export function renderCharts(minutes) {
  const count = (v) => String(Math.round(v));
  $("charts").replaceChildren(
    chart("chart-jobs", "Jobs per minute", minutes, [
      { key: "enqueued", label: "enqueued" }, { key: "succeeded", label: "succeeded" },
      { key: "failed", label: "failed" }], count),
    chart("chart-wait", "Wait (created to claimed)", minutes, [
      { key: "wait_p50", label: "p50" }, { key: "wait_p95", label: "p95" }], seconds),
    chart("chart-run", "Run (claimed to finished)", minutes, [
      { key: "run_p50", label: "p50" }, { key: "run_p95", label: "p95" }], seconds));
}
