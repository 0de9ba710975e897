"""Idempotent submits: the request fingerprint a key is bound to, its lifetime, and pruning.

A client that sends `Idempotency-Key: K` with POST /prompt gets one prompt and one job for K,
however often (and however concurrently) it repeats the request within `KEY_TTL_SECONDS`. Keys
are scoped per (org, user). The key row is written by the enqueue statement itself
(`PROMPT_INSERT_WITH_JOB`), so the guarantee does not depend on any lock held in Python.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, delete_in_pages
from jobqueue.core.queries import idempotency as q
from jobqueue.core.settings import KEY_TTL_SECONDS

__all__ = ["MAX_KEY_LENGTH", "prune_expired_keys", "request_fingerprint"]

MAX_KEY_LENGTH = 255
"""Longest accepted key (the `sa_idempotency_key_length` constraint says the same)."""

PRUNE_PAGE = 1000


def request_fingerprint(
    text: str,
    parent_id: uuid.UUID | None,
    priority: int,
    max_attempts: int,
    options: dict[str, Any],
    schedule: dict[str, Any] | None = None,
) -> bytes:
    """Returns the SHA-256 of the validated request in canonical form.

    Canonical means: defaults filled in, keys sorted, no insignificant whitespace. So two bodies
    that differ only in key order, spacing or spelled-out defaults (`{"text": "a"}` and
    `{"priority": 50, "text": "a"}`) are the same request; any difference in meaning is not.
    `schedule` (`run_at`, `delay_seconds`, `after` as given) joins the fingerprint only when
    set, so the fingerprint of an unscheduled request is what it always was.
    """
    fields: dict[str, Any] = {
        "text": text,
        "parent_id": str(parent_id) if parent_id is not None else None,
        "priority": priority,
        "max_attempts": max_attempts,
        "options": options,
    }
    if schedule:
        fields["schedule"] = schedule
    canonical = json.dumps(
        fields,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    return hashlib.sha256(canonical.encode("ascii")).digest()


def prune_expired_keys(
    db: ConnectionPool[DictConnection] | DictConnection,
    older_than: float = KEY_TTL_SECONDS,
    page: int = PRUNE_PAGE,
    statement_timeout: float = 30.0,
) -> int:
    """Deletes keys older than `older_than` seconds, a page at a time; returns how many.

    Expired keys are already ignored by the enqueue; pruning only keeps the table small. Works on
    a pool (the CLI) or on one connection (the maintenance leader's own).

    Raises:
        ValueError: `older_than` is shorter than `KEY_TTL_SECONDS` (it would delete live keys).
    """
    if older_than < KEY_TTL_SECONDS:
        raise ValueError(f"older_than must be at least {KEY_TTL_SECONDS} s, got {older_than!r}")
    return delete_in_pages(db, q.IDEMPOTENCY_KEY_DELETE_EXPIRED_MANY, {"ttl": older_than},
                           page=page, statement_timeout=statement_timeout)
