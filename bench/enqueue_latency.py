"""POST /prompt latency through the Procfile's gunicorn: median and p99 over N sequential requests.

Usage: .venv/bin/python -m bench.enqueue_latency [--requests 500] [--port 8765]
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx

from bench.common import VENV_BIN, percentile, scratch_database, spawn, wait_http
from jobqueue.db import open_pool
from jobqueue.tokens import create_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    with scratch_database() as url:
        pool = open_pool(url, name="bench", max_size=1)
        token = create_token(pool, 1, 1)
        pool.close()
        web = spawn([str(VENV_BIN / "gunicorn"), "-c", "ops/gunicorn.conf.py", "service.app:create_app()"],
                    {"DATABASE_URL": url, "PORT": str(args.port)})
        try:
            base = f"http://127.0.0.1:{args.port}"
            wait_http(f"{base}/readyz")
            headers = {"Authorization": f"Bearer {token}"}
            latencies: list[float] = []
            with httpx.Client(base_url=base, headers=headers) as client:
                for i in range(50):
                    client.post("/sa-core/v1/prompt", json={"text": f"warm {i}"})
                for i in range(args.requests):
                    started = time.perf_counter()
                    response = client.post("/sa-core/v1/prompt", json={"text": f"bench {i}"})
                    latencies.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 202, response.text
        finally:
            web.terminate()
            web.wait(timeout=30)
    print(f"POST /prompt, {args.requests} sequential requests over keep-alive, gunicorn per Procfile")
    print(f"median {statistics.median(latencies):.2f} ms  p99 {percentile(latencies, 99):.2f} ms  "
          f"max {max(latencies):.2f} ms")


if __name__ == "__main__":
    main()
