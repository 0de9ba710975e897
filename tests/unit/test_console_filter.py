"""The operator console's filter, without a database: what a text search and a bulk action reach."""

from __future__ import annotations

from jobqueue.core.console import BulkAction, JobFilter, like_pattern, route_models
from jobqueue.core.routes import Route, Routes


def test_a_text_search_takes_like_wildcards_literally() -> None:
    assert like_pattern("50%_off\\") == "%50\\%\\_off\\\\%"


def test_a_text_that_may_start_an_id_also_searches_ids() -> None:
    assert JobFilter(text="3F1C8D2E").params()["id_prefix"] == "3f1c8d2e%"
    assert JobFilter(text="timeout").params()["id_prefix"] is None
    assert JobFilter().params()["text"] is None and JobFilter().params()["states"] is None


def test_a_bulk_action_reaches_only_the_states_it_can_change() -> None:
    assert JobFilter().narrowed(BulkAction.CANCEL).states == ("queued", "running")
    assert JobFilter(states=("failed", "queued")).narrowed(BulkAction.RETRY).states == ("failed",)
    assert JobFilter(states=("running",)).narrowed(BulkAction.RETRY).states == ("none",), (
        "a filter the action cannot change matches nothing, never everything")


def test_the_log_keeps_only_what_the_filter_gave() -> None:
    assert JobFilter(states=("queued",), org_id=7).as_dict() == {"states": ["queued"], "org_id": 7}


def test_a_route_filter_reaches_the_models_the_route_serves() -> None:
    named = Route("azure", "http://a/v1", models=("gpt-x", "gpt-y"))
    rest = Route("default", "http://d/v1", models=("*", "fake-model"))
    routes = Routes((named, rest), default_model="fake-model")
    assert route_models(named, routes) == (("gpt-x", "gpt-y"), ())
    assert route_models(rest, routes) == ((), ("gpt-x", "gpt-y")), "every model but the others'"
