"""`sa-core submit FILE.jsonl` and `sa-core run-prompt TEXT` against a real HTTP server running the
app: lines queued in batches with their ids in order, bad lines named by line number, a rerun
replays, and run-prompt prints the answer with its exit code by outcome."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service.app import create_app
from service.events.hub import EventHub
from tests.helpers import WorkerHarness, fetch_all, fetch_one

Cli = Callable[[list[str]], int]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """The app logs every request itself."""


@pytest.fixture
def api(settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Serves the app over HTTP on a free port; the client commands find it through the env."""
    hub = EventHub.from_settings(pool, settings)
    server = make_server("127.0.0.1", 0, create_app(settings, pool, hub=hub),
                         server_class=_ThreadingServer, handler_class=_Quiet)
    # NOTE: shutdown() waits for serve_forever to look, every poll_interval (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setenv("SA_API_URL", url)
    monkeypatch.setenv("SA_API_TOKEN", auth["Authorization"].removeprefix("Bearer "))
    yield url
    server.shutdown()
    hub.stop()


def _ids(out: str) -> list[dict[str, object]]:
    """The command's own lines (the in-process server's log lines share stdout here)."""
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{"line"')]
    return rows


def _jsonl(path: Path, lines: list[object]) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_submit_queues_every_line_in_batches_and_a_rerun_replays(
    api: str, cli: Cli, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    pool: ConnectionPool[DictConnection],
) -> None:
    lines: list[object] = [{"text": f"prompt {n}"} for n in range(25)]
    lines[3] = {"text": "scheduled", "delay_seconds": 3600, "priority": 10}
    file = _jsonl(tmp_path / "in.jsonl", lines)

    assert cli(["submit", file, "--batch-size", "10"]) == 0
    out, err = capsys.readouterr()
    rows = _ids(out)
    assert [row["line"] for row in rows] == list(range(1, 26))
    assert "25/25 prompts" in err
    texts = {str(r["id"]): r for r in fetch_all(
        pool, "SELECT j.id, j.priority, e.content FROM sa_job j JOIN sa_entity e "
              "ON e.id = j.prompt_id")}
    assert [texts[row["job_id"]]["content"] for row in rows] == [
        line["text"] for line in lines if isinstance(line, dict)]
    assert texts[rows[3]["job_id"]]["priority"] == 10
    assert texts[rows[0]["job_id"]]["priority"] == 80

    assert cli(["submit", file, "--batch-size", "10"]) == 0
    assert _ids(capsys.readouterr().out) == rows
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 25


def test_submit_names_bad_lines_by_number_and_keeps_earlier_batches(
    api: str, cli: Cli, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    pool: ConnectionPool[DictConnection],
) -> None:
    lines: list[object] = [{"text": f"p{n}"} for n in range(6)]
    lines[4] = {"text": ""}
    lines[5] = {"txt": "typo"}
    assert cli(["submit", _jsonl(tmp_path / "bad.jsonl", lines), "--batch-size", "3"]) == 1
    err = capsys.readouterr().err
    assert "lines 4-6 refused (422)" in err
    assert "line 5.text: must not be empty" in err and "line 6.txt: unknown field" in err
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 3

    (tmp_path / "notjson.jsonl").write_text('{"text": "fine"}\n{oops\n')
    assert cli(["submit", str(tmp_path / "notjson.jsonl")]) == 2
    assert "line 2: not JSON" in capsys.readouterr().err


def test_run_prompt_prints_the_answer_and_exits_by_outcome(
    api: str, cli: Cli, capsys: pytest.CaptureFixture[str], workers: WorkerHarness,
) -> None:
    workers.start(listen=True, poll_interval=600)
    assert cli(["run-prompt", "what is a queue?"]) == 0
    assert "what is a queue?" in capsys.readouterr().out

    assert cli(["run-prompt", "no way [fake:400]"]) == 1
    assert "failed" in capsys.readouterr().err

    assert cli(["run-prompt", "slow [fake:latency=5]", "--timeout", "1"]) == 3
    assert "is still" in capsys.readouterr().err

    assert cli(["run-prompt", "   "]) == 2
    assert "text: must not be empty" in capsys.readouterr().err


def test_client_commands_without_a_token_exit_2(
    cli: Cli, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SA_API_TOKEN", raising=False)
    assert cli(["run-prompt", "hello"]) == 2
    assert "no token" in capsys.readouterr().err
