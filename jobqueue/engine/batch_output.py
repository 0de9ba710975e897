"""A finished batch's output and error files, written a slice at a time in line order.

The output file holds one line per request that succeeded (its chat.completion); the error file
one per request that did not: the error body the chat route would have answered for a job that
failed, or `error` with a code for a line that never ran (invalid, `batch_cancelled`,
`batch_expired`). Each line carries its `custom_id`. Both files' ids derive from the batch's, and
a slice commits its pieces with the position it reached, so a keeper that dies mid-write
resumes where the last slice ended, or starts the files over when none had committed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from jobqueue.core.db import DictConnection
from jobqueue.core.openai_wire import (
    BATCH_ID_PREFIX,
    batch_line,
    chat_completion,
    job_answer,
    job_failure,
    object_id,
)
from jobqueue.core.queries import batch as q
from jobqueue.core.queries import file as file_q
from jobqueue.engine.files import FILE_CHUNK_BYTES

__all__ = ["OUTPUT_NAMESPACE", "output_file_ids", "write_slice"]

OUTPUT_NAMESPACE = uuid.UUID("6f1d2c52-9f53-4e0b-9a53-3c2b8e1f7a10")
"""Namespace of the uuid5 ids of a batch's output and error files."""

_PAGE = 50
"""Lines read per round trip. NOTE: with the slice's 1 MiB bound checked after each line, a
slice holds at most a page of answers (each at most SA_PROVIDER_MAX_RESPONSE_BYTES) in memory."""

# NOTE: OpenAI's codes and wording for requests a batch ended before they ran.
_NEVER_RAN = {
    "cancelled": ("batch_cancelled", "This request was cancelled before it was executed."),
    "expired": ("batch_expired", "This request could not be executed before the completion "
                                 "window expired."),
}

Row = dict[str, Any]


def output_file_ids(batch_id: uuid.UUID) -> tuple[uuid.UUID, uuid.UUID]:
    """The ids of a batch's output file and error file."""
    return (uuid.uuid5(OUTPUT_NAMESPACE, f"{batch_id}:output"),
            uuid.uuid5(OUTPUT_NAMESPACE, f"{batch_id}:error"))


@dataclass
class _Piece:
    """One file's lines of this slice."""

    file_id: uuid.UUID
    data: bytearray = field(default_factory=bytearray)
    lines: int = 0

    def add(self, line: Row) -> None:
        self.data += json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        self.lines += 1


def _line(row: Row, batch_id: uuid.UUID) -> tuple[bool, Row, int, int]:
    """(to the output file?, the line, tokens in, tokens out) for one request row."""
    key = row["request_job_id"] or uuid.uuid5(OUTPUT_NAMESPACE, f"{batch_id}:{row['line']}")
    state = row["request_state"]
    custom_id = row["custom_id"]
    if state in _NEVER_RAN:
        code, message = _NEVER_RAN[state]
        return False, batch_line(custom_id, key, code=code, message=message), 0, 0
    if state == "invalid" or row["job_id"] is None:
        error = row["error"] or {"code": "job_missing",
                                 "message": "the request's job is no longer stored"}
        return False, batch_line(custom_id, key, code=error["code"], message=error["message"]), 0, 0
    answer = job_answer(row)
    tokens = (answer.tokens_in or 0, answer.tokens_out or 0)
    if state == "succeeded":
        return True, batch_line(custom_id, key, status=200, body=chat_completion(answer)), *tokens
    status, body = job_failure(answer)
    return False, batch_line(custom_id, key, status=status, body=body), *tokens


def _append(conn: DictConnection, piece: _Piece) -> None:
    if not piece.lines:
        return
    row = conn.execute(file_q.FILE_NEXT_SEQ, {"file_id": piece.file_id}).fetchone()
    assert row is not None
    conn.execute(file_q.FILE_CHUNK_INSERT, {"file_id": piece.file_id, "seq": row["seq"],
                                            "data": bytes(piece.data), "lines": piece.lines})


def write_slice(conn: DictConnection, batch: Row, *, max_lines: int, ttl: float | None) -> bool:
    """Writes the next lines of a finalizing batch's files, in the caller's transaction.

    Args:
        conn: the step's connection, inside its transaction (the batch row locked).
        batch: the batch's row as locked.
        max_lines: most request lines one slice writes.
        ttl: seconds the files live (the batch's output_expires_after, else SA_FILE_TTL).

    Returns:
        True once the files are complete and the batch ended as it was to.
    """
    output_id, error_id = output_file_ids(batch["id"])
    after = int(batch["written_line"])
    name = object_id(BATCH_ID_PREFIX, batch["id"])
    scope = {"org_id": batch["org_id"], "user_id": batch["created_by"],
             "purpose": "batch_output"}
    if after == 0:
        for file_id, suffix in ((output_id, "output"), (error_id, "error")):
            conn.execute(file_q.FILE_DELETE_FOR_REWRITE, {**scope, "id": file_id})
            conn.execute(file_q.FILE_INSERT, {**scope, "id": file_id,
                                              "filename": f"{name}_{suffix}.jsonl"})
    output, errors = _Piece(output_id), _Piece(error_id)
    tokens_in = tokens_out = written = 0
    done = False
    full = False
    while written < max_lines and not full:
        rows = conn.execute(q.BATCH_OUTPUT_PAGE, {"id": batch["id"], "after": after,
                                                  "limit": _PAGE}, prepare=False).fetchall()
        for row in rows:
            to_output, line, used_in, used_out = _line(row, batch["id"])
            (output if to_output else errors).add(line)
            tokens_in, tokens_out = tokens_in + used_in, tokens_out + used_out
            after, written = row["line"], written + 1
            full = max(len(output.data), len(errors.data)) >= FILE_CHUNK_BYTES
            if full:
                break
        if not full and len(rows) < _PAGE:
            done = True
            break
    _append(conn, output)
    _append(conn, errors)
    conn.execute(q.BATCH_SET_WRITTEN, {"id": batch["id"], "line": after,
                                       "tokens_in": tokens_in, "tokens_out": tokens_out})
    if not done:
        return False
    kept = {}
    for file_id in (output_id, error_id):
        done_file = conn.execute(file_q.FILE_COMPLETE, {"id": file_id, "org_id": batch["org_id"],
                                                        "ttl": ttl}).fetchone()
        kept[file_id] = done_file is not None and done_file["lines"] > 0
        if not kept[file_id]:
            conn.execute(file_q.FILE_DELETE, {"id": file_id, "org_id": batch["org_id"]})
    conn.execute(q.BATCH_FINISH, {"id": batch["id"],
                                  "output_file_id": output_id if kept[output_id] else None,
                                  "error_file_id": error_id if kept[error_id] else None})
    return True
