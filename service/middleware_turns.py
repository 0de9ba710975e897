"""Page reads and sign-ins take their token's turn (service/turns.py), so that one token's flood
of them waits for itself instead of taking every other tenant's share of the process."""

from __future__ import annotations

from typing import Any

import falcon
import structlog

from service.turns import Turns

__all__ = ["RETRY_AFTER_SECONDS", "TurnsMiddleware"]

RETRY_AFTER_SECONDS = 1
"""What a refused turn says in Retry-After: a turn lasts one read and its rest."""

log = structlog.get_logger(__name__)


class TurnsMiddleware:
    """Must come after auth (the turn is the token's). The turn covers the responder and the
    rendering of its body, where a large page spends its time."""

    def __init__(self, turns: Turns, routes: frozenset[tuple[str, str]]) -> None:
        self._turns = turns
        self._routes = routes

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         params: dict[str, Any]) -> None:
        """Waits for the token's turn on a route that takes turns.

        Raises:
            falcon.HTTPTooManyRequests: SA_TOKEN_READ_QUEUE requests of the token already wait,
                or its turn did not come within SA_TOKEN_READ_WAIT.
        """
        token: bytes | None = getattr(req.context, "token_digest", None)
        if token is None or (req.method, req.uri_template) not in self._routes:
            return
        started = self._turns.take(token)
        if started is None:
            log.info("http.turn_refused", route=req.uri_template)
            raise falcon.HTTPTooManyRequests(
                title="Too many reads",
                description="This token's page reads and sign-ins take turns in each web process "
                            "(SA_TOKEN_READ_SHARE); too many wait already (SA_TOKEN_READ_QUEUE) "
                            "or this one waited SA_TOKEN_READ_WAIT. Read fewer pages at once.",
                retry_after=RETRY_AFTER_SECONDS)
        req.context.turn = (token, started)

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        """Renders the body inside the turn, then ends it."""
        turn: tuple[bytes, float] | None = getattr(req.context, "turn", None)
        if turn is None:
            return
        try:
            resp.render_body()
        finally:
            self._turns.give(*turn)
