"""Renders an OpenAPI 3 document as one static HTML page: operations, parameters, bodies, responses,
examples and schemas. Pure: a document in, a string out; every value from the document is escaped."""

from __future__ import annotations

import json
import re
from html import escape
from importlib import resources
from typing import Any

__all__ = ["STYLESHEET", "render_docs"]

STYLESHEET: bytes = (resources.files("service.apidocs") / "docs.css").read_bytes()
"""The page's stylesheet, read once from the package."""

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_CODE = re.compile(r"`([^`]+)`")
_MAX_DEPTH = 6


def _text(value: Any) -> str:
    """Escaped prose; `backticks` become <code>."""
    return _CODE.sub(r"<code>\1</code>", escape(str(value)))


def _paragraphs(value: Any) -> str:
    if not value:
        return ""
    return "".join(f"<p>{_text(part)}</p>" for part in str(value).split("\n\n") if part.strip())


def _anchor(kind: str, name: str) -> str:
    return f"{kind}-" + re.sub(r"[^A-Za-z0-9_-]", "-", name)


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: Any, depth: int = 0) -> str:
    """A short, linked description of a schema's type (`string (uuid)`, `array of Job`, ...)."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return "any"
    if "$ref" in schema:
        name = _ref_name(str(schema["$ref"]))
        return f'<a href="#{_anchor("schema", name)}">{escape(name)}</a>'
    for key in ("oneOf", "anyOf", "allOf"):
        if isinstance(schema.get(key), list):
            joiner = " and " if key == "allOf" else " | "
            return joiner.join(_type(s, depth + 1) for s in schema[key])
    kind = schema.get("type", "object" if "properties" in schema else "any")
    if isinstance(kind, list):
        kind = " | ".join(str(k) for k in kind)
    text = escape(str(kind))
    if kind == "array":
        text = f"array of {_type(schema.get('items'), depth + 1)}"
    if "format" in schema:
        text += f" ({escape(str(schema['format']))})"
    if "enum" in schema:
        text += ": " + ", ".join(f"<code>{escape(json.dumps(v))}</code>" for v in schema["enum"])
    if "const" in schema:
        text += f": <code>{escape(json.dumps(schema['const']))}</code>"
    return text


def _limits(schema: Any) -> str:
    if not isinstance(schema, dict):
        return ""
    names = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
             "minItems", "maxItems", "pattern", "default")
    found = [f"{name} <code>{escape(json.dumps(schema[name]))}</code>" for name in names if name in schema]
    return f'<br><span class="muted">{"; ".join(found)}</span>' if found else ""


def _examples(holder: Any) -> str:
    """`example` and `examples` (OpenAPI's map of {summary, value}, or JSON Schema's list)."""
    if not isinstance(holder, dict):
        return ""
    items: list[tuple[str, Any]] = []
    if "example" in holder:
        items.append(("Example", holder["example"]))
    examples = holder.get("examples")
    if isinstance(examples, dict):
        for name, example in examples.items():
            if isinstance(example, dict) and "value" in example:
                items.append((str(example.get("summary") or name), example["value"]))
    elif isinstance(examples, list):
        items += [("Example", value) for value in examples]
    return "".join(f'<p class="muted">{_text(title)}</p><pre><code>'
                   f"{escape(json.dumps(value, indent=2, ensure_ascii=False))}</code></pre>"
                   for title, value in items)


def _properties(schema: Any, components: dict[str, Any]) -> str:
    """A table of an object schema's fields (following one $ref)."""
    if isinstance(schema, dict) and "$ref" in schema:
        schema = components.get(_ref_name(str(schema["$ref"])), {})
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return ""
    required = set(schema.get("required", []))
    rows = "".join(
        f"<tr><td><code>{escape(name)}</code>"
        + (' <span class="required">required</span>' if name in required else "")
        + f"</td><td>{_type(prop)}{_limits(prop)}</td>"
        f"<td>{_text(prop.get('description', '')) if isinstance(prop, dict) else ''}</td></tr>"
        for name, prop in schema["properties"].items())
    return f"<table><tr><th>Field</th><th>Type</th><th>Description</th></tr>{rows}</table>"


def _content(content: Any, components: dict[str, Any]) -> str:
    if not isinstance(content, dict):
        return ""
    out = []
    for media, spec in content.items():
        schema = spec.get("schema") if isinstance(spec, dict) else None
        out.append(f'<p><code>{escape(media)}</code>: {_type(schema)}</p>')
        out.append(_examples(spec))
        if isinstance(schema, dict) and "$ref" not in schema:
            out.append(_properties(schema, components))
    return "".join(out)


def _parameters(parameters: Any) -> str:
    if not isinstance(parameters, list) or not parameters:
        return ""
    rows = "".join(
        f"<tr><td><code>{escape(str(p.get('name', '')))}</code>"
        + (' <span class="required">required</span>' if p.get("required") else "")
        + f"</td><td>{escape(str(p.get('in', '')))}</td>"
        f"<td>{_type(p.get('schema'))}{_limits(p.get('schema'))}</td>"
        f"<td>{_text(p.get('description', ''))}{_examples(p)}</td></tr>"
        for p in parameters if isinstance(p, dict))
    return ("<h3>Parameters</h3><table><tr><th>Name</th><th>In</th><th>Type</th><th>Description</th></tr>"
            f"{rows}</table>")


def _responses(responses: Any, components: dict[str, Any]) -> str:
    if not isinstance(responses, dict):
        return ""
    out = ["<h3>Responses</h3>"]
    for status, response in responses.items():
        if not isinstance(response, dict):
            continue
        out.append(f'<p><span class="status">{escape(str(status))}</span> '
                   f"{_text(response.get('description', ''))}</p>")
        headers = response.get("headers")
        if isinstance(headers, dict) and headers:
            out.append("<p class=\"muted\">Headers: " + ", ".join(
                f"<code>{escape(name)}</code>" for name in headers) + "</p>")
        out.append(_content(response.get("content"), components))
    return "".join(out)


def _operation(path: str, method: str, op: dict[str, Any], document: dict[str, Any],
               components: dict[str, Any]) -> str:
    name = str(op.get("operationId") or f"{method} {path}")
    security = op.get("security", document.get("security"))
    auth = "public: no token" if security == [] else "needs <code>Authorization: Bearer &lt;token&gt;</code>"
    body = op.get("requestBody")
    parts = [
        f'<section class="operation" id="{_anchor("op", name)}">',
        f'<h2><span class="method method-{method}">{method.upper()}</span> '
        f'<span class="path">{escape(path)}</span></h2>',
        f"<p><strong>{_text(op.get('summary', ''))}</strong> <span class=\"auth\">({auth})</span></p>",
        _paragraphs(op.get("description")),
        _parameters(op.get("parameters")),
    ]
    if isinstance(body, dict):
        parts.append("<h3>Request body" + (' <span class="required">required</span>' if body.get("required")
                                           else "") + "</h3>")
        parts.append(_paragraphs(body.get("description")))
        parts.append(_content(body.get("content"), components))
    parts.append(_examples(op))
    parts.append(_responses(op.get("responses"), components))
    parts.append("</section>")
    return "".join(parts)


def render_docs(document: dict[str, Any], stylesheet_url: str) -> str:
    """Returns the whole page for `document`.

    Args:
        document: an OpenAPI 3 document (as the app serves it).
        stylesheet_url: where the page loads its stylesheet from (same origin).
    """
    info = document.get("info", {})
    components = document.get("components", {}).get("schemas", {})
    operations = [(path, method, op) for path, item in document.get("paths", {}).items()
                  for method, op in item.items() if method in _METHODS and isinstance(op, dict)]
    toc = "".join(
        f'<li><a href="#{_anchor("op", str(op.get("operationId") or f"{method} {path}"))}">'
        f'<span class="method method-{method}">{method.upper()}</span> {escape(path)}</a></li>'
        for path, method, op in operations)
    schemas = "".join(
        f'<section id="{_anchor("schema", name)}"><h3>{escape(name)}</h3>'
        f"{_paragraphs(schema.get('description')) if isinstance(schema, dict) else ''}"
        f"{_properties(schema, components) or '<p>' + _type(schema) + '</p>'}{_examples(schema)}</section>"
        for name, schema in components.items())
    title = escape(str(info.get("title", "API")))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{title} API reference</title><link rel="stylesheet" href="{escape(stylesheet_url)}">'
        f'</head><body><header><h1>{title} API reference</h1>'
        f'<p class="version">version {escape(str(info.get("version", "")))} · OpenAPI '
        f'{escape(str(document.get("openapi", "")))}</p>{_paragraphs(info.get("description"))}'
        f"<nav><ul>{toc}</ul></nav></header><main>"
        + "".join(_operation(path, method, op, document, components) for path, method, op in operations)
        + f'<h2 id="schemas">Schemas</h2>{schemas}</main>'
        "<footer>Rendered from the service's OpenAPI document.</footer></body></html>")
