"""The `sa-core` command line: migrate, run-worker, reclaim, cancel and retry jobs, tokens, dev tools."""

from __future__ import annotations

import sys

from jobqueue.runtime.green import patch_for_worker

patch_for_worker(sys.argv[1:])

# NOTE: every import below comes after the worker's monkey-patching (E402 ignored for this file).
import argparse
import logging
import signal
import uuid
from collections.abc import Sequence
from types import FrameType
from typing import NoReturn, cast

import psycopg
import structlog
from psycopg_pool import ConnectionPool, PoolTimeout

from jobqueue.core.db import DictConnection
from jobqueue.core.dbcheck import DatabaseRefused, check_urls, refusal
from jobqueue.core.exposition import ProcessFigures, start_worker_metrics_server
from jobqueue.core.logs import LogLevelError, configure_logging
from jobqueue.core.queries.admin import SESSION_TIMEOUTS
from jobqueue.core.redact import redact
from jobqueue.core.settings import DatabaseUrlMissing, Settings, SettingsError
from jobqueue.core.version import VERSION
from jobqueue.devtools import fake_provider
from jobqueue.devtools.home import database_url_advice
from jobqueue.engine import chains
from jobqueue.engine.control import cancel_job, retry_job
from jobqueue.engine.reclaim import Reclaimer
from jobqueue.operator.cli_pool import Answer, fail, print_answer, with_cli_pool
from jobqueue.operator.client_commands import add_client_commands, priority_arg
from jobqueue.operator.operator_commands import add_operator_commands
from jobqueue.operator.token_commands import add_token_commands
from jobqueue.runtime.assembly import assemble_worker, open_descriptors, worker_config
from jobqueue.runtime.batch_keeper import BatchKeeper
from jobqueue.runtime.collector import settle_collector
from jobqueue.runtime.maintenance import MaintenanceLeader
from jobqueue.runtime.worker import Worker
from jobqueue.runtime.worker_config import DEFAULT_CONCURRENCY
from jobqueue.schema.migrate import MigrationError, migrate

__all__ = ["LONG_RUNNING", "main"]

LONG_RUNNING = frozenset({"run-worker", "fake-provider"})
"""Commands that run until stopped and log at info by default; every other command (and `dev`'s
own process) logs warnings and errors only unless LOG_LEVEL says otherwise."""


class UsageError(Exception):
    """The command cannot run as asked; printed without a traceback, exit code 2."""


class _OneLineParser(argparse.ArgumentParser):
    """argparse, whose refusal of an argument is one line on stderr (exit 2), like every other
    error of `sa-core`, instead of the usage text followed by the error."""

    def error(self, message: str) -> NoReturn:
        """Prints `PROG: error: MESSAGE (see PROG --help)` and exits 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _migrate(args: argparse.Namespace) -> int:
    applied = migrate(Settings.from_env().database_url)
    text = f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "")
    print_answer(Answer(text, {"applied": applied}), args.json)
    return 0


def _report_timeouts(worker: Worker, settings: Settings) -> None:
    """Says where the worker's statement and lock timeouts come from when none was sent (a pooler
    is declared): the server's settings for the role and database, which may be none."""
    if settings.sends_timeouts or settings.pooler == "none":
        return
    log = structlog.get_logger(__name__)
    try:
        with worker.pool.connection() as conn:
            found = conn.execute(SESSION_TIMEOUTS).fetchone() or {}
    except (psycopg.OperationalError, PoolTimeout) as exc:
        # NOTE: a report only: a server that is restarting while the worker starts must not stop it.
        log.warning("worker.database_timeouts_unknown", pooler=settings.pooler, error=redact(str(exc)))
        return
    wanted = {"statement_timeout": settings.statement_timeout, "lock_timeout": settings.lock_timeout}
    missing = [name for name, seconds in wanted.items() if seconds > 0 and found.get(name) == "0"]
    log.info("worker.database_timeouts", pooler=settings.pooler, source="the role's and database's settings",
             **found)
    if missing:
        log.warning("worker.database_timeouts_missing", pooler=settings.pooler, missing=missing,
                    hint="a pooler is declared (SA_DATABASE_POOLER), so no timeout is sent: "
                         + "; ".join(f"ALTER ROLE <worker role> SET {name} = '{wanted[name]:g}s'"
                                     for name in missing))


def _run_worker(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if not settings.routes:
        raise UsageError("SA_PROVIDER_URL is not set, nor SA_PROVIDER_ROUTES(_FILE) "
                         "(try `sa-core fake-provider`)")
    config = worker_config(settings, concurrency=args.concurrency, batch_size=args.batch_size,
                           priority_ceiling=args.priority_ceiling)
    open_descriptors(config.concurrency)
    figures = ProcessFigures()
    # NOTE: the direct URL's users (LISTEN, the maintenance session) reconnect in the background
    # and would retry a refusal for good for ever.
    check_urls({"DATABASE_URL": settings.worker_database_url,
                "SA_DIRECT_DATABASE_URL": settings.direct_database_url})
    if settings.metrics_port and not args.once:
        # NOTE: each long-running worker process is its own scrape target (ops/README.md); a
        # --once run is gone before a scrape could reach it.
        try:
            start_worker_metrics_server(settings.metrics_port, figures=figures)
        except OSError as exc:
            raise UsageError(f"SA_METRICS_PORT={settings.metrics_port}: {exc.strerror}") from None
    try:
        parts = assemble_worker(settings, config)
    except ValueError as exc:
        # NOTE: one line, no traceback: the message hides passwords, a traceback would not.
        raise UsageError(str(exc)) from None
    worker = parts.worker
    _report_timeouts(worker, settings)
    figures.add_pool(worker.pool).add(worker.report_slots)
    # NOTE: only long-running workers compete for the maintenance role; a --once run is too
    # short-lived to hold it (cron runs `reclaim-stuck-jobs` instead).
    leader = None if args.once else MaintenanceLeader.from_settings(settings).start()
    # NOTE: every long-running worker moves batches along; their leases keep them apart.
    keeper = None if args.once else BatchKeeper.from_settings(settings).start()
    # NOTE: wake-up on LISTEN/NOTIFY (the poll stays as the fallback); SA_LISTEN=0 (PgBouncer in
    # transaction mode) leaves only the poll. A --once run claims once and needs no wake-up.
    if settings.listen and not args.once:
        parts.listen(settings.direct_database_url)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    settle_collector()
    try:
        worker.run(once=args.once)
    finally:
        if leader is not None:
            leader.stop()
        if keeper is not None:
            keeper.stop()
        parts.close()
    return 0


def _reclaim_stuck_jobs(args: argparse.Namespace) -> int:
    config = Reclaimer.Config.from_settings(Settings.from_env())

    def reclaim(pool: ConnectionPool[DictConnection]) -> Answer:
        counts = Reclaimer(pool, config).run_once()
        # NOTE: what the leader's round also does, for deployments that run this from cron.
        with pool.connection() as conn:
            settled = chains.sweep(conn)
        text = f"requeued {counts.requeued} job(s), failed {counts.failed} as stuck"
        if settled.released or settled.cancelled:
            text += (f"; chains left waiting on ended jobs: {settled.released} released, "
                     f"{settled.cancelled} cancelled")
        return Answer(text, {"requeued": counts.requeued, "failed": counts.failed,
                             "dependents_released": settled.released,
                             "dependents_cancelled": settled.cancelled})

    return with_cli_pool(reclaim, args.json)


def _cancel_job(args: argparse.Namespace) -> int:
    def cancel(pool: ConnectionPool[DictConnection]) -> Answer:
        job = cancel_job(pool, args.job_id, None)
        return Answer(f"job {job['id']} cancelled (prompt {job['prompt_id']}, org {job['org_id']})",
                      {"job_id": job["id"], "prompt_id": job["prompt_id"], "org_id": job["org_id"],
                       "state": job["state"]})

    return with_cli_pool(cancel, args.json)


def _retry_job(args: argparse.Namespace) -> int:
    def retry(pool: ConnectionPool[DictConnection]) -> Answer:
        new = retry_job(pool, args.job_id, None)
        return Answer(f"job {new.job_id} {new.state}, superseding job {new.supersedes}", new.as_dict())

    return with_cli_pool(retry, args.json)


def _fake_provider(args: argparse.Namespace) -> int:
    fake_provider.serve_forever(args.host, args.port, fake_provider.config_from_args(args))
    return 0


def _dev(args: argparse.Namespace) -> int:
    from jobqueue.devtools.dev import run_dev

    return run_dev(port=args.port)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser of every subcommand."""
    parser = _OneLineParser(
        prog="sa-core", description=__doc__,
        epilog="Answers go to stdout, logs and errors to stderr (JSON lines; LOG_LEVEL sets the level). "
               "Exit codes: 0 done; 1 failed (unknown id, refused, database unreachable); "
               "2 bad arguments or configuration (a database that refuses the connection for "
               "good included).")
    parser.add_argument("--version", action="version", version=f"sa-core {VERSION}")
    # NOTE: every subcommand's parser is a _OneLineParser too (argparse makes them of the parent's
    # class); the command modules take the base type.
    sub = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
               parser.add_subparsers(dest="command", required=True))

    migrating = sub.add_parser(
        "migrate", help="apply pending SQL migrations (shipped in the package)",
        epilog="exit codes: 0 up to date; 1 no migration shipped, an applied migration changed, "
               "or the database is unreachable")
    _json_flag(migrating)
    migrating.set_defaults(func=_migrate)

    worker = sub.add_parser("run-worker", help="claim and run jobs")
    worker.add_argument("--once", action="store_true", help="one claim round, then exit")
    worker.add_argument("--batch-size", type=_positive, default=None,
                        help="most jobs claimed at once (default: --concurrency)")
    worker.add_argument("--priority-ceiling", type=priority_arg, default=100,
                        help="claim only jobs with priority <= N")
    worker.add_argument("--concurrency", type=_positive, default=DEFAULT_CONCURRENCY,
                        help=f"provider calls in flight at once (greenlets; default {DEFAULT_CONCURRENCY})")
    worker.set_defaults(func=_run_worker)

    reclaim = sub.add_parser(
        "reclaim-stuck-jobs", help="requeue jobs whose worker stopped heartbeating (or fail them as stuck)")
    _json_flag(reclaim)
    reclaim.set_defaults(func=_reclaim_stuck_jobs)
    control_codes = "exit code 1 when the job is unknown or its state forbids it (message on stderr)"
    cancel = sub.add_parser("cancel-job", help="cancel a queued or running job (any org)",
                            epilog=control_codes)
    cancel.add_argument("job_id", type=uuid.UUID, metavar="ID")
    _json_flag(cancel)
    cancel.set_defaults(func=_cancel_job)
    retry = sub.add_parser("retry-job", help="queue a new job superseding a finished one (any org)",
                           epilog=control_codes)
    retry.add_argument("job_id", type=uuid.UUID, metavar="ID")
    _json_flag(retry)
    retry.set_defaults(func=_retry_job)
    add_operator_commands(sub)

    add_token_commands(sub)
    add_client_commands(sub)

    fake = sub.add_parser("fake-provider", help="run the OpenAI-compatible fake provider")
    fake_provider.add_arguments(fake)
    fake.set_defaults(func=_fake_provider)

    dev = sub.add_parser("dev", help="migrate and run web, worker and fake provider together")
    dev.add_argument("--port", type=int, default=8000)
    dev.set_defaults(func=_dev)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one subcommand; returns its exit code."""
    args = build_parser().parse_args(argv)
    try:
        configure_logging(default=logging.INFO if args.command in LONG_RUNNING else logging.WARNING)
        code: int = args.func(args)
    except DatabaseUrlMissing as exc:
        fail(database_url_advice(str(exc)))
        return 2
    except (SettingsError, LogLevelError, UsageError, DatabaseRefused) as exc:
        fail(redact(str(exc)))
        return 2
    except MigrationError as exc:
        return fail(str(exc))
    except (psycopg.OperationalError, PoolTimeout) as exc:
        # NOTE: libpq's reason (refused, timeout, authentication) on one line, password hidden;
        # a refusal that retrying cannot fix is configuration (exit 2), with what to do.
        if isinstance(exc, psycopg.OperationalError) and (refused := refusal("DATABASE_URL", exc)):
            fail(str(refused))
            return 2
        return fail(redact(f"database unreachable: {exc}"))
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
