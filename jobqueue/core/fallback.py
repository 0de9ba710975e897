"""Which route a job's attempt calls, and where a failed call sends the next one: pure, no I/O.

The executor (jobqueue/runtime/executor.py) asks `route_for` before each call and `fallback_for`
after a failure; the engine records the route that served each attempt (sa_ledger.route) and the
one the next attempt calls (sa_job.route).
"""

from __future__ import annotations

from collections.abc import Collection

from jobqueue.core.policy import ErrorKind
from jobqueue.core.routes import ANY_MODEL, Route, Routes

__all__ = ["FAILOVER_KINDS", "fails_over", "fallback_for", "named_serving", "route_for", "serves"]

FAILOVER_KINDS: frozenset[ErrorKind] = frozenset(
    {ErrorKind.PROVIDER_5XX, ErrorKind.TIMEOUT, ErrorKind.UNKNOWN})
"""Failures that say the route is unwell, not the request: another route may well answer.

NOTE: `unknown` is the provider unreachable or a stream cut short. A 4xx, `auth` or `parse` would
fail the same way elsewhere (or is the route's own key), so they stay on the route.
"""


def serves(route: Route, model: str) -> bool:
    """Whether `route` serves `model` (it names it, or serves every model)."""
    return model in route.models or ANY_MODEL in route.models


def named_serving(routes: Routes, name: str, model: str) -> Route | None:
    """The route called `name` if it serves `model` (a `prefer_provider` that can be honoured)."""
    route = routes.named(name)
    return route if route is not None and serves(route, model) else None


def route_for(routes: Routes, model: str, *, current: str | None = None,
              prefer: str | None = None) -> Route | None:
    """The route this attempt calls.

    Args:
        routes: every route.
        model: the job's model.
        current: the route an earlier attempt failed over to (sa_job.route), if any.
        prefer: the job's `prefer_provider` option, if any.

    Returns:
        `current`, else `prefer`, else the model's route (Routes.for_model); a name that is not
        a route of this process, or a route not serving `model`, is passed over. None when no
        route serves the model.
    """
    for name in (current, prefer):
        route = named_serving(routes, name, model) if name else None
        if route is not None:
            return route
    return routes.for_model(model)


def fallback_for(routes: Routes, route: Route, model: str,
                 paused: Collection[str] = ()) -> Route | None:
    """The first of `route`'s fallbacks that serves `model` and is not `paused`, or None (the
    job stays on `route`).

    NOTE: a paused fallback is passed over, so two routes naming each other while both are
    throttled do not hand a job back and forth (its attempt kept each time) without a call.
    """
    for name in route.fallbacks:
        candidate = routes.named(name)
        if (candidate is not None and candidate.name != route.name and name not in paused
                and serves(candidate, model)):
            return candidate
    return None


def fails_over(kind: ErrorKind, wait: float | None, max_wait: float) -> bool:
    """Whether a failure of `kind` moves the job's next attempt to a fallback route.

    Args:
        kind: what the call came to.
        wait: for a rate limit, the seconds the route is paused for (Retry-After or the minimum).
        max_wait: SA_FALLBACK_AFTER: a rate limit pausing the route longer than this fails over;
            a shorter one waits for the route.
    """
    if kind is ErrorKind.RATE_LIMIT:
        return wait is not None and wait > max_wait
    return kind in FAILOVER_KINDS
