"""GET /openai/v1/models and /models/{model}: the models sa-core's routes serve."""

from __future__ import annotations

import falcon

from jobqueue.core.openai_wire import Body
from jobqueue.core.routes import Routes
from service.openai.errors import not_found

__all__ = ["ModelItem", "Models", "model_list"]


def model_list(routes: Routes) -> list[Body]:
    """Every model a route names, the default model first, each owned by its route.

    NOTE: a route serving every model (`*`) can list only the names configured; `created` is 0
    as sa-core does not know when a provider published a model.
    """
    names = [routes.default_model] + [m for m in routes.known_models if m != routes.default_model]
    models = []
    for name in names:
        route = routes.for_model(name)
        if route is not None:
            models.append({"id": name, "object": "model", "created": 0, "owned_by": route.name})
    return models


class Models:
    """The model list."""

    def __init__(self, routes: Routes) -> None:
        self._models = model_list(routes)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers OpenAI's model list."""
        resp.media = {"object": "list", "data": self._models}


class ModelItem:
    """One model."""

    def __init__(self, routes: Routes) -> None:
        self._models = {m["id"]: m for m in model_list(routes)}

    def on_get(self, req: falcon.Request, resp: falcon.Response, model: str) -> None:
        """Answers the model, or 404 when no route names it."""
        found = self._models.get(model)
        if found is None:
            raise not_found("model", model, "model")
        resp.media = found
