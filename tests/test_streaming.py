"""Streaming (issue 14, item 3): a route with `stream: true` shows a running attempt's text as
`job.output_delta` events on /mission/events (coalesced) and as `partial_text` on GET /jobs; the
succeeded event carries the final text; a retry starts over; cancel cuts the call mid-stream."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.routes import Route
from jobqueue.core.settings import Settings
from jobqueue.devtools.fake_provider import FakeProvider
from tests.helpers import WorkerHarness, wait_for
from tests.processes import gunicorn
from tests.sse_client import open_http_stream

API = "/sa-core/v1"
WORDS = " ".join(f"w{i}" for i in range(30))


@pytest.fixture
def streamed(base_settings: Settings, fake: FakeProvider) -> Settings:
    return replace(base_settings, provider_url="", stream_interval=0.075,
                   provider_routes=(Route("streamed", fake.url, stream=True),))


def _submit(base: str, auth: dict[str, str], text: str) -> dict[str, Any]:
    answer = httpx.post(f"{base}{API}/prompt", json={"text": text}, headers=auth, timeout=10)
    assert answer.status_code == 202, answer.text
    return dict(answer.json())


def _job(base: str, auth: dict[str, str], job_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{base}{API}/jobs/{job_id}", headers=auth, timeout=10).json())


def _text_of(deltas: list[dict[str, Any]]) -> str:
    """Applies deltas as a client does: by offset, so each attempt starts over."""
    text = ""
    for delta in deltas:
        text = text[:delta["offset"]] + delta["text"]
    return text


def test_a_streamed_reply_reaches_the_viewer_as_deltas_then_as_the_final_text(
        streamed: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        tmp_path: Path) -> None:
    harness = WorkerHarness(streamed, pool)
    with gunicorn(streamed, tmp_path) as base:
        stream = open_http_stream(base, auth)
        done = _submit(base, auth, f"{WORDS} [fake:stream-gap=0.05]")
        try:
            harness.start()
            # NOTE: a polling client sees the text grow while the attempt runs.
            partial = wait_for(lambda: _job(base, auth, done["job_id"])["partial_text"])
            wait_for(lambda: "succeeded" in stream.states(done["job_id"]), timeout=20)
        finally:
            harness.stop_all()
        final = _job(base, auth, done["job_id"])
    answer = f"echo[1]: user:{WORDS} [fake:stream-gap=0.05]"
    assert final["state"] == "succeeded" and final["partial_text"] is None
    assert answer.startswith(partial)
    mine = [(kind, data) for kind, data in stream.order if data["job_id"] == done["job_id"]]
    deltas = [data for kind, data in mine if kind == "job.output_delta"]
    succeeded = [data for kind, data in mine if data.get("to_state") == "succeeded"]
    assert succeeded[0]["response_text"] == answer
    # NOTE: coalesced: 32 pieces over ~1.6 s arrive as a few deltas, each one the next piece
    # of the text, all before the final text.
    assert 2 <= len(deltas) < 32, deltas
    assert deltas[0]["offset"] == 0 and all(d["attempt"] == 1 for d in deltas)
    assert all(b["offset"] == a["offset"] + len(a["text"]) for a, b in pairwise(deltas))
    assert answer.startswith(_text_of(deltas))
    assert mine.index(("job.state_changed", succeeded[0])) > max(
        i for i, (kind, _) in enumerate(mine) if kind == "job.output_delta")


def test_a_retry_streams_from_the_start_and_a_cancel_cuts_the_call(
        streamed: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        fake: FakeProvider, tmp_path: Path) -> None:
    harness = WorkerHarness(streamed, pool)
    with gunicorn(streamed, tmp_path) as base:
        stream = open_http_stream(base, auth)
        # NOTE: the first answer drops after 10 chunks: attempt 1's text is thrown away.
        retried = _submit(base, auth, f"{WORDS} [fake:stream-gap=0.02] [fake:stream-cut=10]")
        slow = _submit(base, auth, f"{WORDS} [fake:stream-gap=0.2]")
        cut_before = fake.streams_cut
        try:
            harness.start()
            wait_for(lambda: any(d["job_id"] == slow["job_id"] for d in stream.deltas),
                     timeout=20)
            cancel = httpx.post(f"{base}{API}/jobs/{slow['job_id']}/cancel", headers=auth,
                                timeout=10)
            assert cancel.status_code == 200, cancel.text
            # NOTE: the stream would run 6 s more; the worker's next write finds the job
            # cancelled and closes the connection.
            wait_for(lambda: fake.streams_cut > cut_before, timeout=2)
            wait_for(lambda: "succeeded" in stream.states(retried["job_id"]), timeout=20)
        finally:
            harness.stop_all()
        assert _job(base, auth, slow["job_id"])["state"] == "cancelled"
        final = _job(base, auth, retried["job_id"])
    assert (final["state"], final["attempt"]) == ("succeeded", 2)
    deltas = [d for d in stream.deltas if d["job_id"] == retried["job_id"]]
    second = [d for d in deltas if d["attempt"] == 2]
    assert {d["attempt"] for d in deltas} == {1, 2} and second[0]["offset"] == 0
    succeeded = next(e for e in stream.events
                     if e["job_id"] == retried["job_id"] and e["to_state"] == "succeeded")
    assert succeeded["response_text"].startswith(_text_of(deltas))
