"""Batches as the web sees them: create one from an uploaded file, read, list, cancel.

The work itself (validating lines, feeding jobs, counting, writing the output files) is the
keeper's (jobqueue/runtime/batch_keeper.py); creating or cancelling a batch only records the
request, so both answer at once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.errors import Conflict, InvalidInput, NotFound, QueueFull
from jobqueue.core.queries import batch as q
from jobqueue.core.tokens import Caller

__all__ = ["BatchRequest", "cancel_batch", "create_batch", "get_batch", "list_batches"]

log = structlog.get_logger(__name__)

Row = dict[str, Any]

_RETRY_AFTER = 60
"""Seconds an org at its cap of unfinished batches is told to wait."""


@dataclass(frozen=True)
class BatchRequest:
    """A checked POST /batches body."""

    input_file_id: uuid.UUID
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    output_ttl: int | None


def create_batch(pool: ConnectionPool[DictConnection], caller: Caller, request: BatchRequest, *,
                 window: float, max_active: int) -> Row:
    """Records a batch (status `validating`); the keeper takes it from there.

    Args:
        pool: database pool.
        caller: the org and user it belongs to.
        request: the checked body.
        window: seconds until it expires (what "24h" lasts, SA_BATCH_WINDOW).
        max_active: the most unfinished batches an org may have (SA_ORG_MAX_ACTIVE_BATCHES).

    Raises:
        NotFound: the input file is not a complete `batch` file of the org.
        QueueFull: the org already has `max_active` unfinished batches.
    """
    batch_id = uuid.uuid4()
    with pool.connection() as conn, conn.transaction():
        conn.execute(q.BATCH_ORG_LOCK, {"org_id": caller.org_id})
        row = conn.execute(q.BATCH_INSERT_IF_ALLOWED, {
            "id": batch_id, "org_id": caller.org_id, "user_id": caller.user_id,
            "input_file_id": request.input_file_id, "endpoint": request.endpoint,
            "completion_window": request.completion_window,
            "metadata": None if request.metadata is None else Jsonb(request.metadata),
            "output_ttl": request.output_ttl, "window": window, "max_active": max_active,
        }).fetchone()
    assert row is not None
    if not row["input_ok"]:
        raise NotFound(f"No such File object: {request.input_file_id} (an uploaded file with "
                       "purpose batch)")
    if not row["under_cap"]:
        raise QueueFull(f"your organization already has {max_active} unfinished batches (the "
                        "most allowed); retry when one has finished", retry_after=_RETRY_AFTER)
    log.info("batch.created", batch_id=str(batch_id), org_id=caller.org_id,
             input_file_id=str(request.input_file_id))
    return {k: v for k, v in row.items() if k not in ("input_ok", "under_cap")}


def get_batch(pool: ConnectionPool[DictConnection], caller: Caller, batch_id: uuid.UUID) -> Row:
    """Returns the org's batch.

    Raises:
        NotFound: no batch of that id in the caller's org.
    """
    with pool.connection() as conn:
        row = conn.execute(q.BATCH_GET, {"id": batch_id, "org_id": caller.org_id}).fetchone()
    if row is None:
        raise NotFound(f"No such Batch object: {batch_id}")
    return row


def list_batches(pool: ConnectionPool[DictConnection], caller: Caller, *,
                 after: uuid.UUID | None, limit: int) -> tuple[list[Row], bool]:
    """Returns a page of the org's batches, newest first, after the batch `after`, and whether
    more follow.

    Raises:
        InvalidInput: `after` names no batch of the org.
    """
    after_created: datetime | None = None
    if after is not None:
        try:
            after_created = get_batch(pool, caller, after)["created_at"]
        except NotFound:
            raise InvalidInput(f"after: no batch {after} in your organization") from None
    with pool.connection() as conn:
        rows = conn.execute(q.BATCH_LIST_PAGE, {
            "org_id": caller.org_id, "after_created": after_created, "after_id": after,
            "limit": limit + 1}).fetchall()
    return rows[:limit], len(rows) > limit


def cancel_batch(pool: ConnectionPool[DictConnection], caller: Caller, batch_id: uuid.UUID) -> Row:
    """Starts cancelling a validating or running batch; a batch already cancelling answers as is.

    Raises:
        NotFound: no batch of that id in the caller's org.
        Conflict: the batch is finalizing or finished.
    """
    with pool.connection() as conn:
        row = conn.execute(q.BATCH_CANCEL_IF_ACTIVE, {"id": batch_id,
                                                      "org_id": caller.org_id}).fetchone()
    if row is None:
        raise NotFound(f"No such Batch object: {batch_id}")
    if not row["changed"] and row["status"] not in ("cancelling", "cancelled"):
        raise Conflict(f"Cannot cancel a batch with status {row['status']}.")
    if row["changed"]:
        log.info("batch.cancelling", batch_id=str(batch_id), org_id=caller.org_id)
    return {k: v for k, v in row.items() if k != "changed"}
