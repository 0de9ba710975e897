"""The OpenAPI document: served without a token, lists exactly the app's routes, and Schemathesis,
with every phase (examples, coverage, fuzzing, stateful through the document's links) and every
check, finds every answer of the running app conforming to it: no 5xx; statuses, headers and
bodies as documented; schema-valid requests accepted and schema-invalid ones refused; every SSE
event (its `data:` included) as its schema says."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import falcon
import falcon.inspect
import falcon.testing
import hypothesis
import pytest
import schemathesis
from hypothesis.stateful import run_state_machine_as_test
from psycopg_pool import ConnectionPool
from schemathesis.config import SchemathesisConfig

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service.app import create_app
from service.event_hub import EventHub
from service.openapi import OPENAPI_PATH, build_openapi

# NOTE: the document depends on settings only through limits; the test app uses the defaults.
DOCUMENT = build_openapi(Settings(database_url="", direct_database_url="", provider_url="",
                                  provider_api_key="", provider_model=""))
EVENTS_PATH = "/sa-core/v1/mission/events"

# NOTE: bounded and deterministic, so the run costs the same few seconds every time. The one
# schema-valid request the app may refuse is POST /prompt with a well-formed parent_id that names
# no entity of the caller's org (422): no schema can say which ids exist. Nothing else is
# tolerated: a schema-valid `since`, body or header is answered 2xx (or 404/409 for an object
# that is missing or in the wrong state, as documented).
CONFIG = SchemathesisConfig.from_dict({
    "seed": 20261130,
    "generation": {"max-examples": 25, "deterministic": True, "database": "none"},
    "suppress-health-check": ["all"],
    "checks": {"max_response_time": 5.0},
    "phases": {"stateful": {"max-steps": 12}},
    "operations": [{
        "include-operation-id": "submitPrompt",
        "checks": {"positive_data_acceptance": {
            "expected-statuses": ["2xx", "401", "404", "422"]}},
    }],
})


def _until_idle(body: Iterable[bytes]) -> Iterator[bytes]:
    """An event stream up to its first keepalive: what it sends at once (the replay, the
    current position), so a stream that never ends can be fetched whole."""
    try:
        for chunk in body:
            yield chunk
            if chunk == b": keepalive\n\n":
                return
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()


class AppUnderTest:
    """The WSGI app Schemathesis calls in process; each test plugs in an app built on its
    fixtures, and the token of that test's caller."""

    target: Any = None
    token: str | None = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        body = self.target(environ, start_response)
        return _until_idle(body) if environ.get("PATH_INFO") == EVENTS_PATH else body


APP = AppUnderTest()
schema = schemathesis.openapi.from_dict(DOCUMENT, config=CONFIG)
schema.app = APP

# NOTE: the token goes through Schemathesis' auth hook, not fixed headers, so the cases that
# deliberately omit or spoil the credentials (negative security tests) are sent without it.
@schema.auth(refresh_interval=None)
class BearerToken:
    """Hands Schemathesis the current test's token."""

    def get(self, case: Any, context: Any) -> str | None:
        return APP.token

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


def _template(path: str) -> str:
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def test_the_document_is_served_without_a_token(client: falcon.testing.TestClient) -> None:
    result = client.simulate_get(OPENAPI_PATH)
    assert result.status_code == 200
    assert result.json["openapi"] == "3.1.0"
    assert result.json == json.loads(json.dumps(DOCUMENT)), "the schema Schemathesis runs is the served one"


def test_every_route_is_documented_and_every_documented_route_is_served(
    client: falcon.testing.TestClient,
) -> None:
    app = client.app
    assert isinstance(app, falcon.App)
    served = {(m.method.lower(), _template(route.path))
              for route in falcon.inspect.inspect_routes(app)
              for m in route.methods if not m.internal}
    documented = {(method, path) for path, item in DOCUMENT["paths"].items() for method in item}
    assert served - documented == set(), "document these routes in service/openapi.py"
    assert documented - served == set(), "these documented routes are not served"


@pytest.fixture
def app_under_test(settings: Settings, pool: ConnectionPool[DictConnection],
                   auth: dict[str, str]) -> Iterator[Any]:
    # NOTE: a short keepalive ends a fetched stream soon after what it sends at once; the hub is
    # ready before the first case, so every stream gets that far.
    settings = replace(settings, sse_keepalive=0.05)
    hub = EventHub.from_settings(pool, settings)
    hub.ensure_started()
    assert hub.wait_ready(10.0) is not None
    app = create_app(settings, pool, hub=hub)
    # NOTE: a prompt with a cancelled job, so the feeds have events to replay and page.
    client = falcon.testing.TestClient(app)
    submitted = client.simulate_post("/sa-core/v1/prompt", json={"text": "hello"}, headers=auth)
    client.simulate_post(f"/sa-core/v1/jobs/{submitted.json['job_id']}/cancel", headers=auth)
    APP.target, APP.token = app, auth["Authorization"].split()[1]
    yield APP
    APP.target = APP.token = None
    hub.stop()


@schema.parametrize()
def test_the_app_conforms_to_its_document(case: Any, app_under_test: Any) -> None:
    case.call_and_validate()


def test_sequences_of_calls_along_the_documents_links_conform(app_under_test: Any) -> None:
    """Stateful phase: from POST /prompt's answer to the job and prompt routes it links."""
    run_state_machine_as_test(schema.as_state_machine(), settings=hypothesis.settings(
        max_examples=15, stateful_step_count=6, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(hypothesis.HealthCheck)))
