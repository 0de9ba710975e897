"""Fallback routes, prefer_provider, prices and per-org budgets (issue 27, part B).

Three fake providers over real HTTP: `fake` answers, `broken` answers 500 to everything and
`limited` 429 with `Retry-After: 600` to everything. The routes put `primary` (broken) and
`limited` in front of `backup` (fake, priced), so a job's attempts show which route served them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import spend as spend_q
from jobqueue.core.routes import load_routes
from jobqueue.core.settings import Settings
from jobqueue.devtools.fake_provider import FakeConfig, FakeProvider
from jobqueue.runtime.retention import Retention
from service.app import create_app
from service.events.hub import EventHub
from tests.helpers import WorkerHarness, fetch_all, fetch_one, plan_nodes, submit
from tests.metrics_page import scrape, value

API = "/sa-core/v1"
Cli = Callable[[list[str]], int]
BACKUP = {"input": 2.5, "output": 10.0}
CHEAP = {"input": 1.0, "output": 2.0}


@pytest.fixture(scope="module")
def broken() -> Iterator[FakeProvider]:
    with FakeProvider(config=FakeConfig(fail_rate=1.0)) as provider:
        yield provider


@pytest.fixture(scope="module")
def hung() -> Iterator[FakeProvider]:
    with FakeProvider(config=FakeConfig(hang_rate=1.0)) as provider:
        yield provider


@pytest.fixture(scope="module")
def limited() -> Iterator[FakeProvider]:
    with FakeProvider(config=FakeConfig(throttle_seconds=3600.0,
                                        throttle_retry_after="600")) as provider:
        yield provider


@pytest.fixture
def settings(base_settings: Settings, fake: FakeProvider, broken: FakeProvider,
             limited: FakeProvider, hung: FakeProvider) -> Settings:
    routes = {"routes": [
        {"name": "primary", "base_url": broken.url, "models": ["m-fb"], "fallbacks": ["backup"]},
        {"name": "slow", "base_url": hung.url, "models": ["m-slow"], "fallbacks": ["backup"]},
        {"name": "limited", "base_url": limited.url, "models": ["m-429"],
         "fallbacks": ["primary", "backup"]},
        {"name": "backup", "base_url": fake.url,
         "models": ["m-fb", "m-429", "m-slow", "m-priced"],
         "prices": BACKUP},
        {"name": "cheap", "base_url": fake.url, "models": ["m-priced"],
         "prices": {"m-priced": CHEAP, "*": {"input": 99, "output": 99}}}]}
    return replace(base_settings,
                   provider_routes=load_routes({"SA_PROVIDER_ROUTES": json.dumps(routes)}))


def _job(client: falcon.testing.TestClient, auth: dict[str, str], job_id: str) -> dict[str, Any]:
    result = client.simulate_get(f"{API}/jobs/{job_id}", headers=auth)
    assert result.status_code == 200, result.text
    return dict(result.json)


def _cost(price: dict[str, float], item: dict[str, Any]) -> float:
    return (item["tokens_in"] * price["input"] + item["tokens_out"] * price["output"]) / 1e6


def test_a_5xx_moves_the_next_attempt_to_the_fallback_priced_by_it(
        client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness) -> None:
    before = scrape(client)
    done = submit(client, auth, text="fall back please", options={"model": "m-fb"})
    workers.build().run(once=True)
    job = _job(client, auth, done["job_id"])
    # NOTE: requeued due at once (no backoff): the next attempt calls another provider.
    assert (job["state"], job["attempt"], job["error_kind"]) == ("queued", 2, "provider_5xx")
    assert "next attempt on route 'backup'" in job["error_message"]
    workers.build().run(once=True)

    job = _job(client, auth, done["job_id"])
    assert (job["state"], job["attempt"]) == ("succeeded", 2), job
    first, second = job["usage"]
    assert (first["attempt"], first["route"], first["cost"]) == (1, "primary", None)
    # NOTE: the fake counts words: 3 in; "echo[1]: user:fall back please" is 4 out.
    assert (second["attempt"], second["route"], second["tokens_in"], second["tokens_out"]) == (
        2, "backup", 3, 4)
    assert second["cost"] == pytest.approx(_cost(BACKUP, second)) == pytest.approx(4.75e-5)
    after = scrape(client)
    assert value(after, "sa_provider_cost_total", route="backup") - value(
        before, "sa_provider_cost_total", route="backup") == pytest.approx(second["cost"])
    assert value(after, "sa_route_fallbacks_total", route="primary", to_route="backup") > value(
        before, "sa_route_fallbacks_total", route="primary", to_route="backup")


def test_a_timeout_moves_the_next_attempt_to_the_fallback(
        settings: Settings, client: falcon.testing.TestClient, auth: dict[str, str],
        pool: ConnectionPool[DictConnection]) -> None:
    done = submit(client, auth, text="never answered", options={"model": "m-slow"})
    harness = WorkerHarness(replace(settings, provider_timeout=0.3), pool)
    try:
        harness.build().run(once=True)
        harness.build().run(once=True)
    finally:
        harness.stop_all()
    job = _job(client, auth, done["job_id"])
    assert (job["state"], job["attempt"]) == ("succeeded", 2), job
    assert [(u["attempt"], u["route"]) for u in job["usage"]] == [(1, "slow"), (2, "backup")]


def test_a_long_retry_after_moves_the_job_to_the_fallback_with_its_attempt_kept(
        client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness) -> None:
    # NOTE: `limited` names `primary` first, which does not serve m-429: skipped for `backup`.
    done = submit(client, auth, text="too many", options={"model": "m-429"})
    workers.build().run(once=True)
    job = _job(client, auth, done["job_id"])
    assert (job["state"], job["attempt"], job["error_kind"]) == ("queued", 1, "rate_limit")
    workers.build().run(once=True)

    job = _job(client, auth, done["job_id"])
    assert (job["state"], job["attempt"]) == ("succeeded", 1), job
    assert [(u["attempt"], u["route"]) for u in job["usage"]] == [(1, "limited"), (1, "backup")]


def test_prefer_provider_picks_the_route_and_usage_shows_its_cost(
        client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
        cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    preferred = submit(client, auth, text="one two",
                       options={"model": "m-priced", "prefer_provider": "cheap"})
    first = submit(client, auth, text="three four", options={"model": "m-priced"})
    workers.build().run(once=True)

    chosen = _job(client, auth, preferred["job_id"])["usage"]
    assert [u["route"] for u in chosen] == ["cheap"]
    assert chosen[0]["cost"] == pytest.approx(_cost(CHEAP, chosen[0]))
    plain = _job(client, auth, first["job_id"])["usage"]
    assert [u["route"] for u in plain] == ["backup"]
    prompt = client.simulate_get(f"{API}/prompts/{first['prompt_id']}", headers=auth).json
    assert prompt["jobs"][0]["usage"] == plain

    capsys.readouterr()
    assert cli(["usage", "--json", "--since", "1h"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert {(i["route"], round(i["cost"], 12)) for i in items} == {
        ("cheap", round(chosen[0]["cost"], 12)), ("backup", round(plain[0]["cost"], 12))}
    assert cli(["usage"]) == 0
    text = capsys.readouterr().out
    assert "cost_usd" in text and f"{chosen[0]['cost'] + plain[0]['cost']:.6f}" in text


def test_a_route_that_does_not_serve_the_model_is_a_422_naming_the_known_ones(
        client: falcon.testing.TestClient, auth: dict[str, str],
        pool: ConnectionPool[DictConnection]) -> None:
    result = client.simulate_post(f"{API}/prompt", headers=auth, json={
        "text": "hi", "options": {"model": "m-priced", "prefer_provider": "nowhere"}})
    assert result.status_code == 422, result.text
    assert result.json["description"] == (
        "options.prefer_provider: no route 'nowhere' serves model 'm-priced' "
        "(known routes serving it: backup, cheap)")
    batch = client.simulate_post(f"{API}/prompts/batch", headers=auth, json={"prompts": [
        {"text": "fine", "options": {"model": "m-fb"}},
        {"text": "wrong", "options": {"model": "m-fb", "prefer_provider": "cheap"}}]})
    assert batch.status_code == 422, batch.text
    assert batch.json["description"].startswith("prompts[1].options.prefer_provider: no route "
                                                "'cheap' serves model 'm-fb'")
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 0


@pytest.mark.parametrize("org_max_running", [0, 4], ids=["claim", "org_capped_claim"])
def test_an_org_past_its_daily_budget_is_refused_and_its_queue_waits(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        other_org_auth: dict[str, str], org_max_running: int, hub: EventHub) -> None:
    # NOTE: one call of a few tokens at BACKUP prices costs about USD 0.00005.
    budgeted = replace(settings, org_budget_daily=0.00001, org_max_running=org_max_running)
    # NOTE: the hub fixture's, stopped after the test: the chat route starts the app's hub.
    client = falcon.testing.TestClient(create_app(budgeted, pool, hub=hub))
    spent = submit(client, auth, text="first", options={"model": "m-priced"})
    held = submit(client, auth, text="second", options={"model": "m-priced"})
    harness = WorkerHarness(budgeted, pool)
    try:
        harness.build(batch_size=1).run(once=True)
        assert _job(client, auth, spent["job_id"])["state"] == "succeeded"

        refused = client.simulate_post(f"{API}/prompt", headers=auth,
                                       json={"text": "third", "options": {"model": "m-priced"}})
        assert refused.status_code == 429, refused.text
        assert refused.json["title"] == "Budget spent"
        assert "SA_ORG_BUDGET_DAILY" in refused.json["description"]
        assert "of its budget of USD 0.000010" in refused.json["description"]
        assert 0 < int(refused.headers["retry-after"]) <= 86400
        retried = client.simulate_post(f"{API}/prompts/{spent['prompt_id']}/retry", headers=auth)
        assert retried.status_code == 429, retried.text
        chat = client.simulate_post("/openai/v1/chat/completions", headers=auth, json={
            "model": "m-priced", "messages": [{"role": "user", "content": "more"}]})
        assert chat.status_code == 429, chat.text
        assert chat.json["error"]["type"] == "rate_limit_error"
        other = submit(client, other_org_auth, text="other org", options={"model": "m-priced"})

        harness.build().run(once=True)
        assert _job(client, other_org_auth, other["job_id"])["state"] == "succeeded"
        assert _job(client, auth, held["job_id"])["state"] == "queued"
        usage = client.simulate_get(f"{API}/usage", headers=auth).json
        assert usage["exceeded"] == "SA_ORG_BUDGET_DAILY"
        assert usage["daily"]["spent"] > usage["daily"]["budget"] == 0.00001
    finally:
        harness.stop_all()

    freed = WorkerHarness(replace(budgeted, org_budget_daily=1.0), pool)
    try:
        freed.build().run(once=True)
    finally:
        freed.stop_all()
    assert _job(client, auth, held["job_id"])["state"] == "succeeded"


def test_a_keyed_repeat_past_the_budget_is_replayed_and_only_new_work_refused(
        settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        hub: EventHub) -> None:
    # NOTE: one call of a few tokens at BACKUP prices costs about USD 0.00005: the first run
    # spends the budget. The chat hold is short, so its first answer is 409 job_in_progress.
    budgeted = replace(settings, org_budget_daily=0.00001, openai_max_wait=0.1)
    client = falcon.testing.TestClient(create_app(budgeted, pool, hub=hub))
    prompt = {"text": "first", "options": {"model": "m-priced"}}
    batch = {"prompts": [{"text": "one", "options": {"model": "m-priced"}},
                         {"text": "two", "options": {"model": "m-priced"}}]}
    chat = {"model": "m-priced", "messages": [{"role": "user", "content": "hello"}]}

    def post(path: str, key: str, body: dict[str, Any]) -> falcon.testing.Result:
        return client.simulate_post(path, json=body, headers={**auth, "Idempotency-Key": key})

    first = post(f"{API}/prompt", "k-prompt", prompt)
    assert first.status_code == 202, first.text
    first_batch = post(f"{API}/prompts/batch", "k-batch", batch)
    assert first_batch.status_code == 202, first_batch.text
    first_chat = post("/openai/v1/chat/completions", "k-chat", chat)
    assert first_chat.status_code == 409, first_chat.text
    harness = WorkerHarness(budgeted, pool)
    try:
        harness.build().run(once=True)
    finally:
        harness.stop_all()
    assert client.simulate_get(f"{API}/usage", headers=auth).json["exceeded"] == (
        "SA_ORG_BUDGET_DAILY")
    jobs = fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"]

    again = post(f"{API}/prompt", "k-prompt", prompt)
    assert again.status_code == 202, again.text
    assert again.json == first.json and again.headers["idempotent-replayed"] == "true"
    assert again.headers["location"] == first.headers["location"]
    again_batch = post(f"{API}/prompts/batch", "k-batch", batch)
    assert again_batch.status_code == 202, again_batch.text
    assert again_batch.json == first_batch.json
    again_chat = post("/openai/v1/chat/completions", "k-chat", chat)
    assert again_chat.status_code == 200, again_chat.text
    assert again_chat.headers["x-sa-job-id"] == first_chat.headers["x-sa-job-id"]
    assert again_chat.headers["idempotent-replayed"] == "true"
    # NOTE: the key with another body is still refused as a reused key, not as over budget.
    reused = post(f"{API}/prompt", "k-prompt", {**prompt, "text": "changed"})
    assert reused.status_code == 422 and reused.json["title"] == "Idempotency-Key reused"

    for path, body in ((f"{API}/prompt", prompt), (f"{API}/prompts/batch", batch),
                       ("/openai/v1/chat/completions", chat)):
        refused = post(path, "a-new-key", body)
        assert refused.status_code == 429, refused.text
        assert "SA_ORG_BUDGET_DAILY" in refused.text
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == jobs == 4


def test_the_budget_reads_are_served_by_the_spend_indexes(
        pool: ConnectionPool[DictConnection]) -> None:
    with pool.connection() as conn:
        one = json.dumps(plan_nodes(conn, spend_q.ORG_SPEND_GET, {"org_id": 1, "now": None}))
        every = json.dumps(plan_nodes(conn, spend_q.ORG_SPEND_LIST_OVER_BUDGET,
                                      {"now": None, "daily": 1.0, "monthly": 0.0}))
    assert "sa_org_spend_pkey" in one and "Seq Scan" not in one
    assert "sa_org_spend_day_idx" in every and "Seq Scan" not in every


def test_the_chat_front_door_takes_prefer_provider_as_an_extra_field(
        client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness) -> None:
    chat = "/openai/v1/chat/completions"
    messages = [{"role": "user", "content": "hello there"}]
    refused = client.simulate_post(chat, headers=auth, json={
        "model": "m-fb", "messages": messages, "prefer_provider": "cheap"})
    assert refused.status_code == 400, refused.text
    assert refused.json["error"]["param"] == "prefer_provider"
    assert "known routes serving it: primary, backup" in refused.json["error"]["message"]

    workers.start()
    answered = client.simulate_post(chat, headers=auth, json={
        "model": "m-priced", "messages": messages, "prefer_provider": "cheap"})
    assert answered.status_code == 200, answered.text
    usage = _job(client, auth, answered.headers["x-sa-job-id"])["usage"]
    assert [u["route"] for u in usage] == ["cheap"]


def test_retention_drops_the_spend_days_no_budget_reads(
        pool: ConnectionPool[DictConnection]) -> None:
    with pool.connection() as conn:
        conn.execute("INSERT INTO sa_org_spend (org_id, day, shard, cost) VALUES "
                     "(1, current_date - 100, 0, 1), (1, current_date, 3, 2)")
    counts = Retention(Retention.Config()).run_once(pool)
    assert counts.removed_spend_days == 1
    assert [r["cost"] for r in fetch_all(pool, "SELECT cost FROM sa_org_spend")] == [2]
