"""The operator console's API over real HTTP: the jobs explorer's filters and keyset pages, a job's
history, bulk cancel and retry in batches with their log, route pause and resume, the workers,
the read-only `ops:read` scope, and the bounds docs/limits.md lists."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import create_token, issue_token
from service.ops_contract import OPS_BULK_MAX, OPS_PAGE_MAX
from tests.helpers import WorkerHarness, fetch_all, fetch_one, serve_app, wait_for

API = "/sa-core/v1"
OPS = f"{API}/ops"


@pytest.fixture
def web(settings: Settings, pool: ConnectionPool[DictConnection]) -> Iterator[str]:
    """The app over real HTTP, with bulk batches of 2 jobs (so a handful of jobs takes several)."""
    with serve_app(replace(settings, ops_bulk_batch=2), pool) as url:
        yield url


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def operator(pool: ConnectionPool[DictConnection]) -> dict[str, str]:
    return bearer(issue_token(pool, 9, 90, scopes=("ops",)).token)


def submit(web: str, headers: dict[str, str], text: str, **body: Any) -> dict[str, Any]:
    answer = httpx.post(f"{web}{API}/prompt", json={"text": text, **body}, headers=headers)
    assert answer.status_code == 202, answer.text
    result: dict[str, Any] = answer.json()
    return result


def get(web: str, headers: dict[str, str], path: str, **params: Any) -> Any:
    answer = httpx.get(f"{web}{OPS}{path}", params=params, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


def post(web: str, headers: dict[str, str], path: str, body: Any = None,
         **params: Any) -> httpx.Response:
    return httpx.post(f"{web}{OPS}{path}", params=params, json=body, headers=headers)


def test_the_explorer_filters_across_orgs_pages_by_keyset_and_links_to_a_jobs_history(
    web: str, pool: ConnectionPool[DictConnection], operator: dict[str, str],
    workers: WorkerHarness,
) -> None:
    org2, org3 = bearer(create_token(pool, 2, 20)), bearer(create_token(pool, 3, 30))
    failed = submit(web, org2, "refused [fake:400]")
    flaky = submit(web, org3, "Unavailable 1 [fake:503]", max_attempts=2)
    workers.build().run(once=True)
    wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'queued' "
                                     "AND scheduled_for <= now()")["n"] > 0, timeout=5)
    workers.build().run(once=True)
    later = [submit(web, org2, f"later {i}", delay_seconds=3600)["job_id"] for i in range(5)]
    submit(web, org3, "other org later", delay_seconds=3600, options={"model": "fake-model"})

    everything = get(web, operator, "/jobs")["items"]
    assert len(everything) == 8 and {j["org_id"] for j in everything} == {2, 3}
    org2_queued = get(web, operator, "/jobs", org=2, state="queued")["items"]
    assert [j["id"] for j in org2_queued] == later[::-1], "newest first"
    assert [j["id"] for j in get(web, operator, "/jobs", error_kind="provider_4xx")["items"]] == [
        failed["job_id"]]
    assert {j["id"] for j in get(web, operator, "/jobs", q="UNAVAILABLE")["items"]} == {
        flaky["job_id"]}
    assert [j["id"] for j in get(web, operator, "/jobs", q=failed["job_id"][:8])["items"]] == [
        failed["job_id"]]
    assert len(get(web, operator, "/jobs", model="fake-model")["items"]) == 8, "default model"
    assert get(web, operator, "/jobs", model="other-model")["items"] == []
    assert len(get(web, operator, "/jobs", route="default")["items"]) == 8, "`*` serves them all"
    assert get(web, operator, "/jobs", q="50%_off")["items"] == [], "wildcards taken literally"
    assert get(web, operator, "/jobs", since="2999-01-01")["items"] == []

    seen: list[str] = []
    cursor = None
    while True:
        page = get(web, operator, "/jobs", limit=3, **({"cursor": cursor} if cursor else {}))
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [j["id"] for j in everything], "the pages hold every job once, in order"

    history = get(web, operator, f"/jobs/{flaky['job_id']}")
    assert [(t["from_state"], t["to_state"]) for t in history["transitions"]] == [
        (None, "queued"), ("queued", "running"), ("running", "queued"), ("queued", "running"),
        ("running", "failed")]
    assert [(c["attempt"], c["http_status"], c["outcome"]) for c in history["provider_calls"]] == [
        (1, 503, "provider_5xx"), (2, 503, "provider_5xx")], "every attempt's error"
    assert all("503" in c["error_message"] for c in history["provider_calls"]), (
        "each attempt keeps its own message")
    assert history["job"]["org_id"] == 3

    minutes = get(web, operator, "/charts")["minutes"]
    assert 60 <= len(minutes) <= 62 and minutes == sorted(minutes, key=lambda m: m["minute"])
    assert sum(m["enqueued"] for m in minutes) == 8 and sum(m["failed"] for m in minutes) == 2
    assert sum(m["succeeded"] for m in minutes) == 0
    measured = [m for m in minutes if m["run_p95"] is not None]
    assert measured and all(m["run_p50"] <= m["run_p95"] for m in measured)
    # NOTE: the errored transitions of the hour, by kind, as the log holds them: the refused job's
    # end and the flaky ones' retries and ends.
    logged = {r["error_kind"]: r["n"] for r in fetch_all(
        pool, "SELECT error_kind, count(*) AS n FROM sa_job_event WHERE error_kind IS NOT NULL "
              "GROUP BY 1")}
    charted: dict[str, int] = {}
    for m in minutes:
        for kind, n in m["errors"].items():
            charted[kind] = charted.get(kind, 0) + n
    assert charted == logged and {"provider_4xx", "provider_5xx"} <= set(charted)


def test_the_charts_count_each_routes_reported_tokens(
    web: str, pool: ConnectionPool[DictConnection], operator: dict[str, str],
    workers: WorkerHarness,
) -> None:
    user = bearer(create_token(pool, 4, 40))
    for text in ("count my tokens", "and mine too"):
        submit(web, user, text)
    workers.build().run(once=True)
    reported = fetch_one(pool, "SELECT sum(tokens_in + tokens_out) AS n FROM sa_ledger")["n"]
    minutes = get(web, operator, "/charts")["minutes"]
    assert reported > 0
    assert sum(m["tokens"].get("default", 0) for m in minutes) == reported


@pytest.mark.parametrize("params", [
    {"state": "bogus"}, {"state": "queued,"}, {"org": "-1"}, {"error_kind": "oops"},
    {"since": "yesterday"}, {"since": "2026-12-02", "until": "2026-12-01"},
    {"limit": "0"}, {"limit": str(OPS_PAGE_MAX + 1)}, {"cursor": "nope"}, {"q": " "},
    {"q": "x" * 201}, {"model": "\u0000"}, {"colour": "red"}, {"route": "nope"},
    {"route": "default", "model": "fake-model"},
])
def test_a_bad_filter_is_a_400_naming_it(web: str, operator: dict[str, str],
                                          params: dict[str, str]) -> None:
    refused = httpx.get(f"{web}{OPS}/jobs", params=params, headers=operator)
    assert refused.status_code == 400, refused.text
    assert refused.json()["title"] and refused.json()["description"]


def test_a_bulk_cancel_of_a_filter_runs_in_batches_after_its_count_and_is_logged(
    web: str, pool: ConnectionPool[DictConnection], operator: dict[str, str],
) -> None:
    org2, org3 = bearer(create_token(pool, 2, 20)), bearer(create_token(pool, 3, 30))
    mine = [submit(web, org2, f"queued {i}", delay_seconds=3600)["job_id"] for i in range(5)]
    other = submit(web, org3, "queued elsewhere", delay_seconds=3600)["job_id"]

    counted = get(web, operator, "/jobs/count", org=2)
    assert counted == {"jobs": 5, "cancellable": 5, "retryable": 0, "max": OPS_BULK_MAX}
    done = post(web, operator, "/bulk/cancel", org=2, max_jobs=counted["cancellable"])
    assert done.status_code == 200, done.text
    assert done.json()["changed"] == 5 and done.json()["batches"] == 3, "batches of 2, 2 and 1"
    rows = fetch_all(pool, "SELECT state, xmin::text AS tx FROM sa_job WHERE id = ANY(%s)",
                     [uuid.UUID(i) for i in mine])
    assert {r["state"] for r in rows} == {"cancelled"}
    assert len({r["tx"] for r in rows}) == 3, "each batch its own transaction"
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", other)["state"] == "queued"

    log = get(web, operator, "/actions")["items"]
    assert len(log) == 1
    entry = log[0]
    assert (entry["action"], entry["org_id"], entry["user_id"], entry["job_count"],
            entry["batches"]) == ("bulk_cancel", 9, 90, 5, 3)
    assert entry["target"] == {"filter": {"org_id": 2}, "max_jobs": 5}
    assert sorted(entry["job_ids"]) == sorted(mine) and entry["finished_at"] is not None

    again = post(web, operator, "/bulk/cancel", org=2, max_jobs=5)
    assert again.json()["changed"] == 0, "nothing left to cancel"
    retried = post(web, operator, "/bulk/retry", {"ids": mine[:3]})
    assert retried.status_code == 200 and retried.json()["changed"] == 3
    assert retried.json()["batches"] == 2
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE supersedes = ANY(%s) "
                           "AND state = 'queued'", [uuid.UUID(i) for i in mine[:3]])["n"] == 3
    bounded = post(web, operator, "/bulk/retry", org=2, state="cancelled", max_jobs=1)
    assert bounded.json()["changed"] == 1, "max_jobs bounds the action"
    newest = get(web, operator, "/actions", limit=2)
    assert [e["action"] for e in newest["items"]] == ["bulk_retry", "bulk_retry"]
    older = get(web, operator, "/actions", limit=2, before=newest["next_before"])
    assert [e["action"] for e in older["items"]] == ["bulk_cancel", "bulk_cancel"]
    assert older["next_before"] is None


@pytest.mark.parametrize(("body", "params", "status"), [
    (None, {}, 422), ({"ids": []}, {}, 422), ({"ids": ["nope"]}, {}, 422),
    ({"ids": [str(uuid.UUID(int=1))] * 2}, {}, 422),
    ({"ids": [str(uuid.UUID(int=i)) for i in range(OPS_BULK_MAX + 1)]}, {}, 422),
    ({"ids": [str(uuid.UUID(int=1))]}, {"max_jobs": "1"}, 422),
    (None, {"max_jobs": "0"}, 400), (None, {"max_jobs": str(OPS_BULK_MAX + 1)}, 400),
    (None, {"max_jobs": "5", "state": "nope"}, 400),
])
def test_a_bad_bulk_request_changes_nothing(
    web: str, pool: ConnectionPool[DictConnection], operator: dict[str, str],
    body: Any, params: dict[str, str], status: int,
) -> None:
    job = submit(web, bearer(create_token(pool, 2, 20)), "stays", delay_seconds=3600)["job_id"]
    refused = post(web, operator, "/bulk/cancel", body, **params)
    assert refused.status_code == status, refused.text
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", job)["state"] == "queued"
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_ops_action")["n"] == 0


def test_routes_pause_and_resume_for_every_worker_and_the_workers_are_listed(
    web: str, pool: ConnectionPool[DictConnection], operator: dict[str, str],
    workers: WorkerHarness,
) -> None:
    [route] = get(web, operator, "/routes")["items"]
    assert (route["name"], route["paused_seconds"], route["requests"]) == ("default", 0.0, 0)
    paused = post(web, operator, "/routes/pause", {"route": "default", "seconds": 300,
                                                   "reason": "provider incident"})
    assert paused.status_code == 200, paused.text
    [route] = get(web, operator, "/routes")["items"]
    assert 290 < route["paused_seconds"] <= 300 and route["reason"] == "provider incident"
    assert post(web, operator, "/routes/pause", {"route": "nope", "seconds": 5}).status_code == 404
    assert post(web, operator, "/routes/pause", {"route": "default", "seconds": 0}
                ).status_code == 422
    assert post(web, operator, "/routes/pause", {"route": "default", "seconds": 86_401}
                ).status_code == 422

    org2 = bearer(create_token(pool, 2, 20))
    slow = submit(web, org2, "slow [fake:latency=30]")
    workers.start()
    # NOTE: the paused route puts the job back unspent; resumed, the worker runs it.
    resumed = post(web, operator, "/routes/resume", {"route": "default"})
    assert resumed.status_code == 200 and resumed.json()["was_paused"] is True
    assert get(web, operator, "/routes")["items"][0]["paused_seconds"] == 0.0
    listed = wait_for(lambda: [w for w in get(web, operator, "/workers")["items"]
                               if w["slots_in_use"]], timeout=10)
    assert listed[0]["slots_in_use"] == 1 and listed[0]["orgs"] == [2]
    assert listed[0]["host"] and listed[0]["last_heartbeat"] is not None
    assert listed[0]["slots"] >= 1 and listed[0]["seen_at"] is not None
    assert post(web, operator, f"/jobs/{slow['job_id']}/cancel", {}).status_code == 200
    assert [e["action"] for e in get(web, operator, "/actions")["items"]] == [
        "cancel", "resume_route", "pause_route"]


def test_an_idle_worker_is_listed_with_its_slots_until_it_stops(
    web: str, operator: dict[str, str], workers: WorkerHarness,
) -> None:
    worker = workers.start(concurrency=3)
    [listed] = wait_for(lambda: get(web, operator, "/workers")["items"], timeout=10)
    assert (listed["worker_id"], listed["slots"], listed["slots_in_use"], listed["orgs"]) == (
        worker.worker_id, 3, 0, [])
    worker.stop()
    wait_for(lambda: get(web, operator, "/workers")["items"] == [], timeout=10)


def test_an_ops_read_token_sees_everything_and_changes_nothing(
    web: str, pool: ConnectionPool[DictConnection], cli: Callable[[list[str]], int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    org2 = bearer(create_token(pool, 2, 20))
    job = submit(web, org2, "stays", delay_seconds=3600)["job_id"]
    assert cli(["create-token", "--org", "9", "--user", "91", "--scope", "ops:read", "--json"]) == 0
    issued = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert issued["scopes"] == ["ops:read"]
    reader = bearer(issued["token"])
    for path in ("/overview", "/jobs", "/jobs/count", f"/jobs/{job}", "/actions", "/routes",
                 "/workers"):
        assert httpx.get(f"{web}{OPS}{path}", headers=reader).status_code == 200, path
    for path, body, params in (
            ("/bulk/cancel", None, {"max_jobs": 5}), ("/bulk/retry", {"ids": [job]}, {}),
            (f"/jobs/{job}/cancel", None, {}), (f"/jobs/{job}/retry", None, {}),
            ("/routes/pause", {"route": "default", "seconds": 60}, {}),
            ("/routes/resume", {"route": "default"}, {})):
        refused = post(web, reader, path, body, **params)
        assert refused.status_code == 403, (path, refused.text)
        assert "ops:read" in refused.json()["description"] and "--scope ops" in refused.text
        plain = post(web, org2, path, body, **params)
        assert plain.status_code == 403 and "--scope ops`" in plain.json()["description"]
    assert httpx.get(f"{web}{OPS}/jobs", headers=org2).status_code == 403
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", job)["state"] == "queued"
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_ops_action")["n"] == 0
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_route_pause")["n"] == 0
