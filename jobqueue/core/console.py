"""The operator console's job filter and bulk actions: plain values, no I/O.

One filter serves the jobs explorer, the count shown before a bulk action and the bulk action's
batches, so what an operator saw listed and counted is what the action reaches.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobqueue.core.routes import ANY_MODEL, Route, Routes

__all__ = ["BulkAction", "JobFilter", "like_pattern", "route_models"]

_ID_PREFIX = re.compile(r"^[0-9a-f-]{4,36}$")
"""A text that may be the start of a job id (at least 4 hex digits or dashes)."""


def like_pattern(text: str) -> str:
    """Returns an ILIKE pattern matching `text` anywhere, its `%`, `_` and `\\` taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def route_models(route: Route, routes: Routes) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The models a route serves, as the filter takes them: (models, other_models).

    A route naming its models serves those (`models`); a route with `*` serves every model no
    other route names (`other_models` lists those it does not serve), as Routes.for_model looks
    a model up.
    """
    if ANY_MODEL not in route.models:
        return route.models, ()
    named = {m for r in routes.routes if r.name != route.name for m in r.models if m != ANY_MODEL}
    return (), tuple(sorted(named - set(route.models)))


class BulkAction(enum.Enum):
    """What a bulk action does, and which states it can change."""

    CANCEL = "cancel"
    RETRY = "retry"

    @property
    def eligible(self) -> tuple[str, ...]:
        """The states a job must be in for the action to change it."""
        if self is BulkAction.CANCEL:
            return ("queued", "running")
        return ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class JobFilter:
    """Which jobs an operator means, across orgs; an empty filter means every hot job.

    Attributes:
        states: only jobs in one of these states (none: any).
        org_id: only this org's jobs.
        models: only jobs running one of these models (`options.model`, else `default_model`).
        other_models: only jobs running none of these models (a `*` route's jobs).
        default_model: the model a job that names none runs.
        model: the model asked for, or
        route: the route asked for (both only for the log: `models` and `other_models` filter).
        error_kind: only jobs whose latest attempt failed with this kind.
        since: only jobs created at or after this instant.
        until: only jobs created before this instant.
        text: only jobs whose prompt text or error message holds it (case-insensitive), or
            whose id starts with it.
    """

    states: tuple[str, ...] = ()
    org_id: int | None = None
    models: tuple[str, ...] = ()
    other_models: tuple[str, ...] = ()
    default_model: str = ""
    model: str | None = None
    route: str | None = None
    error_kind: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    text: str | None = None

    def params(self) -> dict[str, Any]:
        """Returns the statement parameters of queries/console.py's filter (NULL: any)."""
        text = self.text
        id_prefix = None
        if text is not None and _ID_PREFIX.fullmatch(text.lower()):
            id_prefix = text.lower() + "%"
        return {"states": list(self.states) or None, "org_id": self.org_id,
                "models": list(self.models) or None,
                "other_models": list(self.other_models) or None,
                "default_model": self.default_model, "error_kind": self.error_kind,
                "since": self.since, "until": self.until,
                "text": None if text is None else like_pattern(text), "id_prefix": id_prefix}

    def narrowed(self, action: BulkAction) -> JobFilter:
        """The same filter reaching only the states `action` can change."""
        eligible = action.eligible
        states = tuple(s for s in self.states if s in eligible) if self.states else eligible
        # NOTE: a filter naming only states the action cannot change matches nothing; an empty
        # tuple would mean "any state", so an impossible state stands for "none".
        return dataclasses.replace(self, states=states or ("none",))

    def as_dict(self) -> dict[str, Any]:
        """Returns the filter as the audit log keeps it (only what was given)."""
        given = {"states": list(self.states), "org_id": self.org_id, "model": self.model,
                 "route": self.route, "error_kind": self.error_kind,
                 "since": None if self.since is None else self.since.isoformat(),
                 "until": None if self.until is None else self.until.isoformat(),
                 "text": self.text}
        return {k: v for k, v in given.items() if v not in (None, [])}
