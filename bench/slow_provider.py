"""An OpenAI-shaped provider that answers every call after a fixed delay, holding thousands at once.

Usage: .venv/bin/python -m bench.slow_provider [--port 0] [--latency 1.0] [--stream 0]
       [--chunk-chars 0] [--host 127.0.0.1[,127.0.0.2...]] [--reuse-port] [--http2]

A raw asyncio protocol (no framework, no thread per connection), so one process on a busy
2-core machine holds thousands of calls in flight and spends little CPU on each: the benchmark
then measures the worker, not this server. With `--latency 0` it answers as soon as a request is
read: the instant provider of bench/sustained.py and bench/peers.py, where `sa-core
fake-provider` (a thread per connection) took three times its CPU per call (docs/performance.md).
Keep-alive HTTP/1.1, Content-Length bodies only. It prints `listening on PORT` once it is ready
and reports calls answered (and connections) on SIGTERM.

`--host` lists the addresses to listen on (the same port on each); `--reuse-port` lets several
processes listen on the same addresses and port (SO_REUSEPORT: the kernel spreads new
connections over them), so one provider address holds more connections than one process may
hold descriptors (bench/llm_fleet.py).

`--http2` speaks HTTP/2 in clear text instead (prior knowledge, the `h2` package, which the
project's venv does not carry): every stream is answered after `latency`, unstreamed, for
bench/client_models.py's `h2` client.

With `--stream N`, a call that asks for a streamed answer (`"stream": true` in its body) gets
OpenAI's server-sent chunks (chunked transfer, keep-alive): the headers at once, then N chunks
spread evenly over `latency` (the i-th at latency x i / N), the last followed by the
`finish_reason` chunk and `data: [DONE]`. Each chunk's text is `<T>`, T the provider's
`time.time()` when it wrote the chunk, so a viewer of the deltas (bench/stream_viewers.py) can
tell how long each chunk took to reach it (same host, same clock).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import sys
import time
from collections.abc import Callable

__all__ = ["H2ProviderProtocol", "ProviderProtocol", "main", "serve"]

_ANSWER = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "model": "bench-model",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "a reply of a few words"}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
}).encode()
_RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (len(_ANSWER), _ANSWER))
_STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
_CHUNK = ('{"id":"chatcmpl-bench","object":"chat.completion.chunk","model":"bench-model",'
          '"choices":[{"index":0,"delta":{"content":"%s<%.6f>"},"finish_reason":null}]}')
_LAST = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","model":"bench-model",'
         b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
         b'"usage":{"prompt_tokens":12,"completion_tokens":20,"total_tokens":32}}\n\n'
         b"data: [DONE]\n\n")


class H2ProviderProtocol(asyncio.Protocol):
    """One HTTP/2 connection: answers each stream `latency` seconds after its request ended."""

    answered = 0

    def __init__(self, latency: float) -> None:
        import h2.config
        import h2.connection
        import h2.settings

        self._latency = latency
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        # NOTE: wide windows, as large providers advertise: a burst of requests never waits for
        # a WINDOW_UPDATE.
        self._conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1_000_000,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._conn.initiate_connection()
        self._conn.increment_flow_control_window(1 << 30)
        transport.write(self._conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        import h2.events

        for event in self._conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                asyncio.get_running_loop().call_later(self._latency, self._answer, event.stream_id)
        if self._transport is not None:
            self._transport.write(self._conn.data_to_send())

    def _answer(self, stream: int) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._conn.send_headers(stream, [(":status", "200"), ("content-type", "application/json"),
                                         ("content-length", str(len(_ANSWER)))])
        self._conn.send_data(stream, _ANSWER, end_stream=True)
        self._transport.write(self._conn.data_to_send())
        H2ProviderProtocol.answered += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


def _chunked(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


class ProviderProtocol(asyncio.Protocol):
    """One connection: reads a request, answers it `latency` seconds later, waits for the next."""

    answered = 0
    connections = 0

    def __init__(self, latency: float, stream: int = 0, padding: str = "") -> None:
        self._latency = latency
        self._stream = stream
        self._padding = padding
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        ProviderProtocol.connections += 1

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            head_end = self._buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            length = 0
            for line in self._buffer[:head_end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(self._buffer) < end:
                return
            body = self._buffer[head_end + 4:end]
            self._buffer = self._buffer[end:]
            loop = asyncio.get_running_loop()
            if self._stream and b'"stream":true' in body.replace(b" ", b""):
                assert self._transport is not None
                self._transport.write(_STREAM_HEAD)
                loop.call_later(self._latency / self._stream, self._chunk, 1, loop.time())
            elif self._latency > 0:
                loop.call_later(self._latency, self._answer)
            else:
                self._answer()

    def _chunk(self, n: int, start: float) -> None:
        """Writes the n-th of the streamed answer's chunks (and the end after the last).

        Each chunk is due at a fixed time from the request (`start`, the loop's clock), not one
        step after the previous chunk went out: under load the loop runs its timers late, and
        chained steps added that lateness up, twenty times a call, so the answer ended well past
        `latency` (a provider slower than the one asked for, charged to the worker).
        """
        if self._transport is None or self._transport.is_closing():
            return
        event = b"data: " + (_CHUNK % (self._padding, time.time())).encode() + b"\n\n"
        if n < self._stream:
            self._transport.write(_chunked(event))
            asyncio.get_running_loop().call_at(start + (n + 1) * self._latency / self._stream,
                                               self._chunk, n + 1, start)
            return
        self._transport.write(_chunked(event + _LAST) + b"0\r\n\r\n")
        ProviderProtocol.answered += 1

    def _answer(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(_RESPONSE)
            ProviderProtocol.answered += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve(port: int, latency: float, stream: int = 0, chunk_chars: int = 0,
                hosts: tuple[str, ...] = ("127.0.0.1",), reuse_port: bool = False,
                http2: bool = False) -> None:
    """Serves until SIGTERM or SIGINT; `stream` > 0 streams answers asked for as a stream."""
    loop = asyncio.get_running_loop()
    padding = "." * chunk_chars
    # NOTE: each connection is a descriptor; the soft limit is often a twentieth of the hard one.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    servers = []
    for host in hosts:
        # NOTE: port 0 picks a port for the first address; the others listen on that one.
        factory: Callable[[], asyncio.Protocol] = (
            (lambda: H2ProviderProtocol(latency)) if http2
            else (lambda: ProviderProtocol(latency, stream, padding)))
        servers.append(await loop.create_server(factory, host, port, backlog=4096,
                                                reuse_port=reuse_port or None))
        port = servers[0].sockets[0].getsockname()[1]
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"listening on {port}", flush=True)
    await stop.wait()
    for server in servers:
        server.close()
    print(f"answered {ProviderProtocol.answered} on {ProviderProtocol.connections} connections",
          file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--stream", type=int, default=0,
                        help="chunks per streamed answer (0: every answer is one JSON body)")
    parser.add_argument("--chunk-chars", type=int, default=0,
                        help="characters of padding in each streamed chunk")
    parser.add_argument("--host", default="127.0.0.1",
                        help="addresses to listen on, comma-separated (the same port on each)")
    parser.add_argument("--reuse-port", action="store_true",
                        help="share the port with other processes listening with this flag")
    parser.add_argument("--http2", action="store_true",
                        help="speak HTTP/2 in clear text (needs the h2 package)")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.latency, args.stream, args.chunk_chars,
                      tuple(args.host.split(",")), args.reuse_port, args.http2))


if __name__ == "__main__":
    main()
