"""Prices of model routes and the cost of a call: pure arithmetic, no I/O.

A route's `prices` (SA_PROVIDER_ROUTES) is either one price for every model it serves,
`{"input": 2.5, "output": 10}`, or a price per model, `{"gpt-4o": {"input": 2.5, "output": 10},
"*": {...}}` (`*`: the models not named). Prices are USD per million tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["PER_TOKENS", "Price", "Prices", "call_cost", "parse_prices"]

PER_TOKENS = 1_000_000
"""Prices are per this many tokens."""

_DIRECTIONS = ("input", "output")


@dataclass(frozen=True)
class Price:
    """USD per million tokens sent (`input`) and received (`output`)."""

    input: float
    output: float


@dataclass(frozen=True)
class Prices:
    """A route's prices: one for the route, or one per model (`*` for the others)."""

    route: Price | None = None
    models: tuple[tuple[str, Price], ...] = ()

    def for_model(self, model: str) -> Price | None:
        """The price of `model` on this route: its own, else `*`'s, else the route's."""
        named = dict(self.models)
        return named.get(model) or named.get("*") or self.route


def call_cost(price: Price | None, tokens_in: int | None, tokens_out: int | None) -> float | None:
    """The USD a call cost at `price`.

    Returns:
        The cost, or None when the route has no price or the provider reported no tokens (an
        unknown cost is not a zero one).
    """
    if price is None or (tokens_in is None and tokens_out is None):
        return None
    return ((tokens_in or 0) * price.input + (tokens_out or 0) * price.output) / PER_TOKENS


def _price(value: Any, where: str) -> Price:
    if not isinstance(value, dict) or set(value) != set(_DIRECTIONS):
        raise ValueError(f"{where} must be {{\"input\": USD, \"output\": USD}} per 1M tokens")
    for direction in _DIRECTIONS:
        figure = value[direction]
        if (isinstance(figure, bool) or not isinstance(figure, int | float)
                or not math.isfinite(figure) or figure < 0):
            raise ValueError(f"{where}.{direction} must be a number >= 0 (USD per 1M tokens)")
    return Price(float(value["input"]), float(value["output"]))


def parse_prices(value: Any, where: str) -> Prices | None:
    """Reads a route's `prices` field (None when absent).

    Args:
        value: the field's JSON value.
        where: how to name the field in an error (`route 'azure': prices`).

    Raises:
        ValueError: neither one price nor an object of prices per model; a figure is not a
            number >= 0.
    """
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{where} must be an object: {{\"input\", \"output\"}} or prices per model")
    if set(value) <= set(_DIRECTIONS) and not any(isinstance(v, dict) for v in value.values()):
        return Prices(route=_price(value, where))
    return Prices(models=tuple(sorted((model, _price(price, f"{where}.{model}"))
                                      for model, price in value.items())))
