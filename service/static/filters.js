// Which drops the page shows: one state (each with its count) and a text searched in prompts and
// answers. Both act on the drops already loaded, so a filter answers at once.
import { $, el } from "./api.js";

const STATES = ["queued", "running", "succeeded", "failed", "cancelled"];

let chosen = null;   // a state, or null for all
let searched = "";
let changed = () => {};
let countsTimer = null;

export function setupFilters(onChange) {
  changed = onChange;
  $("search").addEventListener("input", () => {
    searched = $("search").value.trim().toLowerCase();
    changed();
  });
}

export function shows(item) {
  if (chosen !== null && item.state !== chosen) return false;
  if (!searched) return true;
  return `${item.text || ""}\n${item.response_text || ""}`.toLowerCase().includes(searched);
}

// NOTE: redrawn once per burst of changes, not once per change.
export function countLater(items) {
  if (countsTimer !== null) return;
  countsTimer = setTimeout(() => { countsTimer = null; drawCounts(items); }, 0);
}

function drawCounts(items) {
  const counts = new Map(STATES.map((state) => [state, 0]));
  for (const item of items.values()) counts.set(item.state, (counts.get(item.state) || 0) + 1);
  const chip = (state, label, n) => {
    const button = el("button", { type: "button", class: "filter quiet", "data-state": state || "all",
                                  "aria-pressed": String(chosen === state), text: `${label} ${n}` });
    button.addEventListener("click", () => {
      chosen = state;
      drawCounts(items);
      changed();
      $("state-filter").querySelector(`[data-state="${state || "all"}"]`).focus();
    });
    return button;
  };
  $("state-filter").replaceChildren(chip(null, "all", items.size),
    ...STATES.filter((state) => counts.get(state) || chosen === state)
      .map((state) => chip(state, state, counts.get(state))));
}
