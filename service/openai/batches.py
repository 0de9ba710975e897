"""The Batch API: POST /batches, GET /batches, GET /batches/{id}, POST /batches/{id}/cancel."""

from __future__ import annotations

import uuid
from typing import Any

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.errors import Conflict, InvalidInput, NotFound
from jobqueue.core.openai_wire import (
    BATCH_ID_PREFIX,
    FILE_ID_PREFIX,
    Body,
    object_id,
    parse_object_id,
    unix,
)
from jobqueue.core.settings import Settings
from jobqueue.engine import batches
from jobqueue.engine.spend import check_budget
from service.openai.errors import OpenAIError, bad_request, not_found

__all__ = ["BATCH_HEADER", "BatchCancel", "BatchCollection", "BatchItem", "batch_object"]

BATCH_HEADER = "X-SA-Batch-Id"
ENDPOINTS = ("/v1/chat/completions",)
WINDOWS = ("24h",)
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
OUTPUT_TTL_MIN, OUTPUT_TTL_MAX = 3600, 30 * 86400
LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 20, 100
_FINISHED = ("completed", "cancelled", "expired")
_TIMES = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
          "failed_at", "expired_at", "cancelling_at", "cancelled_at")


def _file_id(value: uuid.UUID | None) -> str | None:
    return None if value is None else object_id(FILE_ID_PREFIX, value)


def batch_object(row: dict[str, Any]) -> Body:
    """OpenAI's batch object; `usage` once the batch's files are written."""
    body: Body = {"id": object_id(BATCH_ID_PREFIX, row["id"]), "object": "batch",
                  "endpoint": row["endpoint"], "errors": row["errors"],
                  "input_file_id": _file_id(row["input_file_id"]),
                  "completion_window": row["completion_window"], "status": row["status"],
                  "output_file_id": _file_id(row["output_file_id"]),
                  "error_file_id": _file_id(row["error_file_id"]),
                  **{name: unix(row[name]) for name in _TIMES},
                  "request_counts": {"total": row["total"], "completed": row["completed"],
                                     "failed": row["failed"]},
                  "metadata": row["metadata"], "model": None, "usage": None}
    if row["status"] in _FINISHED:
        body["usage"] = {"input_tokens": row["tokens_in"], "output_tokens": row["tokens_out"],
                         "total_tokens": row["tokens_in"] + row["tokens_out"],
                         "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens_details": {"reasoning_tokens": 0}}
    return body


def _metadata(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > METADATA_PAIRS:
        raise bad_request(f"metadata must be an object of at most {METADATA_PAIRS} pairs",
                          "metadata")
    for key, item in value.items():
        if not isinstance(key, str) or not 0 < len(key) <= METADATA_KEY_CHARS or "\x00" in key:
            raise bad_request(f"metadata keys are strings of 1 to {METADATA_KEY_CHARS} "
                              "characters", "metadata")
        if not isinstance(item, str) or len(item) > METADATA_VALUE_CHARS or "\x00" in item:
            raise bad_request(f"metadata values are strings of at most {METADATA_VALUE_CHARS} "
                              "characters", f"metadata.{key}")
    return dict(value)


def _output_ttl(value: object) -> int | None:
    if value is None:
        return None
    seconds = value.get("seconds") if isinstance(value, dict) else None
    if (not isinstance(value, dict) or set(value) != {"anchor", "seconds"}
            or value["anchor"] != "created_at" or isinstance(seconds, bool)
            or not isinstance(seconds, int) or not OUTPUT_TTL_MIN <= seconds <= OUTPUT_TTL_MAX):
        raise bad_request(f"output_expires_after must be {{anchor: created_at, seconds: "
                          f"{OUTPUT_TTL_MIN} to {OUTPUT_TTL_MAX}}}", "output_expires_after")
    return seconds


def parse_batch_request(body: object) -> batches.BatchRequest:
    """Checks a POST /batches body.

    Raises:
        OpenAIError: 400 naming the field at fault.
    """
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object", None, "invalid_json")
    unknown = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata",
                                  "output_expires_after"})
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0],
                          "unknown_parameter")
    for name in ("input_file_id", "endpoint", "completion_window"):
        if name not in body:
            raise bad_request(f"Missing required parameter: '{name}'.", name,
                              "missing_required_parameter")
    if body["endpoint"] not in ENDPOINTS:
        raise bad_request(f"endpoint must be one of: {', '.join(ENDPOINTS)}", "endpoint")
    if body["completion_window"] not in WINDOWS:
        raise bad_request("completion_window must be 24h", "completion_window")
    raw = body["input_file_id"]
    input_file = parse_object_id(FILE_ID_PREFIX, raw) if isinstance(raw, str) else None
    if input_file is None:
        raise not_found("File object", str(raw)[:100], "input_file_id")
    return batches.BatchRequest(input_file, body["endpoint"], body["completion_window"],
                                _metadata(body.get("metadata")),
                                _output_ttl(body.get("output_expires_after")))


def _batch_id(text: str) -> uuid.UUID:
    found = parse_object_id(BATCH_ID_PREFIX, text)
    if found is None:
        raise not_found("Batch object", text)
    return found


def _answer(resp: falcon.Response, row: dict[str, Any]) -> None:
    resp.set_header(BATCH_HEADER, object_id(BATCH_ID_PREFIX, row["id"]))
    resp.media = batch_object(row)


class BatchCollection:
    """Creates a batch from an uploaded file; lists the org's batches, newest first."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings) -> None:
        self._pool = pool
        self._settings = settings

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Records the batch (`validating`); the keeper validates and runs it."""
        request = parse_batch_request(req.get_media(default_when_empty=None))
        check_budget(self._pool, req.context.caller.org_id, self._settings.budgets)
        try:
            row = batches.create_batch(self._pool, req.context.caller, request,
                                       window=self._settings.batch_window,
                                       max_active=self._settings.org_max_active_batches)
        except NotFound as exc:
            raise OpenAIError(404, exc.description, param="input_file_id") from None
        _answer(resp, row)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """A page of the org's batches (`limit` up to 100, `after`)."""
        unknown = sorted(set(req.params) - {"limit", "after"})
        if unknown:
            raise bad_request(f"unknown query parameter {unknown[0]!r}", unknown[0],
                              "unknown_parameter")
        raw = req.get_param("limit")
        if raw is not None and (not raw.isdigit() or not 1 <= int(raw) <= LIST_LIMIT_MAX):
            raise bad_request(f"limit must be an integer from 1 to {LIST_LIMIT_MAX}", "limit")
        after = req.get_param("after")
        try:
            rows, more = batches.list_batches(
                self._pool, req.context.caller, after=None if after is None else _batch_id(after),
                limit=int(raw) if raw is not None else LIST_LIMIT_DEFAULT)
        except (InvalidInput, OpenAIError):
            raise bad_request(f"after: no batch {after}", "after") from None
        data = [batch_object(row) for row in rows]
        resp.media = {"object": "list", "data": data, "has_more": more,
                      "first_id": data[0]["id"] if data else None,
                      "last_id": data[-1]["id"] if data else None}


class BatchItem:
    """One batch."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response, batch_id: str) -> None:
        """The batch object; 404 for another org's or a missing one."""
        try:
            row = batches.get_batch(self._pool, req.context.caller, _batch_id(batch_id))
        except NotFound:
            raise not_found("Batch object", batch_id) from None
        _answer(resp, row)


class BatchCancel:
    """Cancels a batch: queued lines end cancelled, running ones finish, then it is `cancelled`."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_post(self, req: falcon.Request, resp: falcon.Response, batch_id: str) -> None:
        """The batch, now `cancelling`; 409 when it is already finishing or finished."""
        try:
            row = batches.cancel_batch(self._pool, req.context.caller, _batch_id(batch_id))
        except NotFound:
            raise not_found("Batch object", batch_id) from None
        except Conflict as exc:
            raise OpenAIError(409, exc.description, code="batch_not_cancellable") from None
        _answer(resp, row)
