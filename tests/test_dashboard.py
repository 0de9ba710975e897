"""The Grafana dashboard's queries, run by a real Prometheus scraping `sa-core dev`'s web and worker
as ops/prometheus/prometheus.yml's two jobs: every panel answers, and a count made by both
processes (transitions) is summed across the web's and the worker's targets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers import free_port, require_tool, wait_for

# NOTE: the whole module on one xdist worker (make test's --dist loadgroup), so its
# module-scoped scraped stack starts once.
pytestmark = pytest.mark.xdist_group("dashboard")

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "ops" / "grafana" / "dashboard.json"
BIN = Path(sys.executable).parent

def _expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] if panel["type"] != "row"
            for target in panel["targets"]]


def _as_totals(expr: str) -> str:
    """The expression over the counters themselves instead of their rate, every instance chosen
    (the dashboard's "All"): exact totals to compare with what was done."""
    expr = expr.replace("$web_instance", ".*").replace("$worker_instance", ".*")
    return re.sub(r"rate\(([^\[]+)\[\$__rate_interval\]\)", r"(\1)", expr)


@pytest.fixture(scope="module")
def scraped(database_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A Prometheus scraping a running `sa-core dev` every second; yields its URL and the pasted
    environment of the dev's export line."""
    prometheus_bin = require_tool("prometheus", "apt-get install prometheus")
    name = f"sa_dash_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    root = tmp_path_factory.mktemp("prometheus")
    port, metrics_port, prometheus_port = free_port(), free_port(), free_port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SA_") and key not in ("DATABASE_URL", "LOG_LEVEL")}
    dev = subprocess.Popen([str(BIN / "sa-core"), "dev", "--port", str(port)], cwd=root, text=True,
                           env={**env, "DATABASE_URL": make_conninfo(database_url, dbname=name),
                                "SA_METRICS_PORT": str(metrics_port)},
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, process_group=0)
    (root / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: sa-core-web
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
  - job_name: sa-core-worker
    static_configs: [{{targets: ["127.0.0.1:{metrics_port}"]}}]
""")
    prometheus = subprocess.Popen(
        [prometheus_bin, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
    try:
        assert dev.stdout is not None
        exports = next(line for line in dev.stdout if line.startswith("export "))
        pasted = subprocess.run(["bash", "-c", f"{exports}\nenv -0"], env=env, capture_output=True,
                                check=True).stdout.decode()
        yield f"http://127.0.0.1:{prometheus_port}", dict(
            item.split("=", 1) for item in pasted.split("\0") if "=" in item)
    finally:
        for child in (prometheus, dev):
            os.killpg(child.pid, signal.SIGINT)
            child.wait(timeout=60)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _total(prometheus: str, expr: str, **labels: str) -> float:
    return sum(float(r["value"][1]) for r in _query(prometheus, expr)
               if all(r["metric"].get(k) == v for k, v in labels.items()))


def test_every_panel_answers_and_counts_are_summed_across_the_web_and_the_workers(
    scraped: tuple[str, dict[str, str]],
) -> None:
    prometheus, env = scraped
    for text in ("one", "two", "three"):
        assert subprocess.run([str(BIN / "sa-core"), "run-prompt", text], env=env,
                              capture_output=True, timeout=60).returncode == 0
    assert subprocess.run([str(BIN / "sa-core"), "run-prompt", "no [fake:400]"], env=env,
                          capture_output=True, timeout=60).returncode == 1
    transitions = next(expr for title, expr in _expressions() if title == "Transitions per second")

    # NOTE: one scrape of each target after the last job: the web counted the four submits, the
    # worker the four claims, three successes and one failure; the panel's sum adds both.
    def both_scraped() -> bool:
        totals = _as_totals(transitions)
        return (_total(prometheus, totals, from_state="none", to_state="queued") == 4
                and _total(prometheus, totals, from_state="running", to_state="failed") == 1)

    wait_for(both_scraped, timeout=60, interval=0.5)
    totals = _as_totals(transitions)
    assert _total(prometheus, totals, from_state="queued", to_state="running") == 4
    assert _total(prometheus, totals, from_state="running", to_state="succeeded") == 3
    finished = next(expr for title, expr in _expressions()
                    if title == "Enqueued and finished per second" and "transitions" in expr)
    assert _total(prometheus, _as_totals(finished), to_state="succeeded") == 3
    # NOTE: the web's own target alone has none of the worker's counts (why the sum matters).
    web_only = totals.replace('instance=~".*|.*"', 'job="sa-core-web"')
    assert _total(prometheus, web_only, from_state="running", to_state="succeeded") == 0
    # NOTE: every panel's query, as Grafana sends it with "All" chosen, is valid and has data; a
    # rate needs two scrapes of its series, and a counter's series starts at its first count.
    def empty_panels() -> list[str]:
        return [f"{title!r}: {live}" for title, live in (
            (title, expr.replace("$web_instance", ".*").replace("$worker_instance", ".*")
             .replace("$__rate_interval", "1m")) for title, expr in _expressions())
            if not _query(prometheus, live)]

    try:
        wait_for(lambda: not empty_panels(), timeout=30, interval=0.5)
    except AssertionError:
        raise AssertionError(f"panels with no data: {empty_panels()}") from None
