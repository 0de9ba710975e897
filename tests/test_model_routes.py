"""Model routes (issue 14, item 2): `options.model` picks a provider, its key, auth header style
and query; an unknown model is a 422 at submit; the SA_PROVIDER_* variables stay the default."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.routes import load_routes
from jobqueue.core.settings import Settings, SettingsError
from jobqueue.devtools.fake_provider import FakeConfig, FakeProvider
from service.app import create_app
from tests.helpers import WorkerHarness, fetch_one, submit

API = "/sa-core/v1"
AZURE_KEY = "azure-secret"


@pytest.fixture(scope="module")
def azure() -> Iterator[FakeProvider]:
    with FakeProvider(config=FakeConfig(api_key=AZURE_KEY)) as provider:
        yield provider


def _routes_env(azure: FakeProvider, key: str = AZURE_KEY) -> dict[str, str]:
    routes = {"routes": [{
        "name": "azure", "base_url": f"{azure.url}/openai/deployments/big",
        "api_key_env": "AZURE_TEST_KEY", "auth": "api-key", "query": {"api-version": "2024-06-01"},
        "models": ["gpt-4o", "gpt-4o-bad-key"]}]}
    return {"SA_PROVIDER_ROUTES": json.dumps(routes), "AZURE_TEST_KEY": key}


@pytest.fixture
def settings(base_settings: Settings, azure: FakeProvider) -> Settings:
    return replace(base_settings, provider_routes=load_routes(_routes_env(azure)))


def _sent_to(provider: FakeProvider, text: str) -> bool:
    return any(body["messages"][-1]["content"] == text for body in provider.received)


def test_the_model_picks_the_route_its_key_header_and_query(
        client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
        fake: FakeProvider, azure: FakeProvider) -> None:
    routed = submit(client, auth, text="to azure", options={"model": "gpt-4o"})
    default = submit(client, auth, text="to the default route")
    workers.build().run(once=True)

    for done in (routed, default):
        job = client.simulate_get(f"{API}/jobs/{done['job_id']}", headers=auth).json
        assert job["state"] == "succeeded", job
    # NOTE: the Azure fake answers only with `api-key` and `api-version`: success proves both.
    assert _sent_to(azure, "to azure") and not _sent_to(fake, "to azure")
    assert _sent_to(fake, "to the default route") and not _sent_to(azure, "to the default route")


def test_a_model_no_route_serves_is_a_422_and_nothing_is_stored(
        client: falcon.testing.TestClient, auth: dict[str, str],
        pool: ConnectionPool[DictConnection]) -> None:
    result = client.simulate_post(f"{API}/prompt", headers=auth,
                                  json={"text": "hi", "options": {"model": "claude-9"}})
    assert result.status_code == 422, result.text
    assert result.json["description"].startswith("options.model: no route serves model 'claude-9'")
    assert "gpt-4o" in result.json["description"]
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 0


def test_without_routes_the_default_route_takes_any_model(
        base_settings: Settings, auth: dict[str, str], pool: ConnectionPool[DictConnection]) -> None:
    client = falcon.testing.TestClient(create_app(base_settings, pool))
    result = client.simulate_post(f"{API}/prompt", headers=auth,
                                  json={"text": "hi", "options": {"model": "anything-goes"}})
    assert result.status_code == 202, result.text


def test_a_wrong_key_fails_once_as_auth(client: falcon.testing.TestClient, auth: dict[str, str],
                                        base_settings: Settings, azure: FakeProvider,
                                        pool: ConnectionPool[DictConnection]) -> None:
    wrong = replace(base_settings, provider_routes=load_routes(_routes_env(azure, key="stale")))
    done = submit(client, auth, text="bad key", options={"model": "gpt-4o"})
    harness = WorkerHarness(wrong, pool)
    try:
        harness.build().run(once=True)
    finally:
        harness.stop_all()
    job = client.simulate_get(f"{API}/jobs/{done['job_id']}", headers=auth).json
    assert (job["state"], job["attempt"], job["error_kind"]) == ("failed", 1, "auth")
    assert "Access denied" in job["error_message"]


@pytest.mark.parametrize(("env", "named"), [
    ({"SA_PROVIDER_ROUTES": "{"}, "not JSON"),
    ({"SA_PROVIDER_ROUTES": "[]"}, '{"routes": [...]}'),
    ({"SA_PROVIDER_ROUTES": '{"routes": [{"name": "a", "base_url": "http://x", "colour": 1}]}'},
     "routes[0].colour: unknown field"),
    ({"SA_PROVIDER_ROUTES": '{"routes": [{"name": "a", "base_url": "ftp://x"}]}'}, "base_url"),
    ({"SA_PROVIDER_ROUTES": '{"routes": [{"name": "a", "base_url": "http://x", '
                            '"api_key_env": "NOT_SET_ANYWHERE"}]}'}, "NOT_SET_ANYWHERE is not set"),
    ({"SA_PROVIDER_ROUTES": '{"routes": [{"name": "a", "base_url": "http://x", "auth": "basic"}]}'},
     "auth must be one of"),
    ({"SA_PROVIDER_ROUTES": '{"routes": [{"name": "default", "base_url": "http://x"}]}'},
     "'default' is taken"),
    ({"SA_PROVIDER_ROUTES": '{"routes": []}', "SA_PROVIDER_ROUTES_FILE": "/x"}, "not both"),
    ({"SA_PROVIDER_ROUTES_FILE": "/nonexistent/routes.json"}, "cannot read"),
])
def test_bad_routes_stop_the_process_with_one_clear_line(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({"DATABASE_URL": "postgresql:///x", **env})
    assert named in str(raised.value)


def test_routes_are_read_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    path.write_text('{"routes": [{"name": "local", "base_url": "http://127.0.0.1:11434/v1/", '
                    '"models": ["llama3"]}]}')
    settings = Settings.from_env({"DATABASE_URL": "postgresql:///x", "SA_PROVIDER_URL": "http://p",
                                  "SA_PROVIDER_MODEL": "m", "SA_PROVIDER_ROUTES_FILE": str(path)})
    routes = settings.routes
    assert [(r.name, r.models) for r in routes.routes] == [("local", ("llama3",)),
                                                           ("default", ("m",))]
    local = routes.for_model("llama3")
    assert local is not None and local.url == "http://127.0.0.1:11434/v1"
    assert routes.for_model(None) is routes.routes[1] and routes.for_model("gpt-9") is None
