"""Failure model, part 2: cancel (a late result is discarded) and user retry (supersede)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.errors import Conflict, NotFound
from jobqueue.core.tokens import Caller
from jobqueue.engine.claim import ClaimedJob, claim
from jobqueue.engine.control import Retried, cancel_job, retry_job, retry_prompt
from jobqueue.engine.enqueue import enqueue
from jobqueue.engine.reclaim import Reclaimer
from jobqueue.runtime.executor import Outcome
from jobqueue.runtime.run_control import RunControl
from tests.helpers import WorkerHarness, fetch_all, fetch_one, wait_for

API = "/sa-core/v1"


def submit(client: falcon.testing.TestClient, auth: dict[str, str], **body: Any) -> dict[str, Any]:
    result = client.simulate_post(f"{API}/prompt", json=body, headers=auth)
    assert result.status_code == 202, result.text
    return dict(result.json)


def job_row(pool: ConnectionPool[DictConnection], job_id: Any) -> dict[str, Any]:
    return fetch_one(pool, "SELECT * FROM sa_job WHERE id = %s", job_id)


def transitions(pool: ConnectionPool[DictConnection], job_id: Any) -> list[tuple[Any, Any]]:
    rows = fetch_all(pool, "SELECT from_state, to_state FROM sa_job_event WHERE job_id = %s "
                           "ORDER BY id", job_id)
    return [(r["from_state"], r["to_state"]) for r in rows]


def failed_job(pool: ConnectionPool[DictConnection], caller: Caller) -> ClaimedJob:
    """A job that failed (as stuck: claimed by a worker that died, on its only attempt)."""
    enqueue(pool, caller, f"doomed {uuid.uuid4()}", max_attempts=1, priority=7)
    (job,) = claim(pool, "dead-worker", 1, 100)
    counts = Reclaimer(pool, Reclaimer.Config(stale_after=1.0)).run_once(
        now=job.claimed_at + timedelta(seconds=2))
    assert counts.failed == 1
    return job


def artefacts(pool: ConnectionPool[DictConnection], job_id: Any) -> dict[str, int]:
    return {
        "responses": fetch_one(pool, "SELECT count(*) AS n FROM sa_entity WHERE kind = 'response'")["n"],
        "ledger": fetch_one(pool, "SELECT count(*) AS n FROM sa_ledger WHERE job_id = %s", job_id)["n"],
        "audit": fetch_one(pool, "SELECT count(*) AS n FROM sa_audit WHERE job_id = %s", job_id)["n"],
        "edges": fetch_one(pool, "SELECT count(*) AS n FROM sa_edge")["n"],
    }


# --- cancel -------------------------------------------------------------------------------


def test_cancel_queued_job_over_http(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    submitted = submit(client, auth, text="never mind")

    result = client.simulate_post(f"{API}/jobs/{submitted['job_id']}/cancel", headers=auth)

    assert result.status_code == 200, result.text
    body = result.json
    assert (body["id"], body["state"]) == (submitted["job_id"], "cancelled")
    assert body["finished_at"] is not None and body["error_message"] == "cancelled by user 10"
    workers.build().run(once=True)
    assert job_row(pool, submitted["job_id"])["state"] == "cancelled"
    assert transitions(pool, submitted["job_id"]) == [(None, "queued"), ("queued", "cancelled")]


@pytest.mark.parametrize(("heartbeat_interval", "cancel_check_interval", "expected"), [
    (0.1, 60.0, Outcome.ABANDONED),  # the heartbeat notices the lost claim during the call
    (60.0, 0.1, Outcome.ABANDONED),  # the departure watch reads the cancel in the event log
    # neither looks in time: the conditional finalize matches nothing
    (60.0, 60.0, Outcome.CLAIM_LOST),
])
def test_cancelled_running_jobs_late_result_is_discarded(
    heartbeat_interval: float, cancel_check_interval: float, expected: Outcome,
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection], monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = workers.start(heartbeat_interval=heartbeat_interval,
                           cancel_check_interval=cancel_check_interval)
    outcomes: list[Outcome] = []
    finished = threading.Event()
    run_claimed = worker.executor.run_claimed

    def spy(job: ClaimedJob, control: RunControl | None = None) -> Outcome:
        outcome = run_claimed(job, control)
        outcomes.append(outcome)
        finished.set()
        return outcome

    monkeypatch.setattr(worker.executor, "run_claimed", spy)
    submitted = submit(client, auth, text=f"slow answer [fake:latency=1] {uuid.uuid4()}")
    job_id = submitted["job_id"]
    wait_for(lambda: job_row(pool, job_id)["state"] == "running")

    result = client.simulate_post(f"{API}/jobs/{job_id}/cancel", headers=auth)
    assert result.status_code == 200, result.text
    assert result.json["state"] == "cancelled"

    assert finished.wait(10), "the provider call never came back"
    assert outcomes == [expected]
    row = job_row(pool, job_id)
    assert (row["state"], row["response_id"]) == ("cancelled", None)
    assert artefacts(pool, job_id) == {"responses": 0, "ledger": 0, "audit": 0, "edges": 0}
    assert transitions(pool, job_id) == [
        (None, "queued"), ("queued", "running"), ("running", "cancelled")]


def test_a_cancelled_jobs_slot_takes_new_work_while_its_provider_call_still_hangs(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    worker = workers.start(concurrency=1, heartbeat_interval=0.1)
    hung = submit(client, auth, text=f"never answers [fake:hang] {uuid.uuid4()}")["job_id"]
    wait_for(lambda: job_row(pool, hung)["state"] == "running")
    assert client.simulate_post(f"{API}/jobs/{hung}/cancel", headers=auth).status_code == 200
    wait_for(lambda: worker.inflight == 0)

    follower = submit(client, auth, text="next in line")["job_id"]

    # NOTE: well before the hung call's own timeout (settings.provider_timeout, 5 s in tests).
    wait_for(lambda: job_row(pool, follower)["state"] == "succeeded", timeout=3)
    assert job_row(pool, hung)["state"] == "cancelled"


def test_cancel_of_a_terminal_job_answers_409(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    submitted = submit(client, auth, text="done already")
    workers.build().run(once=True)

    result = client.simulate_post(f"{API}/jobs/{submitted['job_id']}/cancel", headers=auth)

    assert result.status_code == 409, result.text
    assert result.json == {
        "title": "Conflict",
        "description": f"job {submitted['job_id']} is already succeeded; nothing to cancel",
    }
    assert job_row(pool, submitted["job_id"])["state"] == "succeeded"


def test_cancel_of_another_orgs_job_looks_exactly_like_a_missing_one(
    client: falcon.testing.TestClient, auth: dict[str, str], other_org_auth: dict[str, str],
    pool: ConnectionPool[DictConnection],
) -> None:
    job_id = submit(client, auth, text="mine")["job_id"]
    missing = str(uuid.uuid4())

    theirs = client.simulate_post(f"{API}/jobs/{job_id}/cancel", headers=other_org_auth)
    nothing = client.simulate_post(f"{API}/jobs/{missing}/cancel", headers=other_org_auth)

    assert theirs.status_code == nothing.status_code == 404
    assert theirs.json == {"title": "Not found", "description": f"job {job_id} not found"}
    assert nothing.json == {"title": "Not found", "description": f"job {missing} not found"}
    assert job_row(pool, job_id)["state"] == "queued"


def test_cancel_job_function_raises_domain_errors(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    done = enqueue(pool, caller, "cancel me")
    with pytest.raises(NotFound):
        cancel_job(pool, done.job_id, caller.org_id + 1)
    row = cancel_job(pool, done.job_id, None)
    assert (row["state"], row["error_message"]) == ("cancelled", "cancelled by an operator")
    assert "changed" not in row
    with pytest.raises(Conflict, match="is already cancelled; nothing to cancel"):
        cancel_job(pool, done.job_id, caller.org_id)
    with pytest.raises(Conflict, match="is already cancelled; nothing to cancel"):
        cancel_job(pool, done.job_id, None)


def test_cli_cancel_job(
    cli: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str],
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    done = enqueue(pool, caller, "operator cancels this")

    assert cli(["cancel-job", str(done.job_id)]) == 0
    assert f"job {done.job_id} cancelled" in capsys.readouterr().out
    assert job_row(pool, done.job_id)["state"] == "cancelled"

    assert cli(["cancel-job", str(done.job_id)]) == 1
    assert "is already cancelled; nothing to cancel" in capsys.readouterr().err

    missing = uuid.uuid4()
    assert cli(["cancel-job", str(missing)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and f"job {missing} not found" in captured.err


# --- retry --------------------------------------------------------------------------------


def test_retry_supersedes_a_failed_job_and_the_new_job_succeeds(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    text = f"[fake:flaky=1] retry me {uuid.uuid4()}"
    submitted = submit(client, auth, text=text, max_attempts=1, priority=7, options={"depth": 3})
    prompt_id, old_id = submitted["prompt_id"], submitted["job_id"]
    workers.build().run(once=True)
    assert (job_row(pool, old_id)["state"], job_row(pool, old_id)["error_kind"]) == (
        "failed", "provider_5xx")

    result = client.simulate_post(f"{API}/prompts/{prompt_id}/retry", headers=auth)

    assert result.status_code == 202, result.text
    new_id = result.json["job_id"]
    assert result.json == {"prompt_id": prompt_id, "job_id": new_id, "state": "queued",
                           "supersedes": old_id}
    assert result.headers["Location"].endswith(f"{API}/jobs/{new_id}")
    old, new = job_row(pool, old_id), job_row(pool, new_id)
    assert old["state"] == "superseded" and old["error_kind"] == "provider_5xx"
    assert (new["state"], new["attempt"], str(new["supersedes"])) == ("queued", 1, old_id)
    for column in ("prompt_id", "priority", "max_attempts", "execution_options", "org_id",
                   "created_by"):
        assert new[column] == old[column], column
    assert transitions(pool, old_id)[-1] == ("failed", "superseded")
    assert transitions(pool, new_id) == [(None, "queued")]

    workers.build().run(once=True)

    new = job_row(pool, new_id)
    assert new["state"] == "succeeded"
    prompt = client.simulate_get(f"{API}/prompts/{prompt_id}", headers=auth).json
    assert [(j["id"], j["state"]) for j in prompt["jobs"]] == [
        (new_id, "succeeded"), (old_id, "superseded")]
    assert prompt["response"]["id"] == str(new["response_id"])
    assert prompt["response"]["content"] == f"echo[1]: user:{text}"


def test_retry_of_a_succeeded_job_shows_the_new_response_once_it_succeeds(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    submitted = submit(client, auth, text=f"again please {uuid.uuid4()}")
    workers.build().run(once=True)
    first_response = job_row(pool, submitted["job_id"])["response_id"]

    retried = client.simulate_post(f"{API}/prompts/{submitted['prompt_id']}/retry", headers=auth)
    assert retried.status_code == 202, retried.text
    workers.build().run(once=True)

    prompt = client.simulate_get(f"{API}/prompts/{submitted['prompt_id']}", headers=auth).json
    newest = job_row(pool, retried.json["job_id"])
    assert newest["state"] == "succeeded" and newest["response_id"] != first_response
    assert prompt["response"]["id"] == str(newest["response_id"])
    assert [j["id"] for j in prompt["jobs"]] == [retried.json["job_id"], submitted["job_id"]]


def test_retry_of_an_active_job_answers_409(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    submitted = submit(client, auth, text="still waiting")
    url = f"{API}/prompts/{submitted['prompt_id']}/retry"

    queued = client.simulate_post(url, headers=auth)
    assert queued.status_code == 409, queued.text
    assert queued.json["description"] == (
        f"job {submitted['job_id']} is still queued; cancel it first")

    claim(pool, "busy-worker", 1, 100)
    running = client.simulate_post(url, headers=auth)
    assert running.status_code == 409, running.text
    assert running.json["description"] == (
        f"job {submitted['job_id']} is still running; cancel it first")
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 1


def test_retry_after_cancel_and_of_a_superseded_job(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    caller: Caller,
) -> None:
    submitted = submit(client, auth, text="changed my mind twice")
    assert client.simulate_post(f"{API}/jobs/{submitted['job_id']}/cancel",
                                headers=auth).status_code == 200

    retried = client.simulate_post(f"{API}/prompts/{submitted['prompt_id']}/retry", headers=auth)
    assert retried.status_code == 202, retried.text
    assert transitions(pool, submitted["job_id"])[-1] == ("cancelled", "superseded")

    with pytest.raises(Conflict) as excinfo:
        retry_job(pool, uuid.UUID(submitted["job_id"]), caller.org_id)
    assert excinfo.value.description == (
        f"job {submitted['job_id']} is already superseded by {retried.json['job_id']}")


def test_retry_of_another_orgs_prompt_looks_exactly_like_a_missing_one(
    client: falcon.testing.TestClient, auth: dict[str, str], other_org_auth: dict[str, str],
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    job = failed_job(pool, caller)
    missing = str(uuid.uuid4())

    theirs = client.simulate_post(f"{API}/prompts/{job.prompt_id}/retry", headers=other_org_auth)
    nothing = client.simulate_post(f"{API}/prompts/{missing}/retry", headers=other_org_auth)

    assert theirs.status_code == nothing.status_code == 404
    assert theirs.json == {"title": "Not found", "description": f"prompt {job.prompt_id} not found"}
    assert nothing.json == {"title": "Not found", "description": f"prompt {missing} not found"}
    with pytest.raises(NotFound):
        retry_job(pool, job.id, caller.org_id + 1)
    assert job_row(pool, job.id)["state"] == "failed"


def test_concurrent_retries_of_one_job_exactly_one_wins(
    pool: ConnectionPool[DictConnection], caller: Caller, database_url: str,
) -> None:
    job = failed_job(pool, caller)
    results: list[Retried | Conflict] = []

    def attempt(action: Callable[[], Retried]) -> None:
        try:
            results.append(action())
        except Conflict as exc:
            results.append(exc)

    racers = [
        threading.Thread(target=attempt, args=(lambda: retry_job(pool, job.id, caller.org_id),)),
        threading.Thread(target=attempt, args=(lambda: retry_prompt(pool, job.prompt_id, caller),)),
    ]
    # Hold the job's row lock so both retries are in flight and queue on it, then let go.
    with pool.connection() as holder, holder.transaction():
        holder.execute("SELECT 1 FROM sa_job WHERE id = %s FOR UPDATE", (job.id,))
        for racer in racers:
            racer.start()
        wait_for(lambda: fetch_one(
            pool, "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                  "AND datname = current_database()")["n"] == 2)
    for racer in racers:
        racer.join(10)

    winners = [r for r in results if isinstance(r, Retried)]
    losers = [r for r in results if isinstance(r, Conflict)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert losers[0].description == f"job {job.id} is already superseded by {winners[0].job_id}"
    assert fetch_all(pool, "SELECT id FROM sa_job WHERE supersedes = %s", job.id) == [
        {"id": winners[0].job_id}]
    assert job_row(pool, job.id)["state"] == "superseded"


def test_a_unique_supersedes_violation_is_a_conflict_and_changes_nothing(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    job = failed_job(pool, caller)
    # A writer that bypassed the row lock already queued a replacement for this job.
    with pool.connection() as conn:
        conn.execute("INSERT INTO sa_job (id, prompt_id, org_id, created_by, supersedes) "
                     "VALUES (%s, %s, %s, %s, %s)",
                     (uuid.uuid4(), job.prompt_id, job.org_id, job.created_by, job.id))

    with pytest.raises(Conflict, match="retried concurrently"):
        retry_job(pool, job.id, caller.org_id)

    assert job_row(pool, job.id)["state"] == "failed"
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 2


def test_cli_retry_job(
    cli: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str],
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    job = failed_job(pool, caller)

    assert cli(["retry-job", str(job.id)]) == 0
    (new,) = fetch_all(pool, "SELECT id, state FROM sa_job WHERE supersedes = %s", job.id)
    assert new["state"] == "queued"
    assert f"job {new['id']} queued, superseding job {job.id}" in capsys.readouterr().out

    assert cli(["retry-job", str(job.id)]) == 1
    assert f"already superseded by {new['id']}" in capsys.readouterr().err
    assert cli(["retry-job", str(new["id"])]) == 1
    assert "is still queued; cancel it first" in capsys.readouterr().err
