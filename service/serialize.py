"""JSON encoding for rows that hold UUIDs and timestamps, strict JSON decoding, JSON errors."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import falcon
import falcon.media

from jobqueue.core.jsonable import json_default
from service.openai.errors import OPENAI_PREFIX, serialize_openai_error

__all__ = ["json_handler", "serialize_error"]

# NOTE: Falcon's own errors (no route, method not allowed) carry no description; every error
# body still has one, and a path that names nothing (a malformed id included) reads like a
# missing object.
_FALLBACK: dict[int, tuple[str, str]] = {
    404: ("Not found", "Nothing exists at this path (or not in your organization)."),
    405: ("Method not allowed", "This route does not take this method; see the Allow header."),
}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    """json.loads, strict: NaN and Infinity are refused, and a document nested too deeply to
    parse is malformed input (400), not a crash (RecursionError is no ValueError)."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def json_handler() -> falcon.media.JSONHandler:
    """Returns Falcon's JSON handler taught to write UUIDs and ISO 8601 timestamps."""
    return falcon.media.JSONHandler(
        dumps=partial(json.dumps, default=json_default, separators=(",", ":")),
        loads=_loads,
    )


def serialize_error(req: falcon.Request, resp: falcon.Response, exception: falcon.HTTPError) -> None:
    """Writes every error as JSON `{title, description}`, whatever the request's Accept header says.

    Under /openai/v1 it is OpenAI's shape instead, so an SDK reads every refusal it gets there.
    """
    if req.path.startswith(OPENAI_PREFIX + "/") or req.path == OPENAI_PREFIX:
        serialize_openai_error(req, resp, exception)
        return
    title, description = exception.title, exception.description
    if description is None:
        title, description = _FALLBACK.get(exception.status_code, (title, title))
    resp.content_type = falcon.MEDIA_JSON
    resp.data = json.dumps({"title": title, "description": description},
                           separators=(",", ":")).encode()
