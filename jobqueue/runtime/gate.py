"""A worker's gate in front of each model route: shared pauses, configured limits, token
reservations, the provider's `x-ratelimit-*` headers, 429s.

The pauses live in Postgres (jobqueue/engine/throttle.py); this keeps a copy re-read when it is
older than `refresh` seconds, at a claim or before a call, so checking a route costs a worker one
round trip per `refresh` seconds, and a worker whose every route is paused skips its claims until
one resumes. On a route with a limit, each call reserves its estimated tokens before it is sent
(`admit`) and settles them to its reported usage after (`settle`, or `release` when it failed).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core import metrics
from jobqueue.core.db import DictConnection
from jobqueue.core.routes import Route
from jobqueue.core.token_estimate import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_RATIO,
    RateLimitHeaders,
    estimate,
    header_pause,
    learn_ratio,
    prompt_chars,
    tighter,
)
from jobqueue.engine import throttle

__all__ = ["RouteGate", "Ticket"]

# NOTE: how long a route pauses when a provider says nothing is left but not when it resets
# (Azure sends no reset headers): short, the next answer's headers say more.
_NO_RESET_PAUSE = 1.0


@dataclass
class Ticket:
    """One call's admission: the wait (0: call now), and the reservation it holds, if any."""

    route: Route
    wait: float
    need: int
    chars: int
    messages: int
    org_id: int
    window_start: datetime | None = None
    org_counted: bool = False

log = structlog.get_logger(__name__)


class RouteGate:
    """Answers "may this route be called now?" for every job thread of one worker."""

    def __init__(self, pool: ConnectionPool[DictConnection], *, refresh: float,
                 window: float, reserve_tokens: bool = True, use_headers: bool = True,
                 fair_by_tokens: bool = False) -> None:
        """Args:
            pool: database pool.
            refresh: most seconds this worker's copy of the pauses may lag the database's.
            window: length of the RPM/TPM windows in seconds (60; shorter in tests).
            reserve_tokens: reserve each call's estimate before it is sent
                (SA_TOKEN_RESERVATIONS); else a `tpm` limit counts reported tokens only.
            use_headers: pause a route when its `x-ratelimit-*` headers say the next call
                would not fit (SA_RATELIMIT_HEADERS).
            fair_by_tokens: count each org's tokens for the claim (SA_FAIR_BY_TOKENS): a
                call's estimate when admitted, its reported usage once settled.
        """
        self._pool = pool
        self._refresh = refresh
        self._window = window
        self._reserve_tokens = reserve_tokens
        self._use_headers = use_headers
        self._fair_by_tokens = fair_by_tokens
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}
        # NOTE: when this process's last pause of each route was written (time.monotonic());
        # infinity while the write is under way.
        self._paused_at: dict[str, float] = {}
        self._ratios: dict[str, float] = {}
        # NOTE: the limits the provider's x-ratelimit-limit-* headers state, per route.
        self._told: dict[str, tuple[int | None, int | None]] = {}
        self._read_at = -float("inf")
        self._read_lock = threading.Lock()

    def refresh(self) -> None:
        """Re-reads the pauses when the copy is older than `refresh` seconds. One read at a time:
        the job threads that find the copy stale meanwhile wait for that read, not another."""
        if time.monotonic() - self._read_at < self._refresh:
            return
        with self._read_lock:
            now = time.monotonic()
            if now - self._read_at < self._refresh:
                return
            pauses = throttle.active_pauses(self._pool)
            with self._lock:
                self._read_at = now
                until = {route: now + seconds for route, seconds in pauses.items()}
                # NOTE: a pause this process wrote after the read began may be missing from it;
                # dropping it would let the next call through.
                for route, at in self._paused_at.items():
                    if at >= now and route in self._until:
                        until[route] = max(until.get(route, 0.0), self._until[route])
                self._until = until

    def paused_for(self, route: str) -> float:
        """Seconds left in the route's pause as last read (0: not paused)."""
        with self._lock:
            until = self._until.get(route, 0.0)
        return max(0.0, until - time.monotonic())

    def all_paused(self, routes: list[Route]) -> bool:
        """True when no route of `routes` may be called now: claiming would only put jobs back."""
        self.refresh()
        return bool(routes) and all(self.paused_for(route.name) > 0 for route in routes)

    def admit(self, route: Route, messages: Iterable[Mapping[str, str]] = (),
              max_tokens: object = None, org_id: int = 0) -> Ticket:
        """Admits one call to `route`, or says how long to wait (`Ticket.wait`).

        The call's tokens are estimated from its messages (the route's learned ratio) plus its
        `max_tokens` (else the route's `max_tokens_default`). On a route with a limit, the call
        is counted and its estimate reserved against the window when both fit; when they do not,
        the route is paused for every worker until the window ends.
        """
        # NOTE: a job claimed just before another worker's 429 may reach here long after the
        # claim round's read (a busy or cold worker): its call must not pass a stale copy.
        try:
            self.refresh()
        except psycopg.Error as exc:
            # NOTE: the call goes by the copy it has; the job's finalize meets the outage.
            log.warning("gate.refresh_failed", route=route.name, error=str(exc))
        chars, count = prompt_chars(messages)
        answer = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) \
            else route.max_tokens_default or DEFAULT_MAX_TOKENS
        need = estimate(chars, count, self._ratio(route.name), answer)
        ticket = Ticket(route, self.paused_for(route.name), need, chars, count, org_id)
        rpm, tpm = self._limits(route)
        if ticket.wait <= 0 and (rpm or tpm):
            self._count(ticket, rpm, tpm)
        if ticket.wait <= 0 and self._fair_by_tokens and org_id:
            # NOTE: counted when admitted, so the claims made while it runs already see it.
            throttle.add_org_tokens(self._pool, org_id, need, self._window)
            ticket.org_counted = True
        return ticket

    def _limits(self, route: Route) -> tuple[int, int]:
        """The route's requests and tokens per window: the configured ones, lowered to what the
        provider's headers state (with reservations: their counts are what a limit checks)."""
        if not self._reserve_tokens:
            return route.rpm, route.tpm
        with self._lock:
            told_rpm, told_tpm = self._told.get(route.name, (None, None))
        return tighter(route.rpm, told_rpm), tighter(route.tpm, told_tpm)

    def _count(self, ticket: Ticket, rpm: int, tpm: int) -> None:
        """Counts the call against its route's limits: with its reservation (or without, as
        before SA_TOKEN_RESERVATIONS); pauses the route when it does not fit."""
        route = ticket.route
        if self._reserve_tokens:
            held = throttle.reserve(self._pool, route.name, rpm, tpm, ticket.need, self._window)
            ticket.window_start = held.window_start
            if held.window_start is None:
                ticket.wait = self.pause(route, held.seconds_left, "limit")
            return
        left = throttle.take(self._pool, route.name, route.rpm, route.tpm, self._window)
        if left is not None:
            ticket.wait = self.pause(route, left, "limit")

    def settle(self, ticket: Ticket, tokens_in: int | None, tokens_out: int | None,
               headers: RateLimitHeaders | None) -> None:
        """After a call that answered: its reservation becomes its reported usage, the route's
        ratio learns from it, its org's recent tokens grow, and its headers are heeded."""
        used = (tokens_in or 0) + (tokens_out or 0)
        route = ticket.route
        if ticket.window_start is not None:
            throttle.settle(self._pool, route.name, ticket.window_start, ticket.need, used)
            ticket.window_start = None
        elif route.tpm and used and not self._reserve_tokens:
            throttle.add_tokens(self._pool, route.name, used, self._window)
        with self._lock:
            self._ratios[route.name] = learn_ratio(self._ratios.get(route.name, DEFAULT_RATIO),
                                                   ticket.chars, tokens_in)
        if ticket.org_counted and used != ticket.need:
            throttle.add_org_tokens(self._pool, ticket.org_id, used - ticket.need, self._window,
                                    calls=0)
        ticket.org_counted = False
        self.heed(ticket, headers)

    def release(self, ticket: Ticket, headers: RateLimitHeaders | None = None) -> None:
        """After a call that failed (or was abandoned): its reservation is given back."""
        if ticket.window_start is not None:
            throttle.settle(self._pool, ticket.route.name, ticket.window_start, ticket.need, 0)
            ticket.window_start = None
        if ticket.org_counted:
            throttle.add_org_tokens(self._pool, ticket.org_id, -ticket.need, self._window,
                                    calls=-1)
            ticket.org_counted = False
        self.heed(ticket, headers)

    def heed(self, ticket: Ticket, headers: RateLimitHeaders | None) -> None:
        """Pauses the route for every worker when the provider's headers say the next call (as
        large as this one) would meet a 429: none left of requests, or fewer tokens than it.
        The limits they state (`x-ratelimit-limit-*`) bound the route's reservations from then
        on, when they are lower than its configured `rpm`/`tpm` (or it has none)."""
        if not self._use_headers or headers is None:
            return
        if headers.limit_requests or headers.limit_tokens:
            # NOTE: taken as per SA_ROUTE_LIMIT_WINDOW (60 s: OpenAI's minute).
            with self._lock:
                self._told[ticket.route.name] = (headers.limit_requests, headers.limit_tokens)
        decision = header_pause(headers, ticket.need, _NO_RESET_PAUSE)
        if decision is not None and decision[0] > 0:
            self.pause(ticket.route, decision[0], "headers")

    def _ratio(self, route: str) -> float:
        with self._lock:
            return self._ratios.get(route, DEFAULT_RATIO)

    def pause(self, route: Route, seconds: float, reason: str) -> float:
        """Pauses `route` for every worker (a 429, or its limit reached); returns seconds left."""
        # NOTE: this process stops calling at once, not after the write's round trip: the call
        # that met the limit freed its slot when it returned, and a job claimed into that slot
        # meanwhile would otherwise make the call the pause is there to prevent.
        with self._lock:
            self._paused_at[route.name] = math.inf
            self._until[route.name] = max(self._until.get(route.name, 0.0),
                                          time.monotonic() + seconds)
        try:
            paused = throttle.pause(self._pool, route.name, seconds, reason)
        finally:
            with self._lock:
                self._paused_at[route.name] = time.monotonic()
        with self._lock:
            self._until[route.name] = time.monotonic() + paused.seconds
        if paused.started:
            metrics.ROUTE_THROTTLED.labels(route=route.name, reason=reason).inc()
            log.warning("route.throttled", route=route.name, reason=reason,
                        seconds=round(paused.seconds, 3))
        return paused.seconds
