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

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import idempotency as q

__all__ = ["KEY_TTL_SECONDS", "MAX_KEY_LENGTH", "prune_expired_keys", "request_fingerprint"]

KEY_TTL_SECONDS = 24 * 3600
"""How long a key stays bound to its request; an older key is treated as absent."""

MAX_KEY_LENGTH = 255
"""Longest accepted key (the `sa_idempotency_key_length` constraint says the same)."""

PRUNE_PAGE = 1000


def request_fingerprint(
    text: str,
    parent_id: uuid.UUID | None,
    priority: int,
    max_attempts: int,
    options: dict[str, Any],
) -> bytes:
    """Returns the SHA-256 of the validated request in canonical form.

    Canonical means: defaults filled in, keys sorted, no insignificant whitespace. So two bodies
    that differ only in key order, spacing or spelled-out defaults (`{"text": "a"}` and
    `{"priority": 50, "text": "a"}`) are the same request; any difference in meaning is not.
    """
    canonical = json.dumps(
        {
            "text": text,
            "parent_id": str(parent_id) if parent_id is not None else None,
            "priority": priority,
            "max_attempts": max_attempts,
            "options": options,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    return hashlib.sha256(canonical.encode("ascii")).digest()


def prune_expired_keys(pool: ConnectionPool[DictConnection], page: int = PRUNE_PAGE) -> int:
    """Deletes keys older than `KEY_TTL_SECONDS`, a page at a time; returns how many.

    Expired keys are already ignored by the enqueue; pruning only keeps the table small.
    """
    deleted = 0
    while True:
        with pool.connection() as conn:
            cur = conn.execute(q.IDEMPOTENCY_KEY_DELETE_EXPIRED_MANY,
                               {"ttl": KEY_TTL_SECONDS, "limit": page})
        deleted += cur.rowcount
        if cur.rowcount < page:
            return deleted
