"""The operator's read and archive commands: list-jobs, job-details, queue-metrics, archive-old-jobs.

Exit codes: 0 done; 1 the job is unknown or the database cannot be reached (message on stderr);
2 bad arguments or configuration (argparse and `sa-core` print why).
"""

from __future__ import annotations

import argparse
import json
import re
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.states import JobState
from jobqueue.engine.inspection import (
    JobDetails,
    OrgFigures,
    QueueMetrics,
    job_details,
    list_jobs,
    queue_metrics,
    usage,
)
from jobqueue.operator.cli_pool import Answer, with_cli_pool
from jobqueue.operator.durations import DURATION_FORMS, shift
from jobqueue.runtime.archive import Archiver

__all__ = ["add_operator_commands", "parse_instant"]

_INSTANT_HELP = ("ISO 8601 (2026-01-31, 2026-01-31T12:00:00+00:00; no offset means UTC) "
                 f"or an age: {DURATION_FORMS}")
_DEFAULT_WINDOW = "24h"
_EXIT_CODES = ("exit codes: 0 done; 1 unknown job id or database unreachable (message on stderr); "
               "2 bad arguments")


def parse_instant(text: str, now: datetime | None = None) -> datetime:
    """Parses an instant given as ISO 8601 or as an age before `now` (`30m`, `12h`, `7d`).

    Args:
        text: the argument.
        now: the reference for ages; the current time when None.

    Returns:
        An aware datetime.

    Raises:
        ValueError: `text` is neither form, or an age older than the year 1.
    """
    if (before := shift(text, now or datetime.now(UTC), -1)) is not None:
        return before
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"not an instant: {text!r}; use {_INSTANT_HELP}") from None
    if len(text.strip()) == 10:
        parsed = datetime.combine(date.fromisoformat(text.strip()), datetime.min.time())
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _instant(text: str) -> datetime:
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _past_instant(text: str) -> datetime:
    value = _instant(text)
    # NOTE: a minute of slack for a database clock a little ahead of this machine's.
    if value > datetime.now(UTC) + timedelta(minutes=1):
        raise argparse.ArgumentTypeError(f"{text!r} is in the future; give a past date or an age (30d)")
    return value


def _bounded(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be within {low}..{high}, got {value}")
        return value

    return parse


def _job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a job id (a UUID): {text!r}") from None


# --- formatting --------------------------------------------------------------------------------


def _when(value: datetime | None, *, millis: bool = False) -> str:
    if value is None:
        return "-"
    text = value.astimezone(UTC).isoformat(sep=" ", timespec="milliseconds" if millis else "seconds")
    return text.replace("+00:00", "Z")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.3f}s"
    if value < 600:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


# NOTE: tenants' text reaches an operator's terminal here: C0/C1 controls (escape sequences,
# carriage returns) and bidirectional overrides are shown as escapes, never sent raw. Content
# keeps its line breaks and tabs; a table cell or field keeps nothing that moves the cursor.
_INVISIBLE = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE_IN_CELL = re.compile(f"[\x00-\x1f{_INVISIBLE}]")
_UNSAFE_IN_CONTENT = re.compile(f"[\x00-\x08\x0b-\x1f{_INVISIBLE}]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _text(value: Any) -> str:
    return "-" if value is None else _UNSAFE_IN_CELL.sub(_escaped, str(value))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> str:
    cells = [list(headers)] + [[_text(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def _render_list(rows: list[dict[str, Any]], limit: int) -> str:
    if not rows:
        return "no jobs match"
    table = _table(
        ["JOB ID", "STATE", "ORG", "USER", "ATTEMPT", "PRI", "ERROR", "CREATED", "UPDATED"],
        [[r["id"], r["state"], r["org_id"], r["created_by"], f"{r['attempt']}/{r['max_attempts']}",
          r["priority"], r["error_kind"], _when(r["created_at"]), _when(r["updated_at"])]
         for r in rows],
        indent="",
    )
    more = f" (the newest {limit}; raise --limit to see more)" if len(rows) == limit else ""
    return f"{table}\n{len(rows)} job(s), newest first{more}"


def _indented(text: str) -> str:
    safe = _UNSAFE_IN_CONTENT.sub(_escaped, text.replace("\r\n", "\n"))
    return "\n".join("  " + line for line in safe.split("\n")) if text else "  (empty)"


def _event_error(event: dict[str, Any]) -> str | None:
    """The error that ended an attempt; other events only carry the job's last error along."""
    ended = event["from_state"] == "running" and event["to_state"] in ("queued", "failed")
    return event["error_kind"] if ended else None


def _render_details(details: JobDetails) -> str:
    job = details.job
    archived = f" (archived {_when(job['archived_at'])})" if job["archived_at"] else ""
    error = None
    if job["error_kind"] or job["error_message"]:
        error = f"{job['error_kind'] or '-'}: {job['error_message'] or ''}".rstrip(": ")
    fields = [
        ("state", job["state"]),
        ("prompt", job["prompt_id"]),
        ("org / user", f"{job['org_id']} / {job['created_by']}"),
        ("attempt", f"{job['attempt']} of {job['max_attempts']}"),
        ("priority", job["priority"]),
        ("options", json.dumps(job["execution_options"], sort_keys=True)),
        ("worker", job["worker_claim"]),
        ("created", _when(job["created_at"], millis=True)),
        ("scheduled for", _when(job["scheduled_for"], millis=True)),
        ("claimed", _when(job["claimed_at"], millis=True)),
        ("heartbeat", _when(job["running_heartbeat_at"], millis=True)),
        ("finished", _when(job["finished_at"], millis=True)),
        ("updated", _when(job["updated_at"], millis=True)),
        ("response", job["response_id"]),
        ("error", error),
        ("supersedes", job["supersedes"]),
        ("superseded by", job["superseded_by"]),
    ]
    width = max(len(name) for name, _ in fields)
    lines = [f"job {job['id']}{archived}"]
    lines += [f"  {name.ljust(width)}  {_text(value)}" for name, value in fields]
    prompt = details.prompt
    if prompt is not None:
        lines += ["", f"prompt {prompt['id']} (parent {_text(prompt['parent_id'])})",
                  _indented(prompt["content"])]
    if details.response is not None:
        lines += ["", f"response {details.response['id']}", _indented(details.response["content"])]
    lines += ["", f"transitions ({len(details.events)})", _table(
        ["EVENT", "AT", "FROM", "TO", "ATTEMPT", "WORKER", "ERROR"],
        [[e["id"], _when(e["at"], millis=True), e["from_state"] or "(created)", e["to_state"],
          e["attempt"], e["worker_claim"], _event_error(e)] for e in details.events])]
    if details.calls:
        lines += ["", f"provider calls ({len(details.calls)})", _table(
            ["ATTEMPT", "AT", "ROUTE", "MODEL", "HTTP", "LATENCY", "TOKENS IN/OUT", "COST USD",
             "OUTCOME"],
            [[c["attempt"], _when(c["created_at"], millis=True), _text(c["route"]), c["model"],
              c["http_status"], f"{c['latency_ms']} ms",
              f"{_text(c['tokens_in'])}/{_text(c['tokens_out'])}",
              "" if c["cost"] is None else _usd(c["cost"]), c["outcome"]]
             for c in details.calls])]
    return "\n".join(lines)


def _org_label(figures: OrgFigures) -> str:
    return "all" if figures.org_id is None else str(figures.org_id)


def _render_metrics(report: QueueMetrics, now: datetime) -> str:
    everyone = [report.overall, *report.orgs]
    states = [state.value for state in JobState]
    window = f"since {_when(report.since)} ({_seconds((now - report.since).total_seconds())})"
    lines = [f"queue metrics at {_when(now)}", "", "jobs by state (hot tables) and the claimable backlog",
             _table(["ORG", *(s.upper() for s in states), "DUE", "OLDEST QUEUED"],
                    [[_org_label(f), *(f.jobs_by_state[s] for s in states), f.queued_due,
                      _seconds(f.oldest_queued_seconds) if f.queued_due else "-"] for f in everyone])]
    lines += ["", f"wait (created -> first claim) and run (claim -> end of attempt) {window}",
              _table(["ORG", "CLAIMS", "WAIT MEAN", "WAIT P95", "ATTEMPTS", "RUN MEAN", "RUN P95",
                      "ERRORS", "ERROR RATE"],
                     [[_org_label(f), f.claims, _seconds(f.wait_mean), _seconds(f.wait_p95),
                       f.attempts, _seconds(f.run_mean), _seconds(f.run_p95), f.errors,
                       _rate(f.error_rate)] for f in everyone])]
    kinds = [[_org_label(f), kind, n, _rate(n / f.attempts if f.attempts else None)]
             for f in everyone for kind, n in f.errors_by_kind.items()]
    lines += ["", f"errors by kind {window}",
              _table(["ORG", "ERROR KIND", "ERRORS", "RATE"], kinds) if kinds else "  (none)"]
    return "\n".join(lines)


# --- commands ----------------------------------------------------------------------------------


def _list_jobs(args: argparse.Namespace) -> int:
    def run(pool: ConnectionPool[DictConnection]) -> Answer:
        state = None if args.state is None else JobState(args.state)
        rows = list_jobs(pool, state=state, org_id=args.org, since=args.since, limit=args.limit)
        return Answer(_render_list(rows, args.limit), rows)

    return with_cli_pool(run, args.json)


def _job_details(args: argparse.Namespace) -> int:
    def run(pool: ConnectionPool[DictConnection]) -> Answer:
        details = job_details(pool, args.job_id)
        return Answer(_render_details(details), details.as_dict())

    return with_cli_pool(run, args.json)


def _queue_metrics(args: argparse.Namespace) -> int:
    def run(pool: ConnectionPool[DictConnection]) -> Answer:
        report = queue_metrics(pool, args.since or parse_instant(_DEFAULT_WINDOW))
        return Answer(_render_metrics(report, datetime.now(UTC)), report.as_dict())

    return with_cli_pool(run, args.json)


def _archive_old_jobs(args: argparse.Namespace) -> int:
    def run(pool: ConnectionPool[DictConnection]) -> Answer:
        archiver = Archiver(pool, Archiver.Config(batch_size=args.batch_size))
        counts = archiver.run_once(args.before, dry_run=args.dry_run)
        what = (f"{counts.jobs} job(s) of {counts.prompts} prompt(s), {counts.events} event(s), "
                f"{counts.ledger} ledger row(s), all finished before {_when(args.before)}")
        data = {"dry_run": args.dry_run, "before": args.before, "jobs": counts.jobs,
                "prompts": counts.prompts, "events": counts.events, "ledger": counts.ledger,
                "batches": counts.batches}
        if args.dry_run:
            return Answer(f"dry run: would archive {what}; nothing changed ({counts.batches} batch(es))",
                          data)
        return Answer(f"archived {what} ({counts.batches} batch(es))", data)

    return with_cli_pool(run, args.json)


def _usage(args: argparse.Namespace) -> int:
    def run(pool: ConnectionPool[DictConnection]) -> Answer:
        since = args.since or parse_instant(_DEFAULT_WINDOW)
        rows = usage(pool, since, args.org)
        totals = ["all", "", "", sum(r["calls"] for r in rows),
                  sum(r["tokens_in"] for r in rows), sum(r["tokens_out"] for r in rows),
                  _usd(sum(r["cost"] for r in rows))]
        lines = [f"provider usage since {_when(since)}" + ("" if args.org is None
                                                           else f", org {args.org}"), _table(
            ["org", "model", "route", "calls", "tokens_in", "tokens_out", "cost_usd"],
            [[r["org_id"], r["model"], _text(r["route"]), r["calls"], r["tokens_in"],
              r["tokens_out"], _usd(r["cost"])] for r in rows] + [totals])]
        return Answer("\n".join(lines), {"since": since, "org_id": args.org, "items": rows})

    return with_cli_pool(run, args.json)


def _usd(amount: float) -> str:
    """USD to the millionth of a dollar (prices per million tokens make such amounts)."""
    return f"{amount:.6f}"


def add_operator_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds list-jobs, job-details, queue-metrics, usage and archive-old-jobs to `sa-core`'s subcommands."""
    listing = sub.add_parser("list-jobs", help="list jobs of any org, newest first",
                             epilog=_EXIT_CODES)
    listing.add_argument("--state", choices=[state.value for state in JobState], metavar="S",
                         help=f"only jobs in state S ({', '.join(JobState)})")
    listing.add_argument("--org", type=_bounded(0, 2**63 - 1), metavar="N", help="only org N's jobs")
    listing.add_argument("--since", type=_instant, metavar="T",
                         help=f"only jobs created at or after T: {_INSTANT_HELP}")
    listing.add_argument("--limit", type=_bounded(1, 100_000), default=50, metavar="N",
                         help="at most N jobs (default 50)")
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    listing.set_defaults(func=_list_jobs)

    details = sub.add_parser("job-details", help="a job, its prompt, response and full transition history",
                             epilog=_EXIT_CODES)
    details.add_argument("job_id", type=_job_id, metavar="ID")
    details.add_argument("--json", action="store_true", help="print a JSON document")
    details.set_defaults(func=_job_details)

    metrics = sub.add_parser(
        "queue-metrics",
        help="jobs by state, oldest queued, wait/run mean and p95, error rate by kind, per org",
        epilog=_EXIT_CODES)
    metrics.add_argument("--since", type=_instant, default=None, metavar="T",
                         help=f"window of the latency and error figures (default 24h): {_INSTANT_HELP}")
    metrics.add_argument("--json", action="store_true", help="print a JSON document")
    metrics.set_defaults(func=_queue_metrics)

    spent = sub.add_parser("usage", help="provider calls, tokens and cost (USD) per org, model "
                                         "and route over a time range (archived jobs included)",
                           epilog=_EXIT_CODES)
    spent.add_argument("--org", type=_bounded(0, 2**63 - 1), metavar="N", help="only org N")
    spent.add_argument("--since", type=_instant, default=None, metavar="T",
                       help=f"start of the range (default 24h ago): {_INSTANT_HELP}")
    spent.add_argument("--json", action="store_true", help="print a JSON document")
    spent.set_defaults(func=_usage)

    archive = sub.add_parser(
        "archive-old-jobs",
        help="move finished jobs (with their events and ledger rows) older than DATE to the archive tables",
        description="Moves every prompt whose jobs are all finished and unchanged since DATE, in "
                    "short batches; queued and running jobs, and any prompt that still has one, stay.",
        epilog=_EXIT_CODES)
    archive.add_argument("--before", type=_past_instant, required=True, metavar="DATE",
                         help=f"cutoff: {_INSTANT_HELP}")
    archive.add_argument("--dry-run", action="store_true", help="count what would move; change nothing")
    archive.add_argument("--batch-size", type=_bounded(1, 100_000), default=500, metavar="N",
                         help="jobs scanned per transaction (default 500)")
    archive.add_argument("--json", action="store_true", help="print the counts as JSON")
    archive.set_defaults(func=_archive_old_jobs)
