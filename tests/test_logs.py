"""Log lines (jobqueue/core/logs.py): one JSON object per line on stderr, whatever a line carries."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime

import pytest
import structlog

from jobqueue.core.logs import configure_logging


def _lines(capfd: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capfd.readouterr().err.splitlines()]


def test_every_line_is_one_json_object_with_a_utc_timestamp(
        capfd: pytest.CaptureFixture[str]) -> None:
    configure_logging(buffered=False)
    job = uuid.uuid4()
    structlog.get_logger("t").info("job.claimed", job_id=job, attempt=2, tags={1: "one"})

    [line] = _lines(capfd)
    assert (line["event"], line["level"], line["job_id"], line["attempt"], line["tags"]) == (
        "job.claimed", "info", str(job), 2, {"1": "one"})
    stamp = str(line["timestamp"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp), stamp
    written = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - written).total_seconds()) < 5


def test_a_value_the_fast_encoder_refuses_still_makes_its_line(
        capfd: pytest.CaptureFixture[str]) -> None:
    configure_logging(buffered=False)
    structlog.get_logger("t").warning("provider.request", tokens_in=2**70, error="bad \ud800 text")

    [raw] = capfd.readouterr().err.splitlines()
    line = json.loads(raw)
    assert (line["event"], line["tokens_in"], line["error"]) == (
        "provider.request", 2**70, "bad \ud800 text")
    # NOTE: as compact as orjson's lines: jobqueue/devtools/relay.py tells levels by these bytes.
    assert '"level":"warning"' in raw
