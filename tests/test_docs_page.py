"""GET /docs: the API reference rendered from the app's own OpenAPI document, public, under a strict CSP."""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path
from typing import Any

import falcon.testing

from service.apidocs.render import render_docs

API_CSP = "default-src 'none'; frame-ancestors 'none'"
SHIPPED_CSS = Path(__file__).resolve().parent.parent / "service" / "apidocs" / "docs.css"


def _examples(node: Any) -> list[Any]:
    """Every `example` value, and every value of an `examples` map, anywhere in the document."""
    found: list[Any] = []
    if isinstance(node, dict):
        if "example" in node:
            found.append(node["example"])
        if isinstance(node.get("examples"), dict):
            found += [e["value"] for e in node["examples"].values() if isinstance(e, dict) and "value" in e]
        for value in node.values():
            found += _examples(value)
    elif isinstance(node, list):
        for value in node:
            found += _examples(value)
    return found


def test_the_reference_shows_every_operation_of_the_served_document_without_a_token(
    client: falcon.testing.TestClient,
) -> None:
    document = client.simulate_get("/sa-core/v1/openapi.json").json
    page = client.simulate_get("/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    for path, item in document["paths"].items():
        for method, operation in item.items():
            anchor = "op-" + re.sub(r"[^A-Za-z0-9_-]", "-", operation["operationId"])
            assert f'id="{anchor}"' in html, (method, path)
            assert escape(path) in html
            assert escape(operation["summary"]).replace("`", "") in re.sub(r"</?code>", "", html)
    for name in document["components"]["schemas"]:
        assert f'id="schema-{name}"' in html
    for example in _examples(document):
        assert escape(json.dumps(example, indent=2, ensure_ascii=False)) in html


def test_the_page_runs_no_script_and_no_inline_style_and_loads_its_stylesheet_from_the_app(
    client: falcon.testing.TestClient,
) -> None:
    page = client.simulate_get("/docs")
    assert page.headers["content-security-policy"] == (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'none'; base-uri 'none'; "
        "frame-ancestors 'none'")
    assert page.headers["x-frame-options"] == "DENY"
    html = page.text.lower()
    assert "<script" not in html and "<style" not in html and " style=" not in html
    assert re.findall(r'<link rel="stylesheet" href="([^"]+)"', page.text) == ["/docs/docs.css"]
    assert "http://" not in html and "https://" not in html, "nothing comes from another origin"

    css = client.simulate_get("/docs/docs.css")
    assert css.status_code == 200 and css.headers["content-type"] == "text/css; charset=utf-8"
    assert css.content == SHIPPED_CSS.read_bytes()


def test_the_api_keeps_its_own_policy(client: falcon.testing.TestClient,
                                      auth: dict[str, str]) -> None:
    for path in ("/sa-core/v1/openapi.json", "/healthz", "/sa-core/v1/mission/recent", "/nowhere"):
        assert client.simulate_get(path, headers=auth).headers["content-security-policy"] == API_CSP


def test_everything_the_document_says_is_escaped() -> None:
    hostile = "<script>alert(1)</script>"
    document = {
        "openapi": "3.1.0",
        "info": {"title": hostile, "version": "1", "description": f"uses `{hostile}`"},
        "paths": {"/x/{id}": {"get": {
            "operationId": "x\"><script>", "summary": hostile,
            "parameters": [{"name": hostile, "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": hostile}, "example": hostile}],
            "responses": {"200": {"description": hostile, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Thing"},
                "examples": {"one": {"summary": hostile, "value": {"k": hostile}}}}}}}}}},
        "components": {"schemas": {"Thing": {"type": "object", "description": hostile,
                                             "properties": {hostile: {"type": "string"}}}}},
    }
    html = render_docs(document, "/docs/docs.css")
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<a href="#schema-Thing">Thing</a>' in html
