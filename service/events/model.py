"""What the SSE path carries: a transition of the event log, or text a streamed attempt appended."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["JobEvent", "Key", "Live", "OutputDelta"]

Key = tuple[int, int | None]
"""Whose events a stream receives: (org, user), or (org, None) for the whole org."""

_FIXED_BYTES = 256
"""What an event costs besides its text, about (ids, states, times, the frame's own bytes)."""


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One row of sa_job_event: a job's transition, in the log's id order."""

    id: int
    job_id: uuid.UUID
    prompt_id: uuid.UUID
    org_id: int
    created_by: int
    from_state: str | None
    to_state: str
    attempt: int
    error_kind: str | None
    response_id: uuid.UUID | None
    at: datetime
    response_text: str | None = None
    response_truncated: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> JobEvent:
        """Builds an event from a row of JOB_EVENT_LIST_* (a dict row)."""
        return cls(**row)

    @property
    def keys(self) -> tuple[Key, Key]:
        """The streams it goes to: its creator's own, and its org's."""
        return (self.org_id, self.created_by), (self.org_id, None)

    @property
    def size(self) -> int:
        """About how many bytes it holds (its text's UTF-8 and a fixed part)."""
        return _FIXED_BYTES + len((self.response_text or "").encode("utf-8", "replace"))

    def payload(self) -> dict[str, Any]:
        """Returns what a client may see: everything but the org, which is the client's own.

        `created_by` names the job's creator, which tells an org-wide stream (`scope=org`) whose
        job moved.
        """
        return {
            "id": self.id,
            "job_id": self.job_id,
            "prompt_id": self.prompt_id,
            "created_by": self.created_by,
            "from_state": self.from_state,
            "to_state": self.to_state,
            "attempt": self.attempt,
            "error_kind": self.error_kind,
            "response_id": self.response_id,
            "at": self.at,
            "response_text": self.response_text,
            "response_truncated": self.response_truncated,
        }


@dataclass(frozen=True, slots=True)
class OutputDelta:
    """Text a streamed attempt appended since the previous delta; no event id (not in the log).

    `offset` is the length of the attempt's text before this piece: 0 starts an attempt (a
    retry's stream starts over), and a client that read `partial_text` from GET /jobs applies
    only what lies past what it has.
    """

    job_id: uuid.UUID
    prompt_id: uuid.UUID
    org_id: int
    created_by: int
    attempt: int
    offset: int
    text: str

    @property
    def keys(self) -> tuple[Key, Key]:
        """The streams it goes to: its creator's own, and its org's."""
        return (self.org_id, self.created_by), (self.org_id, None)

    @property
    def size(self) -> int:
        """About how many bytes it holds (its text's UTF-8 and a fixed part)."""
        return _FIXED_BYTES + len(self.text.encode("utf-8", "replace"))

    def payload(self) -> dict[str, Any]:
        """Returns what a client may see (not the org, its own)."""
        return {"job_id": self.job_id, "prompt_id": self.prompt_id, "attempt": self.attempt,
                "offset": self.offset, "text": self.text}


Live = JobEvent | OutputDelta
"""What a subscription carries: transitions (with ids, in id order) and output deltas."""
