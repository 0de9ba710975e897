"""API tokens: shown once at creation, stored only as a SHA-256 hash, looked up by hash.

Why the lookup is safe against timing attacks: the secret itself is never compared. The
database finds the row by the SHA-256 digest of the presented token (a unique index), so the
time it takes depends on how the *digest* compares with stored digests, and an attacker who
cannot invert SHA-256 cannot steer the digest byte by byte toward a stored one: learning "the
digest of my guess shares a prefix with some stored digest" says nothing about any token. As
defense in depth, the digest the database returns is compared with the presented one again with
`hmac.compare_digest`, so the answer never depends on a non-constant-time comparison in Python.
POST /prompt checks its token inside the enqueue statement instead (`BearerToken`), by the same
index lookup; there no digest comes back to Python, so nothing is compared there at all.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import token as q

__all__ = ["BearerToken", "Caller", "InvalidToken", "IssuedToken", "RevokedToken", "authenticate",
           "create_token", "hash_token", "issue_token", "revoke_token"]

TOKEN_PREFIX = "sa_"


@dataclass(frozen=True)
class Caller:
    """Who a request acts for; every read and write is scoped to `org_id`."""

    org_id: int
    user_id: int


class InvalidToken(Exception):
    """A presented bearer token is unknown, revoked or expired."""


def hash_token(token: str) -> bytes:
    """Returns the digest stored for `token`.

    NOTE: the token carries 256 random bits, so a fast unsalted hash is enough; the lookup
    compares digests inside the database's unique index, never the secret itself.
    """
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True)
class BearerToken:
    """A token as a request presented it, not yet checked; only its digest is kept.

    A statement can take it in place of a `Caller` and check it itself (jobqueue.engine.enqueue), which
    spares the request the round trip of a lookup of its own.
    """

    digest: bytes

    @classmethod
    def presented(cls, token: str) -> BearerToken:
        """Returns the unchecked token for the secret a client sent."""
        return cls(hash_token(token))


@dataclass(frozen=True)
class IssuedToken:
    """A new token (the only time it exists in clear), its row id and its expiry."""

    id: int
    token: str
    expires_at: datetime | None


@dataclass(frozen=True)
class RevokedToken:
    """A revoked token's row: `newly` is False when it had been revoked before."""

    id: int
    org_id: int
    user_id: int
    revoked_at: datetime
    newly: bool


def issue_token(
    pool: ConnectionPool[DictConnection],
    org_id: int,
    user_id: int,
    *,
    label: str | None = None,
    expires_at: datetime | None = None,
) -> IssuedToken:
    """Creates a bearer token for (org, user); only its hash is kept.

    Args:
        pool: database pool.
        org_id: tenant the token acts for.
        user_id: user the token acts as.
        label: free text for operators.
        expires_at: when the token stops working; None for never.

    Returns:
        The token (to be shown once), with its id (for `revoke-token`) and expiry.
    """
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with pool.connection() as conn:
        row = conn.execute(
            q.TOKEN_INSERT,
            {
                "token_hash": hash_token(token),
                "org_id": org_id,
                "user_id": user_id,
                "label": label,
                "expires_at": expires_at,
            },
        ).fetchone()
    assert row is not None
    return IssuedToken(id=row["id"], token=token, expires_at=row["expires_at"])


def create_token(
    pool: ConnectionPool[DictConnection],
    org_id: int,
    user_id: int,
    *,
    label: str | None = None,
    expires_at: datetime | None = None,
) -> str:
    """Creates a bearer token for (org, user) and returns it (see `issue_token`)."""
    return issue_token(pool, org_id, user_id, label=label, expires_at=expires_at).token


def revoke_token(pool: ConnectionPool[DictConnection], token_or_id: str) -> RevokedToken | None:
    """Revokes a token, named by itself or by its id; it stops working at once.

    Args:
        pool: database pool.
        token_or_id: the token, or the decimal id `create-token` printed.

    Returns:
        The revoked token's row, or None when no token matches.
    """
    params: dict[str, object] = {"id": None, "token_hash": None}
    if token_or_id.isascii() and token_or_id.isdigit():
        if int(token_or_id) > 2**63 - 1:
            return None
        params["id"] = int(token_or_id)
    else:
        params["token_hash"] = hash_token(token_or_id)
    with pool.connection() as conn:
        row = conn.execute(q.TOKEN_REVOKE, params).fetchone()
    if row is None:
        return None
    return RevokedToken(id=row["id"], org_id=row["org_id"], user_id=row["user_id"],
                        revoked_at=row["revoked_at"], newly=row["newly"])


def authenticate(pool: ConnectionPool[DictConnection], token: str | BearerToken) -> Caller | None:
    """Returns the caller a token acts for, or None when it is unknown, revoked or expired."""
    digest = token.digest if isinstance(token, BearerToken) else hash_token(token)
    with pool.connection() as conn:
        row = conn.execute(q.TOKEN_GET_ACTIVE, (digest,)).fetchone()
    if row is None or not hmac.compare_digest(bytes(row["token_hash"]), digest):
        return None
    return Caller(org_id=row["org_id"], user_id=row["user_id"])
