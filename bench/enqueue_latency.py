"""POST /prompt latency through the Procfile's gunicorn: median and p99 over N sequential requests.

Usage: .venv/bin/python -m bench.enqueue_latency [--requests 500] [--port 8765]
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx

from bench.common import bench_token, percentile, scratch_database, web_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    with scratch_database() as url:
        token = bench_token(url)
        with web_server({"DATABASE_URL": url}, args.port):
            base = f"http://127.0.0.1:{args.port}"
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
    print(f"POST /prompt, {args.requests} sequential requests over keep-alive, gunicorn per Procfile")
    print(f"median {statistics.median(latencies):.2f} ms  p99 {percentile(latencies, 99):.2f} ms  "
          f"max {max(latencies):.2f} ms")


if __name__ == "__main__":
    main()
