"""The chaos proof: a few hundred jobs, workers SIGKILLed at random, every provider failure injected."""

from __future__ import annotations

from bench.chaos import run_chaos
from jobqueue.devtools.fake_provider import FakeProvider


def test_no_job_is_lost_duplicated_or_stuck_when_workers_die(database_url: str,
                                                             fake: FakeProvider) -> None:
    report = run_chaos(database_url, fake.url, jobs=300, workers=3, kills=6, seed=7, timeout=90,
                       latency=0.3)

    counts = report.counts
    assert report.kills == 6
    assert counts["jobs"] == 300
    assert counts["not_terminal"] == 0, "\n".join(report.lines())
    assert counts["succeeded"] > 0 and counts["failed"] > 0
    assert counts["jobs_reclaimed"] > 0, "no kill landed on a running job; the proof proved nothing"
    assert counts["succeeded_without_exactly_one_response"] == 0
    assert counts["succeeded_without_exactly_one_edge"] == 0
    assert counts["orphan_responses"] == 0
    assert counts["over_max_attempts"] == 0
    assert report.illegal_transitions == 0
