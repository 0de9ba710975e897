"""Prompts accepted per second through POST /prompts/batch, by batch size, against the Procfile's web.

Usage: .venv/bin/python -m bench.batch_submit [--sizes 1,100,1000] [--seconds 5] [--clients 4]

gunicorn runs as the Procfile's `web:` line (ops/gunicorn.conf.py) on a scratch database with no
worker, so every job stays queued. `--clients` threads send back to back, each on its own
keep-alive connection, a body encoded once per size (size 1 goes to POST /prompt, the
single-prompt route, for comparison). Per size: prompts accepted per second over the window, and
each request's latency p50/p99. The sizes run in one process, one after the other, on the same
database, so their ratios compare fairly; the target is 10,000 prompts/s through batches.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import httpx

from bench.common import bench_token, format_table, percentile, scratch_database, web_server

PORT = 8931


def _run(base: str, token: str, size: int, seconds: float, clients: int) -> tuple[int, list[float]]:
    if size == 1:
        path, body = "/sa-core/v1/prompt", {"text": "bench prompt"}
    else:
        path, body = "/sa-core/v1/prompts/batch", {"prompts": [{"text": "bench prompt"}] * size}
    payload = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    latencies: list[float] = []
    accepted = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            while time.monotonic() < deadline:
                sent = time.monotonic()
                answer = http.post(path, content=payload, headers=headers)
                took = time.monotonic() - sent
                if answer.status_code != 202:
                    raise SystemExit(f"{path}: {answer.status_code} {answer.text[:200]}")
                with lock:
                    latencies.append(took)
                    accepted[0] += size

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    return round(accepted[0] / elapsed), latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with scratch_database() as url, web_server({"DATABASE_URL": url}, PORT):
        token = bench_token(url)
        base = f"http://127.0.0.1:{PORT}"
        rows = [["batch size", "prompts/s", "requests", "p50 ms", "p99 ms"]]
        for size in (int(s) for s in args.sizes.split(",")):
            rate, latencies = _run(base, token, size, args.seconds, args.clients)
            rows.append([str(size), f"{rate:,}", str(len(latencies)),
                         f"{percentile(latencies, 50) * 1000:.1f}",
                         f"{percentile(latencies, 99) * 1000:.1f}"])
        print(format_table(rows))


if __name__ == "__main__":
    main()
