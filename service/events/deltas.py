"""Output deltas: what streamed attempts appended to their text since the hub's last look."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import partial as partial_q
from service.events.model import JobEvent, OutputDelta

__all__ = ["DeltaReader"]


@dataclass
class _Growth:
    """One job's rows of one attempt read in this look, and where its text stood before them."""

    first: dict[str, Any]
    attempt: int
    base: int
    # NOTE: (offset, length, text): `text` is the row's last characters, at most the cap.
    rows: list[tuple[int, int, str]] = field(default_factory=list)

    def gap(self) -> tuple[int, int] | None:
        """The range to read again when the rows do not follow `base` and each other, else None.

        NOTE: a job's rows of one attempt come from one worker's writer, each committed before
        the next is written, so rows missing here (a hub's look between two workers' commits
        skips the one with the lower seq) are committed by the time a later one is read.
        """
        start = end = self.base
        for offset, length, _text in self.rows:
            if offset != end:
                return start, self.rows[-1][0] + 1
            end += length
        return None


class DeltaReader:
    """Turns the rows written to sa_job_delta since its last look into deltas, each sent once.

    NOTE: best effort and live only, like the wake-ups. A look reads only the rows past the last
    one it read (a keyset on `seq`), and coalesces each job's rows into one delta. A job whose
    rows do not continue what was sent (rows skipped by commits out of seq order, or a job first
    seen mid-attempt) has the missing range read again by its index, so a skipped row is not
    lost. A delta carries at most `text_chars` characters: past that it sends the latest ones,
    and its `offset` tells a client that it missed some (GET /jobs/{id} has the attempt's whole
    `partial_text`). So a row is read as its last `text_chars` characters and its length: a
    look costs what is new, and no more than the cap per row.
    """

    def __init__(self, text_chars: int, page_size: int = 2000) -> None:
        self._text_chars = text_chars
        self._page_size = page_size
        self._after: int | None = None
        # NOTE: each job's (attempt, length) sent so far, forgotten when its attempt ends.
        self._sent: dict[uuid.UUID, tuple[int, int]] = {}

    def read(self, conn: DictConnection) -> list[OutputDelta]:
        """Returns the deltas written since the previous call (none on the first, which only
        notes where the table stands)."""
        if self._after is None:
            row = conn.execute(partial_q.JOB_DELTA_SEQ_LAST).fetchone()
            assert row is not None
            self._after = int(row["last_seq"])
            return []
        growths = self._group(self._rows(conn))
        gaps = {job_id: gap for job_id, growth in growths.items()
                if (gap := growth.gap()) is not None}
        if gaps:
            self._fill(conn, growths, gaps)
        deltas = []
        for job_id, growth in growths.items():
            delta = self._delta(job_id, growth)
            if delta is not None:
                deltas.append(delta)
        return deltas

    def forget_ended(self, events: Sequence[JobEvent]) -> None:
        """Forgets the attempts that `events` end (a job leaving `running`)."""
        for event in events:
            if event.from_state == "running":
                self._sent.pop(event.job_id, None)

    def _rows(self, conn: DictConnection) -> list[dict[str, Any]]:
        """Every row past the last look, page by page."""
        rows: list[dict[str, Any]] = []
        while True:
            page = conn.execute(partial_q.JOB_DELTA_LIST_AFTER, {
                "after": self._after, "limit": self._page_size,
                "tail": self._text_chars}).fetchall()
            if page:
                self._after = int(page[-1]["seq"])
                rows += page
            if len(page) < self._page_size:
                return rows

    def _group(self, rows: list[dict[str, Any]]) -> dict[uuid.UUID, _Growth]:
        """Each job's rows of its latest attempt, past what was already sent of it."""
        growths: dict[uuid.UUID, _Growth] = {}
        for row in rows:
            job_id, attempt = row["job_id"], row["attempt"]
            growth = growths.get(job_id)
            if growth is not None and attempt < growth.attempt:
                continue
            if growth is None or attempt > growth.attempt:
                sent = self._sent.get(job_id)
                if sent is not None and sent[0] > attempt:
                    continue
                # NOTE: a job never seen is read from 0 (its earlier rows, once per process);
                # a new attempt starts over at 0.
                base = sent[1] if sent is not None and sent[0] == attempt else 0
                growth = growths[job_id] = _Growth(row, attempt, base)
            if row["offset"] >= growth.base:
                growth.rows.append((row["offset"], row["length"], row["text"]))
        return growths

    def _fill(self, conn: DictConnection, growths: dict[uuid.UUID, _Growth],
              gaps: dict[uuid.UUID, tuple[int, int]]) -> None:
        """Reads again the ranges the look skipped, one statement for every job with a gap."""
        ids = list(gaps)
        found = conn.execute(partial_q.JOB_DELTA_LIST_RANGES, {
            "job_id": ids, "attempt": [growths[job_id].attempt for job_id in ids],
            "start": [gaps[job_id][0] for job_id in ids],
            "stop": [gaps[job_id][1] for job_id in ids], "tail": self._text_chars}).fetchall()
        filled: dict[uuid.UUID, list[tuple[int, int, str]]] = {}
        for row in found:
            filled.setdefault(row["job_id"], []).append((row["offset"], row["length"],
                                                         row["text"]))
        for job_id, rows in filled.items():
            growths[job_id].rows = rows

    def _delta(self, job_id: uuid.UUID, growth: _Growth) -> OutputDelta | None:
        """The job's delta: its rows from where they continue, capped to the latest characters."""
        if not growth.rows:
            return None
        offset = end = growth.rows[0][0]
        pieces: list[str] = []
        for row_offset, length, text in growth.rows:
            start = row_offset + length - len(text)
            if start != end:
                # NOTE: a row read as its tail (longer than the cap), or still a hole (the
                # job's rows were deleted meanwhile): what follows is sent.
                offset, pieces = start, []
            pieces.append(text)
            end = row_offset + length
        text = "".join(pieces)
        if len(text) > self._text_chars:
            offset, text = end - self._text_chars, text[-self._text_chars:]
        self._sent[job_id] = (growth.attempt, end)
        first = growth.first
        return OutputDelta(job_id, first["prompt_id"], first["org_id"], first["created_by"],
                           growth.attempt, offset, text)
