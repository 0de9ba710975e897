"""The operator console's routes (/ops/...), declared once for the OpenAPI document.

Their filter, bounds and bodies come from service/ops_contract.py, which also parses them.
"""

from __future__ import annotations

from service.auth import API_PREFIX
from service.openapi.build import Answer, Body, Operation
from service.openapi.components import AT, JOB_ID, PROMPT_ID, Schema
from service.ops_contract import (
    ACTIONS_BEFORE,
    ACTIONS_LIMIT,
    BULK_BODY,
    MAX_JOBS,
    OPS_BULK_MAX,
    OPS_FILTER_PARAMS,
    PAGE_CURSOR,
    PAGE_LIMIT,
    PAUSE_BODY,
    RESUME_BODY,
)
from service.schema import Fields

__all__ = ["ops_operations"]

_OPS = f"{API_PREFIX}/ops"
_READ = ("Needs a token with the `ops` or `ops:read` scope (`sa-core create-token --scope "
         "ops:read`).")
_ACT = "Needs the `ops` scope: an `ops:read` token is answered 403 and nothing changes."


def _object(required: list[str], properties: Schema | None = None) -> Schema:
    return {"type": "object", "required": required,
            "properties": properties or {name: {} for name in required}}


def _items(next_name: str) -> Schema:
    return _object(["items", next_name], {"items": {"type": "array", "items": {"type": "object"}},
                                          next_name: {}})


_JOB_ROW = {"id": JOB_ID, "prompt_id": PROMPT_ID, "state": "failed", "priority": 50,
            "attempt": 3, "max_attempts": 3, "worker_claim": None, "error_kind": "provider_4xx",
            "error_message": "provider answered 400", "org_id": 2, "created_by": 20,
            "model": None, "scheduled_for": AT, "created_at": AT, "updated_at": AT,
            "finished_at": AT, "text": "Summarise the spec in one line."}
_BULK = _object(["action_id", "changed", "batches", "job_ids"])


def _reads() -> list[Operation]:
    return [
        Operation("get", f"{_OPS}/jobs", "opsListJobs",
                  "Every org's jobs a filter reaches, newest first, a page at a time.",
                  {"200": Answer("A page of jobs.", _items("next_cursor"),
                                 {"items": [_JOB_ROW], "next_cursor": None})},
                  description=f"Texts come cut to 200 characters. {_READ}",
                  params=(*OPS_FILTER_PARAMS, PAGE_CURSOR, PAGE_LIMIT)),
        Operation("get", f"{_OPS}/jobs/count", "opsCountJobs",
                  "How many jobs a filter reaches, and how many a bulk cancel or retry would.",
                  {"200": Answer("The counts, each read up to `max` + 1.",
                                 _object(["jobs", "cancellable", "retryable", "max"]),
                                 {"jobs": 40, "cancellable": 37, "retryable": 3,
                                  "max": OPS_BULK_MAX})},
                  description=_READ, params=OPS_FILTER_PARAMS),
        Operation("get", f"{_OPS}/jobs/{{job_id}}", "opsGetJob",
                  "One job of any org, archived too, with every transition and provider call.",
                  {"200": Answer("As `sa-core job-details --json`.",
                                 _object(["job", "prompt", "response", "transitions",
                                          "provider_calls"]),
                                 {"job": {"id": JOB_ID, "state": "failed"}, "prompt": None,
                                  "response": None, "transitions": [], "provider_calls": []})},
                  description=_READ),
        Operation("get", f"{_OPS}/actions", "opsListActions",
                  "The operators' log: who did what to which jobs or routes, newest first.",
                  {"200": Answer("A page of the log.", _items("next_before"), {
                      "items": [{"id": 7, "at": AT, "finished_at": AT, "org_id": 1,
                                 "user_id": 7, "action": "bulk_cancel",
                                 "target": {"filter": {"states": ["queued"]}, "max_jobs": 2},
                                 "job_count": 2, "batches": 1, "job_ids": [JOB_ID]}],
                      "next_before": None})},
                  description=f"`job_ids` holds the first 20 ids; `job_count` counts all. {_READ}",
                  params=(ACTIONS_BEFORE, ACTIONS_LIMIT)),
        Operation("get", f"{_OPS}/routes", "opsListRoutes",
                  "Each model route: its limits, its pause and its current window's use.",
                  {"200": Answer("The routes.", _items("items"), {"items": [
                      {"name": "default", "configured": True, "models": ["*"], "rpm": 0,
                       "tpm": 0, "paused_until": None, "reason": None, "paused_seconds": 0.0,
                       "window_seconds": 60.0, "window_start": None, "requests": 0,
                       "tokens": 0}]})},
                  description=_READ),
        Operation("get", f"{_OPS}/workers", "opsListWorkers",
                  "The running workers, idle ones too: slots and those in use, last seen.",
                  {"200": Answer("The workers.", _items("items"), {"items": [
                      {"worker_id": "host-1:4242:0a1b2c3d4e5f", "host": "host-1", "slots": 16,
                       "slots_in_use": 2, "started_at": AT, "seen_at": AT,
                       "last_heartbeat": AT, "oldest_claim": AT, "orgs": [2]}]})},
                  description=("Each worker says it runs at start and every heartbeat interval "
                               "and withdraws at its stop; one silent for three intervals is "
                               f"not listed. {_READ}")),
        Operation("get", f"{_OPS}/charts", "opsCharts",
                  "The last hour, a point per minute: jobs enqueued, succeeded and failed; wait "
                  "and run p50 and p95.",
                  {"200": Answer("The points, oldest first.", _object(["as_of", "minutes"]), {
                      "as_of": AT, "minutes": [
                          {"minute": AT, "enqueued": 12, "succeeded": 10, "failed": 1,
                           "wait_p50": 0.4, "wait_p95": 1.2, "run_p50": 2.5, "run_p95": 7.9}]})},
                  description=f"Seconds are null in a minute that measured none. {_READ}"),
    ]


def _bulk(action: str, what: str) -> Operation:
    reached = "queued or running" if action == "cancel" else "finished"
    return Operation(
        "post", f"{_OPS}/bulk/{action}", f"opsBulk{action.title()}",
        f"{what.capitalize()} the selected jobs, or those a filter reaches, in batches.",
        {"200": Answer("What the action did; the log entry is `action_id`.", _BULK,
                       {"action_id": 7, "changed": 2, "batches": 1, "job_ids": [JOB_ID]})},
        description=(
            f"Either a body `{{\"ids\": [...]}}` (1 to {OPS_BULK_MAX:,}) or the explorer's "
            "filter with `max_jobs` in the query (the count GET /ops/jobs/count showed; the "
            f"newest {reached} jobs first). Runs "
            "SA_OPS_BULK_BATCH jobs per statement, each batch its own transaction, and logs "
            f"each batch with it (GET /ops/actions). A job whose state changed meanwhile is "
            f"left alone. {_ACT}"),
        params=(*OPS_FILTER_PARAMS, MAX_JOBS),
        body=Body(BULK_BODY, {"ids": [JOB_ID]}, required=False))


def _route_action(action: str, body: Fields, example: Schema) -> Operation:
    return Operation(
        "post", f"{_OPS}/routes/{action}", f"opsRoute{action.title()}",
        f"{action.capitalize()} a model route for every worker.",
        {"200": Answer("The route's new state and the log entry's id.",
                       _object(["route", "action_id"]),
                       {"route": "default", "action_id": 8,
                        **({"paused_until": AT} if action == "pause" else {"was_paused": True})})},
        description=(
            "Workers see it within half a second; a job meeting a paused route goes back to the "
            f"queue without spending an attempt. 404 for a route not configured. {_ACT}"),
        body=Body(body, example), errors=("404",))


def ops_operations() -> list[Operation]:
    """The console's operations (the overview and single-job actions are in operations.py)."""
    return [*_reads(), _bulk("cancel", "cancel"), _bulk("retry", "retry"),
            _route_action("pause", PAUSE_BODY, {"route": "default", "seconds": 300,
                                                "reason": "provider incident"}),
            _route_action("resume", RESUME_BODY, {"route": "default"})]
