"""Tenancy, route by route: a token of another org and a token of another user of the same org
try every scoped route on the owner's objects. Another org gets 404 (exactly like a missing
object) and changes nothing; a teammate shares the org's prompts and jobs (docs/api.md: Tenancy)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.inspect
import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import create_token
from service.auth import API_PREFIX, PUBLIC_ROUTES
from service.openai.routes import OPENAI_ROUTES
from tests.helpers import WorkerHarness, fetch_one, submit


@dataclass
class World:
    """The owner's (org 1, user 10) objects, and the two other callers' headers."""

    owner: dict[str, str]
    teammate: dict[str, str]
    stranger: dict[str, str]
    done_prompt: str
    done_job: str
    response: str
    queued_prompt: str
    queued_job: str

    def fill(self, template: str) -> str:
        return template.format(**vars(self))


@pytest.fixture
def world(client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
          pool: ConnectionPool[DictConnection]) -> World:
    done = submit(client, auth, text="owner's finished prompt")
    workers.build().run(once=True)
    response = fetch_one(pool, "SELECT response_id FROM sa_job WHERE id = %s", done["job_id"])
    queued = submit(client, auth, text="owner's queued prompt")
    post = client.simulate_post(f"{API_PREFIX}/prompt", json={"text": "owner's keyed prompt"},
                                headers={**auth, "Idempotency-Key": "owner-key"})
    assert post.status_code == 202
    return World(
        owner=auth,
        teammate={"Authorization": f"Bearer {create_token(pool, 1, 11)}"},
        stranger={"Authorization": f"Bearer {create_token(pool, 2, 20)}"},
        done_prompt=done["prompt_id"], done_job=done["job_id"],
        response=str(response["response_id"]),
        queued_prompt=queued["prompt_id"], queued_job=queued["job_id"],
    )


Check = Callable[[falcon.testing.Result, World], None]


def _sees_no_items(result: falcon.testing.Result, w: World) -> None:
    assert {i["prompt_id"] for i in result.json["items"]} & {w.done_prompt, w.queued_prompt} == set()


def _sees_items(result: falcon.testing.Result, w: World) -> None:
    assert {w.done_prompt, w.queued_prompt} <= {i["prompt_id"] for i in result.json["items"]}


def _not_a_replay(result: falcon.testing.Result, w: World) -> None:
    assert "idempotent-replayed" not in result.headers


def _cancelled(result: falcon.testing.Result, w: World) -> None:
    assert result.json["state"] == "cancelled" and result.json["created_by"] == 10


def _supersedes_the_owners_job(result: falcon.testing.Result, w: World) -> None:
    assert result.json["supersedes"] == w.done_job


def _is_caller(org_id: int, user_id: int) -> Check:
    def check(result: falcon.testing.Result, w: World) -> None:
        assert (result.json["org_id"], result.json["user_id"]) == (org_id, user_id)
    return check


def _spend_of(org_id: int) -> Check:
    def check(result: falcon.testing.Result, w: World) -> None:
        assert result.json["org_id"] == org_id
    return check


@dataclass(frozen=True)
class Case:
    """One scoped route: what a stranger (org 2) and a teammate (org 1, user 11) get."""

    name: str
    method: str
    route: str  # Falcon's uri_template, as inspect_routes reports it
    path: str
    stranger: int
    teammate: int
    body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    stranger_check: Check | None = None
    teammate_check: Check | None = None


P = API_PREFIX
CASES = [
    Case("submit continuing my thread", "POST", f"{P}/prompt", f"{P}/prompt", 422, 202,
         body={"text": "reply", "parent_id": "{done_prompt}"}),
    Case("submit under my idempotency key", "POST", f"{P}/prompt", f"{P}/prompt", 202, 202,
         body={"text": "their own prompt"}, headers={"Idempotency-Key": "owner-key"},
         stranger_check=_not_a_replay, teammate_check=_not_a_replay),
    Case("submit after my job", "POST", f"{P}/prompt", f"{P}/prompt", 422, 202,
         body={"text": "next step", "after": "{queued_job}"}),
    Case("submit a batch continuing my thread", "POST", f"{P}/prompts/batch",
         f"{P}/prompts/batch", 422, 202,
         body={"prompts": [{"text": "mine"}, {"text": "reply", "parent_id": "{done_prompt}"}]}),
    Case("read my job", "GET", f"{P}/jobs/{{job_id:uuid}}", f"{P}/jobs/{{queued_job}}", 404, 200),
    Case("cancel my job", "POST", f"{P}/jobs/{{job_id:uuid}}/cancel",
         f"{P}/jobs/{{queued_job}}/cancel", 404, 200, teammate_check=_cancelled),
    Case("read my prompt", "GET", f"{P}/prompts/{{prompt_id:uuid}}", f"{P}/prompts/{{done_prompt}}",
         404, 200),
    Case("read my response as a prompt", "GET", f"{P}/prompts/{{prompt_id:uuid}}",
         f"{P}/prompts/{{response}}", 404, 404),
    Case("read my response", "GET", f"{P}/responses/{{response_id:uuid}}",
         f"{P}/responses/{{response}}", 404, 200),
    Case("read my prompt as a response", "GET", f"{P}/responses/{{response_id:uuid}}",
         f"{P}/responses/{{done_prompt}}", 404, 404),
    Case("retry my prompt", "POST", f"{P}/prompts/{{prompt_id:uuid}}/retry",
         f"{P}/prompts/{{done_prompt}}/retry", 404, 202, teammate_check=_supersedes_the_owners_job),
    Case("poll the feed", "GET", f"{P}/mission/recent", f"{P}/mission/recent", 200, 200,
         stranger_check=_sees_no_items, teammate_check=_sees_no_items),
    Case("poll the org's feed", "GET", f"{P}/mission/recent", f"{P}/mission/recent?scope=org",
         200, 200, stranger_check=_sees_no_items, teammate_check=_sees_items),
    Case("load the page's snapshot", "GET", f"{P}/mission/prompts", f"{P}/mission/prompts", 200,
         200, stranger_check=_sees_no_items, teammate_check=_sees_no_items),
    Case("load the org's snapshot", "GET", f"{P}/mission/prompts",
         f"{P}/mission/prompts?scope=org", 200, 200, stranger_check=_sees_no_items,
         teammate_check=_sees_items),
    Case("see who I am", "GET", f"{P}/session", f"{P}/session", 200, 200,
         stranger_check=_is_caller(2, 20), teammate_check=_is_caller(1, 11)),
    Case("see my org's spend and budgets", "GET", f"{P}/usage", f"{P}/usage", 200, 200,
         stranger_check=_spend_of(2), teammate_check=_spend_of(1)),
    Case("read the operator view without the ops scope", "GET", f"{P}/ops/overview",
         f"{P}/ops/overview", 403, 403),
    Case("cancel as an operator without the ops scope", "POST",
         f"{P}/ops/jobs/{{job_id:uuid}}/cancel", f"{P}/ops/jobs/{{queued_job}}/cancel", 403, 403),
    Case("retry as an operator without the ops scope", "POST",
         f"{P}/ops/jobs/{{job_id:uuid}}/retry", f"{P}/ops/jobs/{{done_job}}/retry", 403, 403),
    # NOTE: the operator console's routes: every org's jobs, so the ops scope or nothing.
    Case("explore every org's jobs without the ops scope", "GET", f"{P}/ops/jobs",
         f"{P}/ops/jobs?org=1", 403, 403),
    Case("count every org's jobs without the ops scope", "GET", f"{P}/ops/jobs/count",
         f"{P}/ops/jobs/count?org=1", 403, 403),
    Case("read a job's history without the ops scope", "GET", f"{P}/ops/jobs/{{job_id:uuid}}",
         f"{P}/ops/jobs/{{done_job}}", 403, 403),
    Case("bulk cancel without the ops scope", "POST", f"{P}/ops/bulk/cancel",
         f"{P}/ops/bulk/cancel?org=1&max_jobs=10", 403, 403),
    Case("bulk retry without the ops scope", "POST", f"{P}/ops/bulk/retry",
         f"{P}/ops/bulk/retry", 403, 403, body={"ids": ["{done_job}"]}),
    Case("read the operators' log without the ops scope", "GET", f"{P}/ops/actions",
         f"{P}/ops/actions", 403, 403),
    Case("read the routes without the ops scope", "GET", f"{P}/ops/routes", f"{P}/ops/routes",
         403, 403),
    Case("pause a route without the ops scope", "POST", f"{P}/ops/routes/pause",
         f"{P}/ops/routes/pause", 403, 403, body={"route": "default", "seconds": 60}),
    Case("resume a route without the ops scope", "POST", f"{P}/ops/routes/resume",
         f"{P}/ops/routes/resume", 403, 403, body={"route": "default"}),
    Case("read the workers without the ops scope", "GET", f"{P}/ops/workers", f"{P}/ops/workers",
         403, 403),
    Case("read the charts without the ops scope", "GET", f"{P}/ops/charts", f"{P}/ops/charts",
         403, 403),
]

# NOTE: the event stream never ends, so it is proven where streams are read concurrently:
# tests/test_sse.py::test_a_client_never_sees_another_users_or_another_orgs_events (each
# caller, teammate and stranger alike, receives its own jobs' events only).
# Opening and closing a session acts on the caller's own token only, whatever its org:
# tests/test_mission_auth.py proves a session acts for its own token's org and user, and ends.
DELEGATED = {("GET", f"{P}/mission/events"), ("POST", f"{P}/session"), ("DELETE", f"{P}/session")}
# The OpenAI-compatible front door: tests/test_openai_batches.py proves, through the SDK, that
# another org's file, its content and its batch answer 404 (retrieve, cancel, delete, a batch
# from it) and that its lists are empty; a chat request makes the caller's own job, and the
# models hold nothing of an org.
DELEGATED |= {(method.upper(), path) for method, path in OPENAI_ROUTES}


def _state(pool: ConnectionPool[DictConnection]) -> dict[str, Any]:
    return fetch_one(pool, "SELECT (SELECT count(*) FROM sa_job) AS jobs, "
                           "(SELECT count(*) FROM sa_entity) AS entities, "
                           "(SELECT string_agg(state, ',' ORDER BY created_at, id) FROM sa_job) AS states")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_another_org_gets_404_and_changes_nothing(
    client: falcon.testing.TestClient, world: World, pool: ConnectionPool[DictConnection], case: Case,
) -> None:
    before = _state(pool)
    body = _fill(case.body, world)
    result = client.simulate_request(case.method, world.fill(case.path), json=body,
                                     headers={**world.stranger, **(case.headers or {})})
    assert result.status_code == case.stranger, result.text
    if case.stranger == 404:
        missing = client.simulate_request(case.method, _missing(world.fill(case.path)), json=body,
                                          headers=world.owner)
        assert missing.status_code == 404
        assert result.json["title"] == missing.json["title"] == "Not found"
    if case.stranger_check is not None:
        case.stranger_check(result, world)
    if case.stranger >= 400 or case.method == "GET":
        assert _state(pool) == before


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_teammate_shares_the_orgs_prompts_and_jobs(
    client: falcon.testing.TestClient, world: World, pool: ConnectionPool[DictConnection], case: Case,
) -> None:
    result = client.simulate_request(case.method, world.fill(case.path), json=_fill(case.body, world),
                                     headers={**world.teammate, **(case.headers or {})})
    assert result.status_code == case.teammate, result.text
    if case.teammate_check is not None:
        case.teammate_check(result, world)


def test_every_scoped_route_has_a_tenancy_case(client: falcon.testing.TestClient) -> None:
    app = client.app
    assert isinstance(app, falcon.App)
    served = set()
    for route in falcon.inspect.inspect_routes(app):
        if route.path in PUBLIC_ROUTES:
            continue
        served |= {(m.method, route.path) for m in route.methods if not m.internal}
    covered = {(c.method, c.route) for c in CASES} | DELEGATED
    assert served - covered == set(), "add a tenancy case for these routes"
    assert covered - served == set(), "these cases name routes the app no longer serves"


def _fill(body: dict[str, Any] | None, world: World) -> dict[str, Any] | None:
    if body is None:
        return None
    return {k: _fill_value(v, world) for k, v in body.items()}


def _fill_value(value: Any, world: World) -> Any:
    if isinstance(value, str):
        return world.fill(value)
    if isinstance(value, dict):
        return _fill(value, world)
    if isinstance(value, list):
        return [_fill_value(item, world) for item in value]
    return value


def _missing(path: str) -> str:
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", str(uuid.uuid4()), path)
