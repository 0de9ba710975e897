"""sa_core.client against the real service: gunicorn, a worker process and the fake provider."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from jobqueue.core.db import open_pool
from jobqueue.core.tokens import create_token
from jobqueue.devtools.fake_provider import FakeProvider
from jobqueue.schema.migrate import migrate
from sa_core.client import API_PREFIX, ApiError, AsyncClient, Client, Event, WaitTimeout
from tests.helpers import REPO, answers, free_port, wait_for

# NOTE: the whole module on one xdist worker (make test's --dist loadgroup), so its
# module-scoped web and worker start once.
pytestmark = pytest.mark.xdist_group("client")

_ORGS = itertools.count(700)


class Live:
    """The running service: its URL and a way to get tokens of fresh orgs."""

    def __init__(self, base_url: str, database_url: str) -> None:
        self.base_url = base_url
        self._database_url = database_url

    def token(self) -> str:
        pool = open_pool(self._database_url, name="client-test", max_size=1)
        try:
            return create_token(pool, next(_ORGS), 1, label="client test")
        finally:
            pool.close()


@pytest.fixture(scope="module")
def live(database_url: str, fake: FakeProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    name = f"sa_client_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    url = make_conninfo(database_url, dbname=name)
    migrate(url)
    port = free_port()
    logs = tmp_path_factory.mktemp("live")
    env = {**os.environ, "DATABASE_URL": url, "PORT": str(port), "WEB_CONCURRENCY": "1",
           "SA_PROVIDER_URL": fake.url, "SA_POLL_INTERVAL": "0.1", "SA_SSE_KEEPALIVE": "1",
           "SA_SSE_MAX_STREAMS_PER_TOKEN": "2", "SA_SHUTDOWN_GRACE": "2"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    children: list[subprocess.Popen[bytes]] = []
    with ExitStack() as stack:
        for label, argv in (
                ("web", [sys.executable, "-m", "gunicorn", "-c", "python:service.gunicorn_conf",
                         "service.app:create_app()"]),
                ("worker", [sys.executable, "-m", "jobqueue.operator.cli", "run-worker"])):
            out = stack.enter_context((logs / f"{label}.log").open("wb"))
            children.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                             process_group=0))
        base = f"http://127.0.0.1:{port}"

        try:
            wait_for(lambda: answers(f"{base}/readyz"), timeout=30, interval=0.1)
            yield Live(base, url)
        finally:
            for child in children:
                os.killpg(child.pid, signal.SIGTERM)
            for child in children:
                child.wait(timeout=60)
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


def test_submit_wait_and_read_back_with_an_idempotency_key(live: Live) -> None:
    with Client(live.base_url, live.token()) as sa:
        first = sa.submit("What is sa-core?", idempotency_key="client-1", options={"model": "fake-model"})
        again = sa.submit("What is sa-core?", idempotency_key="client-1", options={"model": "fake-model"})
        assert (again.prompt_id, again.job_id, again.replayed) == (first.prompt_id, first.job_id, True)
        assert not first.replayed and first.state == "queued"

        result = sa.wait(first.job_id, timeout=30)
        assert result.job["state"] == "succeeded"
        assert result.response_text is not None and "What is sa-core?" in result.response_text
        assert sa.job(first.job_id)["prompt_id"] == first.prompt_id
        assert sa.prompt(first.prompt_id)["response"]["content"] == result.response_text

        with pytest.raises(ApiError) as refused:
            sa.submit("something else", idempotency_key="client-1")
        assert refused.value.status == 422


def test_cancel_retry_and_a_wait_that_times_out(live: Live) -> None:
    with Client(live.base_url, live.token()) as sa:
        slow = sa.submit("take your time [fake:latency=30]")
        with pytest.raises(WaitTimeout):
            sa.wait(slow.job_id, timeout=0.5)
        assert sa.cancel(slow.job_id)["state"] == "cancelled"
        with pytest.raises(ApiError) as again:
            sa.cancel(slow.job_id)
        assert again.value.status == 409
        assert sa.wait(slow.job_id, timeout=5).response_text is None

        retried = sa.retry(slow.prompt_id)
        assert retried["supersedes"] == slow.job_id
        with pytest.raises(ApiError) as missing:
            sa.job(str(uuid.uuid4()))
        assert missing.value.status == 404


def _collect(events: Iterator[Event], until: Callable[[list[Event]], bool]) -> list[Event]:
    """Reads `events` on a thread until `until(seen)`; the thread ends with the stream."""
    seen: list[Event] = []
    done = threading.Event()

    def read() -> None:
        for event in events:
            seen.append(event)
            if until(seen):
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(30), f"events seen: {seen}"
    return seen


def test_events_follow_the_stream_and_resume_after_the_last_event_id(live: Live) -> None:
    with Client(live.base_url, live.token()) as sa:
        stream = sa.events()
        submitted: list[str] = []
        threading.Timer(0.5, lambda: submitted.append(sa.submit("stream me").job_id)).start()
        seen = _collect(stream, lambda got: any(e.data["to_state"] == "succeeded" for e in got))
        stream.close()
        assert {e.kind for e in seen} == {"job.state_changed"}
        assert [(e.data["from_state"], e.data["to_state"]) for e in seen] == [
            (None, "queued"), ("queued", "running"), ("running", "succeeded")]
        assert {e.data["job_id"] for e in seen} == set(submitted)

        # NOTE: resuming after the first event replays exactly the two after it.
        resumed = sa.events(last_event_id=seen[0].id)
        replay = _collect(resumed, lambda got: len(got) == 2)
        resumed.close()
        assert [e.id for e in replay] == [e.id for e in seen[1:]]


def test_events_fall_back_to_polling_recent_when_no_stream_is_allowed(live: Live) -> None:
    token = live.token()
    headers = {"Authorization": f"Bearer {token}"}
    with Client(live.base_url, token) as sa, httpx.Client(base_url=live.base_url, headers=headers) as raw, \
            raw.stream("GET", f"{API_PREFIX}/mission/events") as one, \
            raw.stream("GET", f"{API_PREFIX}/mission/events") as two:
        assert one.status_code == two.status_code == 200
        assert raw.get(f"{API_PREFIX}/mission/events").status_code == 429
        done = sa.submit("poll me")
        sa.wait(done.job_id, timeout=30)
        seen = _collect(sa.events(poll_interval=0.2),
                        lambda got: any(e.data["job_id"] == done.job_id for e in got))
        assert seen[-1].kind == "prompt.latest"
        assert (seen[-1].data["prompt_id"], seen[-1].data["state"]) == (done.prompt_id, "succeeded")
        assert seen[-1].id is not None


def test_the_async_client_submits_waits_and_follows_the_stream(live: Live) -> None:
    async def scenario() -> None:
        async with AsyncClient(live.base_url, live.token()) as sa:
            events = sa.events()
            first = asyncio.ensure_future(events.__anext__())
            submitted = await sa.submit("async hello", idempotency_key="async-1")
            event = await asyncio.wait_for(first, 30)
            states = []
            while True:
                assert event.kind == "job.state_changed"
                if event.data["job_id"] == submitted.job_id:
                    states.append(event.data["to_state"])
                    if states[-1] == "succeeded":
                        break
                event = await asyncio.wait_for(events.__anext__(), 30)
            await events.aclose()
            # NOTE: the stream may open after the job was queued, or even claimed: it shows the
            # rest of the job's transitions, in order.
            assert states == ["queued", "running", "succeeded"][-len(states):]
            result = await sa.wait(submitted.job_id, timeout=30)
            assert result.response_text is not None and "async hello" in result.response_text
            assert (await sa.prompt(submitted.prompt_id))["prompt"]["id"] == submitted.prompt_id

    asyncio.run(scenario())
