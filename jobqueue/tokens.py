"""API tokens: shown once at creation, stored only as a SHA-256 hash, looked up by hash."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import ConnectionPool

from jobqueue.db import DictConnection
from jobqueue.queries import token as q

__all__ = ["Caller", "authenticate", "create_token", "hash_token"]

TOKEN_PREFIX = "sa_"


@dataclass(frozen=True)
class Caller:
    """Who a request acts for; every read and write is scoped to `org_id`."""

    org_id: int
    user_id: int


def hash_token(token: str) -> bytes:
    """Returns the digest stored for `token`.

    NOTE: the token carries 256 random bits, so a fast unsalted hash is enough; the lookup
    compares digests inside the database's unique index, never the secret itself.
    """
    return hashlib.sha256(token.encode("utf-8")).digest()


def create_token(
    pool: ConnectionPool[DictConnection],
    org_id: int,
    user_id: int,
    *,
    label: str | None = None,
    expires_at: datetime | None = None,
) -> str:
    """Creates a bearer token for (org, user) and returns it; only its hash is kept.

    Args:
        pool: database pool.
        org_id: tenant the token acts for.
        user_id: user the token acts as.
        label: free text for operators.
        expires_at: when the token stops working; None for never.

    Returns:
        The token, to be shown once.
    """
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with pool.connection() as conn:
        conn.execute(
            q.TOKEN_INSERT,
            {
                "token_hash": hash_token(token),
                "org_id": org_id,
                "user_id": user_id,
                "label": label,
                "expires_at": expires_at,
            },
        )
    return token


def authenticate(pool: ConnectionPool[DictConnection], token: str) -> Caller | None:
    """Returns the caller a token acts for, or None when it is unknown, revoked or expired."""
    with pool.connection() as conn:
        row = conn.execute(q.TOKEN_GET_ACTIVE, (hash_token(token),)).fetchone()
    if row is None:
        return None
    return Caller(org_id=row["org_id"], user_id=row["user_id"])
