"""Request options (issue 14, item 1): validated at submit, stored on the job, sent to the
provider over real HTTP, shown by GET /jobs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.devtools.fake_provider import FakeProvider
from service.app import create_app
from tests.helpers import WorkerHarness, fetch_one, submit

API = "/sa-core/v1"

ALL_OPTIONS: dict[str, Any] = {
    "system": "be brief", "temperature": 0.2, "top_p": 1, "max_tokens": 64, "stop": "END",
    "response_format": {"type": "json_object"}, "seed": 7,
}


def test_options_are_stored_sent_and_shown(client: falcon.testing.TestClient, auth: dict[str, str],
                                           workers: WorkerHarness, fake: FakeProvider) -> None:
    done = submit(client, auth, text="hi [opts]", options=ALL_OPTIONS)
    workers.build().run(once=True)

    job = client.simulate_get(f"{API}/jobs/{done['job_id']}", headers=auth).json
    assert job["state"] == "succeeded"
    # NOTE: a lone stop string is stored as the one-item list the provider is sent.
    assert job["execution_options"] == {**ALL_OPTIONS, "stop": ["END"], "top_p": 1.0}
    sent = next(body for body in fake.received if body["messages"][-1]["content"] == "hi [opts]")
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert {name: sent[name] for name in ALL_OPTIONS if name != "system"} == {
        "temperature": 0.2, "top_p": 1.0, "max_tokens": 64, "stop": ["END"],
        "response_format": {"type": "json_object"}, "seed": 7}
    answer = client.simulate_get(f"{API}/prompts/{done['prompt_id']}", headers=auth).json
    assert "system:be brief | user:hi [opts]" in str(answer)


def test_without_options_the_request_is_the_narrow_one(
        client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
        fake: FakeProvider) -> None:
    submit(client, auth, text="plain [narrow]")
    workers.build().run(once=True)
    sent = next(body for body in fake.received
                if body["messages"][-1]["content"] == "plain [narrow]")
    assert set(sent) == {"model", "messages"} and len(sent["messages"]) == 1


@pytest.mark.parametrize(("options", "named"), [
    ({"temperature": 2.5}, "options.temperature"),
    ({"temperature": True}, "options.temperature"),
    ({"temperature": "0.5"}, "options.temperature"),
    ({"top_p": -0.1}, "options.top_p"),
    ({"max_tokens": 0}, "options.max_tokens"),
    ({"max_tokens": 1.5}, "options.max_tokens"),
    ({"stop": ""}, "options.stop"),
    ({"stop": []}, "options.stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "options.stop"),
    ({"stop": ["a", 3]}, "options.stop[1]"),
    ({"stop": "a\u0000"}, "options.stop"),
    ({"response_format": {"type": "xml"}}, "options.response_format.type"),
    ({"response_format": {}}, "options.response_format.type"),
    ({"response_format": "json_object"}, "options.response_format"),
    ({"seed": "7"}, "options.seed"),
    ({"seed": 2**64}, "options.seed"),
    ({"system": "  "}, "options.system"),
    ({"system": 1}, "options.system"),
])
def test_bad_options_are_422_naming_the_field(client: falcon.testing.TestClient,
                                              auth: dict[str, str], pool: ConnectionPool[DictConnection],
                                              options: dict[str, Any], named: str) -> None:
    result = client.simulate_post(f"{API}/prompt", json={"text": "hi", "options": options},
                                  headers=auth)
    assert result.status_code == 422, result.text
    assert result.json["description"].startswith(f"{named}:")
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 0


def test_a_system_prompt_is_bounded_as_a_prompt_is(settings: Settings, pool: ConnectionPool[DictConnection],
                                                   auth: dict[str, str]) -> None:
    client = falcon.testing.TestClient(create_app(replace(settings, max_prompt_chars=50), pool))
    refused = client.simulate_post(f"{API}/prompt", json={"text": "hi", "options": {"system": "s" * 51}},
                                   headers=auth)
    assert refused.status_code == 422, refused.text
    assert refused.json["description"] == "options.system: must be at most 50 characters"
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 0
    accepted = client.simulate_post(f"{API}/prompt", json={"text": "hi", "options": {"system": "s" * 50}},
                                    headers=auth)
    assert accepted.status_code == 202, accepted.text
