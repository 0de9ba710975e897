"""Small helpers shared by the integration tests."""

from __future__ import annotations

from typing import Any

import falcon.testing
import psycopg


def submit(client: falcon.testing.TestClient, auth: dict[str, str], **body: Any) -> dict[str, Any]:
    """POSTs a prompt and returns the 202 body."""
    result = client.simulate_post("/sa-core/v1/prompt", json=body, headers=auth)
    assert result.status_code == 202, result.text
    return dict(result.json)


def job_state(client: falcon.testing.TestClient, auth: dict[str, str], job_id: str) -> str:
    """Returns a job's state as GET /jobs/{id} shows it."""
    result = client.simulate_get(f"/sa-core/v1/jobs/{job_id}", headers=auth)
    assert result.status_code == 200, result.text
    return str(result.json["state"])


def plan_nodes(conn: psycopg.Connection[Any], statement: Any, params: Any = None) -> list[dict[str, Any]]:
    """EXPLAINs `statement` and returns every node of its plan, flattened."""
    row = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
    assert row is not None
    plan = row["QUERY PLAN"] if isinstance(row, dict) else row[0]

    def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node] + [n for child in node.get("Plans", []) for n in walk(child)]

    return walk(plan[0]["Plan"])
