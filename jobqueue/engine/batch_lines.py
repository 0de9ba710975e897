"""A batch's validation, a slice at a time: read lines of its input file, check each as a chat
request, and store one request row per line (valid: `pending`; not: `invalid`, for the error file).

A line that cannot run never fails the batch: its row says why. Pages of rows are written under
savepoints; a page the database refuses is split and written again, down to the one row that
cannot be stored, which is stored `invalid` instead. The read position is committed with the
rows, so a keeper that dies mid-slice leaves nothing half-read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from jobqueue.core.chat import ChatInvalid, parse_chat
from jobqueue.core.db import DictConnection
from jobqueue.core.fallback import named_serving, serves
from jobqueue.core.queries import batch as q
from jobqueue.core.queries import file as file_q
from jobqueue.core.routes import Routes
from jobqueue.engine.files import FILE_CHUNK_BYTES

__all__ = ["LineRules", "Slice", "validate_slice"]

MAX_CUSTOM_ID_CHARS = 512
_PAGE = 500
_PAGE_BYTES = 4 * 1024 * 1024
"""A page is written once it holds this many bytes of lines, so a page of long lines stays small."""
_ERRORS_SHOWN = 100
"""Most line errors a failed batch lists in its `errors`."""

Row = dict[str, Any]


@dataclass(frozen=True)
class LineRules:
    """How lines are judged: the text bound, the line bound, and the routes a line may name (its
    model, its `prefer_provider`); with no routes (a keeper configured with none) any passes."""

    max_chars: int
    max_line_bytes: int
    routes: Routes


@dataclass(frozen=True)
class Slice:
    """What one slice read: lines stored, of which invalid, and whether the input is done."""

    lines: int
    invalid: int
    done: bool
    status: str | None = None


@dataclass
class _Line:
    number: int
    custom_id: str | None = None
    text: str | None = None
    options: dict[str, Any] | None = None
    error: dict[str, Any] | None = field(default=None)

    @property
    def state(self) -> str:
        return "invalid" if self.error is not None else "pending"


def _error(code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param}


def _judge(raw: bytes, number: int, endpoint: str, rules: LineRules) -> _Line:
    """One line, checked: the request it holds, or why it cannot run."""
    line = _Line(number)
    try:
        item = json.loads(raw)
    except ValueError:
        line.error = _error("invalid_json", f"line {number} is not valid JSON (UTF-8)")
        return line
    if not isinstance(item, dict):
        line.error = _error("invalid_request", f"line {number} must be a JSON object")
        return line
    custom_id = item.get("custom_id")
    if isinstance(custom_id, str) and 0 < len(custom_id) <= MAX_CUSTOM_ID_CHARS \
            and "\x00" not in custom_id:
        line.custom_id = custom_id
    else:
        line.error = _error("invalid_custom_id", f"custom_id must be a string of 1 to "
                            f"{MAX_CUSTOM_ID_CHARS} characters", "custom_id")
        return line
    unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if unknown:
        line.error = _error("invalid_request", f"unknown field {unknown[0]!r}", unknown[0])
    elif item.get("method") != "POST":
        line.error = _error("invalid_method", "method must be POST", "method")
    elif item.get("url") != endpoint:
        line.error = _error("invalid_url", f"url must be the batch's endpoint, {endpoint}", "url")
    else:
        try:
            request = parse_chat(item.get("body"), rules.max_chars, batch=True)
        except ChatInvalid as exc:
            line.error = _error(exc.code, exc.message, f"body.{exc.param}" if exc.param else "body")
            return line
        line.error = _route_error(request.model, request.options.get("prefer_provider"),
                                  rules.routes)
        if line.error is None:
            line.text, line.options = request.text, request.options
    return line


def _route_error(model: str, prefer: str | None, routes: Routes) -> dict[str, Any] | None:
    """Why no route can run a line's model (or its `prefer_provider`), as the chat route says.

    NOTE: the worker passes over, without a word, a `prefer_provider` that names no route
    serving the model (route_for), so such a line is refused here, as POST /prompt and the chat
    route refuse one.
    """
    if not routes:
        return None
    if routes.for_model(model) is None:
        return _error("model_not_found", f"The model `{model}` does not exist or no route "
                      "serves it.", "body.model")
    if prefer is not None and named_serving(routes, prefer, model) is None:
        serving = ", ".join(r.name for r in routes.routes if serves(r, model))
        return _error("invalid_value", f"No route `{prefer}` serves the model `{model}` (known "
                      f"routes serving it: {serving}).", "body.prefer_provider")
    return None


def _lines(conn: DictConnection, file_id: Any, start: int, max_line_bytes: int
           ) -> Iterator[tuple[int, bytes | None]]:
    """Yields (byte offset after the line, its bytes; None when it passed the line bound).

    NOTE: a line longer than the bound is skipped without being held: its bytes are dropped as
    they come, until its newline.
    """
    seq, skip = divmod(start, FILE_CHUNK_BYTES)
    offset, pending, too_long = start, bytearray(), False
    while True:
        rows = conn.execute(file_q.FILE_CHUNK_LIST_PAGE, {"file_id": file_id, "seq": seq,
                                                          "limit": 1}).fetchall()
        if not rows:
            break
        data = bytes(rows[0]["data"])[skip:]
        seq, skip = seq + 1, 0
        start_of_piece = 0
        while True:
            end = data.find(b"\n", start_of_piece)
            piece = data[start_of_piece:] if end < 0 else data[start_of_piece:end]
            if not too_long:
                pending += piece
                too_long = len(pending) > max_line_bytes
                if too_long:
                    pending = bytearray()
            if end < 0:
                offset += len(data) - start_of_piece
                break
            offset += end - start_of_piece + 1
            yield offset, None if too_long else bytes(pending)
            pending, too_long = bytearray(), False
            start_of_piece = end + 1
    if pending or too_long:
        yield offset, None if too_long else bytes(pending)


def _store(conn: DictConnection, batch_id: Any, lines: list[_Line]) -> None:
    """Writes a page of lines; a page refused is split, and a lone refused line stored invalid."""
    params = {"batch_id": batch_id, "lines": [line.number for line in lines],
              "custom_ids": [line.custom_id for line in lines],
              "states": [line.state for line in lines], "texts": [line.text for line in lines],
              "options": [None if line.options is None else json.dumps(line.options)
                          for line in lines],
              "errors": [None if line.error is None else json.dumps(line.error)
                         for line in lines]}
    try:
        with conn.transaction():
            written = {r["line"] for r in conn.execute(q.BATCH_REQUEST_INSERT_MANY,
                                                       params, prepare=False).fetchall()}
    except (psycopg.DataError, psycopg.IntegrityError) as exc:
        if len(lines) > 1:
            half = len(lines) // 2
            _store(conn, batch_id, lines[:half])
            _store(conn, batch_id, lines[half:])
            return
        line = lines[0]
        if line.error is not None:
            raise
        line.error = _error("invalid_request", f"line {line.number} cannot be stored: "
                            f"{type(exc).__name__}")
        line.text = line.options = None
        _store(conn, batch_id, [line])
        return
    repeats = [line for line in lines if line.number not in written]
    for line in repeats:
        line.error = _error("duplicate_custom_id", f"custom_id {line.custom_id!r} is already "
                            "used by an earlier line of this batch", "custom_id")
        line.text = line.options = None
    if repeats:
        _store(conn, batch_id, repeats)


def validate_slice(conn: DictConnection, batch: Row, rules: LineRules, *, max_lines: int,
                   max_bytes: int) -> Slice:
    """Reads and stores the next lines of a validating batch's input, in the caller's transaction.

    Args:
        conn: the step's connection, inside its transaction (the batch row locked).
        batch: the batch's row as locked.
        rules: how lines are judged.
        max_lines: most lines one slice reads.
        max_bytes: most input bytes one slice reads (a line in progress is finished).

    Returns:
        What was read; with `done`, the status the batch took (in_progress, or failed when no
        line can run or the input file is gone).
    """
    source = conn.execute(file_q.FILE_GET, {"id": batch["input_file_id"],
                                            "org_id": batch["org_id"]}).fetchone()
    if source is None:
        return _end(conn, batch, _error("input_file_gone", "the input file was deleted before "
                                        "it was read whole", "input_file_id"))
    start, number = int(batch["read_bytes"]), int(batch["read_lines"])
    page: list[_Line] = []
    stored = invalid = page_bytes = 0
    offset = start
    for offset, raw in _lines(conn, batch["input_file_id"], start, rules.max_line_bytes):
        number += 1
        if raw is None:
            page.append(_Line(number, error=_error(
                "line_too_long", f"line {number} is longer than {rules.max_line_bytes} bytes")))
        elif raw.strip():
            page.append(_judge(raw, number, batch["endpoint"], rules))
            page_bytes += len(raw)
        if len(page) >= _PAGE or page_bytes >= _PAGE_BYTES:
            _store(conn, batch["id"], page)
            stored, invalid = stored + len(page), invalid + sum(1 for line in page if line.error)
            page, page_bytes = [], 0
        if number - int(batch["read_lines"]) >= max_lines or offset - start >= max_bytes:
            break
    if page:
        _store(conn, batch["id"], page)
        stored, invalid = stored + len(page), invalid + sum(1 for line in page if line.error)
    conn.execute(q.BATCH_SET_READ, {"id": batch["id"], "read_bytes": offset,
                                    "read_lines": number, "total": stored, "failed": invalid})
    if offset < int(source["bytes"]):
        return Slice(stored, invalid, done=False)
    return _end(conn, batch, None, Slice(stored, invalid, done=True))


def _end(conn: DictConnection, batch: Row, reason: dict[str, Any] | None,
         read: Slice | None = None) -> Slice:
    """Ends the validation: the batch runs, or fails (no line can run, or its input is gone)."""
    if reason is not None:
        errors = [reason]
    else:
        errors = [{**row["error"], "line": row["line"]} for row in conn.execute(
            q.BATCH_REQUEST_ERRORS, {"id": batch["id"], "limit": _ERRORS_SHOWN}).fetchall()]
        errors = errors or [_error("empty_file", "the input file holds no request")]
    row = conn.execute(q.BATCH_END_VALIDATION, {
        "id": batch["id"], "errors": json.dumps({"object": "list", "data": errors}),
        # NOTE: an input that vanished fails the batch whatever was read of it.
        "force_fail": reason is not None}).fetchone()
    status = None if row is None else str(row["status"])
    read = read or Slice(0, 0, done=True)
    return Slice(read.lines, read.invalid, done=True, status=status)
