"""A multi-host harness on one machine: hosts in Linux network namespaces, a Postgres and a PgBouncer.

Each "host" is a network namespace with its own loopback and one veth link to a bridge of its
own run; the bridge carries an address in the root namespace, where this run's Postgres cluster
(initdb into a temporary directory, Debian's binaries under /usr/lib/postgresql/*/bin) and its
PgBouncer (transaction mode) listen. Hosts have no default route and forwarding is never turned
on, so their only traffic is their loopback and the bridge. Cutting a host's link
(`ip link set ... down` on the bridge side) is a network cut: its TCP connections stay open,
unanswered, as with a pulled cable.

Needs root (namespaces, links, addresses) and the `ip`, `initdb` and `pgbouncer` commands; Postgres
and PgBouncer refuse to run as root, so they run as the `postgres` system user (as the current
user when not root: `Bouncer` alone works unprivileged, for a pooler in front of any server).
`unavailable()` says what is missing to have the namespaces and what provides it, for a skip.

Cleanup: `Hosts` is a context manager that stops every process it started (each in its own
process group), deletes its namespaces, links and bridge, stops its Postgres and removes its
temporary directory, when the block ends whatever the reason (a failed assertion, Ctrl-C, and
SIGTERM, which it turns into an exception while it runs). Every name carries the run's process
id (`sah<pid>...`, `/tmp/sa-hosts-<pid>-*`), so parallel runs never collide, and a run reaps what
a dead run (SIGKILL) left behind before it starts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from tests.helpers import free_port

__all__ = ["COUNTS", "Bouncer", "Cluster", "Host", "Hosts", "Process", "conninfo_host_port",
           "procfile_command", "reap_stale", "unavailable"]

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
PREFIX = "sah"
TMP_PREFIX = "sa-hosts-"
SERVICE_USER = "postgres"
PROVIDER_PORT = 9100
"""Each host's provider listens on its own loopback, so every host uses the same port."""


def procfile_command(role: str) -> str:
    """The Procfile's command line for `role` (`web`, `worker`), so the harness runs what ships."""
    for line in (REPO / "Procfile").read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() == role:
            return command.strip()
    raise LookupError(f"the Procfile has no {role!r} line")


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def _as_service_user(args: Sequence[str]) -> list[str]:
    """`args` run as the `postgres` user when we are root (initdb, postgres and pgbouncer refuse root).

    NOTE: setpriv execs the command; runuser stays its parent and, told to stop, waits 2 s
    before it exits however soon the command did (2 s of every PgBouncer stop).
    """
    if os.geteuid() != 0:
        return list(args)
    return ["setpriv", f"--reuid={SERVICE_USER}", f"--regid={SERVICE_USER}", "--init-groups", *args]


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else None


_PACKAGES = {"ip": "iproute2", "pgbouncer": "pgbouncer", "setpriv": "util-linux"}
"""The Debian package of each command the harness runs."""


def unavailable() -> tuple[str, str] | None:
    """What this machine lacks to run the multi-host harness and what provides it, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root", "run the tests as root (.ci/run does in CI)"
    for tool, package in _PACKAGES.items():
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed", f"apt-get install {package}"
    if _postgres_bin() is None:
        return "no Postgres server binaries under /usr/lib/postgresql/*/bin", "apt-get install postgresql"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return (f"cannot create a network namespace: {made.stderr.strip()}",
                "run as root where the kernel allows network namespaces")
    _run("ip", "netns", "del", probe, check=False)
    return None


class Process:
    """A child in its own process group, output to a log file; stopped with the whole group."""

    def __init__(self, args: Sequence[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.popen = subprocess.Popen(list(args), cwd=REPO, env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the group, SIGKILL past `timeout`."""
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(10)
        # NOTE: a group's stragglers (gunicorn's workers) must not outlive their namespace.
        self.signal(signal.SIGKILL)

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


def _wait_port(host: str, port: int, timeout: float, process: Process | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.popen.poll() is not None:
            raise RuntimeError(f"{process.log.name} exited: {process.lines()[-5:]}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout}s")


class Cluster:
    """This run's own Postgres: initdb'd into `root`, listening on `address:port` only."""

    def __init__(self, root: Path, address: str, port: int) -> None:
        bindir = _postgres_bin()
        if bindir is None:
            raise RuntimeError("no Postgres server binaries under /usr/lib/postgresql/*/bin")
        self.bindir = bindir
        self.data = root / "pgdata"
        self.log = root / "postgres.log"
        self.address, self.port = address, port
        self.data.mkdir()
        _chown(root)
        _checked(_as_service_user([str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
                                   "-A", "trust", "--no-sync", "-E", "UTF8"]))
        # NOTE: fsync off: the faults here restart processes, never the machine, so nothing is
        # lost, and commits stop costing a disk flush on a shared machine.
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '{address}'\nport = {port}\n"
                       f"unix_socket_directories = '{root}'\nmax_connections = 300\n"
                       "fsync = off\nshared_buffers = 64MB\n")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\n")
        self.start()

    def url(self, dbname: str = "postgres", **extra: Any) -> str:
        return make_conninfo(host=self.address, port=self.port, user="postgres", dbname=dbname,
                             **extra)

    def _ctl(self, *args: str) -> None:
        _checked(_as_service_user([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                                   str(self.log), "-w", "-t", "60", *args]))

    def start(self) -> None:
        self._ctl("start")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("stop", "-m", mode)

    def restart(self) -> None:
        """Stops (fast: every session is ended, as in a failover or an upgrade) and starts again."""
        self._ctl("restart", "-m", "fast")


class Bouncer:
    """A PgBouncer of its own (config in `root`) in transaction mode in front of one server."""

    def __init__(self, root: Path, listen: str, port: int, server_host: str, server_port: int,
                 users: Sequence[str] = ("postgres",), pool_size: int = 20) -> None:
        self.root, self.listen, self.port = root, listen, port
        self.config = root / "pgbouncer.ini"
        users_file = root / "pgbouncer-users.txt"
        users_file.write_text("".join(f'"{user}" ""\n' for user in users))
        # NOTE: server_login_retry 1 s (default 15): after a Postgres restart the pool comes
        # back as soon as the server does; server_check_delay 0 tests an idle server connection
        # before reuse, so one the restart killed is never handed out.
        self.config.write_text(f"""[databases]
* = host={server_host} port={server_port}
[pgbouncer]
listen_addr = {listen}
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {users_file}
admin_users = postgres
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 2000
server_login_retry = 1
server_check_delay = 0
logfile = {root / 'pgbouncer.log'}
pidfile = {root / 'pgbouncer.pid'}
""")
        _chown(root)
        self.process: Process | None = None
        self.start()

    def url(self, dbname: str, user: str = "postgres") -> str:
        return make_conninfo(host=self.listen, port=self.port, user=user, dbname=dbname)

    def start(self) -> None:
        self.process = Process(_as_service_user(["pgbouncer", str(self.config)]), dict(os.environ),
                               self.root / "pgbouncer.out")
        _wait_port(self.listen, self.port, 20, self.process)

    def stop(self) -> None:
        """SIGTERM: PgBouncer closes every client and server connection at once."""
        if self.process is not None:
            self.process.stop()
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def logins(self) -> int:
        """Client connections accepted so far (PgBouncer logs each login)."""
        log = self.root / "pgbouncer.log"
        return sum("login attempt" in line for line in log.read_text().splitlines()) if log.exists() else 0

    def show(self, what: str) -> list[dict[str, Any]]:
        """Rows of the admin console's `SHOW <what>` (STATS, POOLS, ...)."""
        assert re.fullmatch(r"[A-Z_]+", what), what
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, row_factory=dict_row,
                             prepare_threshold=None) as conn:
            # NOTE: the admin console takes the simple query protocol only.
            cur = conn.cursor()
            cur.execute(f"SHOW {what}", prepare=False)
            return list(cur.fetchall())

    def __enter__(self) -> Bouncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Host:
    """One network namespace on the bridge: `address` on it, `veth` its link's bridge side."""

    name: str
    netns: str
    address: str
    veth: str
    logs: Path
    processes: list[Process] = field(default_factory=list)

    def spawn(self, args: Sequence[str], env: dict[str, str], label: str) -> Process:
        """Runs `args` inside this host (environment `env` added to ours), logging to a file."""
        log = self.logs / f"{self.name}-{label}-{len(self.processes)}.log"
        process = Process(["ip", "netns", "exec", self.netns, *args],
                          {**os.environ, **env}, log)
        self.processes.append(process)
        return process

    def cut(self) -> None:
        """Takes the host's link down: nothing in or out, open connections left hanging."""
        _checked(["ip", "link", "set", self.veth, "down"])

    def restore(self) -> None:
        _checked(["ip", "link", "set", self.veth, "up"])


class Hosts:
    """This run's bridge, hosts, Postgres and PgBouncer; everything removed when the block ends.

    Attributes (inside the block): `address` (the bridge's, where Postgres and PgBouncer
    listen), `cluster`, `bouncer`, `direct_url` / `pooled_url` (database `sa_core`, migrated).
    """

    def __init__(self, pool_size: int = 20, idle_in_transaction: float = 5.0) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.idle_in_transaction = idle_in_transaction
        self.bridge = f"{self.tag}b"
        self.pool_size = pool_size
        self.hosts: list[Host] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Hosts:
        missing = unavailable()
        if missing is not None:
            raise RuntimeError("{} ({})".format(*missing))
        reap_stale()
        try:
            self._setup()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _setup(self) -> None:
        stack = self._stack
        stack.enter_context(_sigterm_raises())
        self.root = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
        stack.callback(shutil.rmtree, self.root, ignore_errors=True)
        self.network = _free_subnet()
        self.address = str(self.network.network_address + 1)
        _checked(["ip", "link", "add", self.bridge, "type", "bridge"])
        stack.callback(_run, "ip", "link", "del", self.bridge, check=False)
        _checked(["ip", "addr", "add", f"{self.address}/{self.network.prefixlen}", "dev", self.bridge])
        _checked(["ip", "link", "set", self.bridge, "up"])
        self.cluster = Cluster(self.root, self.address, free_port())
        stack.callback(_quietly, self.cluster.stop, "immediate")
        with psycopg.connect(self.cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE sa_core")
            # NOTE: the worker's timeouts as ops/README.md's PgBouncer section says: on the role,
            # since PgBouncer refuses them as startup options.
            conn.execute("ALTER ROLE postgres SET statement_timeout = '30s'")
            conn.execute("ALTER ROLE postgres SET lock_timeout = '10s'")
            # NOTE: a host cut inside a transaction (a claim's pipeline before its Sync, a
            # COMMIT never sent) leaves it open, its rows locked and skipped by every other
            # claim, until the server ends the session; the harness uses a short bound to keep
            # tests short.
            conn.execute(sql.SQL("ALTER ROLE postgres SET idle_in_transaction_session_timeout = {}")
                         .format(sql.Literal(f"{self.idle_in_transaction:g}s")))
        self.direct_url = self.cluster.url("sa_core")
        _checked([str(VENV_BIN / "sa-core"), "migrate"], env={"DATABASE_URL": self.direct_url})
        self.bouncer = stack.enter_context(Bouncer(self.root, self.address, free_port(self.address),
                                                   self.address, self.cluster.port,
                                                   pool_size=self.pool_size))
        self.pooled_url = self.bouncer.url("sa_core")

    def add(self, name: str) -> Host:
        """A new host on the bridge, with the next free address."""
        index = len(self.hosts) + 2
        host = Host(name=name, netns=f"{self.tag}-{name}",
                    address=str(self.network.network_address + index), veth=f"{self.tag}v{index}",
                    logs=self.root)
        peer = f"{self.tag}p{index}"
        _checked(["ip", "netns", "add", host.netns])
        self._stack.callback(_delete_netns, host.netns)
        _checked(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer])
        self._stack.callback(_run, "ip", "link", "del", host.veth, check=False)
        _checked(["ip", "link", "set", peer, "netns", host.netns])
        _checked(["ip", "link", "set", host.veth, "master", self.bridge, "up"])
        inside = ["ip", "netns", "exec", host.netns, "ip"]
        _checked([*inside, "link", "set", "lo", "up"])
        _checked([*inside, "link", "set", peer, "name", "eth0"])
        _checked([*inside, "addr", "add", f"{host.address}/{self.network.prefixlen}", "dev", "eth0"])
        _checked([*inside, "link", "set", "eth0", "up"])
        self._stack.callback(_stop_all, host)
        self.hosts.append(host)
        return host

    def service_env(self, *, listen: bool = True) -> dict[str, str]:
        """Settings for a web or worker host: the pooler for queries, Postgres for sessions."""
        return {
            "DATABASE_URL": self.pooled_url,
            "SA_DIRECT_DATABASE_URL": self.direct_url,
            "SA_LISTEN": "1" if listen else "0",
            "SA_STATEMENT_TIMEOUT": "0",
            "SA_LOCK_TIMEOUT": "0",
        }

    def start_worker(self, host: Host, latency: float, *, concurrency: int = 4, listen: bool = True,
                     env: dict[str, str] | None = None) -> Process:
        """bench/slow_provider.py answering after `latency` s on `host`'s loopback, then the
        Procfile's worker on `host` calling it, through the pooler (`service_env`)."""
        provider = host.spawn([str(VENV_BIN / "python"), "-m", "bench.slow_provider",
                               "--port", str(PROVIDER_PORT), "--latency", str(latency)], {},
                              "provider")
        deadline = time.monotonic() + 30
        while not any("listening on" in line for line in provider.lines()):
            if provider.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the provider on {host.name} did not start: {provider.lines()}")
            time.sleep(0.05)
        return host.spawn(["sh", "-c", f"exec {procfile_command('worker')} --concurrency {concurrency}"],
                          {**self.service_env(listen=listen), **(env or {}),
                           "PATH": f"{VENV_BIN}:/usr/bin:/bin",
                           "SA_PROVIDER_URL": f"http://127.0.0.1:{PROVIDER_PORT}/v1",
                           "SA_PROVIDER_MODEL": "bench-model", "SA_PROVIDER_API_KEY": "k"},
                          "worker")

    def counts(self) -> dict[str, int]:
        """Prompts, jobs by outcome and the anomalies (lost, stuck, duplicated), read directly."""
        return {k: int(v) for k, v in self.sql(COUNTS)[0].items()}

    def sql(self, statement: str, params: Sequence[Any] | dict[str, Any] | None = None,
            ) -> list[dict[str, Any]]:
        """Runs one statement on the direct connection (for the tests' counts)."""
        with psycopg.connect(self.direct_url, autocommit=True, row_factory=dict_row,
                             connect_timeout=10) as conn:
            cur = conn.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []


COUNTS = """
SELECT (SELECT count(*) FROM sa_entity WHERE kind = 'prompt') AS prompts,
       (SELECT count(*) FROM sa_job WHERE state = 'succeeded') AS succeeded,
       (SELECT count(*) FROM sa_job WHERE state NOT IN ('queued', 'running', 'succeeded'))
           AS ended_otherwise,
       (SELECT count(*) FROM sa_entity p WHERE p.kind = 'prompt'
           AND NOT EXISTS (SELECT 1 FROM sa_job j WHERE j.prompt_id = p.id)) AS lost,
       (SELECT count(*) FROM sa_job WHERE state IN ('queued', 'running')) AS stuck,
       (SELECT count(*) FROM (SELECT prompt_id FROM sa_job GROUP BY prompt_id
                              HAVING count(*) > 1) d) AS duplicated_jobs,
       (SELECT count(*) FROM (SELECT parent_id FROM sa_entity WHERE kind = 'response'
                              GROUP BY parent_id HAVING count(*) > 1) d) AS duplicated_responses,
       (SELECT count(*) FROM sa_job j WHERE j.state = 'succeeded' AND (
            SELECT count(*) FROM sa_ledger l WHERE l.job_id = j.id AND l.outcome = 'succeeded')
            <> 1) AS ledger_mismatches,
       (SELECT count(*) FROM sa_job WHERE attempt > 1) AS retried
"""
"""Exact outcome counts: 0 lost, 0 stuck and 0 duplicated is what every fault must end with."""


def _checked(args: Sequence[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, cwd=REPO,
                          env=None if env is None else {**os.environ, **env})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-2000:]}")


def _quietly(action: Any, *args: Any) -> None:
    """Runs a cleanup step whose failure must not stop the next ones (a server already down)."""
    with contextlib.suppress(Exception):
        action(*args)


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        _checked(["chown", "-R", SERVICE_USER, str(path)])


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200-250.x.x that no address of this machine is in (other runs' bridges too)."""
    used = re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", _run("ip", "-4", "addr").stdout)
    seed = os.getpid()
    for step in range(51 * 256):
        n = (seed + step * 7919) % (51 * 256)
        net = ipaddress.IPv4Network(f"10.{200 + n // 256}.{n % 256}.0/24")
        if not any(ipaddress.IPv4Address(a) in net for a in used):
            return net
    raise RuntimeError("no free /24 in 10.200.0.0 - 10.250.255.0")


def _delete_netns(netns: str) -> None:
    for pid in _run("ip", "netns", "pids", netns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _run("ip", "netns", "del", netns, check=False)


def _stop_all(host: Host) -> None:
    _quietly(host.restore)
    for process in host.processes:
        _quietly(process.stop)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale() -> None:
    """Removes what runs that died without cleaning up (SIGKILL) left: namespaces, links, clusters."""
    pattern = re.compile(rf"^{PREFIX}(\d+)")
    for netns in _run("ip", "netns", "list", check=False).stdout.split("\n"):
        name = netns.split(" ")[0]
        match = pattern.match(name)
        if match and not _alive(int(match.group(1))):
            _delete_netns(name)
    for link in re.findall(r"^\d+: ([^:@]+)", _run("ip", "-o", "link").stdout, re.M):
        match = pattern.match(link)
        if match and not _alive(int(match.group(1))):
            _run("ip", "link", "del", link, check=False)
    for root in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        match = re.match(rf"{TMP_PREFIX}(\d+)-", root.name)
        if not match or _alive(int(match.group(1))):
            continue
        for pidfile, program in ((root / "pgdata" / "postmaster.pid", b"postgres"),
                                 (root / "pgbouncer.pid", b"pgbouncer")):
            with contextlib.suppress(OSError, ValueError, IndexError, ProcessLookupError):
                pid = int(pidfile.read_text().split()[0])
                # NOTE: only if that process still is the dead run's server (pids are reused).
                if program in Path(f"/proc/{pid}/cmdline").read_bytes() and \
                        str(root).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the harness runs, SIGTERM raises SystemExit, so the cleanup runs as on Ctrl-C."""
    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def conninfo_host_port(conninfo: str) -> tuple[str, int]:
    """The server address of a conninfo (a folder for a Unix socket), port 5432 by default."""
    parts = conninfo_to_dict(conninfo)
    return str(parts.get("host") or "/var/run/postgresql"), int(parts.get("port") or 5432)
