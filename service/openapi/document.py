"""Assembles the OpenAPI document from the operations' declarations, and serves it."""

from __future__ import annotations

from typing import Any

import falcon

from jobqueue.core.settings import Settings
from service.openapi.build import operation_object, request_components
from service.openapi.components import answer_schemas
from service.openapi.operations import OPENAPI_PATH, operations

__all__ = ["OPENAPI_PATH", "OpenApiDocument", "build_openapi"]


def build_openapi(settings: Settings) -> dict[str, Any]:
    """Returns the document for the app built with `settings` (limits come from there)."""
    declared = operations(settings)
    paths: dict[str, dict[str, Any]] = {}
    for op in declared:
        paths.setdefault(op.path, {})[op.method] = operation_object(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sa-core",
            "version": "1",
            "description": (
                "Asynchronous prompt execution. Every route under /sa-core/v1 (but this document) "
                "needs `Authorization: Bearer <token>`. Errors are JSON `{title, description}`. "
                "Another org's objects answer 404, exactly like missing ones; members of one org "
                "share its prompts and jobs (see the README's Tenancy section). Request bodies "
                "must be `application/json`, at most SA_MAX_BODY_BYTES."),
        },
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": {**request_components(declared), **answer_schemas(settings)},
        },
    }


class OpenApiDocument:
    """Serves the document (no token needed)."""

    def __init__(self, document: dict[str, Any]) -> None:
        self._document = document

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the document."""
        resp.media = self._document
