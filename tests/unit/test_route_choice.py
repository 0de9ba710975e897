"""The pure parts of fallbacks, prices and budgets: which route an attempt calls, where a failure
sends the next one, what a call costs, and when an org is past its budget."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from jobqueue.core.budget import Budgets, exceeded, next_day, next_month
from jobqueue.core.fallback import fails_over, fallback_for, route_for
from jobqueue.core.policy import ErrorKind
from jobqueue.core.pricing import Price, call_cost, parse_prices
from jobqueue.core.routes import RouteError, Routes, default_routes, load_routes


def _routes(*items: dict[str, object]) -> Routes:
    configured = load_routes({"SA_PROVIDER_ROUTES": json.dumps({"routes": list(items)})})
    return default_routes(configured, "http://default", "", "base-model")


ROUTES = _routes(
    {"name": "a", "base_url": "http://a", "models": ["m"], "fallbacks": ["x", "b", "c"]},
    {"name": "x", "base_url": "http://x", "models": ["other"]},
    {"name": "b", "base_url": "http://b", "models": ["m", "n"], "fallbacks": ["a"]},
    {"name": "c", "base_url": "http://c", "models": ["*"]})


def test_an_attempt_calls_its_fallback_then_its_preference_then_the_models_route() -> None:
    assert route_for(ROUTES, "m").name == "a"  # type: ignore[union-attr]
    assert route_for(ROUTES, "m", prefer="b").name == "b"  # type: ignore[union-attr]
    assert route_for(ROUTES, "m", current="c", prefer="b").name == "c"  # type: ignore[union-attr]
    # NOTE: a name this process does not know, or a route not serving the model, is passed over.
    assert route_for(ROUTES, "m", current="gone", prefer="x").name == "a"  # type: ignore[union-attr]
    assert route_for(ROUTES, "unlisted").name == "c"  # type: ignore[union-attr]


def test_the_fallback_is_the_first_named_route_serving_the_model() -> None:
    a, b = ROUTES.named("a"), ROUTES.named("b")
    assert a is not None and b is not None
    assert fallback_for(ROUTES, a, "m") is b  # `x` does not serve m
    assert fallback_for(ROUTES, a, "m", paused=["b"]) is ROUTES.named("c")
    assert fallback_for(ROUTES, b, "m", paused=["a"]) is None
    assert fallback_for(ROUTES, b, "n") is None  # `a` does not serve n
    assert fallback_for(ROUTES, ROUTES.routes[-1], "m") is None  # `default` has none


@pytest.mark.parametrize(("kind", "wait", "moves"), [
    (ErrorKind.PROVIDER_5XX, None, True), (ErrorKind.TIMEOUT, None, True),
    (ErrorKind.UNKNOWN, None, True), (ErrorKind.PROVIDER_4XX, None, False),
    (ErrorKind.AUTH, None, False), (ErrorKind.PARSE, None, False),
    (ErrorKind.RATE_LIMIT, 600.0, True), (ErrorKind.RATE_LIMIT, 10.0, False),
    (ErrorKind.RATE_LIMIT, None, False)])
def test_which_failures_move_a_job_to_a_fallback(kind: ErrorKind, wait: float | None,
                                                 moves: bool) -> None:
    assert fails_over(kind, wait, max_wait=10.0) is moves


@pytest.mark.parametrize(("fallbacks", "named"), [
    (["a"], "'a', which is not another route"), (["nope"], "'nope'"), ("b", "list of route")])
def test_a_fallback_must_name_another_route(fallbacks: object, named: str) -> None:
    with pytest.raises(RouteError, match=named):
        _routes({"name": "a", "base_url": "http://a", "fallbacks": fallbacks},
                {"name": "b", "base_url": "http://b"})


def test_prices_per_route_or_per_model_and_the_cost_of_a_call() -> None:
    route = parse_prices({"input": 2.5, "output": 10}, "p")
    assert route is not None and route.for_model("any") == Price(2.5, 10.0)
    models = parse_prices({"big": {"input": 5, "output": 15}, "*": {"input": 1, "output": 2}}, "p")
    assert models is not None
    assert models.for_model("big") == Price(5.0, 15.0) and models.for_model("small") == Price(1, 2)
    assert call_cost(Price(2.5, 10.0), 1000, 500) == pytest.approx(0.0075)
    assert call_cost(None, 1000, 500) is None and call_cost(Price(1, 1), None, None) is None
    assert parse_prices(None, "p") is None


@pytest.mark.parametrize("prices", [
    {"input": 1}, {"input": -1, "output": 1}, {"input": "1", "output": 1}, {"m": 3}, [], {},
    {"input": float("inf"), "output": 1}, {"input": True, "output": 1}])
def test_bad_prices_stop_the_process_naming_the_route(prices: object) -> None:
    with pytest.raises(RouteError, match="route 'a': prices"):
        _routes({"name": "a", "base_url": "http://a", "prices": prices})


def test_an_org_is_past_a_budget_once_its_spend_reaches_it() -> None:
    now = datetime(2026, 12, 31, 22, 30, tzinfo=UTC)
    assert exceeded(Budgets(), 100.0, 100.0, now) is None
    assert exceeded(Budgets(daily=5.0), 4.99, 4.99, now) is None
    daily = exceeded(Budgets(daily=5.0), 5.0, 9.0, now)
    assert daily is not None and daily.setting == "SA_ORG_BUDGET_DAILY"
    assert daily.resets_at == next_day(now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert daily.seconds_left(now) == 5400
    assert "USD 5.000000 of its budget of USD 5.000000" in daily.description
    monthly = exceeded(Budgets(daily=5.0, monthly=8.0), 9.0, 9.0, now)
    assert monthly is not None and monthly.setting == "SA_ORG_BUDGET_MONTHLY"
    assert next_month(datetime(2026, 5, 3, tzinfo=UTC)) == datetime(2026, 6, 1, tzinfo=UTC)
    with pytest.raises(ValueError):
        Budgets(daily=-1.0)
