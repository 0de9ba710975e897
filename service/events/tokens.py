"""The re-check that ends the streams of a token revoked or expired since they opened."""

from __future__ import annotations

from collections.abc import Sequence

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import token as token_q

__all__ = ["inactive_tokens"]


def inactive_tokens(conn: DictConnection, tokens: Sequence[bytes]) -> set[bytes]:
    """Returns the digests among `tokens` that no longer act (revoked, expired or deleted)."""
    if not tokens:
        return set()
    rows = conn.execute(token_q.TOKEN_LIST_ACTIVE_MANY, {"token_hashes": list(tokens)}).fetchall()
    active = {bytes(row["token_hash"]) for row in rows}
    return {token for token in tokens if token not in active}
