"""Token budgets (issue 27, part A): a call reserves its estimated tokens against its route's
window before it is sent and settles them after; the provider's `x-ratelimit-*` headers pause a
route before a 429; the claim can share the provider between orgs by tokens, not by jobs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.routes import Route, RouteError, load_routes
from jobqueue.core.settings import Settings
from jobqueue.core.token_estimate import RateLimitHeaders, header_pause, parse_reset, tighter
from jobqueue.core.tokens import Caller
from jobqueue.devtools.fake_provider import FakeConfig, FakeProvider
from jobqueue.engine import throttle
from jobqueue.engine.claim import claim
from jobqueue.engine.enqueue import Submission, enqueue, enqueue_many
from tests.helpers import WorkerHarness, fetch_all, fetch_one, wait_for

JOBS = "SELECT state, attempt FROM sa_job ORDER BY created_at"
# NOTE: 100 words of 5 characters: the fake counts 100 prompt tokens, the worker first
# estimates 0.25 a character (125) and learns the ratio from there.
LONG = " ".join(["word"] * 100)


def _all_done(pool: ConnectionPool[DictConnection], n: int) -> bool:
    rows = fetch_all(pool, JOBS)
    return len(rows) == n and all(r["state"] in ("succeeded", "failed") for r in rows)


@pytest.fixture(scope="module")
def limited() -> Iterator[FakeProvider]:
    # NOTE: 520 tokens a second (prompt + max_tokens): four of the long prompts below at most.
    # The route allows 400 (three): a call reserved at the very end of one of its windows may
    # reach the provider in the next one (a loaded machine), and is counted there.
    with FakeProvider(config=FakeConfig(tpm=520, limit_window=1.0)) as provider:
        yield provider


def test_a_burst_of_long_prompts_stays_under_the_routes_tpm_reserved_before_the_call(
        base_settings: Settings, pool: ConnectionPool[DictConnection], caller: Caller,
        limited: FakeProvider) -> None:
    before = limited.limited
    route = Route("budget", limited.url, tpm=400)
    # NOTE: the headers off: the reservations alone keep the burst under the limit.
    budget = replace(base_settings, provider_url="", route_limit_window=1.0,
                     provider_routes=(route,), ratelimit_headers=False)
    for i in range(6):
        enqueue(pool, caller, f"{LONG} {i}", options={"max_tokens": 20})
    harness = WorkerHarness(budget, pool)
    try:
        # NOTE: six slots: without a reservation all six calls would leave at once (the
        # window's reported tokens are 0 until the first answer) and the provider refuse most.
        harness.start(concurrency=6)
        wait_for(lambda: _all_done(pool, 6), timeout=20)
    finally:
        harness.stop_all()
    assert {(r["state"], r["attempt"]) for r in fetch_all(pool, JOBS)} == {("succeeded", 1)}
    assert limited.limited == before, "the provider answered 429: the burst went past its tpm"
    assert fetch_one(pool, "SELECT reason FROM sa_route_pause WHERE route = 'budget'")["reason"] \
        == "limit"


@pytest.fixture
def roomy(base_settings: Settings) -> Settings:
    # NOTE: a long window, so the one the calls reserve in is still there to be read.
    return replace(base_settings, route_limit_window=3600.0, provider_routes=(
        Route("roomy", base_settings.provider_url, tpm=1_000_000, models=("fake-model",)),),
        provider_url="")


def test_the_reservation_is_settled_to_the_reported_usage(
        roomy: Settings, pool: ConnectionPool[DictConnection], caller: Caller) -> None:
    enqueue(pool, caller, f"{LONG} [fake:latency=0.5]", options={"max_tokens": 500})
    harness = WorkerHarness(roomy, pool)
    try:
        harness.start()
        # NOTE: during the call the window holds its estimate: 101 words of ~5 characters at
        # 0.25 a character, 4 for the message, and the 500 of max_tokens.
        held = wait_for(lambda: fetch_all(pool, "SELECT tokens, reserved FROM sa_route_window"))
        assert held[0]["tokens"] == held[0]["reserved"] > 600
        wait_for(lambda: _all_done(pool, 1))
    finally:
        harness.stop_all()
    used = fetch_one(pool, "SELECT tokens_in + tokens_out AS n FROM sa_ledger "
                           "WHERE outcome = 'succeeded'")["n"]
    window = fetch_one(pool, "SELECT requests, tokens, reserved FROM sa_route_window")
    # NOTE: the answer's usage is 101 prompt words and a reply of about as many.
    assert window == {"requests": 1, "tokens": used, "reserved": 0}
    assert used < 500


def test_a_failed_call_releases_its_reservation(
        roomy: Settings, pool: ConnectionPool[DictConnection], caller: Caller) -> None:
    enqueue(pool, caller, "refused [fake:400]", max_attempts=1)
    WorkerHarness(roomy, pool).build().run(once=True)
    assert fetch_one(pool, "SELECT state FROM sa_job")["state"] == "failed"
    window = fetch_one(pool, "SELECT requests, tokens, reserved FROM sa_route_window")
    assert window == {"requests": 1, "tokens": 0, "reserved": 0}


def test_a_call_larger_than_the_whole_tpm_is_taken_alone_by_an_empty_window(
        base_settings: Settings, pool: ConnectionPool[DictConnection], caller: Caller) -> None:
    # NOTE: 10,000 tokens of max_tokens against a tpm of 100: it never fits a window with
    # anything in it, so an empty one takes it (else it would wait for ever); the next call
    # waits for the window after.
    small = replace(base_settings, provider_url="", route_limit_window=1.0, provider_routes=(
        Route("small", base_settings.provider_url, tpm=100),))
    for i in range(2):
        enqueue(pool, caller, f"huge {i}", options={"max_tokens": 10_000})
    harness = WorkerHarness(small, pool)
    try:
        harness.start(concurrency=2)
        wait_for(lambda: _all_done(pool, 2), timeout=10)
    finally:
        harness.stop_all()
    assert {(r["state"], r["attempt"]) for r in fetch_all(pool, JOBS)} == {("succeeded", 1)}
    # NOTE: the second found the window taken: it was put back (no call, attempt kept).
    assert fetch_one(pool, "SELECT reason FROM sa_route_pause WHERE route = 'small'")["reason"] \
        == "limit"


def test_the_providers_headers_pause_the_route_before_a_429(
        base_settings: Settings, pool: ConnectionPool[DictConnection], caller: Caller) -> None:
    # NOTE: the route itself has no limit, and the reservations are off: only the answers'
    # x-ratelimit-remaining-* headers tell. 40 prompt words + 20 max_tokens = 60 a call, 200 a
    # second: a fourth call in a window would be refused; the third's answer says 20 tokens
    # remain, fewer than a call needs.
    with FakeProvider(config=FakeConfig(tpm=200, limit_window=1.0)) as fake:
        told = replace(base_settings, provider_url="", route_limit_window=1.0,
                       provider_routes=(Route("told", fake.url),), token_reservations=False)
        for i in range(7):
            enqueue(pool, caller, " ".join(["word"] * 39) + f" {i}", options={"max_tokens": 20})
        harness = WorkerHarness(told, pool)
        try:
            harness.start(concurrency=1)
            wait_for(lambda: _all_done(pool, 7), timeout=20)
        finally:
            harness.stop_all()
        assert fake.limited == 0, "the provider answered 429"
    assert {(r["state"], r["attempt"]) for r in fetch_all(pool, JOBS)} == {("succeeded", 1)}
    assert fetch_one(pool, "SELECT reason FROM sa_route_pause WHERE route = 'told'")["reason"] \
        == "headers"


def test_openai_reset_durations_and_the_pause_they_make() -> None:
    assert [parse_reset(t) for t in ("1s", "6m0s", "20ms", "1h2m3.5s", "0.5", "soon", None)] \
        == [1.0, 360.0, 0.02, 3723.5, 0.5, None, None]
    headers = {"x-ratelimit-remaining-tokens": "50", "x-ratelimit-reset-tokens": "250ms",
               "x-ratelimit-remaining-requests": "9", "x-ratelimit-reset-requests": "6m0s"}
    read = RateLimitHeaders.read(headers.get)
    assert read == RateLimitHeaders(9, 50, 360.0, 0.25)
    assert tighter(0, None) == 0 and tighter(100, 80) == 80 and tighter(0, 80) == 80 \
        and tighter(100, 0) == 100
    assert header_pause(read, 60, 1.0) == (0.25, "remaining_tokens")
    assert header_pause(read, 50, 1.0) is None
    # NOTE: Azure sends the remaining counts without a reset: a short pause.
    assert header_pause(RateLimitHeaders(remaining_requests=0), 1, 1.0) == (1.0,
                                                                            "remaining_requests")
    assert RateLimitHeaders.read({}.get) is None


def test_fair_by_tokens_gives_orgs_of_long_and_short_prompts_comparable_token_shares(
        pool: ConnectionPool[DictConnection]) -> None:
    # NOTE: org 1 asks 1,000 tokens a call, org 2 100; equal demand. Each round a worker claims
    # four jobs and their usage is reported, as workers do after each call.
    cost = {1: 1000, 2: 100}
    for org in cost:
        enqueue_many(pool, Caller(org, org), [Submission(text=f"org {org}")] * 200)

    def share(token_window: float, rounds: int = 30) -> float:
        used = dict.fromkeys(cost, 0)
        for _ in range(rounds):
            for job in claim(pool, "w", 4, 100, token_window=token_window):
                throttle.add_org_tokens(pool, job.org_id, cost[job.org_id], 3600.0)
                used[job.org_id] += cost[job.org_id]
        return used[1] / sum(used.values())

    # NOTE: by turns (the default), org 1 takes 10 tokens for each of org 2's.
    assert share(0.0) > 0.85
    with pool.connection() as conn:
        conn.execute("TRUNCATE sa_org_token_window")
    assert 0.4 <= share(3600.0) <= 0.6


def test_a_routes_max_tokens_default_is_a_count() -> None:
    env = {"SA_PROVIDER_ROUTES": json.dumps({"routes": [
        {"name": "r", "base_url": "http://127.0.0.1:9", "max_tokens_default": 800}]})}
    assert load_routes(env)[0].max_tokens_default == 800
    env["SA_PROVIDER_ROUTES"] = env["SA_PROVIDER_ROUTES"].replace("800", "-1")
    with pytest.raises(RouteError, match="max_tokens_default must be an integer >= 0"):
        load_routes(env)
