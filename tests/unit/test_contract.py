"""Unit tests of the request contract: the patterns the document publishes accept exactly what the
validators accept, and the document is complete enough to drive Schemathesis' stateful phase and
the rendered /docs (links that resolve, an example for every request and answer)."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from typing import Any

import pytest

from jobqueue.core.policy import ErrorKind
from jobqueue.core.settings import Settings
from jobqueue.core.states import JobState
from service.openapi.document import build_openapi
from service.schema import BLANK_CHARACTERS, SINCE_PATTERN, TEXT_PATTERN, Text

__all__: list[str] = []

DOCUMENT = build_openapi(Settings(database_url="", direct_database_url="", provider_url="",
                                  provider_api_key="", provider_model=""))
OPERATIONS = [(path, method, operation) for path, item in DOCUMENT["paths"].items()
              for method, operation in item.items()]
SINCE_RE = re.compile(SINCE_PATTERN)


def _is_date(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("year", [0, 1, 4, 100, 400, 800, 1900, 1996, 2000, 2023, 2024, 2100, 9996, 9999])
def test_since_pattern_allows_exactly_the_real_days_of_a_year(year: int) -> None:
    for month in range(0, 14):
        for day in range(0, 33):
            text = f"{year:04d}-{month:02d}-{day:02d}"
            assert bool(SINCE_RE.fullmatch(text)) == _is_date(text), text


def test_since_pattern_refuses_year_zero_and_every_day_of_a_leap_cycle_parses() -> None:
    assert not SINCE_RE.fullmatch("0000-01-01")
    day = date(2000, 1, 1)
    while day < date(2401, 1, 1):
        assert SINCE_RE.fullmatch(day.isoformat()), day
        day += timedelta(days=97)


def test_blank_characters_are_exactly_what_str_strip_drops() -> None:
    blank = re.compile(f"[{BLANK_CHARACTERS}]")
    for code in range(0x10000):
        char = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue
        assert bool(blank.fullmatch(char)) == char.isspace(), hex(code)


@pytest.mark.parametrize("text", ["", " ", "\x1c\t", "\u3000", "a", " a ", "a\x00", "\x00",
                                  "\ufeff", "\u200bx", "line\nline", "\x85 b"])
def test_text_pattern_accepts_what_the_text_check_accepts(text: str) -> None:
    spec = Text(100)
    try:
        spec.check(text, "text")
        accepted = True
    except Exception:
        accepted = False
    assert bool(re.fullmatch(TEXT_PATTERN, text)) == accepted, repr(text)


def test_enums_come_from_the_state_and_error_kind_types() -> None:
    schemas = DOCUMENT["components"]["schemas"]
    assert schemas["Job"]["properties"]["state"]["enum"] == [s.value for s in JobState]
    kinds = schemas["Job"]["properties"]["error_kind"]["anyOf"][0]["enum"]
    assert kinds == [k.value for k in ErrorKind]


def test_links_name_real_operations_and_their_parameters() -> None:
    by_id = {operation["operationId"]: operation for _, _, operation in OPERATIONS}
    linked = set()
    for _, _, operation in OPERATIONS:
        for answer in operation["responses"].values():
            for link in answer.get("links", {}).values():
                target = by_id[link["operationId"]]
                names = {p["name"] for p in target.get("parameters", [])}
                assert set(link.get("parameters", {})) <= names, link
                linked.add(link["operationId"])
    assert {"getJob", "cancelJob", "getPrompt", "retryPrompt", "submitPrompt"} <= linked
    submitted = by_id["submitPrompt"]["responses"]["202"]["links"]
    assert {link["operationId"] for link in submitted.values()} >= {
        "getJob", "cancelJob", "getPrompt", "retryPrompt"}


@pytest.mark.parametrize(("path", "method", "operation"), OPERATIONS,
                         ids=[f"{m} {p}" for p, m, _ in OPERATIONS])
def test_every_request_and_answer_has_an_example(path: str, method: str,
                                                 operation: dict[str, Any]) -> None:
    for parameter in operation.get("parameters", []):
        assert "example" in parameter, parameter["name"]
    for media in operation.get("requestBody", {}).get("content", {}).values():
        assert "example" in media
    for code, answer in operation["responses"].items():
        for media in answer.get("content", {}).values():
            assert "example" in media, code


def test_every_operation_documents_its_errors_as_json_title_and_description() -> None:
    for path, method, operation in OPERATIONS:
        secured = operation.get("security", DOCUMENT["security"]) != []
        codes = set(operation["responses"])
        assert not secured or "401" in codes, (method, path)
        for code, answer in operation["responses"].items():
            if code.startswith(("4", "5")):
                assert answer["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"}, (method, path, code)
