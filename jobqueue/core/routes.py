"""Model routes: which provider (base URL, key, auth style, query, limits) serves which model.

One configuration, read once: `SA_PROVIDER_ROUTES` (JSON text) or `SA_PROVIDER_ROUTES_FILE` (a
JSON file). The `SA_PROVIDER_*` variables make the route named `default`: it serves
`SA_PROVIDER_MODEL`, and every model when no other route is configured (today's behaviour).
Pure: parsing and lookup, no I/O past reading the file.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jobqueue.core.pricing import Prices, parse_prices

__all__ = ["ANY_MODEL", "DEFAULT_ROUTE", "Route", "RouteError", "Routes", "default_routes",
           "load_routes"]

ANY_MODEL = "*"
"""A route listing this model serves every model no other route names."""

DEFAULT_ROUTE = "default"

AuthStyle = Literal["bearer", "api-key"]
_AUTH_STYLES: tuple[AuthStyle, ...] = ("bearer", "api-key")
_KEYS = frozenset({"name", "base_url", "api_key_env", "auth", "query", "models", "stream", "rpm",
                   "tpm", "max_tokens_default", "fallbacks", "prices"})


class RouteError(ValueError):
    """The routes' configuration cannot be used (the message names the route and the field)."""


@dataclass(frozen=True)
class Route:
    """One provider endpoint and the models it serves."""

    name: str
    base_url: str
    api_key: str = field(default="", repr=False)
    auth: AuthStyle = "bearer"
    query: tuple[tuple[str, str], ...] = ()
    models: tuple[str, ...] = (ANY_MODEL,)
    stream: bool = False
    rpm: int = 0
    tpm: int = 0
    fallbacks: tuple[str, ...] = ()
    """Routes a failed call moves the job's next attempt to, in order (jobqueue/core/fallback.py)."""
    prices: Prices | None = None
    """USD per million tokens (jobqueue/core/pricing.py); None: calls cost nothing known."""
    # NOTE: the answer's tokens a call without `max_tokens` reserves (0: 256, token_estimate.py).
    max_tokens_default: int = 0

    @property
    def url(self) -> str:
        """The base URL with the route's query parameters added to its own."""
        if not self.query:
            return self.base_url
        parts = urllib.parse.urlsplit(self.base_url)
        query = "&".join(q for q in (parts.query, urllib.parse.urlencode(self.query)) if q)
        return urllib.parse.urlunsplit(parts._replace(query=query))

    @property
    def headers(self) -> dict[str, str]:
        """The authentication header of the route's style (none without a key)."""
        if not self.api_key:
            return {}
        if self.auth == "api-key":
            return {"api-key": self.api_key}
        return {"Authorization": f"Bearer {self.api_key}"}


@dataclass(frozen=True)
class Routes:
    """Every route, looked up by model name; `default_model` is what a job without one uses."""

    routes: tuple[Route, ...]
    default_model: str

    def for_model(self, model: str | None) -> Route | None:
        """The route serving `model` (None: the default model): an exact name first, then `*`."""
        model = model or self.default_model
        exact = next((r for r in self.routes if model in r.models), None)
        return exact or next((r for r in self.routes if ANY_MODEL in r.models), None)

    def named(self, name: str) -> Route | None:
        """The route called `name`, or None."""
        return next((r for r in self.routes if r.name == name), None)

    @property
    def known_models(self) -> list[str]:
        """Every model named by some route (for error messages)."""
        return sorted({m for r in self.routes for m in r.models if m != ANY_MODEL})

    def __bool__(self) -> bool:
        return bool(self.routes)


def load_routes(env: Mapping[str, str]) -> tuple[Route, ...]:
    """The configured routes (not the default one), from SA_PROVIDER_ROUTES or _FILE.

    Raises:
        RouteError: malformed JSON, an unknown field, a bad value, a duplicate name, or a key
            variable that is not set.
    """
    text, source = env.get("SA_PROVIDER_ROUTES", ""), "SA_PROVIDER_ROUTES"
    path = env.get("SA_PROVIDER_ROUTES_FILE", "")
    if text and path:
        raise RouteError("set SA_PROVIDER_ROUTES or SA_PROVIDER_ROUTES_FILE, not both")
    if path:
        source = f"SA_PROVIDER_ROUTES_FILE ({path})"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise RouteError(f"{source}: cannot read: {exc.strerror}") from None
    if not text:
        return ()
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise RouteError(f"{source}: not JSON: {exc}") from None
    items = data.get("routes") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise RouteError(f'{source}: must be an object {{"routes": [...]}}')
    routes = tuple(_route(item, i, env) for i, item in enumerate(items))
    names = [r.name for r in routes]
    duplicate = next((n for n in names if names.count(n) > 1 or n == DEFAULT_ROUTE), None)
    if duplicate:
        raise RouteError(f"routes: the name {duplicate!r} is taken (`default` is the "
                         "SA_PROVIDER_* route)")
    for route in routes:
        unknown = next((f for f in route.fallbacks
                        if f == route.name or (f not in names and f != DEFAULT_ROUTE)), None)
        if unknown is not None:
            raise RouteError(f"route {route.name!r}: fallbacks names {unknown!r}, which is not "
                             f"another route (known: {', '.join([*names, DEFAULT_ROUTE])})")
    return routes


def default_routes(configured: tuple[Route, ...], base_url: str, api_key: str,
                   default_model: str) -> Routes:
    """Every route: the configured ones, then `default` from SA_PROVIDER_* when its URL is set.

    NOTE: `default` serves every model only when nothing else is configured, so a deployment
    without routes behaves as before and one with routes refuses a model none of them names.
    """
    routes = list(configured)
    if base_url:
        models = (default_model,) if configured else (ANY_MODEL,)
        routes.append(Route(DEFAULT_ROUTE, base_url, api_key, models=models))
    return Routes(tuple(routes), default_model)


def _route(item: Any, index: int, env: Mapping[str, str]) -> Route:
    where = f"routes[{index}]"
    if not isinstance(item, dict):
        raise RouteError(f"{where}: must be an object")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise RouteError(f"{where}.{unknown[0]}: unknown field (allowed: {', '.join(sorted(_KEYS))})")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise RouteError(f"{where}.name: must be a non-empty string")
    where = f"route {name!r}"
    base_url = item.get("base_url")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise RouteError(f"{where}: base_url must be an http(s) URL")
    key_var = item.get("api_key_env", "")
    if not isinstance(key_var, str):
        raise RouteError(f"{where}: api_key_env must be the name of an environment variable")
    if key_var and not env.get(key_var):
        raise RouteError(f"{where}: the key variable {key_var} is not set")
    auth = item.get("auth", "bearer")
    if auth not in _AUTH_STYLES:
        raise RouteError(f"{where}: auth must be one of: {', '.join(_AUTH_STYLES)}")
    query = item.get("query", {})
    if not isinstance(query, dict) or not all(isinstance(v, str) for v in query.values()):
        raise RouteError(f"{where}: query must be an object of strings")
    models = item.get("models", [ANY_MODEL])
    if (not isinstance(models, list) or not models
            or not all(isinstance(m, str) and m for m in models)):
        raise RouteError(f"{where}: models must be a non-empty list of model names (or \"*\")")
    stream = item.get("stream", False)
    if not isinstance(stream, bool):
        raise RouteError(f"{where}: stream must be true or false")
    limits = {}
    for limit in ("rpm", "tpm", "max_tokens_default"):
        value = item.get(limit, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RouteError(f"{where}: {limit} must be an integer >= 0 (0: "
                             f"{'256' if limit == 'max_tokens_default' else 'no limit'})")
        limits[limit] = value
    fallbacks = item.get("fallbacks", [])
    if not isinstance(fallbacks, list) or not all(isinstance(f, str) and f for f in fallbacks):
        raise RouteError(f"{where}: fallbacks must be a list of route names")
    try:
        prices = parse_prices(item.get("prices"), f"{where}: prices")
    except ValueError as exc:
        raise RouteError(str(exc)) from None
    return Route(name, base_url.rstrip("/"), env.get(key_var, "") if key_var else "",
                 auth, tuple(sorted(query.items())), tuple(models), stream, **limits,
                 fallbacks=tuple(fallbacks), prices=prices)
