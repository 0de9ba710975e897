"""The web's bounds decided without a database: the wait caps, a stream's unread backlog in
events and bytes, the frame cache's bytes, the settings' defaults, and cursors that always parse."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import falcon
import pytest

from jobqueue.core.settings import Settings, SettingsError
from service.events.fanout import Fanout
from service.events.model import JobEvent, OutputDelta
from service.events.stream import FrameCache
from service.events.subscription import SubscriptionClosed
from service.parsers import encode_jobs_cursor, parse_jobs_cursor
from service.waits import Waits

__all__: list[str] = []

A, B = b"a" * 32, b"b" * 32


def _event(event_id: int, text: str | None = None, user: int = 10) -> JobEvent:
    return JobEvent(id=event_id, job_id=uuid.uuid4(), prompt_id=uuid.uuid4(), org_id=1,
                    created_by=user, from_state="running", to_state="succeeded", attempt=1,
                    error_kind=None, response_id=uuid.uuid4(), at=datetime.now(UTC),
                    response_text=text)


# --- waits ----------------------------------------------------------------------------------


def test_a_token_holds_at_most_its_cap_of_waits_and_gets_them_back_however_they_end() -> None:
    waits = Waits(per_token=2, per_process=10)
    with waits.admit(A) as first, waits.admit(A) as second, waits.admit(A) as third:
        assert first is not None and second is not None and second.held == 2
        assert third is None
        with waits.admit(B) as other:
            assert other is not None, "another token is not held back by A's cap"
    assert waits.held == 0
    with pytest.raises(RuntimeError), waits.admit(A) as slot:
        assert slot is not None
        raise RuntimeError("the request failed while waiting")
    assert waits.held == 0
    with waits.admit(A) as again:
        assert again is not None and again.held == 1


def test_the_process_holds_at_most_its_cap_of_waits_whoever_asks() -> None:
    waits = Waits(per_token=5, per_process=3)
    tokens = [bytes([n]) * 32 for n in range(4)]
    with waits.admit(tokens[0]) as s0, waits.admit(tokens[1]) as s1, waits.admit(tokens[2]) as s2:
        assert None not in (s0, s1, s2)
        with waits.admit(tokens[3]) as refused:
            assert refused is None
        assert waits.held == 3
    with waits.admit(tokens[3]) as admitted:
        assert admitted is not None


def test_concurrent_admissions_never_pass_the_caps() -> None:
    waits = Waits(per_token=4, per_process=6)
    admitted, tried, lock = [0], [0], threading.Lock()
    start, everyone_tried = threading.Barrier(20), threading.Event()

    def one(token: bytes) -> None:
        start.wait()
        with waits.admit(token) as slot:
            with lock:
                tried[0] += 1
                admitted[0] += slot is not None
                if tried[0] == 20:
                    everyone_tried.set()
            # NOTE: an admitted request holds its slot until every other one has asked.
            if slot is not None:
                everyone_tried.wait(10)

    threads = [threading.Thread(target=one, args=(A if n % 2 else B,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert everyone_tried.is_set()
    assert admitted[0] == 6 and waits.held == 0


def test_wait_caps_default_to_a_quarter_of_the_web_connections_and_must_be_positive() -> None:
    base = {"DATABASE_URL": "postgresql://x/y"}
    assert Settings.from_env(base).wait_max == 250
    assert Settings.from_env({**base, "SA_WEB_CONNECTIONS": "200"}).wait_max == 50
    assert Settings.from_env({**base, "SA_WAIT_MAX": "7"}).wait_max == 7
    assert Settings.from_env(base).wait_max_per_token == 10
    for name in ("SA_WAIT_MAX", "SA_WAIT_MAX_PER_TOKEN", "SA_SESSIONS_PER_TOKEN",
                 "SA_FEED_TEXT_MAX_CHARS", "SA_BATCH_MAX_BYTES"):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({**base, name: "0"})
    with pytest.raises(SettingsError, match="SA_PAGE_MAX_BYTES"):
        Settings.from_env({**base, "SA_PAGE_MAX_BYTES": "100"})


# --- a stream's unread backlog ----------------------------------------------------------------


def test_a_stream_that_leaves_too_many_bytes_unread_is_dropped_alone() -> None:
    fanout = Fanout(client_buffer=1000, client_buffer_bytes=64 * 1024, max_streams=10,
                    max_streams_per_token=10, retry_after=1)
    fanout.start(0)
    slow = fanout.subscribe(1, 10, A)
    reading = fanout.subscribe(1, 10, A)
    got = []
    for n in range(1, 6):
        fanout.deliver([_event(n, "x" * 20_000)])
        got += [e.id for e in reading.wait(0) if isinstance(e, JobEvent)]
    assert got == [1, 2, 3, 4, 5]
    with pytest.raises(SubscriptionClosed, match="behind"):
        slow.wait(0)
    assert fanout.count == 1 and fanout.cursor == 5


def test_a_stream_that_leaves_too_many_events_unread_is_dropped_however_small() -> None:
    fanout = Fanout(client_buffer=3, client_buffer_bytes=1 << 30, max_streams=10,
                    max_streams_per_token=10, retry_after=1)
    fanout.start(0)
    slow = fanout.subscribe(1, None, A)
    for n in range(1, 5):
        fanout.deliver([_event(n)])
    with pytest.raises(SubscriptionClosed):
        slow.wait(0)


def test_deltas_count_against_the_unread_bytes_too() -> None:
    fanout = Fanout(client_buffer=1000, client_buffer_bytes=10_000, max_streams=10,
                    max_streams_per_token=10, retry_after=1)
    fanout.start(0)
    sub = fanout.subscribe(1, 10, A)
    job = uuid.uuid4()
    fanout.deliver_deltas([OutputDelta(job, job, 1, 10, 1, 0, "y" * 6000)])
    fanout.deliver_deltas([OutputDelta(job, job, 1, 10, 1, 6000, "y" * 6000)])
    with pytest.raises(SubscriptionClosed):
        sub.wait(0)


def test_a_left_stream_frees_its_place_under_the_caps() -> None:
    fanout = Fanout(client_buffer=10, client_buffer_bytes=1 << 20, max_streams=2,
                    max_streams_per_token=1, retry_after=1)
    sub = fanout.subscribe(1, 10, A)
    sub.leave()
    sub.leave()
    assert fanout.count == 0 and fanout.tokens() == []
    fanout.subscribe(1, 10, A)


# --- the frame cache ---------------------------------------------------------------------------


def test_the_frame_cache_keeps_at_most_its_bytes_and_still_encodes_every_frame() -> None:
    cache = FrameCache(size=4096, max_bytes=100_000)
    events = [_event(n, "z" * 30_000) for n in range(1, 11)]
    for event in events:
        assert b'"id":%d' % event.id in cache.frames([event])
    assert cache._bytes <= 100_000 and len(cache._frames) == 3
    assert cache.frames(events[:1]).startswith(b"id: 1\nevent: job.state_changed\n")


# --- cursors ----------------------------------------------------------------------------------


def test_a_jobs_cursor_round_trips_and_every_string_of_its_shape_parses() -> None:
    at, job = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC), uuid.uuid4()
    assert parse_jobs_cursor(encode_jobs_cursor(at, job)) == (at, job)
    for raw in ("_" * 32, "A" * 32, "-" * 32, "f" * 32):
        before_at, _ = parse_jobs_cursor(raw) or (None, None)
        assert before_at is not None and before_at - datetime(1, 1, 1, tzinfo=UTC) >= timedelta(0)
    for raw in ("", "A" * 31, "A" * 33, "A" * 31 + "="):
        with pytest.raises(falcon.HTTPInvalidParam):
            parse_jobs_cursor(raw)
