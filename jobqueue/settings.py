"""Configuration read once from the environment, so every duration the spec names can shrink in tests."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DEFAULT_NOTIFY_INTERVAL", "Settings", "SettingsError", "notify_interval"]


class SettingsError(ValueError):
    """An environment variable holds a value the service cannot use."""


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


def _port(env: Mapping[str, str], name: str) -> int:
    """A TCP port, or 0 (the default) for none."""
    value = _int(env, name, 0, minimum=0)
    if value > 65535:
        raise SettingsError(f"{name} must be a TCP port (1..65535) or 0 for none, got {value}")
    return value


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


DEFAULT_NOTIFY_INTERVAL = 0.01
"""Seconds over which a process coalesces its wake-up notifications (see jobqueue/wakeup.py)."""


def notify_interval(env: Mapping[str, str] | None = None) -> float:
    """Reads `SA_NOTIFY_INTERVAL` (seconds; 0 sends every wake-up as soon as the last one is out).

    Read on its own, not through `Settings`: the process-wide wake-up sender is created where a
    transition is committed, which holds a pool, not the settings.
    """
    return _float(os.environ if env is None else env, "SA_NOTIFY_INTERVAL",
                  DEFAULT_NOTIFY_INTERVAL, minimum=-1.0)


@dataclass(frozen=True)
class Settings:
    """Every knob of DESIGN.md's interface contract, in seconds where it is a duration."""

    database_url: str
    direct_database_url: str
    provider_url: str
    provider_api_key: str
    provider_model: str
    provider_timeout: float = 180.0
    heartbeat_interval: float = 30.0
    stale_after: float = 300.0
    stuck_after: float = 900.0
    poll_interval: float = 2.0
    reclaim_interval: float = 60.0
    backoff_base: float = 5.0
    backoff_cap: float = 3600.0
    rate_limit_min_wait: float = 60.0
    shutdown_grace: float = 30.0
    listen: bool = True
    max_prompt_chars: int = 100_000
    pool_max_size: int = 10
    max_body_bytes: int = 1_048_576
    org_max_queued: int = 0
    cors_origins: tuple[str, ...] = ()
    org_max_running: int = 0
    metrics_port: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Builds settings from `env` (default `os.environ`).

        Raises:
            SettingsError: a variable is malformed or DATABASE_URL is missing.
        """
        env = os.environ if env is None else env
        database_url = env.get("DATABASE_URL", "")
        if not database_url:
            raise SettingsError("DATABASE_URL is not set (use `sa-core dev` for a local database)")
        return cls(
            database_url=database_url,
            direct_database_url=env.get("SA_DIRECT_DATABASE_URL") or database_url,
            provider_url=env.get("SA_PROVIDER_URL", "").rstrip("/"),
            provider_api_key=env.get("SA_PROVIDER_API_KEY", ""),
            provider_model=env.get("SA_PROVIDER_MODEL", "gpt-4o-mini"),
            provider_timeout=_float(env, "SA_PROVIDER_TIMEOUT", 180.0),
            heartbeat_interval=_float(env, "SA_HEARTBEAT_INTERVAL", 30.0),
            stale_after=_float(env, "SA_STALE_AFTER", 300.0),
            stuck_after=_float(env, "SA_STUCK_AFTER", 900.0),
            poll_interval=_float(env, "SA_POLL_INTERVAL", 2.0),
            reclaim_interval=_float(env, "SA_RECLAIM_INTERVAL", 60.0),
            backoff_base=_float(env, "SA_BACKOFF_BASE", 5.0),
            backoff_cap=_float(env, "SA_BACKOFF_CAP", 3600.0),
            rate_limit_min_wait=_float(env, "SA_RATE_LIMIT_MIN_WAIT", 60.0, minimum=-1.0),
            shutdown_grace=_float(env, "SA_SHUTDOWN_GRACE", 30.0, minimum=-1.0),
            listen=env.get("SA_LISTEN", "1") != "0",
            max_prompt_chars=_int(env, "SA_MAX_PROMPT_CHARS", 100_000),
            pool_max_size=_int(env, "SA_POOL_MAX_SIZE", 10),
            max_body_bytes=_int(env, "SA_MAX_BODY_BYTES", 1_048_576),
            org_max_queued=_int(env, "SA_ORG_MAX_QUEUED", 0, minimum=0),
            cors_origins=_origins(env, "SA_CORS_ORIGINS"),
            org_max_running=_int(env, "SA_ORG_MAX_RUNNING", 0, minimum=0),
            metrics_port=_port(env, "SA_METRICS_PORT"),
        )
