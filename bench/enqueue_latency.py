"""POST /prompt latency through the Procfile's gunicorn: median and p99 over N sequential requests.

Usage: .venv/bin/python -m bench.enqueue_latency [--requests 500] [--port 8765]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time

from bench.common import bench_token, percentile, scratch_database, web_server

PROMPT = "/sa-core/v1/prompt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    with scratch_database() as url:
        token = bench_token(url)
        with web_server({"DATABASE_URL": url}, args.port):
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            latencies: list[float] = []
            # NOTE: http.client, not httpx: a latency figure should be the server's, and httpx
            # spends about 0.45 ms of CPU of its own per request (http.client about 0.12 ms).
            client = http.client.HTTPConnection("127.0.0.1", args.port, timeout=30)
            try:
                for i in range(50 + args.requests):
                    body = json.dumps({"text": f"bench {i}"})
                    started = time.perf_counter()
                    client.request("POST", PROMPT, body=body, headers=headers)
                    response = client.getresponse()
                    answer = response.read()
                    elapsed = (time.perf_counter() - started) * 1000
                    assert response.status == 202, answer
                    if i >= 50:  # the first 50 warm up the connection pools and prepared statements
                        latencies.append(elapsed)
            finally:
                client.close()
    print(f"POST /prompt, {args.requests} sequential requests over keep-alive, gunicorn per Procfile")
    print(f"median {statistics.median(latencies):.2f} ms  p99 {percentile(latencies, 99):.2f} ms  "
          f"max {max(latencies):.2f} ms")


if __name__ == "__main__":
    main()
