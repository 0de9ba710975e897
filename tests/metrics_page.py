"""Reading a Prometheus text page in the tests: every sample keyed by name and labels."""

from __future__ import annotations

import falcon.testing
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Samples", "parse", "scrape", "value"]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(page: str) -> Samples:
    """Every sample of a Prometheus text page, keyed by (sample name, labels)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(page) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the page does not have it (a counter never incremented)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape(client: falcon.testing.TestClient) -> Samples:
    """GET /metrics through the app, checked to be the text exposition format, parsed."""
    result = client.simulate_get("/metrics")
    assert result.status_code == 200, result.text
    assert result.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(result.text)
