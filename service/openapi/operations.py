"""Every route of the API, declared once: what is its own (summary, answers, the parameters and
body it takes); the rest of each operation is generated (`build.py`)."""

from __future__ import annotations

import json

from jobqueue.core.settings import KEY_TTL_SECONDS, Settings
from jobqueue.engine.enqueue import QUEUE_FULL_RETRY_AFTER
from service.auth import API_PREFIX
from service.contract import (
    ACCESS_TOKEN,
    CURSOR,
    IDEMPOTENCY_KEY,
    JOBS_CURSOR,
    JOBS_LIMIT,
    LAST_EVENT_ID,
    LAST_EVENT_ID_HEADER,
    MAX_BATCH,
    NO_BODY,
    PREFER,
    RECENT_LIMIT,
    SCOPE,
    SINCE,
    SNAPSHOT_BEFORE,
    SNAPSHOT_LIMIT,
    prompt_batch_body,
    prompt_body,
)
from service.openapi.build import Answer, Body, Operation
from service.openapi.components import (
    AT,
    EVENT_EXAMPLE,
    EVENT_FRAME,
    EVENT_SCHEMA,
    JOB_EXAMPLE,
)
from service.openapi.errors import LOCATION, REPLAYED, WAITED, error_answer, retry_after
from service.openapi.ops import ops_operations

__all__ = ["OPENAPI_PATH", "operations"]

OPENAPI_PATH = f"{API_PREFIX}/openapi.json"

_API = API_PREFIX
_NO_BODY = Body(NO_BODY, {}, required=False)

_JOB_LINKS = {"GetJob": ("getJob", "job_id", "id"),
              "GetPrompt": ("getPrompt", "prompt_id", "prompt_id"),
              "RetryPrompt": ("retryPrompt", "prompt_id", "prompt_id")}
_SUBMITTED_LINKS = {"GetJob": ("getJob", "job_id", "job_id"),
                    "CancelJob": ("cancelJob", "job_id", "job_id"),
                    "GetPrompt": ("getPrompt", "prompt_id", "prompt_id"),
                    "RetryPrompt": ("retryPrompt", "prompt_id", "prompt_id"),
                    "FollowUp": ("submitPrompt", "parent_id", "prompt_id")}
_RETRIED_LINKS = {"GetJob": ("getJob", "job_id", "job_id"),
                  "CancelJob": ("cancelJob", "job_id", "job_id"),
                  "GetPrompt": ("getPrompt", "prompt_id", "prompt_id")}
_QUEUE_FULL = retry_after(f"Seconds to wait ({QUEUE_FULL_RETRY_AFTER}).")
_BUDGET_OR_FULL = retry_after(f"Seconds to wait: {QUEUE_FULL_RETRY_AFTER} for a full queue, "
                              "until the budget resets for a spent one.")
_CANCELLED = {**JOB_EXAMPLE, "state": "cancelled", "response_id": None}



def _turn() -> dict[str, dict[str, object]]:
    """The 429 of a route that takes its token's turn (service/turns.py, docs/limits.md)."""
    return {"429": error_answer(
        "429", "This token's reads already wait SA_TOKEN_READ_QUEUE deep in this web process, or "
               "this one waited SA_TOKEN_READ_WAIT for its turn: its page reads and sign-ins "
               "run one at a time, each followed by a rest (SA_TOKEN_READ_SHARE).")}

def _health() -> list[Operation]:
    return [
        Operation("get", "/healthz", "health", "Liveness: the process answers.",
                  {"200": Answer("Alive.", "Health")}, public=True),
        Operation("get", "/readyz", "ready", "Readiness: the database answers.",
                  {"200": Answer("Ready.", "Health", {"ok": True, "database": "up"})},
                  errors=("503",), public=True),
        Operation("get", "/metrics", "metrics", "Prometheus metrics (text exposition format).",
                  {"200": Answer("The metrics page.", {"type": "string"},
                                 "# TYPE sa_jobs_enqueued_total counter\n"
                                 "sa_jobs_enqueued_total 12.0\n", media="text/plain")},
                  public=True),
        Operation("get", OPENAPI_PATH, "openapi", "This document.",
                  {"200": Answer("The OpenAPI document.", {"type": "object"},
                                 {"openapi": "3.1.0", "info": {"title": "sa-core", "version": "1"}})},
                  public=True),
    ]


def _submits(settings: Settings) -> list[Operation]:
    max_chars = settings.max_prompt_chars
    return [
        Operation(
            "post", f"{_API}/prompt", "submitPrompt",
            "Submit a prompt: 202 at once, a worker runs it.",
            {"200": Answer("Finished within `Prefer: wait=N` seconds: the job (in a terminal "
                           "state) and its response's text, whole.", "JobWithResponse",
                           headers={**LOCATION, **REPLAYED, **WAITED}),
             "202": Answer("Queued (or replayed).", "Submitted",
                           headers={**LOCATION, **REPLAYED, **WAITED}, links=_SUBMITTED_LINKS)},
            description=(
                "Writes the prompt and a queued job atomically. With an `Idempotency-Key`, a "
                f"repeat of the same request by the same user within {KEY_TTL_SECONDS // 3600} h "
                "answers the original ids (with `Idempotent-Replayed: true`) and queues nothing, "
                "even when the repeats race; the same key with a different request answers 422. "
                "When the caller's org already has SA_ORG_MAX_QUEUED jobs queued, it answers 429 "
                "and writes nothing. `Prefer: wait` holds the connection, so waits are capped per "
                "token (SA_WAIT_MAX_PER_TOKEN) and per web process (SA_WAIT_MAX): past a cap the "
                "prompt is accepted all the same and answered 202 at once, with "
                "`SA-Wait-Skipped: cap`."),
            params=(IDEMPOTENCY_KEY, PREFER),
            body=Body(prompt_body(max_chars), {"text": "Summarise the spec in one line.",
                                               "priority": 20, "max_attempts": 3,
                                               "options": {"depth": 4}}),
            answers_past_limits={"429": error_answer(
                "429", "The org's queue is full (SA_ORG_MAX_QUEUED), or the org has spent its "
                       "budget (SA_ORG_BUDGET_DAILY / _MONTHLY: the description says spent, "
                       "budget and when it resets); nothing was written. A repeat of an accepted "
                       "`Idempotency-Key` is replayed, never refused.", _BUDGET_OR_FULL)}),
        Operation(
            "post", f"{_API}/prompts/batch", "submitBatch",
            f"Submit 1 to {MAX_BATCH} prompts at once: all or none, 202 at once.",
            {"202": Answer("Queued (or replayed), in input order.", "BatchSubmitted",
                           headers=REPLAYED)},
            description=(
                "Each item takes POST /prompt's fields; `priority` defaults to background (80). "
                "Every item is validated first: a 422 names each bad one by index "
                "(`prompts[3].text: ...`) and writes nothing. One `Idempotency-Key` covers the "
                "batch: a repeat answers the original ids with `Idempotent-Replayed: true`. "
                "The whole batch must fit under SA_ORG_MAX_QUEUED, else 429 and nothing written. "
                "The body may be at most SA_BATCH_MAX_BYTES (413)."),
            params=(IDEMPOTENCY_KEY,),
            body=Body(prompt_batch_body(max_chars), {"prompts": [
                {"text": "Summarise chapter 1."},
                {"text": "Summarise chapter 2.", "delay_seconds": 60}]}),
            answers_past_limits={
                "413": error_answer("413", "The body is larger than SA_BATCH_MAX_BYTES (default "
                                           "4 MiB)."),
                "429": error_answer("429", "The batch would take the org past "
                                           "SA_ORG_MAX_QUEUED, or the org has spent its budget "
                                           "(SA_ORG_BUDGET_DAILY / _MONTHLY); nothing was "
                                           "written. A repeat of an accepted `Idempotency-Key` "
                                           "is replayed, never refused.", _BUDGET_OR_FULL)}),
    ]


def _jobs_and_prompts() -> list[Operation]:
    return [
        Operation("get", f"{_API}/jobs/{{job_id}}", "getJob", "One job.",
                  {"200": Answer("The job.", "Job", links=_JOB_LINKS)},
                  answers_past_limits=_turn()),
        Operation("post", f"{_API}/jobs/{{job_id}}/cancel", "cancelJob",
                  "Cancel a queued or running job.",
                  {"200": Answer("The cancelled job.", "Job", {
                      **{k: v for k, v in _CANCELLED.items() if k not in ("usage", "partial_text")},
                      "error_message": "cancelled by user 7"}, links=_JOB_LINKS)},
                  body=_NO_BODY, errors=("409",)),
        Operation("get", f"{_API}/prompts/{{prompt_id}}", "getPrompt",
                  "A prompt, its response (if any), a page of its jobs.",
                  {"200": Answer("The prompt.", "PromptView", links={
                      "RetryPrompt": ("retryPrompt", "prompt_id", "prompt/id"),
                      "FollowUp": ("submitPrompt", "parent_id", "prompt/id")})},
                  description=(
                      "The prompt and its response whole, with its jobs newest first, a page at "
                      "a time: at most `limit` (default 20, at most 100), fewer once their "
                      "options and error messages pass SA_PAGE_MAX_BYTES. Pass `next_cursor` "
                      "back as `cursor` for the older ones."),
                  params=(JOBS_CURSOR, JOBS_LIMIT), answers_past_limits=_turn()),
        Operation("get", f"{_API}/responses/{{response_id}}", "getResponse",
                  "A response, its text whole.",
                  {"200": Answer("The response.", "Entity")},
                  description=(
                      "The feeds (SSE events, /mission/recent) carry at most "
                      "SA_FEED_TEXT_MAX_CHARS characters of an answer, with `response_truncated`; "
                      "this route has it whole."), answers_past_limits=_turn()),
        Operation("post", f"{_API}/prompts/{{prompt_id}}/retry", "retryPrompt",
                  "Queue a new job superseding the prompt's latest (finished) job.",
                  {"202": Answer("The new job.", "Retried", headers=LOCATION,
                                 links=_RETRIED_LINKS)},
                  body=_NO_BODY, errors=("409",)),
    ]


def _session_and_ops() -> list[Operation]:
    return [
        Operation(
            "post", f"{_API}/session", "openSession",
            "Open the mission page's session: 201 and an HttpOnly cookie.",
            {"201": Answer("The session is open.", "Session",
                           {"org_id": 1, "user_id": 7, "scopes": [], "expires_at": AT})},
            description=(
                "Takes the token from the Authorization header (never a cookie) and sets "
                "`sa_session` (HttpOnly, SameSite=Strict, Path=/sa-core/v1, at most 8 h and "
                "never past the token's expiry). The cookie then authenticates same-origin "
                "requests without a header; writes also need `X-SA-Session: 1`. A token keeps "
                "at most SA_SESSIONS_PER_TOKEN sessions: opening one more ends its oldest."),
            body=_NO_BODY, errors=("403",), answers_past_limits=_turn()),
        Operation("get", f"{_API}/session", "getSession", "Whom the request acts for.",
                  {"200": Answer("The caller.", "Session")}, errors=("403",)),
        Operation("delete", f"{_API}/session", "closeSession",
                  "End the cookie's session at once and drop the cookie.",
                  {"204": Answer("Signed out.")}, errors=("403",)),
        Operation("get", f"{_API}/usage", "getOrgBudget",
                  "What the caller's org spent today and this month, against its budgets.",
                  {"200": Answer("The org's spend and budgets.", "OrgBudget")},
                  description=(
                      "USD at the model routes' configured `prices`, summed per UTC day as "
                      "calls finish. Past SA_ORG_BUDGET_DAILY or SA_ORG_BUDGET_MONTHLY, submits "
                      "answer 429 (with Retry-After: the seconds until the budget resets) and "
                      "queued jobs wait, unclaimed, until it does."), answers_past_limits=_turn()),
        Operation("get", f"{_API}/ops/overview", "opsOverview",
                  "Every org's queue depth, oldest queued, running jobs and recent failures.",
                  {"200": Answer("The overview.", "OpsOverview")},
                  description="Needs a token with the `ops` or `ops:read` scope "
                              "(`sa-core create-token --scope ops:read`)."),
        Operation("post", f"{_API}/ops/jobs/{{job_id}}/cancel", "opsCancelJob",
                  "Cancel any org's queued or running job.",
                  {"200": Answer("The cancelled job.", "Job", {
                      **_CANCELLED, "error_message": "cancelled by operator user 7 of org 1"})},
                  description="Needs the `ops` scope.", body=_NO_BODY, errors=("409",)),
        Operation("post", f"{_API}/ops/jobs/{{job_id}}/retry", "opsRetryJob",
                  "Queue a new job superseding any org's finished job.",
                  {"202": Answer("The new job.", "Retried")},
                  description="Needs the `ops` scope.", body=_NO_BODY, errors=("409",)),
    ]


def _feeds() -> list[Operation]:
    return [
        Operation(
            "get", f"{_API}/mission/recent", "missionRecent",
            "The viewer's prompts whose jobs changed, a page at a time.",
            {"200": Answer("A page of changes.", "MissionRecent", links={
                "FollowUp": ("submitPrompt", "parent_id", "items/0/prompt_id"),
                "GetPrompt": ("getPrompt", "prompt_id", "items/0/prompt_id"),
                "GetJob": ("getJob", "job_id", "items/0/job_id")})},
            description=(
                "Pages the same event log as /mission/events: a page is the viewer's next "
                "`limit` transitions (heartbeats are none), collapsed to their prompts' latest "
                "state. Following `next_cursor` misses nothing, even a transaction that commits "
                "late, and repeats a prompt only when it changed again. Texts come cut to "
                "SA_FEED_TEXT_MAX_CHARS characters (`text_truncated`, `response_truncated`), and a "
                "page ends early, with `has_more`, once its texts pass SA_PAGE_MAX_BYTES."),
            params=(CURSOR, SINCE, RECENT_LIMIT, SCOPE), answers_past_limits=_turn()),
        Operation(
            "get", f"{_API}/mission/prompts", "missionPrompts",
            "The viewer's prompts with their latest state, latest activity first.",
            {"200": Answer("A page of prompts.", "MissionSnapshot", links={
                "GetPrompt": ("getPrompt", "prompt_id", "items/0/prompt_id"),
                "GetJob": ("getJob", "job_id", "items/0/job_id")})},
            description=(
                "A first load: the present state of the viewer's prompts without their "
                "history. The items hold for `event_id`: /mission/events?last_event_id=N "
                "continues from it with no gap. A page walks at most 5,000 events; older "
                "prompts come with `before`. Texts are cut as in /mission/recent, and a page "
                "ends early, with `has_more`, once its texts pass SA_PAGE_MAX_BYTES."),
            params=(SNAPSHOT_BEFORE, SNAPSHOT_LIMIT, SCOPE), answers_past_limits=_turn()),
        Operation(
            "get", f"{_API}/mission/events", "missionEvents",
            "Server-Sent Events of the caller's own jobs' transitions.",
            {"200": Answer("The event stream.", EVENT_FRAME,
                           "retry: 2000\n\nid: 42\nevent: job.state_changed\ndata: "
                           + json.dumps(EVENT_EXAMPLE) + "\n\n", media="text/event-stream")},
            description=(
                "`event: job.state_changed`, `id:` the event id, `data:` JSON (the "
                f"`{EVENT_SCHEMA}` schema). Resumes after `Last-Event-ID`; a replay sends at "
                "most SA_SSE_REPLAY_LIMIT events, then the stream ends and the EventSource "
                "reconnects (after `retry:`) with the last id it got, for the next part. The "
                "replay is read a page at a time (at most 500 events, and SA_PAGE_MAX_BYTES of "
                "texts), the next one only once the client has read the last. An answer travels "
                "cut to SA_FEED_TEXT_MAX_CHARS characters (`response_truncated`; GET "
                "/responses/{response_id} has it whole). A stream that leaves more than 1,000 "
                "events or 4 MiB unread is closed (it resumes with Last-Event-ID). The "
                "stream ends when its token is revoked or expires (within SA_SSE_TOKEN_CHECK "
                "seconds) and at shutdown; otherwise never."),
            params=(LAST_EVENT_ID_HEADER, LAST_EVENT_ID, SCOPE, ACCESS_TOKEN),
            answers_past_limits={"429": error_answer(
                "429", "The token already has SA_SSE_MAX_STREAMS_PER_TOKEN streams open on this "
                       "process, or the process SA_SSE_MAX_STREAMS.")}),
    ]


def operations(settings: Settings) -> list[Operation]:
    """Every operation of the app built with `settings` (limits come from there)."""
    return [*_health(), *_submits(settings), *_jobs_and_prompts(), *_session_and_ops(),
            *ops_operations(), *_feeds()]
