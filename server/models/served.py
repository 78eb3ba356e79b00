"""The models this process serves: one engine each, found by id or alias."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chat.template import ChatTemplate, TemplateError
from server.errors import ServerError

if TYPE_CHECKING:
    from engine.client import EngineLike, ModelInfo


@dataclass(eq=False)
class ServedModel:
    """One `[[models]]` entry at run time: its names, its engine, its chat template."""

    id: str
    aliases: tuple[str, ...]
    engine: EngineLike
    template_override: str | None = None  # configured Jinja; None: the GGUF's own
    context_overflow: str = "error"  # or "drop_oldest" (server/serving/prepare.py)
    loras: tuple[tuple[str, float], ...] = ()  # configured adapters: (id, default scale)
    on_demand: bool = False  # loaded by its first request, not at start
    idle_unload_s: float = 0.0  # unloaded after this long without requests; 0: never
    path: str = ""  # the configured GGUF ("" for a hub model until it is fetched)
    pulled: bool = False  # a hub-cache model (pulled, or found in the cache): deletable
    in_flight: int = 0  # requests using it now (see server/http/lease.py)
    last_used: float = 0.0  # time.monotonic() of its last request's start or end
    # Set by the keep_alive of a caller who may manage models (server/models/keep_alive.py):
    # idle seconds before an unload, inf for never; None: `idle_unload_s` as configured.
    keep_alive_s: float | None = None
    _template: ChatTemplate | None = None

    @property
    def unload_after_s(self) -> float | None:
        """Idle seconds after which the model is unloaded; None: never."""
        if self.keep_alive_s is None:
            return self.idle_unload_s or None
        return None if self.keep_alive_s == float("inf") else self.keep_alive_s

    @property
    def template(self) -> ChatTemplate:
        """Built on first use: the GGUF's template is known once the model has loaded."""
        if self._template is None:
            info = self.engine.info
            try:
                self._template = ChatTemplate(
                    self.template_override or info.chat_template,
                    bos_token=info.bos_token,
                    eos_token=info.eos_token,
                    add_bos=info.add_bos,
                )
            except TemplateError as exc:
                raise ServerError(str(exc)) from exc
        return self._template


class ModelRegistry:
    """Served models by name; the first one is the default (for /tokenize and the like).

    `patterns`: (glob, served name) pairs, `[model_names] aliases`; `any_with_one`: with
    a single model served, a name nothing else matches means it (`stand_in`)."""

    def __init__(
        self,
        models: list[ServedModel],
        patterns: tuple[tuple[str, str], ...] = (),
        *,
        any_with_one: bool = False,
    ):
        if not models:
            raise ValueError("at least one model is needed")
        self.models = models
        self._by_name: dict[str, ServedModel] = {}
        for model in models:
            for name in (model.id, *model.aliases):
                if name in self._by_name:
                    raise ValueError(f"the model name {name!r} is used twice")
                self._by_name[name] = model
        for pattern, target in patterns:
            if target not in self._by_name:
                raise ValueError(f"the alias pattern {pattern!r} names {target!r}, "
                                 "which no model serves")  # fmt: skip
        self.patterns = patterns
        self.any_with_one = any_with_one
        # Asked when a request names a model not served here: True when it looked for
        # more (server/models/hub_models.py: the hub cache that replicas share), so ask again.
        self.on_miss: Callable[[str], bool] | None = None

    def get(self, name: str) -> ServedModel | None:
        return self._by_name.get(name)

    def find(self, name: str) -> ServedModel | None:
        """The model a request names: `get`, and on a miss, once more after `on_miss`."""
        served = self._by_name.get(name)
        if served is None and self.on_miss is not None and self.on_miss(name):
            served = self._by_name.get(name)
        return served

    def stand_in(self, name: str) -> ServedModel | None:
        """The model that answers a request naming `name`, which no model is called:
        the first `patterns` glob it matches (ignoring case), else, with `any_with_one`
        and a single model served, that one (as llama-server answers any name); else
        None (a 404). Model management (show, copy, delete, load) names models exactly."""
        folded = name.lower()
        for pattern, target in self.patterns:
            if fnmatch.fnmatchcase(folded, pattern.lower()):
                return self._by_name.get(target)
        if self.any_with_one and len(self.models) == 1:
            return self.models[0]
        return None

    # -- models and names added at run time (server/models/hub_models.py, /api/copy) ----------

    def add(self, model: ServedModel) -> None:
        """Serve one more model (a pulled one); its names must be free."""
        taken = [n for n in (model.id, *model.aliases) if n in self._by_name]
        if taken:
            raise ValueError(f"the model name {taken[0]!r} is used twice")
        self.models.append(model)
        for name in (model.id, *model.aliases):
            self._by_name[name] = model

    def remove(self, model: ServedModel) -> None:
        """Stop serving `model` (never the default one), with every name it has."""
        if model is self.default:
            raise ValueError("the default model cannot be removed")
        self.models.remove(model)
        for name in [n for n, m in self._by_name.items() if m is model]:
            del self._by_name[name]

    def alias(self, name: str, model: ServedModel) -> None:
        """`name` names `model` too (an /api/copy); a free name, or one made this way."""
        self.drop_alias(name)
        model.aliases = (*model.aliases, name)
        self._by_name[name] = model

    def drop_alias(self, name: str) -> None:
        model = self._by_name.get(name)
        if model is None:
            return
        if name == model.id:
            raise ValueError(f"{name!r} is a model's id, not an alias")
        model.aliases = tuple(a for a in model.aliases if a != name)
        del self._by_name[name]

    def names(self) -> list[str]:
        return list(self._by_name)

    @property
    def default(self) -> ServedModel:
        return self.models[0]

    @property
    def engines(self) -> list[EngineLike]:
        return [m.engine for m in self.models]

    @property
    def ids(self) -> list[str]:
        return [m.id for m in self.models]

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self.models)


def family_of(info: ModelInfo) -> dict[str, Any]:
    """What the load's probe found (engine/family.py), and what exact reuse recomputes:
    the one view /v1/models, /v1/status, /api/show and the page show."""
    out = info.family.as_dict() if info.family is not None else {}
    out["exact_reuse_rows"] = info.exact_min_rows or None  # None: exact_reuse is off
    out["warm_start_rows"], out["warm_start_why"] = info.warm_tail
    return out


# Which served model a request's name means, in each API's way of naming one. OpenAI's and
# Anthropic's APIs name a configured id or alias exactly (`ModelRegistry.find`); Ollama's
# clients write `name:tag`, lower case. Each API's spec names its rule
# (server/http/apis.py), and a route's model dependency applies it (server/http/lease.py).


def matching_names(models: ModelRegistry, name: str) -> list[str]:
    """The served names an Ollama name means. Tried in order: the name as it is (an id or
    alias, `smollm2:135m` included); without a `:latest` tag (`SmolLM2-135M-Instruct:latest`);
    with `:latest` added (`smollm2` for an alias `smollm2:latest`): the first that is a
    name. Else every name equal to one of those ignoring case (Ollama's names are lower
    case, Hugging Face's are not): more than one when only case tells them apart."""
    base = name.removesuffix(":latest")
    candidates = [name, base, f"{base}:latest"]
    # A miss looks at a shared hub cache again (it walks the cache's directories): once,
    # for the name as given, not once per spelling.
    if models.find(name) is not None:
        return [name]
    for candidate in candidates[1:]:
        if models.get(candidate) is not None:
            return [candidate]
    folded = {c.lower() for c in candidates}
    return [n for n in models.names() if n.lower() in folded]


def resolve_ollama_model(models: ModelRegistry, name: str) -> ServedModel | None:
    """The served model an Ollama name means (`matching_names`' first), or None."""
    names = matching_names(models, name)
    return models.get(names[0]) if names else None


def requested_model(models: ModelRegistry, name: str, *, ollama: bool) -> ServedModel | None:
    """The model that answers a request for a generation (or embeddings, tokens...)
    naming `name`: the one so named (in Ollama's way on its routes), else its stand-in
    (`ModelRegistry.stand_in`); None: a 404. The one rule for every API (the model
    dependency of each route, server/http/lease.py, resolves the name here)."""
    served = resolve_ollama_model(models, name) if ollama else models.find(name)
    return served if served is not None else models.stand_in(name)
