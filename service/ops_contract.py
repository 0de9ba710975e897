"""The operator console's request contract: the jobs filter (query parameters), page and bulk
bounds, and the bodies of its actions; parsed here, published by service/openapi/ops.py.

Every bound is listed in docs/limits.md.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

import falcon

from jobqueue.core.console import JobFilter, route_models
from jobqueue.core.policy import ErrorKind
from jobqueue.core.routes import Routes
from jobqueue.core.states import JobState
from service.contract import JOBS_CURSOR_PATTERN
from service.parsers import parse_jobs_cursor, parse_since
from service.schema import SINCE_PATTERN, TEXT_PATTERN, Fields, Ids, Number, Param, Text

__all__ = ["ACTIONS_BEFORE", "ACTIONS_LIMIT", "BULK_BODY", "MAX_JOBS", "OPS_BULK_MAX",
           "OPS_FILTER_PARAMS", "OPS_PAGE_DEFAULT", "OPS_PAGE_MAX", "OPS_TEXT_MAX", "PAGE_CURSOR",
           "PAGE_LIMIT", "PAUSE_BODY", "PAUSE_MAX_SECONDS", "RESUME_BODY", "parse_bulk_ids",
           "parse_cursor", "parse_filter", "parse_max_jobs", "parse_page_limit"]

OPS_PAGE_DEFAULT = 50
OPS_PAGE_MAX = 200
"""Most jobs (or log entries) one page of the console answers."""

OPS_BULK_MAX = 10_000
"""Most jobs one bulk action reaches (selected ids, or `max_jobs` of a filter)."""

OPS_TEXT_MAX = 200
"""Longest text search (`q`) and model name."""

PAUSE_MAX_SECONDS = 86_400.0
"""Longest pause an operator may put on a route at once (a day)."""

_STATES = tuple(state.value for state in JobState)
_STATE_LIST = f"^({'|'.join(_STATES)})(,({'|'.join(_STATES)}))*$"
_STATE_RE = re.compile(_STATE_LIST)
_KINDS = tuple(kind.value for kind in ErrorKind)
_TEXT_RE = re.compile(TEXT_PATTERN)
_MAX_ORG = 2**63 - 1

STATE = Param("state", "query", {"type": "string", "pattern": _STATE_LIST},
              "Only jobs in these states, comma-separated (`queued,running`).", "failed")
ORG = Param("org", "query", {"type": "integer", "minimum": 0, "maximum": _MAX_ORG},
            "Only this org's jobs.", 2)
MODEL = Param("model", "query", {"type": "string", "minLength": 1, "maxLength": OPS_TEXT_MAX,
                                 "pattern": TEXT_PATTERN},
              "Only jobs for this model (`options.model`; the default model takes in the jobs "
              "that name none).", "fake-model")
ROUTE = Param("route", "query", {"type": "string", "minLength": 1, "maxLength": OPS_TEXT_MAX,
                                 "pattern": TEXT_PATTERN},
              "Only jobs whose model this route serves (GET /ops/routes); not with `model`.",
              "default")
ERROR_KIND = Param("error_kind", "query", {"type": "string", "enum": list(_KINDS)},
                   "Only jobs whose latest attempt failed with this kind.", "provider_4xx")
SINCE = Param("since", "query", {"type": "string", "pattern": SINCE_PATTERN},
              "Only jobs created at or after this instant (ISO 8601; no offset means UTC).",
              "2026-11-30T12:00:00Z")
UNTIL = Param("until", "query", {"type": "string", "pattern": SINCE_PATTERN},
              "Only jobs created before this instant (ISO 8601; no offset means UTC).",
              "2026-12-01T12:00:00Z")
TEXT = Param("q", "query", {"type": "string", "minLength": 1, "maxLength": OPS_TEXT_MAX,
                            "pattern": TEXT_PATTERN},
             "Only jobs whose prompt text or error message holds this (case-insensitive), or "
             "whose id starts with it.", "timeout")
OPS_FILTER_PARAMS = (STATE, ORG, MODEL, ROUTE, ERROR_KIND, SINCE, UNTIL, TEXT)
"""The explorer's filter; the count and the bulk actions by filter take the same."""

PAGE_CURSOR = Param("cursor", "query", {"type": "string", "pattern": JOBS_CURSOR_PATTERN},
                    "The previous page's `next_cursor` (opaque): the next, older jobs.",
                    "AAZhfSYz0ABeb3qLnA1OH6KzxNXm96i5")
PAGE_LIMIT = Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": OPS_PAGE_MAX,
                                      "default": OPS_PAGE_DEFAULT},
                   "Most items answered, newest first.", 50)
MAX_JOBS = Param("max_jobs", "query", {"type": "integer", "minimum": 1, "maximum": OPS_BULK_MAX},
                 "With a filter: the most jobs the action reaches, newest first (send the count "
                 "you were shown). Required unless the body selects ids.", 37)
ACTIONS_BEFORE = Param("before", "query", {"type": "integer", "minimum": 1, "maximum": _MAX_ORG},
                       "The previous page's `next_before`: older entries.", 120)
ACTIONS_LIMIT = PAGE_LIMIT

BULK_BODY = Fields(
    {"ids": Ids(OPS_BULK_MAX, f"The jobs selected (1 to {OPS_BULK_MAX:,}); the filter "
                              "parameters and `max_jobs` are then not taken.")},
    description="A selection of jobs by id; without a body, the query's filter and `max_jobs` "
                "say which jobs.")
PAUSE_BODY = Fields(
    {"route": Text(OPS_TEXT_MAX, "A configured route's name (GET /ops/routes)."),
     "seconds": Number(1, PAUSE_MAX_SECONDS, "How long from now (at most a day)."),
     "reason": Text(OPS_TEXT_MAX, "Shown with the pause (default: the operator's name).")},
    required=("route", "seconds"))
RESUME_BODY = Fields({"route": Text(OPS_TEXT_MAX, "A configured route's name.")},
                     required=("route",))


def _text(req: falcon.Request, param: Param) -> str | None:
    raw = req.get_param(param.name)
    if raw is None:
        return None
    if len(raw) > OPS_TEXT_MAX or not _TEXT_RE.fullmatch(raw):
        raise falcon.HTTPInvalidParam(
            f"must be 1 to {OPS_TEXT_MAX} characters, not blank, without NUL", param.name)
    return raw


def _instant(req: falcon.Request, param: Param) -> datetime | None:
    try:
        return parse_since(req.get_param(param.name))
    except falcon.HTTPInvalidParam:
        raise falcon.HTTPInvalidParam("must be an ISO 8601 timestamp", param.name) from None


def parse_filter(req: falcon.Request, routes: Routes) -> JobFilter:
    """Reads the explorer's filter from the query.

    Raises:
        falcon.HTTPInvalidParam: a parameter outside its declaration, both `model` and
            `route`, or a route not configured (400 naming it).
    """
    states = req.get_param(STATE.name)
    if states is not None and not _STATE_RE.fullmatch(states):
        raise falcon.HTTPInvalidParam(f"must be states ({', '.join(_STATES)}), comma-separated",
                                      STATE.name)
    kind = req.get_param(ERROR_KIND.name)
    if kind is not None and kind not in _KINDS:
        raise falcon.HTTPInvalidParam(f"must be one of: {', '.join(_KINDS)}", ERROR_KIND.name)
    org = req.get_param_as_int(ORG.name, min_value=0, max_value=_MAX_ORG)
    since, until = _instant(req, SINCE), _instant(req, UNTIL)
    if since is not None and until is not None and until <= since:
        raise falcon.HTTPInvalidParam("must be later than `since`", UNTIL.name)
    model, route_name = _text(req, MODEL), _text(req, ROUTE)
    models: tuple[str, ...] = (model,) if model is not None else ()
    other_models: tuple[str, ...] = ()
    if route_name is not None:
        if model is not None:
            raise falcon.HTTPInvalidParam("cannot be given with `model`", ROUTE.name)
        route = next((r for r in routes.routes if r.name == route_name), None)
        if route is None:
            raise falcon.HTTPInvalidParam("must be a configured route (GET /ops/routes)",
                                          ROUTE.name)
        models, other_models = route_models(route, routes)
    return JobFilter(states=tuple(dict.fromkeys(states.split(","))) if states else (),
                     org_id=org, models=models, other_models=other_models,
                     default_model=routes.default_model, model=model, route=route_name,
                     error_kind=kind, since=since, until=until, text=_text(req, TEXT))


def parse_page_limit(req: falcon.Request) -> int:
    """Reads `limit` (1 to OPS_PAGE_MAX, default OPS_PAGE_DEFAULT)."""
    limit = req.get_param_as_int(PAGE_LIMIT.name, min_value=1, max_value=OPS_PAGE_MAX,
                                 default=OPS_PAGE_DEFAULT)
    assert limit is not None
    return limit


def parse_cursor(req: falcon.Request) -> tuple[datetime, uuid.UUID] | None:
    """Reads the explorer's `cursor` (a previous page's `next_cursor`)."""
    return parse_jobs_cursor(req.get_param(PAGE_CURSOR.name))


def parse_max_jobs(req: falcon.Request) -> int | None:
    """Reads `max_jobs` (1 to OPS_BULK_MAX)."""
    return req.get_param_as_int(MAX_JOBS.name, min_value=1, max_value=OPS_BULK_MAX)


def parse_bulk_ids(body: Any) -> list[uuid.UUID]:
    """Reads a bulk action's body: the selected ids, or none (an empty body or `{}`).

    Raises:
        falcon.HTTPUnprocessableEntity: a body other than `{ids: [...]}` or `{}`.
    """
    if body is None:
        return []
    checked = BULK_BODY.check(body, "")
    ids: list[uuid.UUID] = checked.get("ids", [])
    return ids

