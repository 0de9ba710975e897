"""Turns a route's declaration into its OpenAPI operation, generating all that can be generated.

From the contract: each parameter (`service.contract` Params), the request body and the request
components it refers to (`service.schema.Fields`). From the route template: the path ids. From
what the route does: its error answers (`errors.py`), so that every route taking a body
documents 413/415/422, every route naming an id 404, every secured route 400/401/503, and
every route under a scoped prefix 403.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from service.auth import SCOPED_PREFIXES
from service.openapi.components import EXAMPLES, JOB_ID, PROMPT_ID, RESPONSE_ID, Schema, ref
from service.openapi.errors import error_answer
from service.schema import Fields, Items, OneOrMore, Param, Spec

__all__ = ["Answer", "Body", "Operation", "operation_object", "request_components"]

_PATH_IDS = {"job_id": ("job", JOB_ID), "prompt_id": ("prompt", PROMPT_ID),
             "response_id": ("response", RESPONSE_ID)}
"""Each path parameter the routes use: what it names, and the example id."""


@dataclass(frozen=True)
class Answer:
    """A success answer: a component by name (its example from `EXAMPLES` unless given), or an
    inline schema of another media type."""

    description: str
    schema: str | Schema | None = None
    example: Any = None
    headers: dict[str, Any] = field(default_factory=dict)
    links: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    """Link name -> (operationId, its parameter, the answer's field); a `parent_id` parameter is
    a follow-up POST /prompt's body field."""
    media: str = "application/json"

    def openapi(self) -> dict[str, Any]:
        """Returns the OpenAPI response object."""
        answer: dict[str, Any] = {"description": self.description}
        if self.schema is not None:
            schema = ref(self.schema) if isinstance(self.schema, str) else self.schema
            example = self.example
            if example is None and isinstance(self.schema, str):
                example = EXAMPLES[self.schema]
            answer["content"] = {self.media: {"schema": schema, "example": example}}
        if self.headers:
            answer["headers"] = self.headers
        if self.links:
            answer["links"] = _links(self.links)
        return answer


@dataclass(frozen=True)
class Body:
    """A request body: its contract declaration and an example."""

    spec: Fields
    example: Any
    required: bool = True

    def openapi(self) -> dict[str, Any]:
        """Returns the OpenAPI request body object."""
        schema = ref(self.spec.component) if self.spec.component else self.spec.schema()
        body: dict[str, Any] = {"required": self.required}
        if self.spec.description and not self.spec.component:
            body["description"] = self.spec.description
        body["content"] = {"application/json": {"schema": schema, "example": self.example}}
        return body


@dataclass(frozen=True)
class Operation:
    """One route and method, declared once: only what no rule derives.

    `errors` lists the error statuses the rules cannot see (409, a session route's 403);
    `answers_past_limits` the route's own 429 (or other) answers, with their meaning there.
    """

    method: str
    path: str
    id: str
    summary: str
    answers: dict[str, Answer]
    description: str = ""
    params: tuple[Param, ...] = ()
    body: Body | None = None
    errors: tuple[str, ...] = ()
    answers_past_limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    public: bool = False


def _links(targets: dict[str, tuple[str, str, str]]) -> dict[str, Any]:
    links: dict[str, Any] = {}
    for name, (operation, parameter, answer_field) in targets.items():
        value = f"$response.body#/{answer_field}"
        links[name] = {"operationId": operation, **(
            {"requestBody": {"text": "Go on.", "parent_id": value}} if parameter == "parent_id"
            else {"parameters": {parameter: value}})}
    return links


def _path_ids(path: str) -> list[dict[str, Any]]:
    params = []
    for name in re.findall(r"\{(\w+)\}", path):
        what, example = _PATH_IDS[name]
        params.append({"name": name, "in": "path", "required": True,
                       "description": f"The {what}'s id.",
                       "schema": {"type": "string", "format": "uuid"}, "example": example})
    return params


def _error_codes(op: Operation) -> set[str]:
    """The error statuses the route answers by what it does, plus the ones it declares."""
    codes = set(op.errors)
    if not op.public:
        # NOTE: 400 for any query parameter the route does not document, or a malformed header.
        codes |= {"400", "401", "503"}
    if "{" in op.path:
        codes.add("404")
    if op.body is not None:
        codes |= {"400", "413", "415", "422"}
    if any(op.path.startswith(prefix) for prefix in SCOPED_PREFIXES):
        codes.add("403")
    return codes - set(op.answers_past_limits)


def operation_object(op: Operation) -> dict[str, Any]:
    """Returns the OpenAPI operation object of a declaration."""
    out: dict[str, Any] = {"operationId": op.id, "summary": op.summary}
    if op.description:
        out["description"] = op.description
    if op.public:
        out["security"] = []
    params = _path_ids(op.path) + [param.openapi() for param in op.params]
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = op.body.openapi()
    responses = {code: answer.openapi() for code, answer in op.answers.items()}
    responses.update({code: error_answer(code) for code in _error_codes(op)})
    responses.update(op.answers_past_limits)
    out["responses"] = dict(sorted(responses.items()))
    return out


def request_components(operations: list[Operation]) -> dict[str, Schema]:
    """Every named request declaration the operations' bodies use, nested ones included."""
    found: dict[str, Schema] = {}

    def walk(spec: Spec) -> None:
        if isinstance(spec, Fields):
            if spec.component and spec.component not in found:
                found[spec.component] = spec.schema()
            for child in spec.fields.values():
                walk(child)
        elif isinstance(spec, (Items, OneOrMore)):
            walk(spec.item)

    for op in operations:
        if op.body is not None:
            walk(op.body.spec)
    return found

