"""Output deltas: what streamed attempts appended to their text since the hub's last look."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import partial as partial_q
from service.events.model import JobEvent, OutputDelta

__all__ = ["DeltaReader"]


class DeltaReader:
    """Turns the growth of sa_job_partial rows into deltas, each sent once per process.

    NOTE: best effort and live only, like the wake-ups: a delta is what a row holds past what
    was sent, so a rewrite read late or twice repeats nothing and loses nothing. A delta carries
    at most `text_chars` characters: past that (a hub that looked late, or first saw a long
    attempt) it sends the latest ones, and its `offset` tells a client that it missed some
    (GET /jobs/{id} has the attempt's whole `partial_text`).
    """

    def __init__(self, text_chars: int) -> None:
        self._text_chars = text_chars
        self._after: int | None = None
        # NOTE: each job's (attempt, length) sent so far, forgotten when its attempt ends.
        self._sent: dict[uuid.UUID, tuple[int, int]] = {}

    def read(self, conn: DictConnection) -> list[OutputDelta]:
        """Returns the deltas written since the previous call (none on the first, which only
        notes where the table stands)."""
        if self._after is None:
            row = conn.execute(partial_q.JOB_PARTIAL_SEQ_LAST).fetchone()
            assert row is not None
            self._after = int(row["last_seq"])
            return []
        rows = conn.execute(partial_q.JOB_PARTIAL_LIST_CHANGED, {"after": self._after}).fetchall()
        if not rows:
            return []
        self._after = int(rows[-1]["seq"])
        deltas = []
        for r in rows:
            attempt, sent = self._sent.get(r["job_id"], (r["attempt"], 0))
            offset = sent if attempt == r["attempt"] and sent <= len(r["text"]) else 0
            if offset == len(r["text"]):
                continue
            offset = max(offset, len(r["text"]) - self._text_chars)
            self._sent[r["job_id"]] = (r["attempt"], len(r["text"]))
            deltas.append(OutputDelta(r["job_id"], r["prompt_id"], r["org_id"], r["created_by"],
                                      r["attempt"], offset, r["text"][offset:]))
        return deltas

    def forget_ended(self, events: Sequence[JobEvent]) -> None:
        """Forgets the attempts that `events` end (a job leaving `running`)."""
        for event in events:
            if event.from_state == "running":
                self._sent.pop(event.job_id, None)
