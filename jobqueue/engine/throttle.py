"""Provider rate limits shared by every worker: route pauses and per-window call counts.

A 429, or a configured requests/tokens-per-minute limit reached, pauses the route in Postgres
(sa_route_pause), so every worker stops calling it, not just the one that met the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import route as q

__all__ = ["Pause", "active_pauses", "add_tokens", "pause", "take"]


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
