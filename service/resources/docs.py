"""GET /docs (the API reference, rendered once from the app's OpenAPI document) and its stylesheet."""

from __future__ import annotations

from typing import Any

import falcon

from service.apidocs.render import STYLESHEET, render_docs

__all__ = ["DOCS_CSP", "DOCS_PATH", "STYLESHEET_PATH", "ApiDocs", "ApiDocsStylesheet"]

DOCS_PATH = "/docs"
STYLESHEET_PATH = "/docs/docs.css"

DOCS_CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'none'; base-uri 'none'; "
            "frame-ancestors 'none'")
"""The reference's Content-Security-Policy: its own stylesheet, no script at all, nothing inline.
SecurityHeadersMiddleware keeps a policy a resource set; the API's answers keep `default-src 'none'`."""


class ApiDocs:
    """The reference page; public, like the document it renders."""

    def __init__(self, document: dict[str, Any]) -> None:
        self._page = render_docs(document, STYLESHEET_PATH).encode()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the page."""
        resp.content_type = falcon.MEDIA_HTML
        resp.set_header("Content-Security-Policy", DOCS_CSP)
        resp.data = self._page


class ApiDocsStylesheet:
    """The page's stylesheet, shipped in the package (service/apidocs/docs.css)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the stylesheet; browsers may keep it an hour."""
        resp.content_type = "text/css; charset=utf-8"
        resp.cache_control = ["public", "max-age=3600"]
        resp.set_header("Content-Security-Policy", DOCS_CSP)
        resp.data = STYLESHEET
