"""The OpenAPI document: served without a token, lists exactly the app's routes, and Schemathesis,
with every phase (examples, coverage, fuzzing, stateful through the document's links) and every
check, finds every answer of the running app conforming to it: no 5xx; statuses, headers and
bodies as documented; schema-valid requests accepted and schema-invalid ones refused; every SSE
event (its `data:` included) as its schema says."""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import falcon
import falcon.inspect
import falcon.testing
import pytest
import schemathesis
from psycopg_pool import ConnectionPool
from schemathesis.config import SchemathesisConfig
from schemathesis.generation import GenerationMode
from schemathesis.transport.wsgi import WSGI_TRANSPORT

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service.app import create_app
from service.auth import API_PREFIX, PAGE_ROUTES
from service.contract import IDEMPOTENCY_KEY, PREFER
from service.events.hub import EventHub
from service.openai.errors import OPENAI_PREFIX
from service.openai.routes import OPENAI_ROUTES
from service.openapi.document import OPENAPI_PATH, build_openapi
from service.schema import INSTANT_PATTERN, UUID_PATTERN

# NOTE: the document depends on settings only through limits, and this module's app is built
# with a small prompt bound: Schemathesis folds a string's maxLength into its pattern, and
# compiling that pattern for 100,000 characters (the default) took 30 s of every run.
TEXT_CHARS = 2000
DOCUMENT = build_openapi(Settings(database_url="", direct_database_url="", provider_url="",
                                  provider_api_key="", provider_model="",
                                  max_prompt_chars=TEXT_CHARS))
EVENTS_PATH = f"{API_PREFIX}/mission/events"
UUID_RE = re.compile(UUID_PATTERN)
INSTANT_RE = re.compile(INSTANT_PATTERN)
PREFER_RE = re.compile(PREFER.schema["pattern"])
KEY_RE = re.compile(IDEMPOTENCY_KEY.schema["pattern"])
MAX_KEY_LENGTH = IDEMPOTENCY_KEY.schema["maxLength"]

# NOTE: bounded and deterministic, so the run costs the same few seconds every time. Nothing is
# tolerated: a schema-valid request is answered 2xx, or 401/404 (no or another org's object) as
# documented; what no schema can vouch for (which ids exist, which keys were used) is made real
# (_known_state).
CONFIG_DATA: dict[str, Any] = {
    "seed": 20261130,
    "generation": {"max-examples": 25, "deterministic": True, "database": "none"},
    "suppress-health-check": ["all"],
    "checks": {"max_response_time": 5.0},
}
PHASES = ("examples", "coverage", "fuzzing", "stateful")
SUBMIT = f"POST {API_PREFIX}/prompt"
BATCH = f"POST {API_PREFIX}/prompts/batch"


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
    prompt_id: str | None = None
    waiting_job: Callable[[], str] | None = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        body = self.target(environ, start_response)
        return _until_idle(body) if environ.get("PATH_INFO") == EVENTS_PATH else body


APP = AppUnderTest()
# NOTE: every operation of the document, as "METHOD /path": the conformance test's ids. Read from
# the document, not from Schemathesis' cases, so collection is instant and every xdist worker
# collects the same list.
OPERATIONS = sorted(f"{method.upper()} {path}" for path, item in DOCUMENT["paths"].items()
                    for method in item if method in ("get", "put", "post", "delete", "patch"))


def _phases(*enabled: str) -> dict[str, Any]:
    """CONFIG_DATA with only these phases enabled."""
    data = copy.deepcopy(CONFIG_DATA)
    data["phases"] = {phase: {"enabled": phase in enabled} for phase in PHASES}
    return data


# NOTE: copies, since Schemathesis annotates the dict it is given. `schema` runs the examples,
# coverage and fuzzing phases, one operation per test; `stateful` runs that phase alone. Both
# through Schemathesis' engine inside the test: its cases are built when the test runs, not at
# collection (the coverage phase's cases took 30 s to build there).
schema = schemathesis.openapi.from_dict(
    copy.deepcopy(DOCUMENT), config=SchemathesisConfig.from_dict(_phases("examples", "coverage", "fuzzing")))
schema.app = APP
STATEFUL = _phases("stateful")
STATEFUL["phases"]["stateful"]["max-steps"] = 12
# NOTE: without the operator routes (/ops/): they have no links to follow and answer 403 to the
# test's token (no `ops` scope), so in a sequence they only spend the steps the linked routes
# need (with the console's ten routes the retry was no longer reached in 12 steps). Each is
# still run alone by the test above, and tests/test_ops_console.py calls them with the scope.
stateful = schemathesis.openapi.from_dict(copy.deepcopy(DOCUMENT),
                                          config=SchemathesisConfig.from_dict(STATEFUL)
                                          ).exclude(path_regex=f"^{API_PREFIX}/ops/")
stateful.app = APP

# NOTE: the token goes through Schemathesis' auth hook, not fixed headers, so the cases that
# deliberately omit or spoil the credentials (negative security tests) are sent without it.
@schema.auth(refresh_interval=None)
class BearerToken:
    """Hands Schemathesis the current test's token."""

    def get(self, case: Any, context: Any) -> str | None:
        return APP.token

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


def _known_prompt(body: Any) -> Any:
    """One prompt's body with what only the database or the clock can vouch for made real."""
    if not isinstance(body, dict):
        return body
    if isinstance(body.get("parent_id"), str) and UUID_RE.fullmatch(body["parent_id"]):
        body = {**body, "parent_id": APP.prompt_id}
    if isinstance(body.get("after"), str) and UUID_RE.fullmatch(body["after"]) and APP.waiting_job:
        body = {**body, "after": APP.waiting_job()}
    options = body.get("options")
    if isinstance(options, dict) and isinstance(options.get("prefer_provider"), str):
        body = {**body, "options": {**options, "prefer_provider": "default"}}
    if isinstance(body.get("run_at"), str) and INSTANT_RE.fullmatch(body["run_at"]):
        body = {**body, "run_at": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}
    return body


def _known_state(case: Any) -> None:
    """Makes real what only the database or the clock can vouch for, on POST /prompt and POST
    /prompts/batch: a well-formed `parent_id` names the test's own prompt and `after` a job of
    its org queued at that moment, made for the call (a made-up one, or one cancelled or
    superseded, is a 422 by design: the stateful engine infers links from the job ids of GET
    /mission/recent and GET /jobs/{job_id} to the cancel and retry routes, so a job made once
    could end before a later step names it), a well-formed `run_at` is an hour ahead (a past one
    is a 422 by design), a `prefer_provider` names the test's one route, `default` (a name no
    route has is a 422 by design, tested in tests/test_route_costs.py), and a well-formed
    Idempotency-Key is a fresh one (reused with another body it is a 422 by design).
    These 422s are tested in tests/test_validation.py, tests/test_scheduled.py and
    tests/test_idempotency.py. A well-formed `Prefer: wait=N` (or any, in a case meant valid:
    _positive) becomes wait=0: with no worker here, every call would hold N seconds (waiting is
    tested in tests/test_wait.py)."""
    if case.operation.label not in (SUBMIT, BATCH):
        return
    body = case.body
    if case.operation.label == SUBMIT:
        case.body = _known_prompt(body)
    elif isinstance(body, dict) and isinstance(body.get("prompts"), list):
        case.body = {**body, "prompts": [_known_prompt(item) for item in body["prompts"]]}
    key = (case.headers or {}).get(IDEMPOTENCY_KEY.name)
    if isinstance(key, str) and KEY_RE.fullmatch(key) and len(key) <= MAX_KEY_LENGTH:
        case.headers = {**case.headers, IDEMPOTENCY_KEY.name: str(uuid.uuid4())}
    prefer = (case.headers or {}).get(PREFER.name)
    if isinstance(prefer, str) and (PREFER_RE.fullmatch(prefer) or _positive(case)):
        case.headers = {**case.headers, PREFER.name: "wait=0"}


def _positive(case: Any) -> bool:
    """Whether Schemathesis made `case` to be schema-valid. NOTE: its coverage phase's
    "All required properties and optional 'Prefer'" case (Schemathesis 4.32.5) sends `Prefer: 0`
    as valid, ignoring the header's pattern; the app's 400 to it is right."""
    return case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE


stateful.auth(refresh_interval=None)(BearerToken)


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Every call, from pytest or the engine, first gets _known_state."""
    _known_state(case)


def _template(path: str) -> str:
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


@pytest.fixture
def settings(base_settings: Settings) -> Settings:
    """This module's app: the one the document above describes."""
    return replace(base_settings, max_prompt_chars=TEXT_CHARS)


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
    # NOTE: the pages are HTML for browsers, not API operations; the OpenAI-compatible front
    # door follows OpenAI's own published API (docs/openai.md), checked against its list below.
    served = {(m.method.lower(), _template(route.path))
              for route in falcon.inspect.inspect_routes(app) if route.path not in PAGE_ROUTES
              for m in route.methods if not m.internal}
    openai_served = {(method, path) for method, path in served if path.startswith(OPENAI_PREFIX)}
    assert openai_served == OPENAI_ROUTES, "list the front door's routes in service/openai/routes.py"
    served -= openai_served
    documented = {(method, path) for path, item in DOCUMENT["paths"].items() for method in item}
    assert served - documented == set(), "declare these routes in service/openapi/operations.py"
    assert documented - served == set(), "these documented routes are not served"


# NOTE: socket settings the engine hands every transport; the WSGI transport drops them only when
# it is also handed the engine's requests.Session (schemathesis/transport/wsgi.py, send).
_SOCKET_ONLY = ("max_redirects", "verify", "cert", "proxies")


def _without_socket_settings(send: Callable[..., Any]) -> Callable[..., Any]:
    """The WSGI transport's `send`, dropping the socket settings a call brings without a session.

    NOTE: the fix for the `ignored_auth` check's errors (a TypeError on every probe, Schemathesis
    4.32.5): the check probes an operation without credentials through
    schemathesis/specs/openapi/_auth_retry.py's send_probe, whose build_retry_transport_kwargs
    removes the engine's session (it carries the credentials) but keeps `max_redirects`,
    `verify` and `cert`; with no requests.Session to recognise, WSGITransport.send passes them
    on to werkzeug's Client.open, which has no such arguments. In process, they mean nothing.
    """

    def wrapped(case: Any, *, session: Any = None, **kwargs: Any) -> Any:
        if session is None:
            for name in _SOCKET_ONLY:
                kwargs.pop(name, None)
        return send(case, session=session, **kwargs)

    return wrapped


@pytest.fixture
def app_under_test(settings: Settings, pool: ConnectionPool[DictConnection],
                   auth: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(WSGI_TRANSPORT, "send", _without_socket_settings(WSGI_TRANSPORT.send))
    # NOTE: a short keepalive ends a fetched stream soon after what it sends at once; the hub is
    # ready before the first case, so every stream gets that far.
    settings = replace(settings, sse_keepalive=0.05)
    hub = EventHub.from_settings(pool, settings)
    assert hub.wait_ready(10.0) is not None
    app = create_app(settings, pool, hub=hub)
    client = falcon.testing.TestClient(app)

    def waiting_job() -> str:
        """A job of the caller's org queued now (due in an hour), for one `after` to name."""
        waiting = client.simulate_post(f"{API_PREFIX}/prompt",
                                       json={"text": "later", "delay_seconds": 3600}, headers=auth)
        return str(waiting.json["job_id"])

    # NOTE: one prompt with a cancelled job, so the feeds have events to replay and page.
    submitted = client.simulate_post(f"{API_PREFIX}/prompt", json={"text": "hello"}, headers=auth)
    client.simulate_post(f"{API_PREFIX}/jobs/{submitted.json['job_id']}/cancel", headers=auth)
    APP.target, APP.token, APP.prompt_id = app, auth["Authorization"].split()[1], submitted.json["prompt_id"]
    APP.waiting_job = waiting_job
    waiting_job()  # NOTE: and a job still queued, so the feeds list both kinds.
    yield APP
    APP.target = APP.token = APP.prompt_id = APP.waiting_job = None
    hub.stop()


def _described(info: Any) -> str:
    """A failed check's failure and the command that reproduces it (nothing for a crashed one)."""
    if info is None:
        return "the check raised (no failure recorded)"
    return f"{info.failure.title}: {info.failure.message}\n{info.code_sample}"


def _run(tested: Any) -> tuple[list[tuple[str, object]], set[str]]:
    """Runs Schemathesis' engine on `tested`: the checks that failed or errored (and the engine's
    own errors), and the operations its scenarios reached."""
    failures: list[tuple[str, object]] = []
    reached: set[str] = set()
    for event in schemathesis.engine.from_schema(tested).execute():
        if isinstance(event, schemathesis.engine.events.ScenarioFinished):
            reached.update(case.value.operation.label for case in event.recorder.cases.values())
            failures += [(check.name, _described(check.failure_info))
                         for checks in event.recorder.checks.values()
                         for check in checks
                         if check.status in (schemathesis.engine.Status.FAILURE,
                                             schemathesis.engine.Status.ERROR)]
        elif isinstance(event, (schemathesis.engine.events.NonFatalError,
                                schemathesis.engine.events.FatalError)):
            failures.append(("error", event))
    return failures, reached


@pytest.mark.parametrize("operation", OPERATIONS)
def test_the_app_conforms_to_its_document(operation: str, app_under_test: Any) -> None:
    """The examples, coverage and fuzzing phases on one operation, every check on every case."""
    method, path = operation.split(" ", 1)
    failures, reached = _run(schema.include(method=method, path=path))
    assert not failures, failures
    assert reached == {operation}


def test_sequences_of_calls_along_the_documents_links_conform(app_under_test: Any) -> None:
    """The stateful phase, run by Schemathesis' own engine: from POST /prompt's answer (and the
    feed's, and a prompt's) along the links to the job and prompt routes, every check on every
    step. NOTE: the engine, not Hypothesis' state machine runner: the database answers the same
    scenario differently from one replay to the next (ids, times), which only the engine is
    built to take."""
    failures, reached = _run(stateful)
    assert not failures, failures
    assert {SUBMIT, f"GET {API_PREFIX}/jobs/{{job_id}}", f"POST {API_PREFIX}/jobs/{{job_id}}/cancel",
            f"GET {API_PREFIX}/prompts/{{prompt_id}}",
            f"POST {API_PREFIX}/prompts/{{prompt_id}}/retry"} <= reached
