"""Unit tests of the checks that run before any I/O: execution options a worker can use, the
maintenance loops' configs, and the settings and CLI arguments parsed from strings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobqueue.core.settings import Settings, SettingsError
from jobqueue.engine.claim import MAX_DEPTH, Undecodable, options_error
from jobqueue.engine.reclaim import Reclaimer
from jobqueue.operator.operator_commands import parse_instant
from jobqueue.operator.token_commands import parse_expiry
from jobqueue.runtime.archive import Archiver
from jobqueue.runtime.maintenance import MaintenanceLeader
from jobqueue.runtime.retention import Retention

__all__: list[str] = []

DAY = 86400.0


@pytest.mark.parametrize("options", [{"depth": "abc"}, {"depth": True}, {"depth": MAX_DEPTH + 1},
                                     {"depth": -1}, {"depth": 2.0}, {"model": ["x"]}, [],
                                     Undecodable("too many digits")])
def test_options_the_worker_cannot_use_are_named(options: Any) -> None:
    error = options_error(options)
    assert error is not None and "execution_options" in error


@pytest.mark.parametrize("options", [{}, {"depth": 0}, {"depth": MAX_DEPTH}, {"model": "m"},
                                     {"depth": 3, "model": "m", "later_option": 1}])
def test_options_the_worker_can_use_pass(options: dict[str, Any]) -> None:
    assert options_error(options) is None


@pytest.mark.parametrize("field", ["stale_after", "stuck_after", "batch_size", "statement_timeout"])
@pytest.mark.parametrize("value", [0, -1])
def test_reclaim_config_rejects_non_positive_values(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        Reclaimer.Config(**{field: value})


@pytest.mark.parametrize("field", ["reclaim_interval", "lock_retry_interval", "reconnect_delay",
                                   "connect_timeout"])
def test_leader_config_rejects_non_positive_intervals(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        MaintenanceLeader.Config(**{field: 0})
    with pytest.raises(ValueError, match="jitter"):
        MaintenanceLeader.Config(jitter=1.0)


@pytest.mark.parametrize(("name", "value"), [
    ("SA_ARCHIVE_AFTER", "-1"), ("SA_ARCHIVE_AFTER", "inf"), ("SA_ARCHIVE_AFTER", "soon"),
    ("SA_IDEMPOTENCY_KEY_RETENTION", "3600"), ("SA_RETENTION_INTERVAL", "0"),
    ("SA_STATEMENT_TIMEOUT", "-5"), ("SA_LOCK_TIMEOUT", "nan"),
])
def test_retention_and_timeout_settings_refuse_nonsense(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({"DATABASE_URL": "postgresql:///x", name: value})


def test_retention_and_timeouts_default_to_documented_values_and_0_turns_them_off() -> None:
    settings = Settings.from_env({"DATABASE_URL": "postgresql:///x"})
    assert (settings.archive_after, settings.idempotency_key_retention,
            settings.retention_interval) == (30 * DAY, DAY, 3600.0)
    assert (settings.statement_timeout, settings.lock_timeout) == (30.0, 10.0)
    off = Settings.from_env({"DATABASE_URL": "postgresql:///x", "SA_ARCHIVE_AFTER": "0",
                             "SA_IDEMPOTENCY_KEY_RETENTION": "0", "SA_STATEMENT_TIMEOUT": "0",
                             "SA_LOCK_TIMEOUT": "0", "SA_BATCH_RETENTION": "0"})
    assert not Retention.Config.from_settings(off).enabled
    assert off.worker_database_url == "postgresql:///x"


def test_metrics_port_setting_is_validated() -> None:
    base = {"DATABASE_URL": "postgresql://x"}
    assert Settings.from_env(base).metrics_port == 0
    assert Settings.from_env({**base, "SA_METRICS_PORT": "9101"}).metrics_port == 9101
    for bad in ("70000", "-1", "http"):
        with pytest.raises(SettingsError, match="SA_METRICS_PORT"):
            Settings.from_env({**base, "SA_METRICS_PORT": bad})


def test_parse_instant_accepts_iso_dates_and_ages() -> None:
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert parse_instant("2026-01-31", now) == datetime(2026, 1, 31, tzinfo=UTC)
    assert parse_instant("2026-01-31T10:00:00+02:00", now) == datetime(2026, 1, 31, 8, tzinfo=UTC)
    assert parse_instant("2026-01-31T10:00:00", now) == datetime(2026, 1, 31, 10, tzinfo=UTC)
    assert parse_instant("30m", now) == now - timedelta(minutes=30)
    assert parse_instant("1.5h", now) == now - timedelta(minutes=90)
    assert parse_instant("2w", now) == now - timedelta(days=14)
    with pytest.raises(ValueError, match="not an instant"):
        parse_instant("yesterday", now)


def test_archive_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        Archiver.Config(batch_size=0)
    with pytest.raises(ValueError, match="statement_timeout"):
        Archiver.Config(statement_timeout=0)


def test_the_cap_is_off_by_default_and_bad_values_are_refused() -> None:
    base = {"DATABASE_URL": "postgresql://x/y"}
    assert Settings.from_env(base).org_max_queued == 0
    assert Settings.from_env({**base, "SA_ORG_MAX_QUEUED": "500"}).org_max_queued == 500
    for bad in ("-1", "lots", "1.5"):
        with pytest.raises(SettingsError, match="SA_ORG_MAX_QUEUED"):
            Settings.from_env({**base, "SA_ORG_MAX_QUEUED": bad})


def test_cors_and_body_settings_are_parsed_strictly() -> None:
    base = {"DATABASE_URL": "postgresql://x/y"}
    parsed = Settings.from_env(base)
    assert (parsed.cors_origins, parsed.max_body_bytes) == ((), 1_048_576)
    many = Settings.from_env({**base, "SA_CORS_ORIGINS": " https://a.example , http://b.example:8080,"})
    assert many.cors_origins == ("https://a.example", "http://b.example:8080")
    assert Settings.from_env({**base, "SA_CORS_ORIGINS": "*"}).cors_origins == ("*",)
    assert Settings.from_env({**base, "SA_MAX_BODY_BYTES": "4096"}).max_body_bytes == 4096
    for name, bad in [("SA_CORS_ORIGINS", "https://a.example/"), ("SA_CORS_ORIGINS", "a.example"),
                      ("SA_CORS_ORIGINS", "*, https://a.example"), ("SA_CORS_ORIGINS", "ftp://a.example"),
                      ("SA_MAX_BODY_BYTES", "0"), ("SA_MAX_BODY_BYTES", "1MB")]:
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({**base, name: bad})


def test_parse_expiry_forms() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert parse_expiry("90s", now) == now + timedelta(seconds=90)
    assert parse_expiry("1.5h", now) == now + timedelta(minutes=90)
    assert parse_expiry("2w", now) == now + timedelta(days=14)
    assert parse_expiry("2030-01-02", now) == datetime(2030, 1, 2, tzinfo=UTC)
    assert parse_expiry("2030-01-01T12:00:00+02:00", now) == datetime(2030, 1, 1, 10, tzinfo=UTC)
    with pytest.raises(ValueError, match="future"):
        parse_expiry("2029-12-31", now)
