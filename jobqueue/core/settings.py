"""Configuration read once from the environment, so every duration the spec names can shrink in tests."""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from jobqueue.core.budget import Budgets
from jobqueue.core.routes import Route, RouteError, Routes, default_routes, load_routes

__all__ = ["DEFAULT_CHAIN_MAX_DEPTH", "DEFAULT_MAX_RESPONSE_BYTES", "DEFAULT_NOTIFY_INTERVAL",
           "DEFAULT_PRIORITY_AGING", "KEY_TTL_SECONDS", "POOLERS", "DatabaseUrlMissing", "Settings",
           "SettingsError", "metrics_port", "notify_interval"]

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
"""A chat completion is kilobytes; megabytes mean a misbehaving server (SA_PROVIDER_MAX_RESPONSE_BYTES)."""

KEY_TTL_SECONDS = 24 * 3600
"""How long an Idempotency-Key stays bound to its request; an older key is treated as absent.

NOTE: here, not in the engine, because retention settings are checked against it.
"""


class SettingsError(ValueError):
    """An environment variable holds a value the service cannot use."""


class DatabaseUrlMissing(SettingsError):
    """DATABASE_URL is not set; the CLI adds what to do in the situation at hand (`sa-core dev`
    running or not)."""


POOLERS = ("none", "session", "transaction")
"""The values of SA_DATABASE_POOLER: what DATABASE_URL goes through on its way to Postgres."""

DEFAULT_CHAIN_MAX_DEPTH = 1000
"""Most predecessors a job may have before it in its chain (SA_CHAIN_MAX_DEPTH): a chain costs
one index probe per link when its first job ends, and a link that long is a runaway loop more
often than a plan."""

DEFAULT_PRIORITY_AGING = 300.0
"""Seconds after which a due job at the head of its org's queue ranks before every priority
(SA_PRIORITY_AGING)."""


def _float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not value > minimum:
        raise SettingsError(f"{name} must be greater than {minimum}, got {raw!r}")
    return value


def _fraction(env: Mapping[str, str], name: str, default: float) -> float:
    """A share in (0, 1]."""
    raw = env.get(name) or str(default)
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a fraction in (0, 1], got {raw!r}") from None
    if not 0 < value <= 1:
        raise SettingsError(f"{name} must be a fraction in (0, 1], got {raw!r}")
    return value


def _usd(env: Mapping[str, str], name: str) -> float:
    """An amount of US dollars, 0 (the default) for none."""
    raw = env.get(name) or "0"
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an amount of USD (0: none), got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise SettingsError(f"{name} must be an amount of USD >= 0 (0: none), got {raw!r}")
    return value


def _seconds_or_off(env: Mapping[str, str], name: str, default: float, *,
                    at_least: float = 0.0) -> float:
    """A duration in seconds where 0 turns the feature off; otherwise at least `at_least`."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number of seconds (0: off), got {raw!r}") from None
    if not math.isfinite(value) or value < 0 or 0 < value < at_least:
        raise SettingsError(f"{name} must be 0 (off) or at least {at_least:g} seconds, got {raw!r}"
                            if at_least else f"{name} must be 0 (off) or a positive number of "
                            f"seconds, got {raw!r}")
    return value


def _int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name} must be at least {minimum}, got {raw!r}")
    return value


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """`1` or `0`; unset or empty means `default`."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw not in ("0", "1"):
        raise SettingsError(f"{name} must be 1 (on) or 0 (off), got {raw!r}")
    return raw == "1"


def _port(env: Mapping[str, str], name: str) -> int:
    """A TCP port, or 0 (the default) for none."""
    value = _int(env, name, 0, minimum=0)
    if value > 65535:
        raise SettingsError(f"{name} must be a TCP port (1..65535) or 0 for none, got {value}")
    return value


def _conninfo(name: str, value: str) -> str:
    """`value` when libpq can parse it; the error never repeats it (it may hold a password)."""
    try:
        conninfo_to_dict(value)
    except psycopg.ProgrammingError:
        raise SettingsError(f"{name} is malformed: neither a postgresql:// URI nor key=value pairs "
                            "(value not shown: it may hold a password)") from None
    return value


def _pooler(env: Mapping[str, str], database_url: str, direct_database_url: str) -> str:
    """SA_DATABASE_POOLER; unset, a direct URL other than DATABASE_URL declares a transaction pooler
    (the deployment ops/README.md describes), else none."""
    raw = env.get("SA_DATABASE_POOLER", "").strip().lower()
    if not raw:
        return "transaction" if direct_database_url != database_url else "none"
    if raw not in POOLERS:
        raise SettingsError(f"SA_DATABASE_POOLER must be one of {', '.join(POOLERS)}, got {raw!r}")
    return raw


def _origins(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Parses a comma-separated list of browser origins (`scheme://host[:port]`), or `*`."""
    origins = tuple(part.strip() for part in env.get(name, "").split(",") if part.strip())
    for origin in origins:
        if origin == "*":
            if len(origins) > 1:
                raise SettingsError(f"{name}: '*' allows every origin and cannot be combined")
            continue
        scheme, sep, rest = origin.partition("://")
        # NOTE: a browser sends the Origin without path or trailing slash; an entry with one
        # would never match, so it is refused here rather than ignored at request time.
        if scheme not in ("http", "https") or not sep or not rest or "/" in rest:
            raise SettingsError(f"{name}: {origin!r} is not an origin like https://app.example.com")
    return origins


def _addresses(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Parses a comma-separated list of IP addresses (IPv4 or IPv6 literals, no host names)."""
    addresses = tuple(part.strip() for part in env.get(name, "").split(",") if part.strip())
    for address in addresses:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise SettingsError(f"{name}: {address!r} is not an IP address like 127.0.0.2") from None
    if len(set(addresses)) < len(addresses):
        raise SettingsError(f"{name}: an address is listed twice")
    return addresses


DEFAULT_NOTIFY_INTERVAL = 0.01
"""Seconds over which a process coalesces its wake-up notifications (see jobqueue/core/wakeup.py)."""


def notify_interval(env: Mapping[str, str] | None = None) -> float:
    """Reads `SA_NOTIFY_INTERVAL` (seconds; 0 sends every wake-up as soon as the last one is out).

    Read on its own, not through `Settings`: the process-wide wake-up sender is created where a
    transition is committed, which holds a pool, not the settings.
    """
    return _float(os.environ if env is None else env, "SA_NOTIFY_INTERVAL",
                  DEFAULT_NOTIFY_INTERVAL, minimum=-1.0)


def metrics_port(env: Mapping[str, str] | None = None) -> int:
    """Reads `SA_METRICS_PORT` (0: none); on its own for `sa-core dev`, which runs without
    DATABASE_URL and hands its worker this port.

    Raises:
        SettingsError: not a TCP port.
    """
    return _port(os.environ if env is None else env, "SA_METRICS_PORT")


def _bounded(value: float, name: str, high: float) -> float:
    if value > high:
        raise SettingsError(f"{name} must be at most {high:g}, got {value:g}")
    return value


def _openai_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The OpenAI-compatible front door's and the Batch API's settings (docs/openai.md)."""
    file_max_bytes = _int(env, "SA_FILE_MAX_BYTES", 200 * 1024 * 1024)
    org_max_file_bytes = _int(env, "SA_ORG_MAX_FILE_BYTES", 10 * 1024**3)
    if org_max_file_bytes < file_max_bytes:
        raise SettingsError("SA_ORG_MAX_FILE_BYTES must be at least SA_FILE_MAX_BYTES")
    batch_priority = _int(env, "SA_BATCH_PRIORITY", 80, minimum=60)
    return {
        # NOTE: the chat route holds a request as POST /prompt's `Prefer: wait` does, 60 s at most.
        "openai_max_wait": _bounded(_float(env, "SA_OPENAI_MAX_WAIT", 60.0), "SA_OPENAI_MAX_WAIT",
                                    60.0),
        "openai_stream_max": _float(env, "SA_OPENAI_STREAM_MAX", 600.0),
        "openai_max_waiting": _int(env, "SA_OPENAI_MAX_WAITING", 500),
        "openai_max_waiting_per_token": _int(env, "SA_OPENAI_MAX_WAITING_PER_TOKEN", 50),
        "file_max_bytes": file_max_bytes,
        "file_max_requests": _int(env, "SA_FILE_MAX_REQUESTS", 50_000),
        "file_upload_timeout": _float(env, "SA_FILE_UPLOAD_TIMEOUT", 600.0),
        "file_max_uploads": _int(env, "SA_FILE_MAX_UPLOADS", 8),
        "file_ttl": _float(env, "SA_FILE_TTL", 30 * 86400.0),
        "org_max_file_bytes": org_max_file_bytes,
        "org_max_active_batches": _int(env, "SA_ORG_MAX_ACTIVE_BATCHES", 20),
        # NOTE: OpenAI takes only "24h" on the wire; this is how long "24h" lasts here, so a
        # test (or an operator) can shorten a batch's window.
        "batch_window": _float(env, "SA_BATCH_WINDOW", 86400.0),
        "batch_priority": int(_bounded(batch_priority, "SA_BATCH_PRIORITY", 90)),
        "batch_max_queued": _int(env, "SA_BATCH_MAX_QUEUED", 1000),
        "batch_interval": _float(env, "SA_BATCH_INTERVAL", 1.0),
        "batch_retention": _seconds_or_off(env, "SA_BATCH_RETENTION", 30 * 86400.0),
    }


@dataclass(frozen=True)
class Settings:
    """Every knob of the interface contract (docs/architecture.md), in seconds where it is a duration."""

    database_url: str
    direct_database_url: str
    provider_url: str
    provider_api_key: str
    provider_model: str
    provider_timeout: float = 180.0
    provider_connect_timeout: float = 10.0
    provider_read_timeout: float = 0.0
    provider_max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    provider_routes: tuple[Route, ...] = ()
    provider_source_addresses: tuple[str, ...] = ()
    heartbeat_interval: float = 30.0
    cancel_check_interval: float = 0.5
    stale_after: float = 300.0
    stuck_after: float = 900.0
    poll_interval: float = 2.0
    reclaim_interval: float = 60.0
    backoff_base: float = 5.0
    backoff_cap: float = 3600.0
    rate_limit_min_wait: float = 60.0
    throttle_max_wait: float = 3600.0
    fallback_after: float = 10.0
    org_budget_daily: float = 0.0
    org_budget_monthly: float = 0.0
    route_limit_window: float = 60.0
    token_reservations: bool = True
    ratelimit_headers: bool = True
    fair_by_tokens: bool = False
    stream_interval: float = 0.075
    shutdown_grace: float = 30.0
    listen: bool = True
    max_prompt_chars: int = 100_000
    pool_max_size: int = 10
    max_body_bytes: int = 1_048_576
    org_max_queued: int = 0
    chain_max_depth: int = DEFAULT_CHAIN_MAX_DEPTH
    cors_origins: tuple[str, ...] = ()
    org_max_running: int = 0
    priority_aging: float = DEFAULT_PRIORITY_AGING
    metrics_port: int = 0
    statement_timeout: float = 30.0
    lock_timeout: float = 10.0
    retention_interval: float = 3600.0
    archive_after: float = 30 * 86400.0
    idempotency_key_retention: float = 86400.0
    sse_max_streams: int = 500
    sse_max_streams_per_token: int = 10
    sse_keepalive: float = 15.0
    sse_token_check: float = 5.0
    sse_replay_limit: int = 1000
    body_timeout: float = 10.0
    token_cache_ttl: float = 2.0
    pooler: str = "none"
    prepared_statements: bool = True
    leader_keepalive_idle: int = 20
    leader_keepalive_interval: int = 10
    leader_keepalive_count: int = 3
    openai_max_wait: float = 60.0
    openai_stream_max: float = 600.0
    openai_max_waiting: int = 500
    openai_max_waiting_per_token: int = 50
    file_max_bytes: int = 200 * 1024 * 1024
    file_max_requests: int = 50_000
    file_upload_timeout: float = 600.0
    file_max_uploads: int = 8
    file_ttl: float = 30 * 86400.0
    org_max_file_bytes: int = 10 * 1024**3
    org_max_active_batches: int = 20
    batch_window: float = 86400.0
    batch_priority: int = 80
    batch_max_queued: int = 1000
    batch_interval: float = 1.0
    batch_retention: float = 30 * 86400.0
    wait_max: int = 250
    wait_max_per_token: int = 10
    feed_text_max_chars: int = 16_384
    page_max_bytes: int = 1_048_576
    sessions_per_token: int = 20
    token_read_share: float = 0.25
    token_read_queue: int = 100
    token_read_wait: float = 10.0
    batch_max_bytes: int = 4 * 1_048_576
    ops_bulk_batch: int = 500

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Builds settings from `env` (default `os.environ`).

        Raises:
            SettingsError: a variable is malformed (a connection string too) or DATABASE_URL is
                missing.
        """
        env = os.environ if env is None else env
        database_url = env.get("DATABASE_URL", "")
        if not database_url:
            raise DatabaseUrlMissing(
                "DATABASE_URL is not set: export DATABASE_URL=postgresql://USER@HOST:5432/DBNAME "
                "for a database of yours, or run `sa-core dev` (a local database, web and worker)")
        try:
            routes = load_routes(env)
        except RouteError as exc:
            raise SettingsError(str(exc)) from None
        _conninfo("DATABASE_URL", database_url)
        direct_database_url = _conninfo("SA_DIRECT_DATABASE_URL",
                                        env.get("SA_DIRECT_DATABASE_URL") or database_url)
        pooler = _pooler(env, database_url, direct_database_url)
        return cls(
            database_url=database_url,
            direct_database_url=direct_database_url,
            provider_url=env.get("SA_PROVIDER_URL", "").rstrip("/"),
            provider_api_key=env.get("SA_PROVIDER_API_KEY", ""),
            provider_model=env.get("SA_PROVIDER_MODEL", "gpt-4o-mini"),
            provider_timeout=_float(env, "SA_PROVIDER_TIMEOUT", 180.0),
            provider_connect_timeout=_float(env, "SA_PROVIDER_CONNECT_TIMEOUT", 10.0),
            provider_read_timeout=_seconds_or_off(env, "SA_PROVIDER_READ_TIMEOUT", 0.0),
            provider_max_response_bytes=_int(env, "SA_PROVIDER_MAX_RESPONSE_BYTES",
                                             DEFAULT_MAX_RESPONSE_BYTES),
            provider_routes=routes,
            provider_source_addresses=_addresses(env, "SA_PROVIDER_SOURCE_ADDRESSES"),
            heartbeat_interval=_float(env, "SA_HEARTBEAT_INTERVAL", 30.0),
            cancel_check_interval=_float(env, "SA_CANCEL_CHECK_INTERVAL", 0.5),
            stale_after=_float(env, "SA_STALE_AFTER", 300.0),
            stuck_after=_float(env, "SA_STUCK_AFTER", 900.0),
            poll_interval=_float(env, "SA_POLL_INTERVAL", 2.0),
            reclaim_interval=_float(env, "SA_RECLAIM_INTERVAL", 60.0),
            backoff_base=_float(env, "SA_BACKOFF_BASE", 5.0),
            backoff_cap=_float(env, "SA_BACKOFF_CAP", 3600.0),
            rate_limit_min_wait=_float(env, "SA_RATE_LIMIT_MIN_WAIT", 60.0, minimum=-1.0),
            throttle_max_wait=_float(env, "SA_THROTTLE_MAX_WAIT", 3600.0, minimum=-1.0),
            route_limit_window=_float(env, "SA_ROUTE_LIMIT_WINDOW", 60.0),
            fallback_after=_float(env, "SA_FALLBACK_AFTER", 10.0, minimum=-1.0),
            org_budget_daily=_usd(env, "SA_ORG_BUDGET_DAILY"),
            org_budget_monthly=_usd(env, "SA_ORG_BUDGET_MONTHLY"),
            token_reservations=_flag(env, "SA_TOKEN_RESERVATIONS", True),
            ratelimit_headers=_flag(env, "SA_RATELIMIT_HEADERS", True),
            fair_by_tokens=_flag(env, "SA_FAIR_BY_TOKENS", False),
            stream_interval=_float(env, "SA_STREAM_INTERVAL", 0.075),
            shutdown_grace=_float(env, "SA_SHUTDOWN_GRACE", 30.0, minimum=-1.0),
            listen=env.get("SA_LISTEN", "1") != "0",
            max_prompt_chars=_int(env, "SA_MAX_PROMPT_CHARS", 100_000),
            pool_max_size=_int(env, "SA_POOL_MAX_SIZE", 10),
            max_body_bytes=_int(env, "SA_MAX_BODY_BYTES", 1_048_576),
            org_max_queued=_int(env, "SA_ORG_MAX_QUEUED", 0, minimum=0),
            chain_max_depth=_int(env, "SA_CHAIN_MAX_DEPTH", DEFAULT_CHAIN_MAX_DEPTH),
            cors_origins=_origins(env, "SA_CORS_ORIGINS"),
            org_max_running=_int(env, "SA_ORG_MAX_RUNNING", 0, minimum=0),
            priority_aging=_float(env, "SA_PRIORITY_AGING", DEFAULT_PRIORITY_AGING),
            metrics_port=metrics_port(env),
            statement_timeout=_seconds_or_off(env, "SA_STATEMENT_TIMEOUT", 30.0),
            lock_timeout=_seconds_or_off(env, "SA_LOCK_TIMEOUT", 10.0),
            retention_interval=_float(env, "SA_RETENTION_INTERVAL", 3600.0),
            archive_after=_seconds_or_off(env, "SA_ARCHIVE_AFTER", 30 * 86400.0),
            # NOTE: a key younger than its TTL still answers repeats; pruning it would break that.
            idempotency_key_retention=_seconds_or_off(
                env, "SA_IDEMPOTENCY_KEY_RETENTION", float(KEY_TTL_SECONDS),
                at_least=float(KEY_TTL_SECONDS)),
            # NOTE: half the gevent worker's connections by default, so a flood of streams
            # always leaves room for ordinary requests and /healthz (service/gunicorn_conf.py).
            sse_max_streams=_int(env, "SA_SSE_MAX_STREAMS",
                                 max(1, _int(env, "SA_WEB_CONNECTIONS", 1000) // 2)),
            sse_max_streams_per_token=_int(env, "SA_SSE_MAX_STREAMS_PER_TOKEN", 10),
            sse_keepalive=_float(env, "SA_SSE_KEEPALIVE", 15.0),
            sse_token_check=_float(env, "SA_SSE_TOKEN_CHECK", 5.0),
            sse_replay_limit=_int(env, "SA_SSE_REPLAY_LIMIT", 1000),
            body_timeout=_float(env, "SA_BODY_TIMEOUT", 10.0),
            token_cache_ttl=_float(env, "SA_TOKEN_CACHE_TTL", 2.0, minimum=-1.0),
            pooler=pooler,
            # NOTE: a transaction pooler (before PgBouncer 1.21) loses prepared statements
            # between transactions; so they are off there unless asked for.
            prepared_statements=_flag(env, "SA_PREPARED_STATEMENTS", pooler != "transaction"),
            leader_keepalive_idle=_int(env, "SA_LEADER_KEEPALIVE_IDLE", 20),
            leader_keepalive_interval=_int(env, "SA_LEADER_KEEPALIVE_INTERVAL", 10),
            leader_keepalive_count=_int(env, "SA_LEADER_KEEPALIVE_COUNT", 3),
            **_openai_settings(env),
            # NOTE: a quarter of the gevent worker's connections by default: with the streams'
            # half, waits never hold every connection (docs/limits.md).
            wait_max=_int(env, "SA_WAIT_MAX", max(1, _int(env, "SA_WEB_CONNECTIONS", 1000) // 4)),
            wait_max_per_token=_int(env, "SA_WAIT_MAX_PER_TOKEN", 10),
            feed_text_max_chars=_int(env, "SA_FEED_TEXT_MAX_CHARS", 16_384),
            page_max_bytes=_int(env, "SA_PAGE_MAX_BYTES", 1_048_576, minimum=1024),
            sessions_per_token=_int(env, "SA_SESSIONS_PER_TOKEN", 20),
            token_read_share=_fraction(env, "SA_TOKEN_READ_SHARE", 0.25),
            token_read_queue=_int(env, "SA_TOKEN_READ_QUEUE", 100, minimum=0),
            token_read_wait=_float(env, "SA_TOKEN_READ_WAIT", 10.0),
            batch_max_bytes=_int(env, "SA_BATCH_MAX_BYTES", 4 * 1_048_576),
            ops_bulk_batch=_int(env, "SA_OPS_BULK_BATCH", 500),
        )

    @property
    def gate_refresh(self) -> float:
        """How stale a worker's copy of the route pauses may be: the poll interval, at most 0.5 s."""
        return min(self.poll_interval, 0.5)

    @property
    def budgets(self) -> Budgets:
        """The per-org budgets (SA_ORG_BUDGET_DAILY / _MONTHLY; 0: none)."""
        return Budgets(self.org_budget_daily, self.org_budget_monthly)

    @property
    def routes(self) -> Routes:
        """Every model route: SA_PROVIDER_ROUTES(_FILE), then `default` from SA_PROVIDER_*."""
        return default_routes(self.provider_routes, self.provider_url, self.provider_api_key,
                              self.provider_model)

    @property
    def sends_timeouts(self) -> bool:
        """Whether the worker's statement and lock timeouts travel as startup options.

        NOTE: not through a pooler: PgBouncer refuses every startup parameter it does not know,
        `options` included, and a transaction pooler would not keep a session's SET either. The
        server's own settings for the role and database apply there (ops/README.md, PgBouncer).
        """
        return self.pooler == "none" and (self.statement_timeout > 0 or self.lock_timeout > 0)

    @property
    def worker_database_url(self) -> str:
        """`DATABASE_URL` with the worker's statement and lock timeouts as libpq `options`
        (`sends_timeouts`): they cost no round trip and bind every statement of the session."""
        extra = [f"-c {name}={round(seconds * 1000)}"
                 for name, seconds in (("statement_timeout", self.statement_timeout),
                                       ("lock_timeout", self.lock_timeout)) if seconds > 0]
        if not extra or not self.sends_timeouts:
            return self.database_url
        own = conninfo_to_dict(self.database_url).get("options")
        if own:
            extra.insert(0, str(own))
        return make_conninfo(self.database_url, options=" ".join(extra))
