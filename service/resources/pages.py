"""The mission pages (/mission, /mission/ops) and their static assets, from service/static/.

The files are read once, when the app is built: no path from a request ever reaches the file
system, and an asset name that is not one of them is a 404.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import falcon

__all__ = ["PAGE_CSP", "STATIC_DIR", "Asset", "Page", "load_static"]

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
            "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'")
"""The pages' Content-Security-Policy: their own scripts, styles and API only; nothing inline."""

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


class _File:
    """A static file held in memory with its content type and a strong ETag."""

    def __init__(self, path: Path) -> None:
        self.data = path.read_bytes()
        self.content_type = _TYPES[path.suffix]
        self.etag = hashlib.sha256(self.data).hexdigest()[:32]

    def send(self, req: falcon.Request, resp: falcon.Response) -> None:
        # NOTE: revalidated on every load (no-cache), so a deploy is seen at once; an unchanged
        # file costs a 304.
        resp.cache_control = ["no-cache"]
        resp.etag = self.etag
        resp.set_header("Content-Security-Policy", PAGE_CSP)
        if req.if_none_match and any(tag == self.etag for tag in req.if_none_match):
            resp.status = falcon.HTTP_304
            return
        resp.content_type = self.content_type
        resp.data = self.data


def load_static() -> dict[str, _File]:
    """Reads every file of service/static/ (by name)."""
    return {path.name: _File(path) for path in sorted(STATIC_DIR.iterdir())
            if path.suffix in _TYPES}


class Page:
    """One HTML page; the same bytes for everyone (the data comes from the API, authenticated)."""

    def __init__(self, files: dict[str, _File], name: str) -> None:
        self._file = files[name]

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the page."""
        self._file.send(req, resp)


class Asset:
    """The pages' scripts and styles, by file name."""

    def __init__(self, files: dict[str, _File]) -> None:
        self._files = {name: f for name, f in files.items() if not name.endswith(".html")}

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        """Answers the asset, or 404."""
        found = self._files.get(name)
        if found is None:
            raise falcon.HTTPNotFound()
        found.send(req, resp)
