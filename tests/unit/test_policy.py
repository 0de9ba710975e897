"""Unit tests for failure classification, backoff and the retry decision."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from jobqueue.core.policy import (
    RETRYABLE,
    BackoffConfig,
    ErrorKind,
    ReclaimCandidate,
    RetryAction,
    RetryDecision,
    backoff_delay,
    classify_status,
    decide,
    decide_reclaim,
    parse_retry_after,
)

__all__: list[str] = []

NOW = datetime(2025, 1, 15, 12, 0, 0, tzinfo=UTC)
DRAWS = 2000


# --- classify_status ---------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (408, ErrorKind.TIMEOUT),
        (429, ErrorKind.RATE_LIMIT),
        (401, ErrorKind.AUTH),
        (403, ErrorKind.AUTH),
        (400, ErrorKind.PROVIDER_4XX),
        (404, ErrorKind.PROVIDER_4XX),
        (409, ErrorKind.PROVIDER_4XX),
        (422, ErrorKind.PROVIDER_4XX),
        (499, ErrorKind.PROVIDER_4XX),
        (500, ErrorKind.PROVIDER_5XX),
        (502, ErrorKind.PROVIDER_5XX),
        (503, ErrorKind.PROVIDER_5XX),
        (599, ErrorKind.PROVIDER_5XX),
        (100, ErrorKind.UNKNOWN),
        (199, ErrorKind.UNKNOWN),
        (302, ErrorKind.UNKNOWN),
        (304, ErrorKind.UNKNOWN),
        (600, ErrorKind.UNKNOWN),
        (999, ErrorKind.UNKNOWN),
        (0, ErrorKind.UNKNOWN),
    ],
)
def test_classify_status(status: int, kind: ErrorKind) -> None:
    assert classify_status(status) is kind


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_classify_status_rejects_success(status: int) -> None:
    with pytest.raises(ValueError, match="success"):
        classify_status(status)


def test_retryable_set_matches_spec() -> None:
    assert (
        frozenset(
            {
                ErrorKind.TIMEOUT,
                ErrorKind.RATE_LIMIT,
                ErrorKind.PROVIDER_5XX,
                ErrorKind.WORKER_CRASH,
                ErrorKind.UNKNOWN,
            }
        )
        == RETRYABLE
    )


# --- parse_retry_after -------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        ("120", 120.0),
        ("  7 ", 7.0),
        ("0.5", 0.5),
        ("2.25", 2.25),
        (".5", 0.5),
        ("3.", 3.0),
        # HTTP-dates, RFC 9110 preferred form and the obsolete ones
        ("Wed, 15 Jan 2025 12:01:30 GMT", 90.0),
        ("Wed, 15 Jan 2025 13:00:00 GMT", 3600.0),
        ("Wednesday, 15-Jan-25 12:00:10 GMT", 10.0),
        ("Wed Jan 15 12:00:05 2025", 5.0),
        ("Wed, 15 Jan 2025 12:00:20 -0000", 20.0),
        # dates in the past clamp to zero
        ("Wed, 15 Jan 2025 11:59:00 GMT", 0.0),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
    ],
)
def test_parse_retry_after_valid(value: str, expected: float) -> None:
    assert parse_retry_after(value, NOW) == pytest.approx(expected)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "   ",
        "soon",
        "-1",
        "-0.5",
        "+5",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "1e3",
        "1_000",
        "5s",
        "1.2.3",
        "9" * 400,
        "Wed, 99 Foo 2025 12:00:00 GMT",
        "Wed, 15 Jan 2025 25:61:00 GMT",
    ],
)
def test_parse_retry_after_invalid(value: str | None) -> None:
    assert parse_retry_after(value, NOW) is None


def test_parse_retry_after_uses_now_offset() -> None:
    # The same instant expressed in another zone must give the same answer.
    other = NOW.astimezone(timezone(timedelta(hours=-5)))
    assert parse_retry_after("Wed, 15 Jan 2025 12:00:45 GMT", other) == pytest.approx(45.0)


def test_parse_retry_after_rejects_naive_now() -> None:
    with pytest.raises(ValueError, match="aware"):
        parse_retry_after("5", datetime(2025, 1, 15, 12, 0, 0))


# --- BackoffConfig -----------------------------------------------------------


def test_backoff_config_defaults() -> None:
    config = BackoffConfig()
    assert (config.base, config.cap, config.rate_limit_min_wait) == (5.0, 3600.0, 60.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": 0.0},
        {"base": -1.0},
        {"cap": 0.0},
        {"cap": -5.0},
        {"rate_limit_min_wait": -0.1},
        {"base": math.nan},
        {"cap": math.inf},
        {"rate_limit_min_wait": math.nan},
    ],
)
def test_backoff_config_rejects(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BackoffConfig(**kwargs)


def test_backoff_config_accepts_fractions_and_zero_min_wait() -> None:
    config = BackoffConfig(base=0.5, cap=2.5, rate_limit_min_wait=0.0)
    assert (config.base, config.cap, config.rate_limit_min_wait) == (0.5, 2.5, 0.0)


# --- backoff_delay -----------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [
        (2, 5.0, 10.0),
        (3, 25.0, 40.0),
        (4, 125.0, 200.0),
        (5, 625.0, 1000.0),
    ],
)
def test_backoff_ranges(attempt: int, low: float, high: float) -> None:
    rng = random.Random(1234)
    config = BackoffConfig()
    draws = [backoff_delay(attempt, config, rng) for _ in range(DRAWS)]
    assert low <= min(draws)
    assert max(draws) <= high
    # jitter really spreads: most of the range is used and values differ
    assert min(draws) < low + 0.05 * (high - low)
    assert max(draws) > high - 0.05 * (high - low)
    assert len(set(draws)) > DRAWS * 0.99


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [(2, 0.5, 1.0), (3, 2.5, 4.0), (4, 12.5, 20.0), (6, 312.5, 500.0)],
)
def test_backoff_scales_with_base(attempt: int, low: float, high: float) -> None:
    rng = random.Random(7)
    config = BackoffConfig(base=0.5)
    draws = [backoff_delay(attempt, config, rng) for _ in range(500)]
    assert low <= min(draws)
    assert max(draws) <= high


def test_backoff_is_repeatable_with_a_seed() -> None:
    config = BackoffConfig()
    first = [backoff_delay(3, config, random.Random(42)) for _ in range(3)]
    assert first[0] == first[1] == first[2]


def test_backoff_cap_clips_jitter() -> None:
    # attempt 5 would be 625..1000; a cap of 800 clips the upper part only
    rng = random.Random(5)
    config = BackoffConfig(cap=800.0)
    draws = [backoff_delay(5, config, rng) for _ in range(DRAWS)]
    assert min(draws) >= 625.0
    assert max(draws) == 800.0
    assert any(d < 800.0 for d in draws)


@pytest.mark.parametrize("attempt", [6, 7, 10, 50, 1000, 10**6, 10**18])
def test_backoff_capped_for_large_attempts(attempt: int) -> None:
    # attempt 6 starts at 3125 + up to 1875, over the default cap of 3600
    rng = random.Random(0)
    config = BackoffConfig()
    draws = {backoff_delay(attempt, config, rng) for _ in range(200)}
    if attempt == 6:
        assert min(draws) >= 3125.0
        assert max(draws) == 3600.0
    else:
        assert draws == {3600.0}


def test_backoff_floor_above_cap_returns_cap() -> None:
    config = BackoffConfig(base=10.0, cap=3.0)
    assert backoff_delay(2, config, random.Random(0)) == 3.0


@pytest.mark.parametrize("attempt", [1, 0, -3])
def test_backoff_rejects_first_attempt(attempt: int) -> None:
    with pytest.raises(ValueError, match="next_attempt"):
        backoff_delay(attempt, BackoffConfig(), random.Random(0))


# --- decide ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "low", "high"),
    [
        (ErrorKind.TIMEOUT, 5.0, 10.0),
        (ErrorKind.PROVIDER_5XX, 5.0, 10.0),
        (ErrorKind.UNKNOWN, 5.0, 10.0),
        (ErrorKind.WORKER_CRASH, 0.0, 0.0),
        (ErrorKind.RATE_LIMIT, 60.0, 60.0),
    ],
)
def test_decide_retries_retryable_kinds(kind: ErrorKind, low: float, high: float) -> None:
    decision = decide(kind, 1, 3, None, BackoffConfig(), random.Random(3))
    assert decision.action is RetryAction.RETRY
    assert low <= decision.delay <= high
    assert decision.reason == f"retrying in {decision.delay:.1f}s (attempt 2 of 3)"


@pytest.mark.parametrize(
    "kind",
    [ErrorKind.PROVIDER_4XX, ErrorKind.PARSE, ErrorKind.AUTH, ErrorKind.STUCK],
)
def test_decide_fails_non_retryable(kind: ErrorKind) -> None:
    decision = decide(kind, 1, 3, None, BackoffConfig(), random.Random(0))
    assert decision == RetryDecision(RetryAction.FAIL, 0.0, "not retryable")


@pytest.mark.parametrize("kind", sorted(RETRYABLE))
@pytest.mark.parametrize(("attempt", "max_attempts"), [(3, 3), (1, 1), (5, 3)])
def test_decide_fails_when_budget_exhausted(
    kind: ErrorKind, attempt: int, max_attempts: int
) -> None:
    decision = decide(kind, attempt, max_attempts, 1.0, BackoffConfig(), random.Random(0))
    assert decision == RetryDecision(
        RetryAction.FAIL, 0.0, f"retry budget exhausted after {attempt} attempts"
    )


def test_decide_second_attempt_uses_attempt_three_backoff() -> None:
    decision = decide(ErrorKind.TIMEOUT, 2, 3, None, BackoffConfig(), random.Random(9))
    assert decision.action is RetryAction.RETRY
    assert 25.0 <= decision.delay <= 40.0
    assert decision.reason.endswith("(attempt 3 of 3)")


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [(0.0, 0.0), (0.5, 0.5), (7.0, 7.0), (120.0, 120.0), (10_000.0, 3600.0), (math.inf, 3600.0)],
)
def test_decide_rate_limit_honours_retry_after(retry_after: float, expected: float) -> None:
    # NOTE: retry_after below rate_limit_min_wait is still honoured as given.
    decision = decide(ErrorKind.RATE_LIMIT, 1, 3, retry_after, BackoffConfig(), random.Random(0))
    assert decision.action is RetryAction.RETRY
    assert decision.delay == expected


def test_decide_rate_limit_without_header_uses_min_wait_floor() -> None:
    rng = random.Random(11)
    config = BackoffConfig()
    delays = [decide(ErrorKind.RATE_LIMIT, 1, 5, None, config, rng).delay for _ in range(200)]
    assert set(delays) == {60.0}


def test_decide_rate_limit_without_header_backoff_beats_floor() -> None:
    # next attempt 4 backs off 125..200s, above the 60s floor
    rng = random.Random(12)
    delays = [
        decide(ErrorKind.RATE_LIMIT, 3, 5, None, BackoffConfig(), rng).delay for _ in range(200)
    ]
    assert all(125.0 <= d <= 200.0 for d in delays)
    assert len(set(delays)) > 150


def test_decide_rate_limit_floor_is_capped() -> None:
    config = BackoffConfig(cap=30.0, rate_limit_min_wait=60.0)
    decision = decide(ErrorKind.RATE_LIMIT, 1, 3, None, config, random.Random(0))
    assert decision.delay == 30.0


def test_decide_retry_after_ignored_for_other_kinds() -> None:
    decision = decide(ErrorKind.PROVIDER_5XX, 1, 3, 900.0, BackoffConfig(), random.Random(1))
    assert 5.0 <= decision.delay <= 10.0


def test_decide_worker_crash_is_immediate_on_any_attempt() -> None:
    for attempt in range(1, 10):
        decision = decide(
            ErrorKind.WORKER_CRASH, attempt, 10, None, BackoffConfig(), random.Random(0)
        )
        assert decision.action is RetryAction.RETRY
        assert decision.delay == 0.0


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "retry_after"),
    [(0, 3, None), (1, 0, None), (1, 3, -1.0), (1, 3, math.nan)],
)
def test_decide_rejects_bad_arguments(
    attempt: int, max_attempts: int, retry_after: float | None
) -> None:
    with pytest.raises(ValueError):
        decide(
            ErrorKind.TIMEOUT, attempt, max_attempts, retry_after, BackoffConfig(), random.Random(0)
        )


# --- decide_reclaim ----------------------------------------------------------


def _running(started_ago: float, silent_for: float, attempt: int = 1,
             max_attempts: int = 3) -> ReclaimCandidate:
    return ReclaimCandidate(worker_claim="w1", attempt=attempt, max_attempts=max_attempts,
                            started_at=NOW - timedelta(seconds=started_ago),
                            last_heartbeat=NOW - timedelta(seconds=silent_for))


def test_decide_reclaim_leaves_a_heartbeating_job_within_the_stuck_limit_alone() -> None:
    assert decide_reclaim(_running(899.9, 300.0), NOW, 300.0, 900.0) is None


def test_decide_reclaim_requeues_a_silent_job_with_attempts_left_at_once() -> None:
    decision = decide_reclaim(_running(400.0, 300.5, attempt=2), NOW, 300.0, 900.0)
    assert decision is not None
    assert (decision.action, decision.kind) == (RetryAction.RETRY, ErrorKind.WORKER_CRASH)
    assert "w1" in decision.message and "attempt 2 of 3 requeued" in decision.message


def test_decide_reclaim_fails_a_silent_job_on_its_last_attempt_as_stuck() -> None:
    decision = decide_reclaim(_running(400.0, 301.0, attempt=3), NOW, 300.0, 900.0)
    assert decision is not None
    assert (decision.action, decision.kind) == (RetryAction.FAIL, ErrorKind.STUCK)
    assert "last attempt (3 of 3)" in decision.message


@pytest.mark.parametrize("silent_for", [0.0, 301.0])
def test_decide_reclaim_fails_an_attempt_past_the_stuck_limit_heartbeat_or_not(
    silent_for: float,
) -> None:
    decision = decide_reclaim(_running(900.0, silent_for, attempt=1), NOW, 300.0, 900.0)
    assert decision is not None
    assert (decision.action, decision.kind) == (RetryAction.FAIL, ErrorKind.STUCK)
    assert "longer ago than the stuck limit" in decision.message
    assert ("still heartbeating" in decision.message) == (silent_for == 0.0)


def test_decide_reclaim_rejects_a_naive_instant_and_bad_attempts() -> None:
    with pytest.raises(ValueError, match="timezone"):
        decide_reclaim(_running(1.0, 1.0), NOW.replace(tzinfo=None), 300.0, 900.0)
    with pytest.raises(ValueError, match="attempt"):
        decide_reclaim(_running(1.0, 1.0, attempt=0), NOW, 300.0, 900.0)
