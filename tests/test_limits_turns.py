"""A token's page reads and sign-ins take turns in a web process (docs/limits.md): a token that
reads back to back waits for its own answers, and past the wait is refused 429 with Retry-After,
while another token's reads and every submit go on at once."""

from __future__ import annotations

import uuid
from dataclasses import replace

import falcon.testing
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import create_token
from service.app import TURN_ROUTES, create_app
from service.events.hub import EventHub
from tests.helpers import fetch_one

API = "/sa-core/v1"


def test_a_token_reading_back_to_back_waits_its_turn_and_other_tokens_do_not(
    settings: Settings, pool: ConnectionPool[DictConnection], hub: EventHub,
) -> None:
    # NOTE: a share this small makes any read's rest last seconds, past the wait.
    web = falcon.testing.TestClient(create_app(
        replace(settings, token_read_share=0.0001, token_read_wait=0.3), pool, hub=hub))
    a = {"Authorization": f"Bearer {create_token(pool, 1, 10)}"}
    b = {"Authorization": f"Bearer {create_token(pool, 1, 11)}"}

    assert web.simulate_get(f"{API}/mission/recent", headers=a).status_code == 200
    submitted = web.simulate_post(f"{API}/prompt", json={"text": "not a read"}, headers=a)
    assert submitted.status_code == 202
    # NOTE: the turn is taken before the resource is looked up, so an unknown response id is
    # refused like a known one.
    reads = (("GET", f"{API}/mission/recent"), ("GET", f"{API}/mission/prompts"),
             ("GET", f"{API}/jobs/{submitted.json['job_id']}"),
             ("GET", f"{API}/prompts/{submitted.json['prompt_id']}"),
             ("GET", f"{API}/responses/{uuid.uuid4()}"),
             ("GET", f"{API}/usage"), ("POST", f"{API}/session"))
    assert len(reads) == len(TURN_ROUTES)
    for method, path in reads:
        refused = web.simulate_request(method, path, headers=a)
        assert refused.status_code == 429, path
        assert refused.headers["Retry-After"] == "1"
        assert "SA_TOKEN_READ_SHARE" in refused.json["description"]

    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_session")["n"] == 0
    assert web.simulate_get(f"{API}/mission/recent", headers=b).status_code == 200
    assert web.simulate_post(f"{API}/prompt", json={"text": "still not a read"},
                             headers=a).status_code == 202
