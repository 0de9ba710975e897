"""OpenAI's error shape for every answer under /openai/v1, the middleware's refusals included."""

from __future__ import annotations

import json
from collections.abc import Mapping

import falcon

from jobqueue.core.openai_wire import Body, error_body

__all__ = ["OPENAI_PREFIX", "OpenAIError", "bad_request", "not_found", "serialize_openai_error"]

OPENAI_PREFIX = "/openai/v1"

# NOTE: the `type` (and `code`) OpenAI's own answers carry for each status, for errors raised
# with Falcon's or sa-core's own types (auth, body limits, domain errors).
_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", None),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("invalid_request_error", "request_timeout"),
    409: ("invalid_request_error", "conflict"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    422: ("invalid_request_error", None),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("api_error", "service_unavailable"),
}


class OpenAIError(falcon.HTTPError):
    """An error answered in OpenAI's shape, with its own type, code and param."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None,
                 headers: Mapping[str, str] | None = None, body: Body | None = None) -> None:
        super().__init__(falcon.code_to_http_status(status), title=type_, description=message,
                         headers=dict(headers) if headers else None)
        self.body = body or error_body(message, type_, code, param)


def bad_request(message: str, param: str | None = None,
                code: str | None = "invalid_value") -> OpenAIError:
    """A 400 `invalid_request_error` naming the parameter at fault."""
    return OpenAIError(400, message, code=code, param=param)


def not_found(what: str, object_id: str, param: str = "id") -> OpenAIError:
    """The 404 for a missing object, another org's included (they look the same)."""
    return OpenAIError(404, f"No such {what}: {object_id}", param=param)


def serialize_openai_error(req: falcon.Request, resp: falcon.Response,
                           exception: falcon.HTTPError) -> None:
    """Writes `{"error": {"message", "type", "param", "code"}}` for any error of the front door."""
    body = getattr(exception, "body", None)
    if not isinstance(body, dict):
        type_, code = _TYPES.get(exception.status_code, ("api_error", None))
        message = exception.description or exception.title or "error"
        body = error_body(str(message), type_, code)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = json.dumps(body, separators=(",", ":")).encode()
