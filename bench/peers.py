"""Side by side: sa-core's queue against pgqueuer, procrastinate and oban on the same Postgres.

Usage: .venv/bin/python -m bench.peers [--jobs 5000] [--rounds 3] [--pickups 200]
       [--only sa-core,sa-core-2p,sa-core-noop,sa-core-post,pgqueuer,procrastinate,oban]
       [--concurrency 32] [--post-seconds 5]

Each contender runs as a child process (bench/peer_runners/) against its own throwaway database
on the same server, in two measurements:

- burn-down: N jobs enqueued one at a time (each its own commit; enqueues/s), then one worker
  process at concurrency C runs them all (jobs/s, from the first task start to the last job's
  completion as the database shows it).
- pick-up: with one idle worker, one job at a time; latency from the enqueue's commit to the
  task's start (p50/p99 over every sample of every round).

Rounds are interleaved (A B C, A B C, ...) so a noisy machine hurts everyone alike. The three
libraries are installed from PyPI by name into virtual environments cached under
.sa-core/bench-venvs/ (`--reinstall` rebuilds them): one for pgqueuer + procrastinate on this
interpreter, one for oban, which needs Python >= 3.12 (found under pyenv, or SA_BENCH_PY312).
A contender that cannot be installed or run says why in its row; the others go on.

Contenders: `sa-core` is the real `sa-core run-worker` against bench/slow_provider.py answering
at once (full prompt jobs: HTTP call, response entity, edge, ledger, events); `sa-core-2p` the
same with two worker processes (each at the concurrency); `sa-core-post` only measures
`POST /prompt` through the Procfile's gunicorn for `--post-seconds` (closed loop, 32 keep-alive
connections, one generator process; its enqueue/s column), to hold against the peers' single
enqueues (one library call and commit each, on one connection) in the same run;
`sa-core-noop` runs the same Worker/Executor/finalize in one process with a provider stub and
the LISTEN wake-up wired as the tests wire it (see bench/peer_runners/sa_core.py); the others
run a no-op task.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import structlog
from psycopg.conninfo import conninfo_to_dict

from bench.common import REPO, format_table, percentile, scratch_database
from jobqueue.devtools.embedded_db import admin_conninfo

RUNNERS = REPO / "bench" / "peer_runners"
VENVS = REPO / ".sa-core" / "bench-venvs"
UV_BOOTSTRAP_BIN = REPO / ".sa-core" / "uv-bootstrap" / "bin"
RESULT_PREFIX = "PEER_RESULT "
STAMP = ".sa-core-bench.json"


# --- virtual environments -------------------------------------------------------------------


def _python_version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    major, minor = out.split()
    return int(major), int(minor)


def this_python() -> str:
    """The interpreter sa-core runs on (its base, not the venv's shim)."""
    return str(getattr(sys, "_base_executable", sys.executable))


def python_312_or_later() -> str:
    """A Python >= 3.12 on this machine: SA_BENCH_PY312, pyenv's versions, or PATH."""
    explicit = os.environ.get("SA_BENCH_PY312")
    candidates = [explicit] if explicit else []
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = glob.glob(str(pyenv / "versions" / "3.*" / "bin" / "python3"))

    def key(path: str) -> tuple[int, ...]:
        match = re.search(r"versions/(\d+)\.(\d+)\.?(\d*)", path)
        return tuple(int(x or 0) for x in match.groups()) if match else (0,)

    candidates += sorted(found, key=key)
    candidates += [p for p in (shutil.which("python3.12"), shutil.which("python3.13")) if p]
    for python in candidates:
        version = _python_version(python)
        if version is not None and version >= (3, 12):
            return python
    raise RuntimeError("no Python >= 3.12 found (set SA_BENCH_PY312 to one)")


@dataclass(frozen=True)
class Venv:
    """A cached virtual environment for one or more contenders."""

    name: str
    packages: tuple[str, ...]
    python: Callable[[], str]

    @property
    def path(self) -> Path:
        return VENVS / self.name

    @property
    def bin_python(self) -> Path:
        return self.path / "bin" / "python"


# NOTE: aiohttp is the HTTP client of bench/llm_shaped.py's tasks.
PEERS_VENV = Venv("peers", ("pgqueuer", "asyncpg", "procrastinate", "psycopg[binary]", "aiohttp"),
                  this_python)
OBAN_VENV = Venv("oban", ("oban", "aiohttp"), python_312_or_later)


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def ensure_venv(venv: Venv, reinstall: bool) -> None:
    """Creates the venv and installs its packages with uv, unless a matching one is cached.

    Raises:
        RuntimeError: uv is missing, no interpreter fits, or the install failed (with why).
    """
    stamp = venv.path / STAMP
    wanted = {"packages": list(venv.packages)}
    if not reinstall and stamp.exists() and venv.bin_python.exists():
        with open(stamp) as handle:
            if json.load(handle) == wanted and _python_version(str(venv.bin_python)):
                return
    # NOTE: where the Makefile finds or installs uv: PATH, else its bootstrap venv.
    uv = shutil.which("uv") or shutil.which("uv", path=str(UV_BOOTSTRAP_BIN))
    if uv is None:
        raise RuntimeError(f"uv is neither on PATH nor in {UV_BOOTSTRAP_BIN} (run `make venv`)")
    python = venv.python()
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    steps = [[uv, "venv", "--quiet", "--clear", "-p", python, str(venv.path)],
             [uv, "pip", "install", "--quiet", "--python", str(venv.bin_python), *venv.packages]]
    print(f"installing {', '.join(venv.packages)} into {venv.path.relative_to(REPO)} "
          f"(Python {python})", file=sys.stderr)
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(step[:3])} ...` failed: {_tail(done.stderr)}")
    stamp.write_text(json.dumps(wanted))


def installed_versions(venv: Venv) -> dict[str, str]:
    """Distribution versions in the venv, plus its Python."""
    names = [re.sub(r"\[.*", "", package) for package in venv.packages]
    code = ("import json, sys; from importlib.metadata import version as v; "
            f"names = {names!r}; "
            "print(json.dumps({'python': sys.version.split()[0], **{n: v(n) for n in names}}))")
    out = subprocess.run([str(venv.bin_python), "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    versions: dict[str, str] = json.loads(out)
    return versions


# --- contenders -------------------------------------------------------------------------------


@dataclass
class Contender:
    """One row of the table: how to run it, and what its runs gave."""

    name: str
    venv: Venv | None
    runner: str
    migrated: bool = False
    extra: tuple[str, ...] = ()
    shows: tuple[str, ...] = ()
    error: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    enqueue_per_s: list[float] = field(default_factory=list)
    jobs_per_s: list[float] = field(default_factory=list)
    pickup_ms: list[float] = field(default_factory=list)
    claim_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    post: bool = False
    """Measures POST /prompt only (its enqueue/s), no burn-down or pick-up."""

    def modes(self, args: argparse.Namespace) -> list[tuple[str, int]]:
        if self.post:
            return [("post", args.post_seconds)]
        return [("burndown", args.jobs), ("pickup", args.pickups)]

    def command(self, url: str, mode: str, count: int, args: argparse.Namespace) -> list[str]:
        common = [url, mode, str(count), "--concurrency", str(args.concurrency),
                  "--timeout", str(args.timeout), "--budget", str(args.pickup_budget), *self.extra]
        if self.venv is None:
            return [sys.executable, "-m", self.runner, *common]
        return [str(self.venv.bin_python), str(RUNNERS / self.runner), *common]


def contenders() -> list[Contender]:
    return [
        Contender("sa-core", None, "bench.peer_runners.sa_core", migrated=True,
                  extra=("--variant", "full")),
        Contender("sa-core-2p", None, "bench.peer_runners.sa_core", migrated=True,
                  extra=("--variant", "full", "--procs", "2")),
        Contender("sa-core-noop", None, "bench.peer_runners.sa_core", migrated=True,
                  extra=("--variant", "noop")),
        Contender("sa-core-post", None, "bench.peer_runners.sa_core", migrated=True,
                  extra=("--variant", "full"), post=True),
        Contender("pgqueuer", PEERS_VENV, "pgqueuer_runner.py", shows=("pgqueuer", "asyncpg")),
        Contender("procrastinate", PEERS_VENV, "procrastinate_runner.py",
                  shows=("procrastinate", "psycopg")),
        Contender("oban", OBAN_VENV, "oban_runner.py", shows=("oban", "psycopg")),
    ]


def as_uri(conninfo: str) -> str:
    """A libpq URI for a key=value conninfo (asyncpg takes URIs only)."""
    parts = conninfo_to_dict(conninfo)
    user = quote(str(parts.get("user", "postgres")), safe="")
    password = parts.get("password")
    auth = f"{user}:{quote(str(password), safe='')}" if password else user
    host = quote(str(parts.get("host", "127.0.0.1")), safe="")
    return f"postgresql://{auth}@{host}:{parts.get('port', 5432)}/{quote(str(parts['dbname']))}"


def run_once(contender: Contender, mode: str, count: int, args: argparse.Namespace) -> dict[str, Any]:
    """One child run against a fresh database; returns its result, or raises with why it failed."""
    with scratch_database(migrated=contender.migrated) as conninfo:
        cmd = contender.command(as_uri(conninfo), mode, count, args)
        # NOTE: a session of its own, so a child that overruns is ended with everything it spawned.
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"{mode} did not finish within {args.timeout + 60:.0f}s") from None
    for line in reversed(out.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX):])
            return result
    raise RuntimeError(f"{mode} exited {proc.returncode}: {_tail(err or out)}")


# --- report -----------------------------------------------------------------------------------


def machine_header(admin_url: str) -> list[str]:
    with psycopg.connect(admin_url) as conn:
        row = conn.execute("SELECT current_setting('server_version'), version()").fetchone()
    assert row is not None
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [f"machine: {os.cpu_count()} cores (nproc), load average {load}",
            f"postgres: {row[0]} on {admin_url.split('@')[-1]} ({row[1].split(',')[0]})"]


def _fmt_range(values: Sequence[float]) -> str:
    if not values:
        return "-"
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:,.0f}"
    return f"{median:,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def _ratio(values: Sequence[float], base: Sequence[float]) -> str:
    if not values or not base:
        return "-"
    return f"{statistics.median(values) / statistics.median(base):.2f}x"


def table(rows: list[Contender], args: argparse.Namespace) -> str:
    base = next((c for c in rows if c.name == "sa-core"), None)
    head = ["contender", "version", "enqueue/s", "burn-down jobs/s", "vs sa-core",
            "pick-up p50 ms", "p99 ms", "n"]
    lines = [head]
    notes: list[str] = []
    for c in rows:
        version = c.versions.get(c.name, c.versions.get("sa-core", "?"))
        if c.error and not c.jobs_per_s and not c.pickup_ms:
            lines.append([c.name, version, "-", "-", "-", "-", "-", "-"])
            notes.append(f"{c.name}: {c.error}")
            continue
        p50 = f"{percentile(c.pickup_ms, 50):.1f}" if c.pickup_ms else "-"
        p99 = f"{percentile(c.pickup_ms, 99):.1f}" if c.pickup_ms else "-"
        ratio = _ratio(c.jobs_per_s, base.jobs_per_s) if base is not None else "-"
        lines.append([c.name, version, _fmt_range(c.enqueue_per_s), _fmt_range(c.jobs_per_s),
                      ratio, p50, p99, str(len(c.pickup_ms))])
        notes += [f"{c.name}: {failure}" for failure in c.failures]
    out = [format_table(lines, left=2), ""]
    out.append(f"enqueue/s and jobs/s: median (min-max) of {args.rounds} interleaved round(s), "
               f"{args.jobs} jobs each; vs sa-core = burn-down median / sa-core's (full jobs).")
    out.append("pick-up: enqueue commit -> task start, p50/p99 over all n samples of all rounds;")
    out.append("  sa-core (full): task start is not visible outside `sa-core run-worker`, so its figure")
    out.append("  runs to the job's `running` event (clock_timestamp() in the claim), a bit early.")
    out += [f"  {c.name}: enqueue commit -> `running` event p50 {percentile(c.claim_ms, 50):.1f} ms, "
            f"p99 {percentile(c.claim_ms, 99):.1f} ms" for c in rows if c.claim_ms]
    out += _ratios(rows)
    out += [f"! {note}" for note in notes]
    return "\n".join(out)


def _ratios(rows: list[Contender]) -> list[str]:
    """The ratios issue 28 sets targets on, from this run's medians."""
    by_name = {c.name: c for c in rows}
    pairs = [(f"{a} burn-down / {b} burn-down", a, b, "jobs_per_s")
             for a in ("sa-core", "sa-core-2p") for b in ("oban", "pgqueuer")]
    pairs += [(f"sa-core-post POST/s / {b} enqueue/s", "sa-core-post", b, "enqueue_per_s")
              for b in ("pgqueuer", "oban")]
    out = []
    for label, a, b, column in pairs:
        if a in by_name and b in by_name:
            ratio = _ratio(getattr(by_name[a], column), getattr(by_name[b], column))
            if ratio != "-":
                out.append(f"ratio: {label} = {ratio[:-1]}")
    return out


def prepare(rows: list[Contender], reinstall: bool) -> None:
    """Installs (or finds cached) each venv once; a contender whose venv fails gets its error."""
    venv_errors: dict[str, str] = {}
    for venv in dict.fromkeys(c.venv for c in rows if c.venv is not None):
        try:
            ensure_venv(venv, reinstall)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            venv_errors[venv.name] = f"not installed: {exc}"
    for c in rows:
        if c.venv is None:
            c.versions = {"sa-core": version("sa-core"), "python": sys.version.split()[0]}
        elif c.venv.name in venv_errors:
            c.error = venv_errors[c.venv.name]
        else:
            try:
                c.versions = installed_versions(c.venv)
            except (subprocess.SubprocessError, OSError, ValueError) as exc:
                c.error = f"cannot read versions: {exc}"


def run_rounds(rows: list[Contender], args: argparse.Namespace) -> list[dict[str, Any]]:
    """for each round: for each contender: burn-down then pick-up; progress on stderr."""
    raw: list[dict[str, Any]] = []
    started = time.monotonic()
    for round_no in range(1, args.rounds + 1):
        for c in rows:
            if c.error:
                continue
            for mode, count in c.modes(args):
                prefix = (f"[{time.monotonic() - started:6.0f}s load {os.getloadavg()[0]:.1f}] "
                          f"round {round_no} {c.name} {mode}:")
                print(prefix, "...", file=sys.stderr, flush=True)
                try:
                    result = run_once(c, mode, count, args)
                except (RuntimeError, OSError, subprocess.SubprocessError, psycopg.Error) as exc:
                    c.failures.append(f"round {round_no} {mode}: {exc}")
                    print(prefix, f"FAILED {exc}", file=sys.stderr, flush=True)
                    continue
                raw.append({"round": round_no, "contender": c.name, **result})
                if mode == "post":
                    c.enqueue_per_s.append(result["enqueue_per_s"])
                    summary = (f"{result['enqueue_per_s']:,.0f} POST/s, p99 "
                               f"{result['post_p99_ms']:.1f} ms")
                elif mode == "burndown":
                    c.enqueue_per_s.append(result["enqueue_per_s"])
                    c.jobs_per_s.append(result["jobs_per_s"])
                    summary = (f"{result['enqueue_per_s']:,.0f} enqueues/s, "
                               f"{result['jobs_per_s']:,.0f} jobs/s")
                else:
                    c.pickup_ms += result["pickup_ms"]
                    c.claim_ms += result.get("claim_ms", [])
                    samples = result["pickup_ms"] or [float("nan")]
                    summary = (f"pick-up p50 {percentile(samples, 50):.1f} ms over "
                               f"{len(result['pickup_ms'])}")
                print(prefix, summary, file=sys.stderr, flush=True)
    for c in rows:
        if c.failures and not c.error and not c.jobs_per_s and not c.pickup_ms:
            c.error = c.failures[0]
    return raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pickups", type=int, default=200)
    parser.add_argument("--pickup-budget", type=float, default=60.0,
                        help="seconds of pick-up sampling per run at most (a polling worker is slow)")
    # NOTE: oban's pool holds concurrency + 5 connections, so this stays well under the server's
    # max_connections (sa-core's own default, 512, is for calls that wait on a provider).
    parser.add_argument("--concurrency", type=int, default=32,
                        help="jobs at once in the one worker process of every contender")
    parser.add_argument("--post-seconds", type=int, default=5,
                        help="sa-core-post: seconds of POST /prompt after a 1 s warm-up")
    parser.add_argument("--only", default=",".join(c.name for c in contenders()))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per child run")
    parser.add_argument("--reinstall", action="store_true", help="rebuild the cached venvs")
    parser.add_argument("--json", type=Path, default=None, help="also write raw results here")
    args = parser.parse_args()
    # NOTE: sa-core's migrate logs each migration through structlog on stdout; keep the table clean.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    known = {c.name: c for c in contenders()}
    wanted = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in known]
    if unknown:
        parser.error(f"unknown contender(s) {unknown}; known: {', '.join(known)}")
    rows = [known[name] for name in wanted]
    prepare(rows, args.reinstall)

    header = machine_header(admin_conninfo("SA_BENCH_DATABASE_URL"))
    header += [f"{c.name}: " + ", ".join(f"{k} {v}" for k, v in c.versions.items()
                                         if not c.shows or k in c.shows or k == "python")
               for c in rows if c.versions]
    header.append(f"one worker process per contender, concurrency {args.concurrency}; "
                  f"{args.jobs} jobs, {args.rounds} round(s), {args.pickups} pick-ups "
                  f"(at most {args.pickup_budget:.0f}s) per run")
    print("\n".join(header) + "\n", flush=True)

    raw = run_rounds(rows, args)
    print(table(rows, args))
    if args.json is not None:
        args.json.write_text(json.dumps({"header": header, "args": vars(args) | {"json": str(args.json)},
                                         "runs": raw}, indent=1))


if __name__ == "__main__":
    main()
