"""Client commands of `sa-core`: `submit FILE.jsonl` and `run-prompt TEXT`, through the web API.

They speak HTTP to a running web (`--url`, default `SA_API_URL` or http://127.0.0.1:8000) with a
token (`--token`, default `SA_API_TOKEN`), so every line is validated, scoped to the token's org
and queued exactly as a client's request would be (the request contract lives in the web only).

Exit codes: `submit`: 0 every line queued; 1 a batch was refused or the web failed (the lines
before it stay queued: a rerun of the same file replays them, each batch has its own
Idempotency-Key); 2 bad arguments or a line that is not a JSON object. `run-prompt`: 0 the job
succeeded (its answer on stdout); 1 it failed, was cancelled or superseded (error on stderr); 2
bad arguments or the request refused; 3 still unfinished after `--timeout` (the job id on stderr).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from typing import Any, TextIO

__all__ = ["add_client_commands", "priority_arg"]

DEFAULT_URL = "http://127.0.0.1:8000"
API = "/sa-core/v1"
BATCH_SIZE = 1000
"""Lines sent per POST /prompts/batch (its most)."""
MAX_WAIT = 60
"""The longest `Prefer: wait=N` the web takes."""
_POLL = 0.5
_ITEM = re.compile(r"prompts\[(\d+)\]")
_BAR = 30


class ApiError(Exception):
    """The web refused a request or could not be reached."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None,
          headers: dict[str, str] | None = None, timeout: float = 30.0) -> tuple[int, Any]:
    """Sends one request; returns (status, decoded JSON). Raises ApiError on 4xx, 5xx or no answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(args.url.rstrip("/") + API + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {args.token}",
                                              "Content-Type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        try:
            detail = json.loads(error.read())
            message = f"{detail.get('title')}: {detail.get('description')}"
        except ValueError:
            message = error.reason
        raise ApiError(error.code, message) from None
    except (urllib.error.URLError, OSError) as error:
        raise ApiError(0, f"cannot reach {args.url}: {error}") from None


def _read_lines(path: str) -> list[tuple[int, str, dict[str, Any]]]:
    """Returns (line number, raw line, object) for every non-blank line; ValueError on a bad one."""
    items = []
    with open(path, encoding="utf-8") as source:
        for number, raw in enumerate(source, start=1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except ValueError as error:
                raise ValueError(f"line {number}: not JSON ({error})") from None
            if not isinstance(value, dict):
                raise ValueError(f"line {number}: must be a JSON object")
            items.append((number, raw, value))
    return items


def _progress(stream: TextIO, done: int, total: int, started: float) -> None:
    filled = _BAR * done // total
    rate = done / max(time.monotonic() - started, 1e-9)
    stream.write(f"\rsubmit [{'#' * filled}{'.' * (_BAR - filled)}] {done}/{total} "
                 f"prompts, {rate:,.0f}/s")
    stream.flush()


def _by_line(message: str, numbers: list[int]) -> str:
    """Names a batch's bad items (`prompts[3]`) by their line in the file."""
    return _ITEM.sub(lambda m: f"line {numbers[int(m.group(1))]}", message)


def _submit(args: argparse.Namespace) -> int:
    try:
        lines = _read_lines(args.file)
    except (OSError, ValueError) as error:
        print(f"sa-core submit: {error}", file=sys.stderr)
        return 2
    started = time.monotonic()
    done = 0
    for start in range(0, len(lines), args.batch_size):
        chunk = lines[start:start + args.batch_size]
        # NOTE: the key is the batch's own content and place, so a rerun of the file replays
        # the batches already queued and a fixed line changes only its own batch's key.
        digest = hashlib.sha256("".join(raw for _, raw, _ in chunk).encode()).hexdigest()
        key = f"submit-{chunk[0][0]}-{digest[:40]}"
        try:
            _, answer = _call(args, "POST", "/prompts/batch",
                              {"prompts": [value for _, _, value in chunk]},
                              {"Idempotency-Key": key})
        except ApiError as error:
            sys.stderr.write("\n")
            message = _by_line(str(error), [number for number, _, _ in chunk])
            print(f"sa-core submit: lines {chunk[0][0]}-{chunk[-1][0]} refused ({error.status}): "
                  f"{message}; {done} prompt(s) before them are queued", file=sys.stderr)
            return 1
        for (number, _, _), item in zip(chunk, answer["items"], strict=True):
            print(json.dumps({"line": number, "prompt_id": item["prompt_id"],
                              "job_id": item["job_id"]}))
        done += len(chunk)
        _progress(sys.stderr, done, len(lines), started)
    sys.stderr.write("\n")
    return 0


def _run_prompt(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"text": args.text}
    if args.priority is not None:
        body["priority"] = args.priority
    if args.model is not None:
        body["options"] = {"model": args.model}
    deadline = time.monotonic() + args.timeout
    wait = max(0, min(MAX_WAIT, int(args.timeout)))
    try:
        status, job = _call(args, "POST", "/prompt", body, {"Prefer": f"wait={wait}"},
                            timeout=wait + 30)
        if status == 202:
            # NOTE: past the web's longest wait, the job is read again every _POLL seconds.
            job_id = job["job_id"]
            while True:
                _, job = _call(args, "GET", f"/jobs/{job_id}")
                if job["state"] in ("succeeded", "failed", "cancelled", "superseded"):
                    break
                if time.monotonic() >= deadline:
                    print(f"sa-core run-prompt: job {job_id} is still {job['state']} after "
                          f"{args.timeout:g} s", file=sys.stderr)
                    return 3
                time.sleep(_POLL)
            _, prompt = _call(args, "GET", f"/prompts/{job['prompt_id']}")
            job["response_text"] = (prompt["response"] or {}).get("content")
    except ApiError as error:
        print(f"sa-core run-prompt: {error}", file=sys.stderr)
        return 2 if 400 <= error.status < 500 else 1
    if job["state"] != "succeeded":
        print(f"sa-core run-prompt: job {job['id']} {job['state']}: {job['error_kind']}: "
              f"{job['error_message']}", file=sys.stderr)
        return 1
    print(job["response_text"])
    return 0


def _api_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("SA_API_URL", DEFAULT_URL),
                        help=f"the web's base URL (default SA_API_URL or {DEFAULT_URL})")
    parser.add_argument("--token", default=os.environ.get("SA_API_TOKEN"),
                        help="API token (default SA_API_TOKEN)")


def _positive(text: str) -> int:
    value = int(text)
    if not 1 <= value <= BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"must be within 1..{BATCH_SIZE}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def priority_arg(text: str) -> int:
    """An argparse type: a job priority, 0..100."""
    value = int(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError("must be within 0..100")
    return value


def _with_token(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        if not args.token:
            print(f"sa-core {args.command}: no token (--token or SA_API_TOKEN)", file=sys.stderr)
            return 2
        return int(func(args))
    return run


def add_client_commands(sub: Any) -> None:
    """Adds `submit` and `run-prompt` to the `sa-core` parser."""
    submit = sub.add_parser(
        "submit", help="queue every line of a JSONL file (one POST /prompt body each) in batches",
        epilog="stdout: one JSON line per prompt {line, prompt_id, job_id}; progress on stderr")
    submit.add_argument("file", metavar="FILE.jsonl")
    submit.add_argument("--batch-size", type=_positive, default=BATCH_SIZE,
                        help=f"lines per POST /prompts/batch (default {BATCH_SIZE})")
    _api_arguments(submit)
    submit.set_defaults(func=_with_token(_submit))

    run = sub.add_parser("run-prompt", help="run one prompt through the queue and print its answer",
                         epilog="exit 0 only when it succeeded")
    run.add_argument("text", metavar="TEXT")
    run.add_argument("--priority", type=priority_arg, default=None)
    run.add_argument("--model", default=None)
    run.add_argument("--timeout", type=_seconds, default=120.0,
                     help="seconds to wait for the answer (default 120)")
    _api_arguments(run)
    run.set_defaults(func=_with_token(_run_prompt))
