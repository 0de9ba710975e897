"""The OpenAI chat request's translation to a job (pure) and the answer shapes built from a job."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from jobqueue.core.chat import MAX_MESSAGES, ChatInvalid, parse_chat
from jobqueue.core.openai_wire import (
    BATCH_ID_PREFIX,
    JobAnswer,
    chat_chunk,
    chat_completion,
    job_failure,
    object_id,
    parse_object_id,
)
from jobqueue.core.settings import Settings, SettingsError

USER = [{"role": "user", "content": "hi"}]


def _parse(**body: Any) -> Any:
    return parse_chat({"model": "m", "messages": USER, **body}, 100)


def test_mapped_fields_become_options_and_messages_stay_as_given() -> None:
    request = _parse(temperature=1, top_p=0.5, max_completion_tokens=9, stop="x", seed=3,
                     response_format={"type": "json_object"}, frequency_penalty=-1, n=1,
                     stream=True, stream_options={"include_usage": True}, store=True,
                     logprobs=False, user=None)
    assert request.options == {
        "model": "m", "messages": USER, "depth": 0, "temperature": 1.0, "top_p": 0.5,
        "max_tokens": 9, "stop": ["x"], "seed": 3, "response_format": {"type": "json_object"},
        "frequency_penalty": -1.0}
    assert (request.text, request.stream, request.include_usage) == ("hi", True, True)


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": []}, "tools"),
    ({"user": "u1"}, "user"),
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"store": False}, "store"),
    ({"temperature": 3}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5, "max_completion_tokens": 5}, "max_completion_tokens"),
    ({"stop": ["a"] * 5}, "stop"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "a\x00b"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{}]}]},
     "messages[0].tool_calls"),
    ({"messages": [{"role": "user", "content": "x" * 101}]}, "messages[0].content"),
    ({"messages": USER * (MAX_MESSAGES + 1)}, "messages"),
    ({"model": ""}, "model"),
    ({"wat": 1}, "wat"),
])
def test_a_field_sa_core_cannot_honour_is_refused_by_name(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ChatInvalid) as refused:
        _parse(**body)
    assert refused.value.param == param


def test_a_batch_line_cannot_stream() -> None:
    with pytest.raises(ChatInvalid, match="batch"):
        parse_chat({"model": "m", "messages": USER, "stream": True}, 100, batch=True)


def _answer(**fields: Any) -> JobAnswer:
    base: dict[str, Any] = {
        "job_id": uuid.UUID(int=1), "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        "state": "succeeded", "model": "m", "max_tokens": None, "response_text": "ok",
        "tokens_in": 2, "tokens_out": 3, "error_kind": None, "error_message": None}
    return JobAnswer(**{**base, **fields})


def test_a_completion_and_its_chunks_name_the_job() -> None:
    body = chat_completion(_answer())
    assert body["id"] == "chatcmpl-" + uuid.UUID(int=1).hex
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert chat_completion(_answer(max_tokens=3))["choices"][0]["finish_reason"] == "length"
    usage = chat_chunk(_answer(), None, include_usage=True, usage={"total_tokens": 5})
    assert usage["choices"] == [] and usage["usage"] == {"total_tokens": 5}
    assert "usage" not in chat_chunk(_answer(), {"content": "o"})


@pytest.mark.parametrize(("state", "kind", "status"), [
    ("failed", "provider_4xx", 400), ("failed", "rate_limit", 429), ("failed", "timeout", 502),
    ("cancelled", None, 409)])
def test_a_job_that_did_not_succeed_answers_its_status(state: str, kind: str | None,
                                                      status: int) -> None:
    answered, body = job_failure(_answer(state=state, error_kind=kind, error_message="why"))
    assert answered == status and set(body["error"]) == {"message", "type", "param", "code"}


def test_ids_round_trip_and_anything_else_is_none() -> None:
    value = uuid.uuid4()
    assert parse_object_id(BATCH_ID_PREFIX, object_id(BATCH_ID_PREFIX, value)) == value
    for bad in ("batch_xyz", "file-" + value.hex, "batch_" + value.hex.upper(), ""):
        assert parse_object_id(BATCH_ID_PREFIX, bad) is None


@pytest.mark.parametrize(("name", "value"), [
    ("SA_OPENAI_MAX_WAIT", "61"), ("SA_BATCH_PRIORITY", "59"), ("SA_BATCH_PRIORITY", "91"),
    ("SA_BATCH_WINDOW", "0"), ("SA_FILE_MAX_REQUESTS", "0")])
def test_the_front_doors_settings_are_checked(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({"DATABASE_URL": "postgresql:///x", name: value})
    with pytest.raises(SettingsError, match="SA_ORG_MAX_FILE_BYTES"):
        Settings.from_env({"DATABASE_URL": "postgresql:///x", "SA_ORG_MAX_FILE_BYTES": "10",
                           "SA_FILE_MAX_BYTES": "20"})
