// The mission page: the viewer's prompts as drops, live over SSE, polling /mission/recent as fallback.
//
// The page opens on a snapshot (/mission/prompts: the latest state of the newest prompts, as of an
// event id), never on the log's history; older prompts come a page at a time on request. The event
// stream resumes from the snapshot's event id, and each event is applied from its own data; the
// page reads /mission/recent (from the snapshot's cursor on) only for what an event does not carry:
// a prompt it has not seen, and an error's message and next run time. When the stream fails, the
// page polls every POLL_MS and keeps trying the stream; the browser's own reconnection sends
// Last-Event-ID, and the first event or `open` after it returns the page to live.
import { $, API, announce, api, el, setConnection, setupSession } from "./api.js";
import { countLater, setupFilters, shows } from "./filters.js";
import { setServerClock, tell, waitsFor } from "./status.js";
import { answerNode, collapsible, short } from "./text.js";
import { detailView } from "./details.js";
import { threadView } from "./thread.js";

const POLL_MS = 2000;
const SNAPSHOT_PAGE = 50;
const STREAM_RETRY_MS = 5000;
const WATCH_MS = 4000;
const ACTIVE = new Set(["queued", "running"]);
const STATE_CLASS = {
  queued: "is-queued", running: "is-pending", succeeded: "is-settled", failed: "is-orphan",
  cancelled: "is-cancelled", superseded: "is-superseded",
};

const items = new Map();   // prompt_id -> item (a /mission/recent item)
const drops = new Map();   // prompt_id -> <li>
const opened = new Set();  // long texts the viewer expanded ("prompt:<id>", "answer:<id>")
const partials = new Map(); // job_id -> {attempt, text}: a streamed attempt's text so far
const catching = new Set(); // jobs whose partial_text is being read
const thread = threadView({ itemOf, childrenOf, drops, stateClass: STATE_CLASS });
const details = detailView({ drops });
let cursor = null;
let lastEventId = null;
let olderBefore = null;
let syncing = false;
let again = false;
let stream = null;
let streamOpenedAt = 0;
let pollTimer = null;


// NOTE: a session that ended (401) reloads the page: nothing of this viewer stays on screen for
// whoever signs in next.
function failed(err) {
  if (err.status === 401) { closeStream(); stopPolling(); location.reload(); return true; }
  return false;
}

// ---- the field of drops ----------------------------------------------------------------------

function renderDrop(item) {
  let li = drops.get(item.prompt_id);
  const fresh = !li;
  if (fresh) {
    li = el("li", { class: "drop", "data-prompt-id": item.prompt_id, tabindex: "-1" });
    drops.set(item.prompt_id, li);
  }
  li.className = `drop ${STATE_CLASS[item.state] || ""}`;
  li.dataset.state = item.state;
  li.dataset.jobId = item.job_id;
  const attempts = item.attempt ? `attempt ${item.attempt} of ${item.max_attempts}` : null;
  const actions = el("div", { class: "actions" });
  if (ACTIVE.has(item.state)) {
    actions.append(el("button", { type: "button", class: "cancel", text: "Cancel",
      "aria-label": `Cancel “${short(item.text, 30)}”`, onclick: () => cancel(item) }));
  }
  if (item.state === "failed" || item.state === "cancelled") {
    actions.append(el("button", { type: "button", class: "retry chip", text: "Retry",
      "aria-label": `Retry “${short(item.text, 30)}”`, onclick: () => retry(item) }));
  }
  if (item.state === "succeeded") {
    actions.append(el("button", { type: "button", class: "continue quiet", text: "Continue",
      "aria-label": `Continue “${short(item.text, 30)}”`, onclick: () => continueThread(item) }));
  }
  if (item.parent_id || childrenOf(item.prompt_id).length) {
    actions.append(el("button", { type: "button", class: "thread-open quiet", text: "Thread",
      "aria-label": `Thread of “${short(item.text, 30)}”`, onclick: () => thread.show(item.prompt_id) }));
  }
  actions.append(el("a", { class: "details", href: `#prompt=${item.prompt_id}`, text: "Details",
    "aria-label": `Details of “${short(item.text, 30)}”` }));
  // NOTE: a running attempt shows no error: the one kept in the item belongs to an earlier attempt.
  const why = item.state === "queued"
    ? waitsFor(item, (jobId) => [...items.values()].find((i) => i.job_id === jobId)) : null;
  const error = item.error_kind && item.state !== "succeeded" && item.state !== "running"
    ? el("p", { class: "error-text" }, el("strong", { text: item.error_kind }),
      item.error_message ? `: ${item.error_message}` : "")
    : null;
  // NOTE: the drop is drawn anew; focus inside it stays there (on the same button when it is still
  // offered, else on the drop), never falling back to <body>.
  const focused = li.contains(document.activeElement) ? document.activeElement : null;
  li.replaceChildren(...[
    el("div", { class: "drop-head" },
      el("span", { class: "state", text: item.state }),
      attempts ? el("span", { class: "attempts", text: attempts }) : null,
      why,
      item.parent_id ? el("span", { class: "continues", text: "continues a thread" }) : null,
      el("time", { datetime: item.created_at, text: new Date(item.created_at).toLocaleString() })),
    ...collapsible(el("p", { class: "prompt-text", text: item.text }), item.text,
                   `prompt:${item.prompt_id}`, opened),
    ...(item.response_text
      ? collapsible(answerNode(item.response_text, "response-text"), item.response_text,
                    `answer:${item.prompt_id}`, opened)
      : []),
    ...(item.state === "running" && partials.get(item.job_id)?.text
      ? [answerNode(partials.get(item.job_id).text, "response-text partial")]
      : []),
    error,
    actions].filter(Boolean));
  if (focused && !li.contains(focused)) {
    const same = focused.className && li.querySelector(`button.${focused.className.split(" ")[0]}`);
    (same || li).focus();
  }
  if (fresh) place(li, item);
  li.hidden = !shows(item);
  $("empty").hidden = drops.size > 0;
  countLater(items);
}

function place(li, item) {
  const field = $("field");
  for (const other of field.children) {
    const o = items.get(other.dataset.promptId);
    if (o && o.created_at < item.created_at) { field.insertBefore(li, other); return; }
  }
  field.append(li);
}

// NOTE: a reply continues its parent's answer (parent_id is the response's id), so that the model
// sees that answer; a prompt sent through the API may name the prompt itself.
function childrenOf(promptId) {
  const parent = items.get(promptId);
  const answer = parent && parent.response_id;
  return [...items.values()].filter((i) => i.parent_id === promptId || (answer && i.parent_id === answer));
}

function itemOf(id) {
  return items.get(id) || [...items.values()].find((i) => i.response_id === id);
}

function merge(item) {
  const before = items.get(item.prompt_id);
  items.set(item.prompt_id, { ...before, ...item });
  const merged = items.get(item.prompt_id);
  if (merged.state !== "running") partials.delete(merged.job_id);
  renderDrop(items.get(item.prompt_id));
  const parent = item.parent_id && itemOf(item.parent_id);
  if (parent) renderDrop(parent);
  if (before && before.state !== item.state) {
    tell(items.get(item.prompt_id));
    details.refresh(item.prompt_id);
  }
  thread.refresh();
}

// NOTE: a streamed attempt's text as it is written: each job.output_delta applies at its offset
// (a retry starts over at 0). A delta past what the page has (it opened while the answer
// streamed, or missed some while the stream was away) reads the text so far from the job's
// partial_text, once at a time; the deltas after it apply on top. Only streamed jobs cost a read.
function applyDelta(delta) {
  const item = items.get(delta.prompt_id);
  if (!item || item.job_id !== delta.job_id || item.state !== "running") return;
  let partial = partials.get(delta.job_id);
  if (!partial || partial.attempt !== delta.attempt) partial = { attempt: delta.attempt, text: "" };
  if (delta.offset > partial.text.length) {
    if (!catching.has(delta.job_id)) catchUp(item);
    return;
  }
  partial.text = partial.text.slice(0, delta.offset) + delta.text;
  partials.set(delta.job_id, partial);
  renderDrop(item);
}

async function catchUp(item) {
  catching.add(item.job_id);
  try {
    const job = await api("GET", `/jobs/${item.job_id}`);
    const mine = partials.get(item.job_id);
    if (job.state !== "running" || typeof job.partial_text !== "string") return;
    if (mine && mine.attempt === job.attempt && mine.text.length >= job.partial_text.length) return;
    partials.set(item.job_id, { attempt: job.attempt, text: job.partial_text });
    const current = items.get(item.prompt_id);
    if (current && current.job_id === item.job_id) renderDrop(current);
  } catch (err) {
    failed(err);
  } finally {
    catching.delete(item.job_id);
  }
}

// An event carries its job's new state, attempt, error kind and answer: it is applied as it is.
// What it does not carry (a prompt this page has not seen; an error's message and the time the
// job runs again) is read from /mission/recent, one read for however many events ask at once.
function applyEvent(event) {
  const item = items.get(event.prompt_id);
  if (!item) { sync().catch(failed); return; }
  if (event.from_state !== null && event.job_id !== item.job_id) return;
  // NOTE: what holds a due job back (`held`) is known from reads only; an event makes it unknown.
  const update = { job_id: event.job_id, state: event.to_state, attempt: event.attempt,
    error_kind: event.error_kind, updated_at: event.at, held: null };
  if (event.from_state === null) {
    Object.assign(update, { response_id: null, response_text: null, error_message: null });
  }
  if (event.response_id) {
    Object.assign(update, { response_id: event.response_id, response_text: event.response_text,
      response_truncated: event.response_truncated });
  }
  merge({ ...item, ...update });
  // NOTE: a prompt sent from this page is known before the feed described it (max_attempts,
  // created_at, scheduled_for come from there).
  if (event.error_kind || item.max_attempts === undefined) sync().catch(failed);
}

// The fields an event sets. NOTE: a page read before an event arrived may land after it; the
// event's newer state stays, and the page adds only what events do not carry.
const EVENT_FIELDS = ["job_id", "state", "attempt", "error_kind", "updated_at", "response_id",
  "response_text", "response_truncated"];

function mergeRead(item) {
  const known = items.get(item.prompt_id);
  if (known && known.updated_at && Date.parse(known.updated_at) > Date.parse(item.updated_at)) {
    merge({ ...item, ...Object.fromEntries(EVENT_FIELDS.map((name) => [name, known[name]])) });
    return;
  }
  merge(item);
}

// ---- first load: the snapshot, then older pages on request ---------------------------------------

async function loadSnapshot() {
  let page = await api("GET", `/mission/prompts?limit=${SNAPSHOT_PAGE}`);
  // NOTE: null while the server's event hub starts (a second or two after a deploy).
  while (page.event_id === null) {
    await new Promise((resolve) => setTimeout(resolve, 500));
    page = await api("GET", `/mission/prompts?limit=${SNAPSHOT_PAGE}`);
  }
  setServerClock(page.as_of);
  for (const item of page.items) merge(item);
  lastEventId = page.event_id;
  cursor = page.cursor;
  showOlder(page);
}

function showOlder(page) {
  olderBefore = page.has_more ? page.next_before : null;
  $("older").hidden = olderBefore === null;
}

async function loadOlder() {
  const button = $("older");
  button.disabled = true;
  try {
    const query = new URLSearchParams({ limit: String(SNAPSHOT_PAGE), before: olderBefore });
    const page = await api("GET", `/mission/prompts?${query}`);
    // NOTE: an older page repeats a prompt that also had older events; the page has it newer.
    for (const item of page.items) if (!items.has(item.prompt_id)) merge(item);
    showOlder(page);
  } catch (err) {
    failed(err);
  } finally {
    button.disabled = false;
  }
}

// ---- keeping up: /mission/recent by cursor ------------------------------------------------------

async function sync() {
  if (syncing) { again = true; return; }
  syncing = true;
  try {
    do {
      again = false;
      let more = true;
      while (more) {
        const query = new URLSearchParams({ limit: "500" });
        if (cursor) query.set("cursor", cursor);
        const page = await api("GET", `/mission/recent?${query}`);
        setServerClock(page.as_of);
        for (const item of page.items) mergeRead(item);
        cursor = page.next_cursor;
        more = page.has_more;
      }
    } while (again);
  } finally {
    syncing = false;
  }
}

function openStream() {
  closeStream();
  streamOpenedAt = Date.now();
  // NOTE: from the last event this page applied (the snapshot's at first), so nothing between
  // them is missed; the browser's own reconnections send Last-Event-ID.
  const from = lastEventId === null ? "" : `?last_event_id=${lastEventId}`;
  const source = new EventSource(`${API}/mission/events${from}`);
  source.addEventListener("open", () => {
    setConnection("live");
    stopPolling();
  });
  source.addEventListener("job.output_delta", (message) => applyDelta(JSON.parse(message.data)));
  source.addEventListener("job.state_changed", (message) => {
    if (message.lastEventId) lastEventId = message.lastEventId;
    applyEvent(JSON.parse(message.data));
  });
  source.addEventListener("error", () => {
    // NOTE: CONNECTING means the browser retries by itself (with Last-Event-ID); CLOSED means it
    // gave up (an error status), and the poll loop opens a new stream later.
    if (source.readyState === EventSource.CLOSED && stream === source) stream = null;
    startPolling();
  });
  stream = source;
}

function closeStream() {
  if (stream) stream.close();
  stream = null;
}

function startPolling() {
  if (pollTimer !== null) return;
  setConnection("polling", $("conn").dataset.reachable === "true");
  const tick = async () => {
    let reachable = true;
    try {
      await sync();
    } catch (err) {
      if (failed(err)) return;
      reachable = false;
    }
    // NOTE: the stream may have come back while this poll was under way; it has the last word.
    if (pollTimer === null) return;
    setConnection("polling", reachable);
    if (stream === null && Date.now() - streamOpenedAt > STREAM_RETRY_MS) openStream();
    pollTimer = setTimeout(tick, POLL_MS);
  };
  pollTimer = setTimeout(tick, 0);
}

function stopPolling() {
  clearTimeout(pollTimer);
  pollTimer = null;
}

// NOTE: an EventSource never shows the server's keepalive comments, so a server that stopped
// answering (frozen, or behind a network that drops packets silently) would look live for ever.
// While live, a cheap probe every WATCH_MS says whether it still answers; when it does not, the
// page says so and polls, and the poll loop opens a fresh stream once the server is back.
function watchServer() {
  setInterval(async () => {
    if (pollTimer !== null || stream === null) return;
    try {
      const probe = await fetch("/healthz", { cache: "no-store", signal: AbortSignal.timeout(WATCH_MS) });
      if (probe.ok) return;
    } catch {
      // no answer in time
    }
    if (pollTimer !== null) return;
    closeStream();
    setConnection("connecting", false);
    startPolling();
  }, WATCH_MS);
}

// ---- actions --------------------------------------------------------------------------------

async function cancel(item) {
  try {
    await api("POST", `/jobs/${item.job_id}/cancel`);
  } catch (err) {
    if (!failed(err)) announce(`Could not cancel: ${err.message}`);
  }
  sync().catch(failed);
}

async function retry(item) {
  try {
    const job = await api("POST", `/prompts/${item.prompt_id}/retry`);
    merge({ ...item, job_id: job.job_id, state: job.state, error_kind: null, error_message: null });
  } catch (err) {
    if (!failed(err)) announce(`Could not retry: ${err.message}`);
  }
  sync().catch(failed);
}

function continueThread(item) {
  $("parent-row").hidden = false;
  $("parent-row").dataset.parentId = item.response_id || item.prompt_id;
  $("parent-label").textContent = short(item.text, 50);
  $("text").focus();
}

function clearParent() {
  $("parent-row").hidden = true;
  delete $("parent-row").dataset.parentId;
}

// NOTE: the submission in flight, or the last one that got no answer: sending the same text again
// reuses its Idempotency-Key, so a click repeated after a timeout never makes a second prompt.
let draft = null;
let sending = false;

function newKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return `mission-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

function setSending(on) {
  sending = on;
  const button = $("compose").querySelector("button[type=submit]");
  button.disabled = on;
  button.textContent = on ? "Sending…" : "Send";
}

async function submit(event) {
  event.preventDefault();
  if (sending) return;
  const text = $("text").value;
  if (!text.trim()) return;
  const body = { text };
  const parent = $("parent-row").dataset.parentId;
  if (parent) body.parent_id = parent;
  if (!draft || draft.text !== text || draft.parent !== parent) draft = { text, parent, key: newKey() };
  $("compose-error").textContent = "";
  setSending(true);
  try {
    const done = await api("POST", "/prompt", { body, headers: { "Idempotency-Key": draft.key } });
    draft = null;
    $("text").value = "";
    clearParent();
    if (!items.has(done.prompt_id)) {
      merge({ prompt_id: done.prompt_id, job_id: done.job_id, state: done.state, text,
              parent_id: parent || null, created_at: new Date().toISOString() });
    }
    announce(`Sent: “${short(text, 40)}” is queued.`);
    sync().catch(failed);
  } catch (err) {
    if (failed(err)) return;
    $("compose-error").textContent = err.name === "TimeoutError"
      ? "No answer from the server yet: send again (it will not be sent twice)."
      : `Not sent: ${err.message}`;
  } finally {
    setSending(false);
  }
}

// ---- start ----------------------------------------------------------------------------------

async function begin() {
  $("app").hidden = false;
  $("text").focus();
  setConnection("connecting");
  try {
    await loadSnapshot();
  } catch (err) {
    if (failed(err)) return;
  }
  openStream();
  watchServer();
  details.fromAddress();
}

setupFilters(() => {
  for (const [promptId, li] of drops) li.hidden = !shows(items.get(promptId));
});
$("compose").addEventListener("submit", submit);
$("text").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("compose").requestSubmit();
});
$("parent-clear").addEventListener("click", clearParent);
$("older").addEventListener("click", loadOlder);
$("thread-close").addEventListener("click", () => thread.close());
$("detail-close").addEventListener("click", () => details.close());
window.addEventListener("hashchange", () => details.fromAddress());
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") { thread.close(); details.close(); }
});
setupSession(begin);
