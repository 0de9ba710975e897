"""API tokens: shown once at creation, stored only as a SHA-256 hash, looked up by hash.

Why the lookup is safe against timing attacks: the secret itself is never compared. The
database finds the row by the SHA-256 digest of the presented token (a unique index), so the
time it takes depends on how the *digest* compares with stored digests, and an attacker who
cannot invert SHA-256 cannot steer the digest byte by byte toward a stored one: learning "the
digest of my guess shares a prefix with some stored digest" says nothing about any token. As
defense in depth, the digest the database returns is compared with the presented one again with
`hmac.compare_digest`, so the answer never depends on a non-constant-time comparison in Python.

`Authenticator` may remember a valid token's caller for a short while (the web's hot path then
skips the lookup's round trip); a revoke notifies every web process, which forgets it at once.

A session (`open_session`) is a short-lived random id that acts for the token that opened it; the
mission page keeps it in an HttpOnly cookie so that no script, and no URL, ever holds the token.
It is stored as a digest too, and looked up on every request (no cache), so revoking the token or
closing the session takes effect at once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, reconnecting
from jobqueue.core.errors import SignInBusy
from jobqueue.core.queries import session as session_q
from jobqueue.core.queries import token as q

__all__ = ["OPS_READ_SCOPE", "OPS_SCOPE", "SCOPES", "Authenticator", "Caller", "IssuedToken", "OpenedSession",
           "RevokedToken", "close_session", "create_token", "hash_token", "issue_token",
           "open_session", "revoke_token"]

TOKEN_PREFIX = "sa_"

OPS_SCOPE = "ops"
"""Lets a token read and steer every org's jobs through /sa-core/v1/ops/ (the operator view)."""

OPS_READ_SCOPE = "ops:read"
"""Lets a token read everything the `ops` scope reads (the console's views), and change nothing."""

SCOPES = (OPS_SCOPE, OPS_READ_SCOPE)
"""Every scope a token may carry (sa_api_token_scopes_known, last set in 0032_ops_console.sql)."""


@dataclass(frozen=True)
class Caller:
    """Who a request acts for; every read and write is scoped to `org_id`, unless a scope widens it."""

    org_id: int
    user_id: int
    scopes: frozenset[str] = frozenset()


def hash_token(token: str) -> bytes:
    """Returns the digest stored for `token`.

    NOTE: the token carries 256 random bits, so a fast unsalted hash is enough; the lookup
    compares digests inside the database's unique index, never the secret itself.
    """
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True)
class IssuedToken:
    """A new token (the only time it exists in clear), its row id, its expiry and its scopes."""

    id: int
    token: str
    expires_at: datetime | None
    scopes: tuple[str, ...] = ()


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
    scopes: tuple[str, ...] = (),
) -> IssuedToken:
    """Creates a bearer token for (org, user); only its hash is kept.

    Args:
        pool: database pool.
        org_id: tenant the token acts for.
        user_id: user the token acts as.
        label: free text for operators.
        expires_at: when the token stops working; None for never.
        scopes: what the token may do beyond its org's prompts (SCOPES); none by default.

    Returns:
        The token (to be shown once), with its id (for `revoke-token`), expiry and scopes.
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
                "scopes": sorted(set(scopes)),
            },
        ).fetchone()
    assert row is not None
    return IssuedToken(id=row["id"], token=token, expires_at=row["expires_at"],
                       scopes=tuple(row["scopes"]))


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


def _lookup(pool: ConnectionPool[DictConnection], digest: bytes) -> tuple[Caller, float | None] | None:
    """The caller of an active token and the seconds until it expires (None: never)."""
    row = reconnecting(pool, lambda conn: conn.execute(q.TOKEN_GET_ACTIVE, (digest,)).fetchone())
    if row is None or not hmac.compare_digest(bytes(row["token_hash"]), digest):
        return None
    return _caller(row), row["expires_in"]


def _caller(row: dict[str, Any]) -> Caller:
    return Caller(org_id=row["org_id"], user_id=row["user_id"], scopes=frozenset(row["scopes"]))


@dataclass(frozen=True)
class OpenedSession:
    """A new session: its id (the cookie's value, the only time it exists in clear) and expiry."""

    id: str
    expires_at: datetime


def open_session(pool: ConnectionPool[DictConnection], token: str, ttl: float,
                 max_per_token: int) -> OpenedSession | None:
    """Opens a session acting for `token`, for `ttl` seconds at most (never past the token's expiry).

    A token keeps at most `max_per_token` sessions: opening one more ends its oldest.

    Returns:
        The session, or None when the token is not active (unknown, revoked or expired).

    Raises:
        SignInBusy: another sign-in with the same token is being written (retry in a second).
    """
    session_id = secrets.token_urlsafe(32)
    params = {"session_hash": hash_token(session_id), "token_hash": hash_token(token), "ttl": ttl,
              "keep": max_per_token - 1}
    try:
        with pool.connection() as conn, conn.transaction():
            row = conn.execute(session_q.SESSION_INSERT, params).fetchone()
            if row is not None:
                conn.execute(session_q.SESSION_DELETE_OLDEST_FOR_TOKEN, params)
    except psycopg.errors.LockNotAvailable:
        raise SignInBusy("another sign-in with this token is being written; try again in a "
                         "second", retry_after=1) from None
    if row is None:
        return None
    return OpenedSession(id=session_id, expires_at=row["expires_at"])


def close_session(pool: ConnectionPool[DictConnection], session_id: str) -> None:
    """Ends a session at once (sign-out); an unknown id is already ended."""
    with pool.connection() as conn:
        conn.execute(session_q.SESSION_DELETE, (hash_token(session_id),))


class Authenticator:
    """Looks tokens up, remembering a valid one's caller for a short while.

    An entry lives `ttl` seconds while `revocations` (set by the web's LISTEN on
    TOKEN_REVOKED_CHANNEL) says revocations are heard, and only `fallback_ttl` seconds otherwise
    (SA_LISTEN=0, or the LISTEN connection is down); never past the token's own expiry. Only
    valid tokens are remembered, so random guesses cannot fill the table; `max_entries` bounds it.
    `ttl` = `fallback_ttl` = 0 turns caching off: every request is one lookup.
    """

    def __init__(self, pool: ConnectionPool[DictConnection], *, ttl: float = 0.0,
                 fallback_ttl: float = 0.0, max_entries: int = 10_000,
                 revocations: threading.Event | None = None) -> None:
        self._pool = pool
        self._ttl = ttl
        self._fallback_ttl = fallback_ttl
        self._max_entries = max_entries
        self.revocations = revocations or threading.Event()
        # NOTE: digest -> (caller, monotonic time it was looked up, monotonic expiry or inf).
        self._entries: dict[bytes, tuple[Caller, float, float]] = {}
        # NOTE: bumped by every forget and clear; a lookup that overlapped one is not remembered,
        # since its answer may predate the revoke that was just announced.
        self._generation = 0

    def authenticate(self, token: str) -> Caller | None:
        """Returns the caller `token` acts for, or None when it is unknown, revoked or expired."""
        digest = hash_token(token)
        now = time.monotonic()
        entry = self._entries.get(digest)
        ttl = self._ttl if self.revocations.is_set() else self._fallback_ttl
        if entry is not None and now - entry[1] < ttl and now < entry[2]:
            return entry[0]
        generation = self._generation
        found = _lookup(self._pool, digest)
        if found is None:
            self._entries.pop(digest, None)
            return None
        caller, expires_in = found
        if ttl > 0 and generation == self._generation:
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
            expiry = now + expires_in if expires_in is not None else float("inf")
            self._entries[digest] = (caller, now, expiry)
        return caller

    def authenticate_session(self, session_id: str) -> tuple[Caller, bytes] | None:
        """Returns the caller a session acts for and its token's digest, or None when the session
        is unknown or expired, or its token no longer acts.

        NOTE: never cached: a browser makes few requests (one stream, a poll while it is down),
        and an uncached lookup makes sign-out and token revocation immediate.
        """
        digest = hash_token(session_id)
        row = reconnecting(self._pool, lambda conn: conn.execute(
            session_q.SESSION_GET_ACTIVE, (digest,)).fetchone())
        if row is None:
            return None
        return _caller(row), bytes(row["token_hash"])

    def forget(self, payload: str) -> None:
        """Drops a revoked token (TOKEN_REVOKED_CHANNEL's payload: its digest in hex)."""
        self._generation += 1
        try:
            self._entries.pop(bytes.fromhex(payload), None)
        except ValueError:
            self.clear()

    def clear(self) -> None:
        """Drops every entry: revocations may have been missed (the LISTEN reconnected)."""
        self._generation += 1
        self._entries.clear()
