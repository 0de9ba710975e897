"""The Files API: POST /files (multipart, purpose=batch), GET /files, GET and DELETE /files/{id},
GET /files/{id}/content. Uploads stream to storage; downloads stream from it."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import falcon
import falcon.media.multipart
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.errors import InvalidInput, NotFound
from jobqueue.core.openai_wire import FILE_ID_PREFIX, Body, object_id, parse_object_id, unix
from jobqueue.core.settings import Settings
from jobqueue.engine import files
from service.middleware_security import BodyTimeout, body_deadline
from service.openai.errors import OpenAIError, bad_request, not_found

__all__ = ["FileCollection", "FileContent", "FileItem", "file_object", "parse_file_id"]

PURPOSES = ("batch",)
EXPIRES_MIN, EXPIRES_MAX = 3600, 30 * 86400
"""OpenAI's bounds on `expires_after[seconds]`."""

LIST_LIMIT_MAX = 10_000
_FORM_OVERHEAD = 64 * 1024
"""Bytes a multipart body may hold besides the file (boundaries, headers, small fields)."""

_FIELD = re.compile(r"expires_after\[(anchor|seconds)\]")


def file_object(row: dict[str, Any]) -> Body:
    """OpenAI's file object."""
    return {"id": object_id(FILE_ID_PREFIX, row["id"]), "object": "file", "bytes": row["bytes"],
            "created_at": unix(row["created_at"]), "expires_at": unix(row["expires_at"]),
            "filename": row["filename"], "purpose": row["purpose"], "status": "processed",
            "status_details": None}


def parse_file_id(text: str) -> uuid.UUID:
    """The file behind an id in a path.

    Raises:
        OpenAIError: 404 for anything that is not one of our file ids.
    """
    found = parse_object_id(FILE_ID_PREFIX, text)
    if found is None:
        raise not_found("File object", text)
    return found


def _get(pool: ConnectionPool[DictConnection], req: falcon.Request, file_id: str) -> Body:
    try:
        return files.get_file(pool, req.context.caller, parse_file_id(file_id))
    except NotFound:
        raise not_found("File object", file_id) from None


class FileCollection:
    """Uploads (streamed to storage) and the org's list of files."""

    streams_body = True
    """RequestLimitsMiddleware leaves the body to this route, which streams it."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings) -> None:
        self._pool = pool
        self._settings = settings
        self._limits = files.FileLimits(max_bytes=settings.file_max_bytes,
                                        max_lines=settings.file_max_requests,
                                        org_max_bytes=settings.org_max_file_bytes,
                                        timeout=settings.file_upload_timeout)
        self._uploads = threading.BoundedSemaphore(settings.file_max_uploads)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Stores the form's `file` (JSONL) for `purpose=batch`; fields must come before it.

        Raises:
            OpenAIError: 400 for a bad form, 413 past the size bound, 408 past the upload time,
                429 when the process already takes SA_FILE_MAX_UPLOADS uploads.
        """
        media_type, _ = falcon.parse_header(req.content_type or "")
        if media_type != falcon.MEDIA_MULTIPART:
            raise OpenAIError(415, "upload the file as multipart/form-data", param="file")
        if (req.content_length or 0) > self._limits.max_bytes + _FORM_OVERHEAD:
            raise OpenAIError(413, f"a file may hold at most {self._limits.max_bytes} bytes",
                              code="file_too_large", param="file")
        if not self._uploads.acquire(blocking=False):
            raise OpenAIError(429, "too many uploads in progress here (SA_FILE_MAX_UPLOADS); "
                              "retry shortly", "rate_limit_error", "too_many_uploads",
                              headers={"Retry-After": "5"})
        try:
            with body_deadline(self._limits.timeout, req.env):
                row = self._upload(req)
        except BodyTimeout:
            raise OpenAIError(408, f"the file did not arrive within {self._limits.timeout:g} s "
                              "(SA_FILE_UPLOAD_TIMEOUT)", code="upload_timeout") from None
        except files.FileTooLarge as exc:
            raise OpenAIError(413, exc.description, code="file_too_large", param="file") from None
        except InvalidInput as exc:
            raise bad_request(exc.description, "file") from None
        finally:
            self._uploads.release()
        resp.media = file_object(row)

    def _upload(self, req: falcon.Request) -> dict[str, Any]:
        form: falcon.media.multipart.MultipartForm = req.get_media()
        parts = iter(form)
        fields: dict[str, str] = {}
        for part in parts:
            name = part.name or ""
            if name != "file":
                if name != "purpose" and not _FIELD.fullmatch(name):
                    raise bad_request(f"unknown form field {name!r}", name, "unknown_parameter")
                fields[name] = (part.get_text() or "").strip()
                continue
            purpose = fields.get("purpose")
            if purpose is None:
                raise bad_request("send `purpose` before `file` in the form", "purpose",
                                  "missing_required_parameter")
            if purpose not in PURPOSES:
                raise bad_request("purpose must be batch: sa-core stores files for the Batch "
                                  "API", "purpose")
            filename = (part.filename or "upload.jsonl").strip()[:255] or "upload.jsonl"
            return files.store_file(self._pool, req.context.caller, part.stream.read,
                                    filename=filename, purpose=purpose, ttl=self._ttl(fields),
                                    limits=self._limits, check_end=lambda: _no_more(parts))
        raise bad_request("the form holds no `file`", "file", "missing_required_parameter")

    def _ttl(self, fields: dict[str, str]) -> float:
        anchor, seconds = fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]")
        if anchor is None and seconds is None:
            return self._settings.file_ttl
        if anchor != "created_at":
            raise bad_request("expires_after[anchor] must be created_at", "expires_after.anchor")
        if seconds is None or not seconds.isdigit() or not EXPIRES_MIN <= int(seconds) <= EXPIRES_MAX:
            raise bad_request(f"expires_after[seconds] must be an integer from {EXPIRES_MIN} to "
                              f"{EXPIRES_MAX}", "expires_after.seconds")
        return float(seconds)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """A page of the org's files (`purpose`, `limit` up to 10,000, `after`, `order`)."""
        unknown = sorted(set(req.params) - {"purpose", "limit", "after", "order"})
        if unknown:
            raise bad_request(f"unknown query parameter {unknown[0]!r}", unknown[0],
                              "unknown_parameter")
        limit = _limit(req, LIST_LIMIT_MAX, LIST_LIMIT_MAX)
        order = req.get_param("order") or "desc"
        if order not in ("asc", "desc"):
            raise bad_request("order must be asc or desc", "order")
        after = req.get_param("after")
        try:
            rows, more = files.list_files(
                self._pool, req.context.caller, purpose=req.get_param("purpose"), limit=limit,
                after=None if after is None else parse_file_id(after), descending=order == "desc")
        except NotFound:
            raise bad_request(f"after: no file {after}", "after") from None
        data = [file_object(row) for row in rows]
        resp.media = {"object": "list", "data": data, "has_more": more,
                      "first_id": data[0]["id"] if data else None,
                      "last_id": data[-1]["id"] if data else None}


def _no_more(parts: Iterator[Any]) -> None:
    """Reads the form to its end: nothing may follow the file, and a form cut short (its closing
    boundary missing) raises Falcon's MultipartParseError, so a truncated file is never kept."""
    for part in parts:
        raise bad_request("`file` must be the form's last field", part.name)


def _limit(req: falcon.Request, default: int, high: int) -> int:
    raw = req.get_param("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= high:
        raise bad_request(f"limit must be an integer from 1 to {high}", "limit")
    return int(raw)


class FileItem:
    """One file: its object, or its deletion."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response, file_id: str) -> None:
        """The file object; 404 for another org's or a missing one."""
        resp.media = file_object(_get(self._pool, req, file_id))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, file_id: str) -> None:
        """Deletes the file and its bytes."""
        try:
            files.delete_file(self._pool, req.context.caller, parse_file_id(file_id))
        except NotFound:
            raise not_found("File object", file_id) from None
        resp.media = {"id": file_id, "object": "file", "deleted": True}


class FileContent:
    """A file's bytes, streamed piece by piece."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response, file_id: str) -> None:
        """The file's content (JSONL), its length known up front."""
        row = _get(self._pool, req, file_id)
        resp.content_type = "application/octet-stream"
        resp.downloadable_as = row["filename"]
        resp.content_length = row["bytes"]
        resp.stream = _pieces(self._pool, row["id"])


def _pieces(pool: ConnectionPool[DictConnection], file_id: uuid.UUID) -> Iterator[bytes]:
    yield from files.read_chunks(pool, file_id)
