"""Provider rate limits shared by every worker: route pauses, per-window call counts and token
reservations, and the tokens each org used recently.

A 429, or a configured requests/tokens-per-minute limit reached, pauses the route in Postgres
(sa_route_pause), so every worker stops calling it, not just the one that met the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import org_token as org_q
from jobqueue.core.queries import route as q

__all__ = ["Pause", "Reserved", "active_pauses", "add_org_tokens", "add_tokens", "pause",
           "reserve", "settle", "take"]


@dataclass(frozen=True)
class Pause:
    """A route's pause as written: seconds left, and whether this write began it."""

    seconds: float
    started: bool


def pause(pool: ConnectionPool[DictConnection], route: str, seconds: float, reason: str) -> Pause:
    """Pauses `route` for `seconds` from now, or keeps a pause that ends later."""
    with pool.connection() as conn:
        row = conn.execute(q.ROUTE_PAUSE, {"route": route, "seconds": max(0.0, seconds),
                                           "reason": reason}).fetchone()
    assert row is not None
    return Pause(max(0.0, float(row["seconds"])), bool(row["started"]))


def active_pauses(pool: ConnectionPool[DictConnection]) -> dict[str, float]:
    """Every route paused now, with the seconds its pause has left."""
    with pool.connection() as conn:
        rows = conn.execute(q.ROUTE_PAUSES_ACTIVE).fetchall()
    return {r["route"]: float(r["seconds"]) for r in rows}


def take(pool: ConnectionPool[DictConnection], route: str, rpm: int, tpm: int,
         window: float) -> float | None:
    """Counts one call against the route's limits (0: none) in its current window.

    Returns:
        None when the call may go; else the seconds left in the window (the limit is reached).
    """
    with pool.connection() as conn:
        row = conn.execute(q.ROUTE_WINDOW_TAKE, {"route": route, "rpm": rpm, "tpm": tpm,
                                                 "window": window}).fetchone()
    assert row is not None
    return None if row["allowed"] else max(0.0, float(row["seconds_left"]))


def add_tokens(pool: ConnectionPool[DictConnection], route: str, tokens: int,
               window: float) -> None:
    """Adds a call's reported tokens to the route's current window (for its TPM limit)."""
    with pool.connection() as conn:
        conn.execute(q.ROUTE_WINDOW_ADD_TOKENS, {"route": route, "tokens": tokens,
                                                 "window": window})


@dataclass(frozen=True)
class Reserved:
    """A reservation's answer: the window it is held in, or the seconds until the next one."""

    window_start: datetime | None
    seconds_left: float


def reserve(pool: ConnectionPool[DictConnection], route: str, rpm: int, tpm: int, tokens: int,
            window: float) -> Reserved:
    """Counts one call and reserves `tokens` against the route's current window if both fit.

    Returns:
        The window held (`window_start` None: the limit is reached; wait `seconds_left`).
    """
    with pool.connection() as conn:
        row = conn.execute(q.ROUTE_WINDOW_RESERVE, {"route": route, "rpm": rpm, "tpm": tpm,
                                                    "tokens": tokens, "window": window}).fetchone()
    assert row is not None
    return Reserved(row["window_start"] if row["allowed"] else None,
                    max(0.0, float(row["seconds_left"])))


def settle(pool: ConnectionPool[DictConnection], route: str, window_start: datetime,
           reserved: int, used: int) -> None:
    """Replaces a reservation by the tokens the call reported (0: releases it)."""
    with pool.connection() as conn:
        conn.execute(q.ROUTE_WINDOW_SETTLE, {"route": route, "window_start": window_start,
                                             "reserved": reserved, "used": used})


def add_org_tokens(pool: ConnectionPool[DictConnection], org_id: int, tokens: int,
                   window: float, calls: int = 1) -> None:
    """Adds tokens (and calls) to an org's current window, for the fair claim by tokens."""
    with pool.connection() as conn:
        conn.execute(org_q.ORG_TOKEN_WINDOW_ADD, {"org_id": org_id, "tokens": tokens,
                                                  "calls": calls, "window": window})
