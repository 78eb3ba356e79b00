"""One registration per API: each package under server/api/ exports one `ApiSpec` (its
`API`), and server/app.py lists them (`APIS`); the app mounts what each spec names, the
error handler answers in each one's shape, and a route's model dependency
(server/http/lease.py) reads a model's name by the rule of the API the route is of.
Adding an API is its package and one line in that list (docs/architecture.md, "Where
things go")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from server.errors import ErrorBody, ErrorShape
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
    # Its error shape on the paths that start with `prefixes` (middleware answers before
    # any route is found: by path); None: OpenAI's.
    prefixes: tuple[str, ...] = ()
    error_body: ErrorBody | None = None
    model_names: ModelNames = BY_ID  # how its routes' bodies name a model
    # What it mounts beyond its routers (pages, files, the routes open without a key):
    # returns the open routes, which KeyFirst lets through without one.
    mount: Callable[[FastAPI], Sequence[BaseRoute]] | None = None


class Apis:
    """The APIs the app speaks, in the order their routes are mounted."""

    def __init__(self, specs: Sequence[ApiSpec]):
        self.specs = tuple(specs)
        # route path -> its API's rule for model names, where it is not BY_ID: looked up
        # once per request by the route's model dependency (app.py mounts the routers as
        # they are, so a route's path in the app is its path here).
        self.model_names: dict[str, ModelNames] = {
            route.path: spec.model_names
            for spec in self.specs
            if spec.model_names is not BY_ID
            for router in spec.routers
            for route in router.routes
            if isinstance(route, APIRoute)
        }

    def error_shapes(self) -> list[ErrorShape]:
        return [ErrorShape(s.prefixes, s.error_body) for s in self.specs if s.error_body]
