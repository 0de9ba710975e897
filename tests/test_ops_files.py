"""The deployment files of ops/: promtool checks and unit-tests the alerts; dashboard and units hold up."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import require_tool

OPS = Path(__file__).resolve().parent.parent / "ops"
PROMETHEUS = OPS / "prometheus"

# The contract's metric names (docs/architecture.md, "Interface contract"); histograms also
# expose _bucket, _count and _sum.
DESIGN_METRICS = {
    "sa_jobs_enqueued_total", "sa_job_transitions_total", "sa_job_failures_total",
    "sa_job_queue_depth", "sa_job_oldest_queued_seconds", "sa_job_wait_seconds",
    "sa_job_run_seconds", "sa_provider_request_seconds", "sa_http_request_seconds",
}
# The operational metrics beside the contract (jobqueue/core/metrics.py declares them).
OPERATIONAL_METRICS = {"sa_worker_slots", "sa_db_pool_connections", "sa_db_pool_requests_waiting",
                       "sa_sse_streams_open", "sa_build_info"}
HISTOGRAMS = {"sa_job_wait_seconds", "sa_job_run_seconds", "sa_provider_request_seconds",
              "sa_http_request_seconds"}


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool", install="apt-get install prometheus")


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True,
                          timeout=60, check=False)


def test_promtool_accepts_the_alerting_rules(promtool: str) -> None:
    checked = _promtool(promtool, "check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout


def test_the_alerts_fire_when_they_should_and_only_then(promtool: str) -> None:
    tested = _promtool(promtool, "test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_accepts_the_example_scrape_config(promtool: str) -> None:
    checked = _promtool(promtool, "check", "config", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _names_in(expression: str) -> set[str]:
    return set(re.findall(r"\bsa_[a-z_]+", expression))


def _base_name(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix) and name[: -len(suffix)] in HISTOGRAMS:
            return name[: -len(suffix)]
    return name


def test_the_alerts_use_only_design_metric_names() -> None:
    text = (PROMETHEUS / "alerts.yml").read_text()
    expressions = re.findall(r"expr: (.*?)(?=\n {8}for:)", text, re.S)
    assert len(expressions) == 10
    used = {_base_name(name) for expr in expressions for name in _names_in(expr)}
    assert used and used <= DESIGN_METRICS, used - DESIGN_METRICS
    for alert in ("SaCoreQueueBackingUp", "SaCoreOldestQueuedJobTooOld", "SaCoreFailureRateHigh",
                  "SaCoreJobsStuckInRunning", "SaCoreNoWorkerAlive", "SaCoreWebDown",
                  "SaCoreHttp5xxRatioHigh", "SaCoreProviderErrorRatioHigh"):
        assert f"alert: {alert}\n" in text


def test_every_alert_links_its_runbook_in_ops_readme() -> None:
    text = (PROMETHEUS / "alerts.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)", text)
    runbooks = re.findall(r'runbook_url: "ops/README\.md#([a-z0-9-]+)"', text)
    assert runbooks == [alert.lower() for alert in alerts]
    # NOTE: GitHub's anchor of a heading is its text, lower-cased.
    headings = {line.lstrip("#").strip().lower()
                for line in (OPS / "README.md").read_text().splitlines() if line.startswith("### ")}
    assert set(runbooks) <= headings, set(runbooks) - headings


def test_the_operational_metrics_are_declared_once_in_the_metrics_module() -> None:
    source = (OPS.parent / "jobqueue" / "core" / "metrics.py").read_text()
    for name in OPERATIONAL_METRICS:
        assert len(re.findall(rf'(?:Gauge|Counter|Histogram)\("{name}"', source)) == 1, name


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_the_grafana_dashboard_imports_as_is_and_queries_design_metrics() -> None:
    dashboard = json.loads((OPS / "grafana" / "dashboard.json").read_text())
    assert dashboard["id"] is None and dashboard["uid"] and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    variable, web, worker = dashboard["templating"]["list"]
    assert (variable["type"], variable["name"], variable["query"]) == ("datasource", "datasource",
                                                                       "prometheus")
    # NOTE: instance filters, one per scrape job, "All" by default.
    assert (web["name"], worker["name"]) == ("web_instance", "worker_instance")
    for instance in (web, worker):
        assert instance["multi"] and instance["includeAll"] and instance["allValue"] == ".*"
        assert instance["definition"].startswith("label_values(up{job=")
    assert "__inputs" not in dashboard
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    used: set[str] = set()
    for panel in _panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            used |= {_base_name(name) for name in _names_in(target["expr"])}
            assert 'instance=~"$' in target["expr"], target["expr"]
    assert used == DESIGN_METRICS | OPERATIONAL_METRICS
    titles = " | ".join(p["title"].lower() for p in _panels(dashboard))
    for topic in ("queue depth by state", "per second", "wait", "run", "failed attempts by error kind",
                  "http latency p95 by route", "job slots", "pool connections", "open event streams",
                  "build info", "web instances up"):
        assert topic in titles


def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


def test_the_systemd_units_run_the_procfile_commands() -> None:
    web = _unit(OPS / "systemd" / "sa-core-web.service")
    assert web["Service"]["ExecStart"] == [
        "/opt/sa-core/.venv/bin/gunicorn -c python:service.gunicorn_conf service.app:create_app()"]
    assert "PROMETHEUS_MULTIPROC_DIR=/run/sa-core-web/prometheus" in web["Service"]["Environment"]
    assert web["Unit"]["Requires"] == ["sa-core-migrate.service"]
    worker = _unit(OPS / "systemd" / "sa-core-worker@.service")
    assert worker["Service"]["ExecStart"][0].startswith("/opt/sa-core/.venv/bin/sa-core run-worker")
    assert "SA_METRICS_PORT=91%i" in worker["Service"]["Environment"]
    assert worker["Service"]["UnsetEnvironment"] == ["PROMETHEUS_MULTIPROC_DIR"]
    assert int(worker["Service"]["TimeoutStopSec"][0]) > 30
    migrate = _unit(OPS / "systemd" / "sa-core-migrate.service")
    assert migrate["Service"]["ExecStart"] == ["/opt/sa-core/.venv/bin/sa-core migrate"]


def test_systemd_analyze_finds_nothing_but_the_uninstalled_binaries(tmp_path: Path) -> None:
    systemd_analyze = require_tool("systemd-analyze", install="apt-get install systemd")
    units = [OPS / "systemd" / "sa-core-web.service", OPS / "systemd" / "sa-core-migrate.service"]
    instance = tmp_path / "sa-core-worker@01.service"
    instance.write_text((OPS / "systemd" / "sa-core-worker@.service").read_text())
    checked = subprocess.run([systemd_analyze, "verify", "--man=no", *map(str, units), str(instance)],
                             capture_output=True, text=True, timeout=60, check=False)
    problems = [line for line in (checked.stdout + checked.stderr).splitlines()
                if line.strip() and "is not executable" not in line]
    assert problems == []


def test_the_crontab_runs_workers_once_with_a_lock_and_the_maintenance_jobs() -> None:
    entries = [line for line in (OPS / "cron" / "sa-core.cron").read_text().splitlines()
               if line and not line.startswith("#") and "=" not in line.split()[0]]
    assert len(entries) == 4
    for entry in entries:
        fields = entry.split(None, 6)
        assert len(fields) == 7 and fields[5] == "sa-core"
        assert ". /etc/sa-core/env" in fields[6]
    assert "flock -n" in entries[0] and "run-worker --once" in entries[0]
    assert "reclaim-stuck-jobs" in entries[1]
    assert "archive-old-jobs --before 30d" in entries[2]
    assert "prune-idempotency-keys" in entries[3]
