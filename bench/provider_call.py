"""The provider client's own cost: client CPU and wall time of one call against the instant provider.

Usage: .venv/bin/python -m bench.provider_call [--calls 3000] [--rounds 3] [--stream 0]

`Provider.complete` in a loop on one thread (no gevent), against bench/slow_provider.py answering
at once on one keep-alive connection: what the worker's client spends on a call, apart from
everything else a job costs. With `--stream N` each call asks for a streamed answer of N chunks.
Prints, per round, the client's CPU (time.process_time) and the wall time per call.
"""

from __future__ import annotations

import argparse
import time

from bench.common import start_slow_provider
from jobqueue.runtime.provider import Provider

WARMUP_CALLS = 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream", type=int, default=0)
    args = parser.parse_args()
    proc, url = start_slow_provider(0.0, stream=args.stream)
    provider = Provider(url, "sk-bench", 30.0)
    messages = [{"role": "user", "content": "bench prompt 12345"}]
    on_delta = (lambda _text: None) if args.stream else None
    try:
        for _ in range(WARMUP_CALLS):
            provider.complete("bench-model", messages, on_delta=on_delta)
        print(f"{args.calls} sequential calls per round, streamed in {args.stream} chunks"
              if args.stream else f"{args.calls} sequential calls per round, unstreamed")
        for n in range(1, args.rounds + 1):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.calls):
                provider.complete("bench-model", messages, on_delta=on_delta)
            cpu_us = (time.process_time() - cpu) / args.calls * 1e6
            wall_us = (time.perf_counter() - wall) / args.calls * 1e6
            print(f"round {n}: client CPU {cpu_us:.1f} us a call, wall {wall_us:.1f} us a call")
    finally:
        provider.close()
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
