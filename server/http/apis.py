"""One registration per API: each package under server/api/ exports one `ApiSpec` (its
`API`), and server/app.py lists them (`APIS`); the app mounts what each spec names, the
error handler answers in each one's shape, and a route's model dependency
(server/models/lease.py) reads a model's name by its API's rule. Adding an API is its
package and one line in that list (docs/architecture.md, "Where things go")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from fastapi import APIRouter, FastAPI, Request
from starlette.routing import BaseRoute

from server.http.errors import ErrorBody, ErrorShape
from server.models.served import ModelRegistry, ServedModel, requested_model

# The model a request's `model` names, by an API's rule; None: a 404.
ModelNames = Callable[[ModelRegistry, str], ServedModel | None]
# By id or alias, else a stand-in (server/models/served.py): every API but Ollama's.
BY_ID: ModelNames = partial(requested_model, ollama=False)


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """What the app needs of one API package."""

    name: str
    routers: tuple[APIRouter, ...] = ()  # its routes; each takes the API key (KeyFirst)
    # The paths that are this API's (their prefixes), for what differs by API below.
    prefixes: tuple[str, ...] = ()
    error_body: ErrorBody | None = None  # its error shape there; None: OpenAI's
    model_names: ModelNames = BY_ID  # how its bodies name a model there
    # What it mounts beyond its routers (pages, files, the routes open without a key):
    # returns the open routes, which KeyFirst lets through without one.
    mount: Callable[[FastAPI], Sequence[BaseRoute]] | None = None


class Apis:
    """The APIs the app speaks, in the order their routes are mounted."""

    def __init__(self, specs: Sequence[ApiSpec]):
        self.specs = tuple(specs)
        self._owned = [s for s in self.specs if s.prefixes]

    def owner(self, path: str) -> ApiSpec | None:
        """The API whose prefixes `path` starts with (None: the OpenAI-shaped rest)."""
        for spec in self._owned:
            if path.startswith(spec.prefixes):
                return spec
        return None

    def error_shapes(self) -> list[ErrorShape]:
        return [ErrorShape(s.prefixes, s.error_body) for s in self._owned if s.error_body]


def model_names(request: Request) -> ModelNames:
    """The rule for model names of the API the request is for."""
    spec = request.app.state.apis.owner(request.scope["path"])
    return spec.model_names if spec is not None else BY_ID
