"""The answers' schemas (the components no request declaration yields) and their examples.

The state and error-kind enums come from `JobState` and `ErrorKind`; the request components
(`PromptRequest`, `ExecutionOptions`, ...) are generated from the contract by `build.py`.
"""

from __future__ import annotations

from typing import Any

from jobqueue.core.policy import ErrorKind
from jobqueue.core.settings import Settings
from jobqueue.core.states import JobState
from service.contract import (
    CURSOR_PATTERN,
    EVENT_ID_PATTERN,
    JOBS_CURSOR_PATTERN,
    JOBS_LIMIT_MAX,
    MAX_BATCH,
)
from service.events.stream import DELTA_EVENT_NAME, EVENT_NAME

__all__ = [
    "AT",
    "DELTA_SCHEMA",
    "EVENT_EXAMPLE",
    "EVENT_FRAME",
    "EVENT_SCHEMA",
    "EXAMPLES",
    "JOB_EXAMPLE",
    "JOB_ID",
    "OLD_JOB_ID",
    "PROMPT_ID",
    "QUEUED",
    "RESPONSE_ID",
    "Schema",
    "answer_schemas",
    "ref",
]

Schema = dict[str, Any]

EVENT_SCHEMA = "JobStateChanged"
"""The component that each SSE `job.state_changed` event's `data:` conforms to."""

DELTA_SCHEMA = "OutputDelta"
"""The component that each SSE `job.output_delta` event's `data:` conforms to."""

JOB_STATES = [state.value for state in JobState]
ERROR_KINDS = [kind.value for kind in ErrorKind]

JOB_ID = "3f1c8d2e-5b7a-4c19-9e2f-0a6d4b8c7e51"
PROMPT_ID = "9b2e4f6a-1c3d-4e5f-8a7b-6c5d4e3f2a10"
RESPONSE_ID = "c4d5e6f7-a8b9-4c0d-8e1f-2a3b4c5d6e7f"
OLD_JOB_ID = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9"
AT = "2026-11-30T12:00:00.123456+00:00"

JOB_EXAMPLE: Schema = {
    "id": JOB_ID, "prompt_id": PROMPT_ID, "state": "succeeded", "priority": 50, "attempt": 1,
    "max_attempts": 3, "execution_options": {"depth": 4}, "worker_claim": None,
    "claimed_at": "2026-11-30T12:00:00.010000+00:00",
    "started_at": "2026-11-30T12:00:00.010000+00:00",
    "running_heartbeat_at": "2026-11-30T12:00:00.010000+00:00", "finished_at": AT,
    "response_id": RESPONSE_ID, "error_kind": None, "error_message": None, "supersedes": None,
    "org_id": 1, "created_by": 7, "scheduled_for": "2026-11-30T12:00:00+00:00",
    "created_at": "2026-11-30T12:00:00+00:00", "updated_at": AT,
    "usage": [{"attempt": 1, "tokens_in": 12, "tokens_out": 48, "route": "default",
               "cost": 0.00051}], "partial_text": None,
}
PROMPT_EXAMPLE: Schema = {
    "id": PROMPT_ID, "kind": "prompt", "parent_id": None, "correlation_id": PROMPT_ID,
    "causation_id": None, "content": "Summarise the spec in one line.", "source_refs": [],
    "truth_class": None, "state_class": None, "created_by": 7,
    "created_at": "2026-11-30T12:00:00+00:00", "updated_at": "2026-11-30T12:00:00+00:00",
}
EVENT_EXAMPLE: Schema = {
    "id": 42, "job_id": JOB_ID, "prompt_id": PROMPT_ID, "created_by": 7,
    "from_state": "running", "to_state": "succeeded", "attempt": 1, "error_kind": None,
    "response_id": RESPONSE_ID, "at": AT, "response_text": "The spec, in one line.",
    "response_truncated": False,
}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


_UUID: Schema = {"type": "string", "format": "uuid"}
_TIME: Schema = {"type": "string", "format": "date-time"}


EVENT_FRAME: Schema = {
    "description": "Each event of the stream (Open API 3.1 reads a text/event-stream schema as "
                   "one event's). `retry:`, lone `id:` and `: keepalive` frames dispatch none. "
                   "A `job.output_delta` has no `id:`: it is not in the log and is not replayed.",
    "oneOf": [{
        "type": "object",
        "required": ["event", "id", "data"],
        "additionalProperties": False,
        "properties": {
            "event": {"type": "string", "const": EVENT_NAME},
            "id": {"type": "string", "pattern": EVENT_ID_PATTERN},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": ref(EVENT_SCHEMA)},
        },
    }, {
        "type": "object",
        "required": ["event", "data"],
        "additionalProperties": False,
        "properties": {
            "event": {"type": "string", "const": DELTA_EVENT_NAME},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": ref(DELTA_SCHEMA)},
        },
    }],
}


def _feed_text(chars: int, what: str) -> Schema:
    return {"type": "string", "maxLength": chars,
            "description": f"{what}, cut to its first {chars} characters (SA_FEED_TEXT_MAX_CHARS) "
                           "when longer, as the matching `*_truncated` says."}


def answer_schemas(settings: Settings) -> dict[str, Schema]:
    """The answers' schemas for the app built with `settings` (the feeds' text bound)."""
    chars = settings.feed_text_max_chars
    return {
        "Error": {
            "type": "object",
            "description": "Every error: a short title and a sentence that says what to fix.",
            "required": ["title", "description"],
            "properties": {"title": {"type": "string"}, "description": {"type": "string"}},
            "additionalProperties": False,
        },
        "BatchSubmitted": {
            "type": "object",
            "required": ["items"],
            "additionalProperties": False,
            "properties": {"items": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH,
                                     "items": ref("Submitted"),
                                     "description": "One per prompt, in input order."}},
        },
        "Submitted": {
            "type": "object",
            "required": ["prompt_id", "job_id", "state"],
            "additionalProperties": False,
            "properties": {"prompt_id": _UUID, "job_id": _UUID,
                           "state": {"type": "string", "const": JobState.QUEUED.value}},
        },
        "Session": {
            "type": "object",
            "description": "Whom the request acts for; `expires_at` when a session was opened.",
            "required": ["org_id", "user_id", "scopes"],
            "properties": {"org_id": {"type": "integer"}, "user_id": {"type": "integer"},
                           "scopes": {"type": "array", "items": {"type": "string",
                                                                 "enum": ["ops"]}},
                           "expires_at": _TIME},
        },
        "OrgBudget": {
            "type": "object",
            "description": "What the caller's org spent on provider calls (USD at the routes' "
                           "`prices`) this UTC day and month, against SA_ORG_BUDGET_DAILY and "
                           "SA_ORG_BUDGET_MONTHLY (`budget` null: none), and when each resets. "
                           "`exceeded` names the budget spent, if any: submits answer 429 and "
                           "queued jobs wait until it resets.",
            "required": ["org_id", "daily", "monthly", "exceeded"],
            "additionalProperties": False,
            "properties": {"org_id": {"type": "integer"},
                           **{period: {"type": "object", "required": ["spent", "budget",
                                                                      "resets_at"],
                                       "additionalProperties": False,
                                       "properties": {"spent": {"type": "number", "minimum": 0},
                                                      "budget": _nullable({"type": "number"}),
                                                      "resets_at": _TIME}}
                              for period in ("daily", "monthly")},
                           "exceeded": _nullable({"type": "string", "enum": [
                               "SA_ORG_BUDGET_DAILY", "SA_ORG_BUDGET_MONTHLY"]})},
        },
        "OpsOverview": {
            "type": "object",
            "description": "Every org's queue: `metrics` as `sa-core queue-metrics --json` over the "
                           "last hour, `running` and `failures` as `sa-core list-jobs --json`.",
            "required": ["as_of", "metrics", "running", "failures"],
            "properties": {"as_of": _TIME, "metrics": {"type": "object"},
                           "running": {"type": "array", "items": {"type": "object"}},
                           "failures": {"type": "array", "items": {"type": "object"}}},
        },
        "Retried": {
            "type": "object",
            "required": ["prompt_id", "job_id", "state", "supersedes"],
            "additionalProperties": False,
            "properties": {"prompt_id": _UUID, "job_id": _UUID,
                           "state": {"type": "string", "const": JobState.QUEUED.value},
                           "supersedes": _UUID},
        },
        "Job": {
            "type": "object",
            "description": "One execution attempt series of a prompt (every column of sa_job).",
            "required": ["id", "prompt_id", "state", "priority", "attempt", "max_attempts",
                         "execution_options", "org_id", "created_by", "scheduled_for",
                         "created_at", "updated_at"],
            "properties": {
                "id": _UUID, "prompt_id": _UUID,
                "state": {"type": "string", "enum": JOB_STATES},
                "priority": {"type": "integer", "minimum": 0, "maximum": 100},
                "attempt": {"type": "integer", "minimum": 1},
                "max_attempts": {"type": "integer", "minimum": 1},
                "execution_options": {"type": "object"},
                "worker_claim": _nullable({"type": "string"}),
                "claimed_at": _nullable(_TIME), "started_at": _nullable(_TIME),
                "running_heartbeat_at": _nullable(_TIME), "finished_at": _nullable(_TIME),
                "response_id": _nullable(_UUID),
                "error_kind": _nullable({"type": "string", "enum": ERROR_KINDS}),
                "error_message": _nullable({"type": "string"}),
                "supersedes": _nullable(_UUID),
                "org_id": {"type": "integer"}, "created_by": {"type": "integer"},
                "scheduled_for": _TIME, "created_at": _TIME, "updated_at": _TIME,
                "partial_text": _nullable({
                    "type": "string", "description": "While a streamed attempt runs, the text "
                    "it has produced so far (rewritten every SA_STREAM_INTERVAL); null otherwise. "
                    "Never a response: only a succeeded attempt's text becomes one. On GET."}),
                "usage": {
                    "type": "array", "description": "Each attempt that called the provider, "
                    "oldest first: its outcome, model, HTTP status, latency and when it ended, its "
                    "tokens (null where the provider reported none), the model route that served "
                    "it and its cost in USD at that route's configured `prices` (null: no price, "
                    "or no tokens reported); on GET.",
                    "items": {"type": "object", "required": ["attempt", "tokens_in", "tokens_out",
                                                             "route", "cost", "outcome", "model",
                                                             "http_status", "latency_ms", "at"],
                              "additionalProperties": False,
                              "properties": {"attempt": {"type": "integer", "minimum": 1},
                                             "tokens_in": _nullable({"type": "integer"}),
                                             "tokens_out": _nullable({"type": "integer"}),
                                             "route": _nullable({"type": "string"}),
                                             "cost": _nullable({"type": "number",
                                                                "minimum": 0}),
                                             "outcome": {"type": "string", "description":
                                                         "`succeeded`, or the error kind"},
                                             "model": {"type": "string"},
                                             "http_status": _nullable({"type": "integer"}),
                                             "latency_ms": {"type": "integer"},
                                             "at": _TIME}}},
                "after_job_id": _nullable(_UUID),
                "waiting": {"type": "boolean", "description": "True while the job waits for "
                            "its predecessor (`after_job_id`) to succeed: queued, but not "
                            "claimable until then; on GET."},
            },
        },
        "JobWithResponse": {
            "allOf": [ref("Job")],
            "type": "object",
            "description": "A finished job with its response's text (null unless it succeeded).",
            "required": ["response_text"],
            "properties": {"response_text": _nullable({"type": "string"})},
        },
        "Entity": {
            "type": "object",
            "description": "A prompt or a response.",
            "required": ["id", "kind", "content", "correlation_id", "created_by", "created_at"],
            "properties": {
                "id": _UUID, "kind": {"type": "string", "enum": ["prompt", "response"]},
                "parent_id": _nullable(_UUID), "correlation_id": _UUID,
                "causation_id": _nullable(_UUID), "content": {"type": "string"},
                "source_refs": {}, "truth_class": _nullable({"type": "string"}),
                "state_class": _nullable({"type": "string"}),
                "created_by": {"type": "integer"}, "created_at": _TIME, "updated_at": _TIME,
            },
        },
        "PromptView": {
            "type": "object",
            "required": ["prompt", "response", "jobs", "next_cursor", "has_more"],
            "properties": {
                "prompt": ref("Entity"),
                "response": {**_nullable(ref("Entity")),
                             "description": "The response of the newest job that has one, whole."},
                "jobs": {"type": "array", "items": ref("Job"), "maxItems": JOBS_LIMIT_MAX,
                         "description": "A page of the prompt's jobs, newest first: at most "
                                        "`limit`, fewer once their options and error messages pass "
                                        "SA_PAGE_MAX_BYTES (the first always comes)."},
                "next_cursor": _nullable({
                    "type": "string", "pattern": JOBS_CURSOR_PATTERN,
                    "description": "Pass it back as `cursor` for the older jobs; null when none "
                                   "remain."}),
                "has_more": {"type": "boolean", "description": "Older jobs remain."},
            },
        },
        "MissionItem": {
            "type": "object",
            "description": "A prompt whose jobs changed, with its latest job.",
            "required": ["prompt_id", "text", "job_id", "state", "updated_at", "held"],
            "properties": {
                "prompt_id": _UUID, "parent_id": _nullable(_UUID),
                "text": _feed_text(chars, "The prompt's text"),
                "text_truncated": {"type": "boolean", "description": "`text` was cut: GET "
                                   "/prompts/{prompt_id} has it whole."},
                "created_at": _TIME, "job_id": _UUID,
                "state": {"type": "string", "enum": JOB_STATES},
                "attempt": {"type": "integer"}, "max_attempts": {"type": "integer"},
                "priority": {"type": "integer"},
                "error_kind": _nullable({"type": "string", "enum": ERROR_KINDS}),
                "error_message": _nullable({"type": "string"}),
                "response_id": _nullable(_UUID), "updated_at": _TIME,
                "scheduled_for": {**_TIME, "description": "When the latest job may run "
                                  "(a scheduled prompt, or a retry's backoff)."},
                "after_job_id": {**_nullable(_UUID), "description": "The job it runs after "
                                 "(`after`)."},
                "waiting": {"type": "boolean", "description": "It waits for `after_job_id` to "
                            "succeed."},
                "held": _nullable({"type": "string", "enum": ["running_cap", "budget"],
                                   "description": "Due and queued, it waits for its org: for a "
                                   "free place under SA_ORG_MAX_RUNNING, or for its spent budget "
                                   "to reset (null otherwise)."}),
                "response_text": _nullable(_feed_text(chars, "The latest job's answer")),
                "response_truncated": {"type": "boolean", "description": "`response_text` was "
                                       "cut: GET /responses/{response_id} has it whole."},
            },
        },
        "MissionSnapshot": {
            "type": "object",
            "required": ["as_of", "event_id", "cursor", "items", "next_before", "has_more"],
            "additionalProperties": False,
            "properties": {
                "as_of": {**_TIME, "description": "When the page was read."},
                "event_id": _nullable({"type": "integer", "minimum": 0, "description": (
                    "The log position the items hold for: follow the changes after it with "
                    "/mission/events?last_event_id=N. Null (with no item) while the event hub "
                    "starts: ask again.")}),
                "cursor": _nullable({"type": "string", "pattern": CURSOR_PATTERN,
                                     "description": "The same position as a /mission/recent "
                                                    "`cursor`: polls the changes after it."}),
                "items": {"type": "array", "items": ref("MissionItem"),
                          "description": "Prompts with their latest job, the one with the "
                                         "newest event first."},
                "next_before": _nullable({"type": "string", "pattern": CURSOR_PATTERN,
                                          "description": "Pass it back as `before` for older "
                                                         "prompts."}),
                "has_more": {"type": "boolean", "description": "Older prompts (or this page's "
                             "rest, past SA_PAGE_MAX_BYTES) remain: ask with `before`."},
            },
        },
        "MissionRecent": {
            "type": "object",
            "required": ["as_of", "items", "next_cursor", "has_more"],
            "additionalProperties": False,
            "properties": {
                "as_of": {**_TIME, "description": "When the page was read. Continue with "
                                                  "`next_cursor`; `since` only starts a feed."},
                "items": {"type": "array", "items": ref("MissionItem"),
                          "description": "Each prompt with an event in the page, once, with "
                                         "its latest job, in the order of its last event."},
                "next_cursor": {"type": "string", "pattern": CURSOR_PATTERN,
                                "description": "Pass it back as `cursor`: the next page starts "
                                               "exactly where this one ended."},
                "has_more": {"type": "boolean",
                             "description": "The page was full (`limit` transitions, or texts "
                                            "past SA_PAGE_MAX_BYTES): ask again at once for the "
                                            "rest."},
            },
        },
        EVENT_SCHEMA: {
            "type": "object",
            "description": "The `data:` of an SSE `job.state_changed` event: one transition of "
                           "a job (`from_state` null when the job was created).",
            "required": ["id", "job_id", "prompt_id", "created_by", "from_state", "to_state",
                         "attempt", "error_kind", "response_id", "at", "response_text",
                         "response_truncated"],
            "additionalProperties": False,
            "properties": {
                "id": {"type": "integer", "minimum": 1,
                       "description": "The event id, also the frame's `id:`."},
                "job_id": _UUID, "prompt_id": _UUID,
                "created_by": {"type": "integer",
                               "description": "The job's creator (tells an org-wide stream "
                                              "whose job moved)."},
                "from_state": _nullable({"type": "string", "enum": JOB_STATES}),
                "to_state": {"type": "string", "enum": JOB_STATES},
                "attempt": {"type": "integer", "minimum": 1},
                "error_kind": _nullable({"type": "string", "enum": ERROR_KINDS}),
                "response_id": _nullable(_UUID),
                "at": _TIME,
                "response_text": _nullable(_feed_text(
                    chars, "The answer, on the event to `succeeded` (null on every other)")),
                "response_truncated": {"type": "boolean", "description": "`response_text` was "
                                       "cut: GET /responses/{response_id} has it whole."},
            },
        },
        DELTA_SCHEMA: {
            "type": "object",
            "description": "The `data:` of an SSE `job.output_delta` event: text a streamed "
                           "attempt appended (coalesced every SA_STREAM_INTERVAL). `offset` 0 "
                           "starts an attempt: a retry's text starts over. Partial text never "
                           "becomes a response unless its attempt succeeds. A delta holds at most "
                           "SA_FEED_TEXT_MAX_CHARS characters: an `offset` past the text a client "
                           "has means it missed some, and GET /jobs/{job_id} has the attempt's "
                           "whole `partial_text`.",
            "required": ["job_id", "prompt_id", "attempt", "offset", "text"],
            "additionalProperties": False,
            "properties": {
                "job_id": _UUID, "prompt_id": _UUID,
                "attempt": {"type": "integer", "minimum": 1},
                "offset": {"type": "integer", "minimum": 0,
                           "description": "Characters of the attempt's text before `text`."},
                "text": {"type": "string", "maxLength": chars},
            },
        },
        "Health": {
            "type": "object", "required": ["ok"],
            "properties": {"ok": {"type": "boolean"}, "database": {"type": "string"}},
        },
    }

QUEUED: Schema = {"prompt_id": PROMPT_ID, "job_id": JOB_ID, "state": JobState.QUEUED.value}

EXAMPLES: dict[str, Any] = {
    "Job": JOB_EXAMPLE,
    "JobWithResponse": {**JOB_EXAMPLE, "response_text": "One queue, many workers."},
    "Submitted": QUEUED,
    "BatchSubmitted": {"items": [QUEUED]},
    "Retried": {**QUEUED, "supersedes": OLD_JOB_ID},
    "PromptView": {
        "prompt": PROMPT_EXAMPLE,
        "response": {**PROMPT_EXAMPLE, "id": RESPONSE_ID, "kind": "response",
                     "parent_id": PROMPT_ID, "causation_id": JOB_ID,
                     "content": "One queue, many workers, nothing lost."},
        "jobs": [JOB_EXAMPLE], "next_cursor": None, "has_more": False},
    "MissionRecent": {"as_of": AT, "next_cursor": "AAAAAAAAACo", "has_more": False, "items": [{
        "prompt_id": PROMPT_ID, "parent_id": None, "text": PROMPT_EXAMPLE["content"],
        "created_at": "2026-11-30T12:00:00+00:00", "job_id": JOB_ID, "state": "succeeded",
        "attempt": 1, "max_attempts": 3, "priority": 50, "error_kind": None,
        "error_message": None, "response_id": RESPONSE_ID, "updated_at": AT,
        "scheduled_for": "2026-11-30T12:00:00+00:00", "after_job_id": None, "waiting": False,
        "held": None,
        "response_text": "One queue, many workers, nothing lost.", "text_truncated": False,
        "response_truncated": False}]},
    "MissionSnapshot": {"as_of": AT, "event_id": 42, "cursor": "AAAAAAAAACo", "next_before": None,
                        "has_more": False,
                        "items": []},
    "Entity": {**PROMPT_EXAMPLE, "id": RESPONSE_ID, "kind": "response", "parent_id": PROMPT_ID,
               "causation_id": JOB_ID, "content": "One queue, many workers, nothing lost."},
    "Session": {"org_id": 1, "user_id": 7, "scopes": ["ops"]},
    "OpsOverview": {"as_of": AT, "metrics": {}, "running": [], "failures": []},
    "OrgBudget": {"org_id": 1,
                  "daily": {"spent": 0.42, "budget": 5.0, "resets_at": "2026-12-01T00:00:00Z"},
                  "monthly": {"spent": 12.5, "budget": None,
                              "resets_at": "2027-01-01T00:00:00Z"},
                  "exceeded": None},
    "Health": {"ok": True},
}
"""Each answer schema's example; an operation may give its own instead."""
