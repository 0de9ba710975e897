"""The Batch API under load: a 50,000-line batch against the fake provider, and an interactive
client beside it.

Usage: .venv/bin/python -m bench.batch_api [--lines 50000] [--concurrency 256]
                                           [--interactive-rate 5] [--timeout 900]

The Procfile's web (gunicorn) and one worker (`sa-core run-worker`, which runs the batch keeper)
on a scratch database, with the fake provider (`sa-core fake-provider`, no latency) as the
route. Through the official `openai` SDK: the JSONL file is uploaded (MB/s), the batch created
and polled to `completed`. Reported: the time until every line is stored as a request, until
every line is a job (the bulk lane feeds them in as room appears, SA_BATCH_MAX_QUEUED at a
time), until completed, and the lines completed per second. Meanwhile an interactive client
sends POST /sa-core/v1/prompt at a steady rate: the 202's latency, and with `Prefer: wait=30`
the time until its answer, p50/p99, measured before the batch (quiet) and while it runs.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from bench.common import (
    VENV_BIN,
    bench_token,
    format_table,
    percentile,
    scratch_database,
    spawn,
    wait_http,
    web_server,
)
from jobqueue.core.db import open_pool

WEB_PORT, PROVIDER_PORT = 8941, 8942


@dataclass
class Interactive:
    """A steady interactive client: POST /prompt latencies (202) and answer times (Prefer: wait)."""

    base: str
    token: str
    rate: float
    accepted: list[float] = field(default_factory=list)
    answered: list[float] = field(default_factory=list)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        period, n = 1.0 / self.rate, 0
        with httpx.Client(base_url=self.base, timeout=60) as http:
            next_at = time.monotonic()
            while not self._stop.is_set():
                n += 1
                waiting = n % 2 == 0
                sent = time.monotonic()
                answer = http.post("/sa-core/v1/prompt", json={"text": f"interactive {n}"},
                                   headers={**headers, **({"Prefer": "wait=30"} if waiting else {})})
                took = time.monotonic() - sent
                if answer.status_code == (200 if waiting else 202):
                    (self.answered if waiting else self.accepted).append(took)
                else:
                    self.errors += 1
                next_at += period
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def measure(self, seconds: float | None = None) -> Interactive:
        """Runs the client in a thread; with `seconds`, for that long and then stops."""
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        if seconds is not None:
            time.sleep(seconds)
            self.stop()
            thread.join()
        return self

    def stop(self) -> None:
        self._stop.set()

    def row(self, label: str) -> list[str]:
        def ms(values: list[float], q: float) -> str:
            return f"{percentile(values, q) * 1000:.1f}" if values else "-"
        return [label, str(len(self.accepted)), ms(self.accepted, 50), ms(self.accepted, 99),
                ms(self.answered, 50), ms(self.answered, 99), str(self.errors)]


def _jsonl(lines: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "fake-model", "max_tokens": 64,
                 "messages": [{"role": "system", "content": "Summarize in one line."},
                              {"role": "user", "content": f"Document {n}: the quick brown fox."}]},
    }).encode() + b"\n" for n in range(lines))


def _fed(database_url: str) -> dict[str, Any]:
    pool = open_pool(database_url, name="bench-read", max_size=1)
    try:
        with pool.connection() as conn:
            row = conn.execute("SELECT count(*) FILTER (WHERE state = 'pending') AS pending, "
                               "count(*) AS stored FROM sa_batch_request").fetchone()
        assert row is not None
        return dict(row)
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--interactive-rate", type=float, default=5.0)
    parser.add_argument("--quiet-seconds", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    provider = spawn([str(VENV_BIN / "sa-core"), "fake-provider", "--port", str(PROVIDER_PORT)], {})
    try:
        wait_http(f"http://127.0.0.1:{PROVIDER_PORT}/healthz")
        with scratch_database() as url:
            env = {"DATABASE_URL": url, "SA_PROVIDER_URL": f"http://127.0.0.1:{PROVIDER_PORT}",
                   "SA_PROVIDER_MODEL": "fake-model", "SA_BATCH_INTERVAL": "0.2"}
            with web_server(env, WEB_PORT):
                worker = spawn([str(VENV_BIN / "sa-core"), "run-worker", "--concurrency",
                                str(args.concurrency)], env)
                try:
                    _run(url, f"http://127.0.0.1:{WEB_PORT}", args)
                finally:
                    worker.terminate()
                    worker.wait(timeout=60)
    finally:
        provider.terminate()
        provider.wait(timeout=10)


def _run(database_url: str, base: str, args: argparse.Namespace) -> None:
    token = bench_token(database_url)
    # NOTE: one answered prompt first, so the worker is up before anything is measured.
    warm = httpx.post(f"{base}/sa-core/v1/prompt", json={"text": "warm up"}, timeout=60,
                      headers={"Authorization": f"Bearer {token}", "Prefer": "wait=30"})
    if warm.status_code != 200:
        raise SystemExit(f"the worker did not answer a first prompt: {warm.status_code}")
    quiet = Interactive(base, token, args.interactive_rate).measure(args.quiet_seconds)
    client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key=token, max_retries=0,
                           timeout=600)
    data = _jsonl(args.lines)
    started = time.monotonic()
    uploaded = client.files.create(file=("bench.jsonl", data), purpose="batch")
    upload_s = time.monotonic() - started
    busy = Interactive(base, token, args.interactive_rate).measure()
    created = time.monotonic()
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    stored_at = fed_at = None
    while True:
        now = time.monotonic()
        if now - created > args.timeout:
            busy.stop()
            raise SystemExit(f"the batch did not complete within {args.timeout:g} s")
        current = client.batches.retrieve(batch.id)
        counts = _fed(database_url)
        if stored_at is None and current.status != "validating":
            stored_at = now
        if fed_at is None and stored_at is not None and counts["pending"] == 0:
            fed_at = now
        if current.status in ("completed", "failed", "expired", "cancelled"):
            break
        time.sleep(0.25)
    done_at = time.monotonic()
    busy.stop()
    assert current.request_counts is not None
    total = current.request_counts.completed
    print(f"batch of {args.lines} lines ({len(data) / 1e6:.1f} MB), status {current.status}, "
          f"{current.request_counts.completed} completed, {current.request_counts.failed} failed")
    print(format_table([
        ["step", "seconds", "rate"],
        ["upload", f"{upload_s:.2f}", f"{len(data) / 1e6 / upload_s:.1f} MB/s"],
        ["every line stored", f"{(stored_at or done_at) - created:.2f}",
         f"{args.lines / ((stored_at or done_at) - created):,.0f} lines/s"],
        ["every line a job", f"{(fed_at or done_at) - created:.2f}", ""],
        ["completed", f"{done_at - created:.2f}", f"{total / (done_at - created):,.0f} jobs/s"],
    ], left=1))
    print()
    print(format_table([
        ["interactive POST /prompt", "202s", "p50 ms", "p99 ms", "answer p50 ms",
         "answer p99 ms", "errors"],
        quiet.row("before the batch"), busy.row("while the batch runs")], left=1))


if __name__ == "__main__":
    main()
