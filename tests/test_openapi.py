"""The OpenAPI document: served without a token, lists exactly the app's routes, and Schemathesis
finds every answer of the running app conforming to it (no 5xx, statuses, headers and bodies as
documented)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import falcon
import falcon.inspect
import falcon.testing
import pytest
import schemathesis
from psycopg_pool import ConnectionPool
from schemathesis.config import SchemathesisConfig

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service.app import create_app
from service.event_hub import EventHub
from service.openapi import OPENAPI_PATH, build_openapi
from service.resources.docs import DOCS_PATH, STYLESHEET_PATH

# NOTE: the document depends on settings only through limits; the test app uses the defaults.
DOCUMENT = build_openapi(Settings(database_url="", direct_database_url="", provider_url="",
                                  provider_api_key="", provider_model=""))

# NOTE: bounded and deterministic, so the run costs the same few seconds every time. The
# positive check also accepts 422 (a well-formed parent_id that names no entity of the org, on
# POST /prompt) and 400 (a `since` of the documented shape that names no real instant, such as
# February 30th): no schema can say which ids exist or which dates are real. Both answers are
# documented for those operations, so status_code_conformance still holds everywhere.
CONFIG = SchemathesisConfig.from_dict({
    "seed": 20261130,
    "generation": {"max-examples": 30, "deterministic": True, "database": "none"},
    "suppress-health-check": ["all"],
    "checks": {"positive_data_acceptance": {
        "expected-statuses": ["2xx", "400", "401", "404", "409", "422", "429"]}},
})



class AppUnderTest:
    """The WSGI app Schemathesis calls in process; each test plugs in an app built on its
    fixtures, and the token of that test's caller."""

    target: Any = None
    token: str | None = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        return self.target(environ, start_response)


APP = AppUnderTest()
_loaded = schemathesis.openapi.from_dict(DOCUMENT, config=CONFIG)
_loaded.app = APP


# NOTE: the token goes through Schemathesis' auth hook, not fixed headers, so the cases that
# deliberately omit or spoil the credentials (negative security tests) are sent without it.
@_loaded.auth(refresh_interval=None)
class BearerToken:
    """Hands Schemathesis the current test's token."""

    def get(self, case: Any, context: Any) -> str | None:
        return APP.token

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


# NOTE: an event stream never ends, so it cannot be fetched whole; tests/test_sse.py covers it.
schema = _loaded.exclude(path="/sa-core/v1/mission/events")


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
    # NOTE: HTML pages and their assets are not API operations.
    served = {(m.method.lower(), _template(route.path))
              for route in falcon.inspect.inspect_routes(app)
              for m in route.methods if not m.internal and route.path not in (DOCS_PATH, STYLESHEET_PATH)}
    documented = {(method, path) for path, item in DOCUMENT["paths"].items() for method in item}
    assert served - documented == set(), "document these routes in service/openapi.py"
    assert documented - served == set(), "these documented routes are not served"


def test_every_operation_documents_its_errors_as_json_title_and_description() -> None:
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            secured = operation.get("security", DOCUMENT["security"]) != []
            codes = set(operation["responses"])
            assert not secured or "401" in codes, (method, path)
            for code, answer in operation["responses"].items():
                if code.startswith(("4", "5")):
                    assert answer["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/Error"}, (method, path, code)


@pytest.fixture
def app_under_test(settings: Settings, pool: ConnectionPool[DictConnection],
                   auth: dict[str, str]) -> Iterator[Any]:
    hub = EventHub.from_settings(pool, settings)
    APP.target, APP.token = create_app(settings, pool, hub=hub), auth["Authorization"].split()[1]
    yield APP
    APP.target = APP.token = None
    hub.stop()


@schema.parametrize()
def test_the_app_conforms_to_its_document(case: Any, app_under_test: Any) -> None:
    case.call_and_validate()
