"""The front door's routes, added to the app in one call."""

from __future__ import annotations

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service.events.hub import EventHub
from service.openai.batches import BatchCancel, BatchCollection, BatchItem
from service.openai.chat import ChatCompletions
from service.openai.errors import OPENAI_PREFIX
from service.openai.files import FileCollection, FileContent, FileItem
from service.openai.models import ModelItem, Models
from service.openai.waits import WaitGate
from service.waits import Waits

__all__ = ["OPENAI_ROUTES", "add_openai_routes"]

OPENAI_ROUTES = frozenset({
    ("post", f"{OPENAI_PREFIX}/chat/completions"),
    ("get", f"{OPENAI_PREFIX}/models"),
    ("get", f"{OPENAI_PREFIX}/models/{{model}}"),
    ("post", f"{OPENAI_PREFIX}/files"),
    ("get", f"{OPENAI_PREFIX}/files"),
    ("get", f"{OPENAI_PREFIX}/files/{{file_id}}"),
    ("delete", f"{OPENAI_PREFIX}/files/{{file_id}}"),
    ("get", f"{OPENAI_PREFIX}/files/{{file_id}}/content"),
    ("post", f"{OPENAI_PREFIX}/batches"),
    ("get", f"{OPENAI_PREFIX}/batches"),
    ("get", f"{OPENAI_PREFIX}/batches/{{batch_id}}"),
    ("post", f"{OPENAI_PREFIX}/batches/{{batch_id}}/cancel"),
})
"""(method, path) of every route of the front door. NOTE: they follow OpenAI's own published
API, not sa-core's OpenAPI document (docs/openai.md lists them and what each maps to)."""


def add_openai_routes(app: falcon.App[falcon.Request, falcon.Response],
                      pool: ConnectionPool[DictConnection], settings: Settings,
                      hub: EventHub, waits: Waits) -> WaitGate:
    """Adds every route of the front door; returns the gate of its held requests."""
    gate = WaitGate(settings.openai_max_waiting, settings.openai_max_waiting_per_token)
    routes = settings.routes
    app.add_route(f"{OPENAI_PREFIX}/chat/completions", ChatCompletions(pool, settings, hub, gate, waits))
    app.add_route(f"{OPENAI_PREFIX}/models", Models(routes))
    app.add_route(f"{OPENAI_PREFIX}/models/{{model}}", ModelItem(routes))
    app.add_route(f"{OPENAI_PREFIX}/files", FileCollection(pool, settings))
    app.add_route(f"{OPENAI_PREFIX}/files/{{file_id}}", FileItem(pool))
    app.add_route(f"{OPENAI_PREFIX}/files/{{file_id}}/content", FileContent(pool))
    app.add_route(f"{OPENAI_PREFIX}/batches", BatchCollection(pool, settings))
    app.add_route(f"{OPENAI_PREFIX}/batches/{{batch_id}}", BatchItem(pool))
    app.add_route(f"{OPENAI_PREFIX}/batches/{{batch_id}}/cancel", BatchCancel(pool))
    return gate
