"""ChunkedBody: a chunked body undone into lines whatever the pieces it arrives in."""

from __future__ import annotations

import http.client
import io

import pytest

from jobqueue.runtime.provider_answer import TooLarge
from jobqueue.runtime.provider_stream import ChunkedBody

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
EVENTS = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\ndata: [DO', b"NE]\n\n"]
# NOTE: a chunk extension and a trailer, both allowed by HTTP/1.1.
BODY = (b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in EVENTS)
        + b"0\r\nX-Trailer: t\r\n\r\n")


class _Socket:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._data))


def _body(limit: int = 1 << 20) -> ChunkedBody:
    response = http.client.HTTPResponse(_Socket(HEAD))  # type: ignore[arg-type]
    response.begin()
    return ChunkedBody(response, limit)


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(BODY)])
def test_lines_come_out_whole_however_the_body_is_cut(size: int) -> None:
    body = _body()
    for start in range(0, len(BODY), size):
        body.push(BODY[start:start + size])
    assert list(body.lines) == [b'data: {"n": 1}', b'data: {"n": 2}', b"data: [DONE]"]
    assert body.ended


def test_a_body_cut_short_hands_out_its_last_line_and_does_not_end() -> None:
    body = _body()
    body.push(b"5\r\ndata:\r\n3\r\n xy")
    body.push(b"")
    assert list(body.lines) == [b"data:"] and not body.ended


def test_a_broken_size_line_and_a_body_past_the_limit_are_refused() -> None:
    with pytest.raises(http.client.IncompleteRead):
        _body().push(b"zz\r\nabc\r\n")
    with pytest.raises(TooLarge):
        _body(limit=10).push(BODY)
