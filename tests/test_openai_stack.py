"""The front door on the production stack (gunicorn, one gevent worker, as the Procfile runs it):
a streamed chat answer arrives piece by piece through the SDK, and an upload that stalls is cut
at SA_FILE_UPLOAD_TIMEOUT, leaving nothing."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import replace
from pathlib import Path

import openai
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.routes import Route
from jobqueue.core.settings import Settings
from jobqueue.devtools.fake_provider import FakeProvider
from tests.helpers import WorkerHarness, fetch_all
from tests.processes import gunicorn


def test_a_streamed_answer_and_a_stalled_upload_under_gunicorn(
        base_settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
        fake: FakeProvider, tmp_path: Path) -> None:
    streamed = replace(base_settings, provider_url="", stream_interval=0.02,
                       provider_routes=(Route("streamed", fake.url, stream=True),))
    routes = json.dumps({"routes": [{"name": "streamed", "base_url": fake.url, "stream": True}]})
    workers = WorkerHarness(streamed, pool)
    words = " ".join(f"w{i}" for i in range(15))
    try:
        workers.start(listen=True, poll_interval=600)
        with gunicorn(base_settings, tmp_path, SA_PROVIDER_ROUTES=routes,
                      SA_PROVIDER_MODEL="fake-model", SA_FILE_UPLOAD_TIMEOUT="1") as base:
            client = openai.OpenAI(base_url=f"{base}/openai/v1", max_retries=0,
                                   api_key=auth["Authorization"].removeprefix("Bearer "))
            arrivals: list[tuple[float, str]] = []
            for chunk in client.chat.completions.create(
                    model="fake-model", stream=True,
                    messages=[{"role": "user", "content": f"{words} [fake:stream-gap=0.06]"}]):
                if chunk.choices and chunk.choices[0].delta.content:
                    arrivals.append((time.monotonic(), chunk.choices[0].delta.content))
            stalled = _stalled_upload(base, auth)
    finally:
        workers.stop_all()
    assert "".join(text for _, text in arrivals) == f"echo[1]: user:{words} [fake:stream-gap=0.06]"
    # NOTE: ~1 s of provider stream reached the client over that time, not all at its end.
    assert len(arrivals) >= 3 and arrivals[-1][0] - arrivals[0][0] > 0.3
    assert stalled.startswith(b"HTTP/1.1 408")
    assert b'"code":"upload_timeout"' in stalled
    assert fetch_all(pool, "SELECT id FROM sa_file") == []


def _stalled_upload(base: str, auth: dict[str, str]) -> bytes:
    """Starts an upload that never finishes; returns what the server answers (within 10 s)."""
    boundary = "stall"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"s.jsonl\"\r\n\r\n{{}}\n").encode()
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST /openai/v1/files HTTP/1.1\r\nHost: {host}\r\n"
                      + "".join(f"{k}: {v}\r\n" for k, v in auth.items())
                      + f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                      f"Content-Length: {len(head) + 100_000}\r\n\r\n").encode() + head)
        answer = b""
        while b"\r\n\r\n" not in answer or b"upload_timeout" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
    return answer
