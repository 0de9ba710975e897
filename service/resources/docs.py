"""GET /docs (the API reference, rendered once from the app's OpenAPI document) and its stylesheet."""

from __future__ import annotations

from typing import Any

import falcon

from service.apidocs.render import STYLESHEET, render_docs
from service.middleware_security import PAGE_CSP

__all__ = ["DOCS_PATH", "STYLESHEET_PATH", "ApiDocs", "ApiDocsStylesheet"]

DOCS_PATH = "/docs"
STYLESHEET_PATH = "/docs/docs.css"


class ApiDocs:
    """The reference page; public, like the document it renders."""

    content_security_policy = PAGE_CSP

    def __init__(self, document: dict[str, Any]) -> None:
        self._page = render_docs(document, STYLESHEET_PATH).encode()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the page."""
        resp.content_type = falcon.MEDIA_HTML
        resp.data = self._page


class ApiDocsStylesheet:
    """The page's stylesheet, shipped in the package (service/apidocs/docs.css)."""

    content_security_policy = PAGE_CSP

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the stylesheet; browsers may keep it an hour."""
        resp.content_type = "text/css; charset=utf-8"
        resp.cache_control = ["public", "max-age=3600"]
        resp.data = STYLESHEET
