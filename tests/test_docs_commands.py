"""Every command in README.md, docs/*.md and ops/README.md runs as a reader would paste it, against
the service the README's first command starts (`make run`).

How to write a fenced block in those files (the info string after the opening backticks):

- ``sh``: commands a reader pastes in the terminal where they pasted `make run`'s export line.
  One bash runs the document's ``sh`` and ``python`` blocks in order (`set -euo pipefail`: every
  command must succeed; write one that is meant to fail as `... || echo "exit code $?"`), with
  that line's environment (SA_API_URL, SA_API_TOKEN, DATABASE_URL, SA_WORKER_METRICS_URL, PATH
  with the venv's bin). README.md runs from the repository's root, every other file from an
  empty temporary directory. Shell variables carry over between the blocks of one document, never
  between documents; nothing may rely on another document having run.
- ``python``: a program, run in that same sequence with the `python3` of that PATH (the venv's).
- ``sh-long``: commands too long for a test or that change the machine (a server in the
  foreground, benchmarks, installs). Each line is checked, not run: `make TARGET` with
  `make -n TARGET`; `sa-core SUB ...`, any other program of the venv's bin (gunicorn) and
  `PYTHON -m MODULE ...` with their `--help`, which must list every `--flag` the line uses;
  `export` and `cd` as they are; any other program only if ELSEWHERE names where it is
  exercised. Say in the text what runs them for real, if anything does.
- ``text`` (and ``json``, ``ini``, ``sql``): output, shapes and file contents; never run.

A block with any other info string, or none, fails this test. The service is `make run PORT=N`
with DATABASE_URL set to a throwaway database and SA_BACKOFF_BASE=0.5, so that a retry the docs
show waits about a second instead of up to ten; nothing else differs from a reader's.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers import wait_for
from tests.hosts import free_port

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "ops" / "README.md"]
RUN = {"sh", "python"}
NEVER_RUN = {"text", "json", "ini", "sql"}
ELSEWHERE = {
    "pip": "tests/test_deployable.py installs the wheel into a fresh venv (with uv pip)",
    "psql": "tests/test_ops_sql.py runs every script of jobqueue/sql/ops/ with psql",
}
"""Programs an ``sh-long`` line may start with besides make, the venv's and `python -m`: where
each is exercised instead."""
BUILTINS = {"export", "cd"}

_FENCE = re.compile(r"^```(\S*)")


@dataclass(frozen=True)
class Block:
    info: str
    code: str
    line: int


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the line each starts on."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        found.append(Block(opening.group(1), "\n".join(lines[i + 1:end]), i + 1))
        i = end + 1
    return found


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_every_block_says_how_it_is_run(path: Path) -> None:
    unknown = [(b.line, b.info) for b in blocks(path) if b.info not in RUN | NEVER_RUN | {"sh-long"}]
    assert not unknown, f"{_name(path)}: blocks of no known kind (see this docstring): {unknown}"


def _commands(code: str) -> list[list[str]]:
    """The simple commands of a block: lines joined at backslashes, split at `&&`, `;` and `|`."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands: list[list[str]] = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, ";"]:
            if word in ("&&", "||", ";", "|", "&"):
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


@functools.cache
def _help(argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    # NOTE: cached: a document shows several command lines of one benchmark.
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def _checker(command: list[str]) -> tuple[str, ...] | None:
    """The command that checks an ``sh-long`` line without running it: `make -n`, or a --help;
    None for a program of ELSEWHERE (or one this test cannot check)."""
    program, *rest = command
    base = Path(program).name
    if base == "make":
        return ("make", "-n", *(word for word in rest if "=" not in word and not word.startswith("-")))
    if base == "sa-core":
        return (str(Path(sys.executable).parent / "sa-core"),
                *[word for word in rest if not word.startswith("-")][:1], "--help")
    if re.fullmatch(r"python[\d.]*", base) and rest[:1] == ["-m"] and len(rest) > 1:
        return (sys.executable, "-m", rest[1], "--help")
    if (Path(sys.executable).parent / base).is_file():
        return (str(Path(sys.executable).parent / base), "--help")
    return None


def _check_long(command: list[str]) -> str | None:
    """Why `command` (an ``sh-long`` line) would not work as written, or None."""
    checker = _checker(command)
    if checker is None:
        return None if Path(command[0]).name in {*ELSEWHERE, *BUILTINS} else \
            f"{command[0]}: not make, sa-core, the venv's or `python -m`, and not in ELSEWHERE"
    done = _help(checker)
    if done.returncode != 0:
        return f"{' '.join(checker)} exited {done.returncode}: {done.stderr.strip()[-300:]}"
    flags = [word.split("=", 1)[0] for word in command[1:] if word.startswith("--")]
    missing = [flag for flag in flags if checker[1] != "-n" and flag not in done.stdout]
    return f"{' '.join(checker)} does not list {missing}" if missing else None


@pytest.mark.parametrize("path", [p for p in DOCUMENTS if any(b.info == "sh-long" for b in blocks(p))],
                         ids=_name)
def test_the_long_commands_exist_as_written(path: Path) -> None:
    commands = [(b.line, command) for b in blocks(path) if b.info == "sh-long"
                for command in _commands(b.code)]
    # NOTE: the checks (a --help imports the whole program) run side by side, then are read.
    with ThreadPoolExecutor(4) as checks:
        list(checks.map(_help, {c for _, command in commands if (c := _checker(command))}))
    problems = [f"line {line}: {problem}" for line, command in commands
                if (problem := _check_long(command))]
    assert not problems, f"{_name(path)}: {problems}"


def test_the_readme_opens_with_the_two_commands() -> None:
    first = blocks(REPO / "README.md")[0]
    assert [command[:2] for command in _commands(first.code)] == [["make", "run"], ["make", "test"]]
    assert (REPO / "README.md").read_text().split("```")[0].strip() == "# sa-core"
    assert len((REPO / "README.md").read_bytes()) <= 12 * 1024


class Service:
    """`make run PORT=N` in its own process group, its output kept."""

    def __init__(self, port: int, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.child = subprocess.Popen(["make", "run", f"PORT={port}"], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      process_group=0)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self.lines.append(line.rstrip("\n"))

    def exports(self) -> str | None:
        return next((line for line in list(self.lines) if line.startswith("export ")), None)

    def stop(self) -> None:
        """Ctrl-C, as a terminal sends it to the foreground group."""
        if self.child.poll() is None:
            os.killpg(self.child.pid, signal.SIGINT)
        self.child.wait(timeout=60)
        self._reader.join(timeout=10)


@pytest.fixture(scope="module")
def pasted(database_url: str) -> Iterator[dict[str, str]]:
    """The environment of a terminal in which `make run`'s export line was pasted."""
    name = f"sa_docs_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    reader = {key: value for key, value in os.environ.items()
              if not key.startswith("SA_") and key not in ("DATABASE_URL", "LOG_LEVEL", "PORT")}
    service = Service(free_port(), {**reader, "DATABASE_URL": make_conninfo(database_url, dbname=name),
                                    "SA_BACKOFF_BASE": "0.5"})
    try:
        exports = wait_for(service.exports, timeout=120, interval=0.2)
        done = subprocess.run(["bash", "-c", f"{exports}\nenv -0"], env=reader, capture_output=True,
                              check=True)
        yield dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    finally:
        service.stop()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _script(path: Path) -> str:
    """The document's runnable blocks as one bash script that names the block a failure is in."""
    parts = ["set -euo pipefail",
             "trap 'echo \"FAILED in the block at line $SA_DOC_BLOCK: $BASH_COMMAND\" >&2' ERR"]
    for block in blocks(path):
        if block.info == "sh":
            parts += [f"SA_DOC_BLOCK={block.line}", block.code]
        elif block.info == "python":
            parts += [f"SA_DOC_BLOCK={block.line}", "python3 - <<'SA_DOC_PYTHON'", block.code,
                      "SA_DOC_PYTHON"]
    return "\n".join(parts) + "\n"


# NOTE: on one xdist worker (make test's --dist loadgroup), so the module-scoped stack the pasted
# commands talk to starts once.
@pytest.mark.xdist_group("docs_commands")
@pytest.mark.parametrize("path", [p for p in DOCUMENTS if any(b.info in RUN for b in blocks(p))],
                         ids=_name)
def test_the_commands_run_as_pasted(path: Path, pasted: dict[str, str], tmp_path: Path) -> None:
    cwd = REPO if path == REPO / "README.md" else tmp_path
    done = subprocess.run(["bash", "-c", _script(path)], cwd=cwd, env=pasted, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{_name(path)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
