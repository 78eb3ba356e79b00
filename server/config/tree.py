"""Configuration: one validated tree, read once at start, handed down frozen.

Precedence, lowest to highest: built-in defaults < TOML file (`--config`) < environment
(`KVSERVE_<SECTION>_<KEY>`, e.g. KVSERVE_SERVER_PORT=9000) < command-line flags.

Sections are plain tables (one frozen dataclass each, listed in `SECTIONS`) plus the
models: `[[models]]` entries, or one `[model]` table as shorthand for a single entry
(server/config/model_entries.py). A model entry may set any `[engine]` key for itself; an
`[engine]` key set by the environment or a flag applies to every model. `[engine]` is
the engine's own `EngineSettings`, `[cache]` the cache's own `CacheConfig` and
`[sessions]` the engine's `SessionLimits`: declared and checked once, there. The
server's own sections state their ranges as pydantic field constraints.
Adding a section: a dataclass, a field on `Settings`, an entry in `SECTIONS`.

Settings flow downwards: a section that one package reads lives here all the same, in a
module of its own named after its concept (`[mcp]` in server/config/mcp.py, `[tracing]`,
`[media]`, `[replay]`, `[responses]`, `[hub]`), and that package imports it from here.
server/config/ imports no other server package, so every one of them may read it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile
import typing
from collections.abc import Mapping
from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from engine.client import CacheConfig, EngineSettings, SessionLimits
from server.config.hub import HubSection
from server.config.mask import masked
from server.config.mcp import McpSection, McpServerSection, mcp_servers, validate_mcp
from server.config.media import MediaSection
from server.config.model_entries import (
    LoraSection,
    ModelNamesSection,
    ModelSection,
    chat_template_source,
    check_models,
    default_model_path,
    hub_source,
    lora_source,
)
from server.config.replay import ReplaySection
from server.config.responses import ResponsesSection
from server.config.sources import hints, later_values, model_entries, read_toml, table
from server.config.tracing import TracingSection
from server.config.values import ConfigError

LOG_LEVELS = ("debug", "info", "warning", "error")
AUTO_DISK_DIR = "auto"  # [cache] disk_dir: the user's cache directory (cache/types.py)
Seconds = Annotated[float, Field(gt=0)]
NotNegative = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=0)]


def _origins(values: tuple[str, ...]) -> tuple[str, ...]:
    """CORS origins as browsers send them ("scheme://host[:port]", no path), or "*": an
    origin with a path or a trailing slash would match nothing, silently."""
    for origin in values:
        scheme, sep, rest = origin.partition("://")
        if origin != "*" and (not sep or scheme not in ("http", "https") or not rest
                              or "/" in rest):  # fmt: skip
            raise PydanticCustomError(
                "origin",
                "{origin} is not an origin such as 'https://app.example:3000' (or '*')",
                {"origin": repr(origin)},
            )
    return values


def _hosts(values: tuple[str, ...]) -> tuple[str, ...]:
    for host in values:
        if not host.strip() or any(c in host for c in "/@ "):
            raise PydanticCustomError(
                "host",
                "{host} is not a host name such as 'kvserve.internal' (or '*')",
                {"host": repr(host)},
            )
    return values


def _header_names(names: tuple[str, ...]) -> tuple[str, ...]:
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9-]+", name):
            raise PydanticCustomError("header", "{name} is not an HTTP header name",
                                      {"name": repr(name)})  # fmt: skip
    return names


@dataclass(frozen=True)
class ServerSection:
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080  # 0 (tests): a free port
    # Browser pages of these origins may call the server (CORS) and send it requests
    # that change something; empty: CORS off, only the server's own page (OriginGuard,
    # server/http/middleware.py).
    cors_origins: Annotated[tuple[str, ...], AfterValidator(_origins)] = ()
    # Host names a request arriving on a loopback address may name besides the loopback
    # ones (DNS rebinding, OriginGuard in server/http/middleware.py); "*": any.
    allowed_hosts: Annotated[tuple[str, ...], AfterValidator(_hosts)] = ()
    max_body_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024
    # Request bodies held at once, all connections together (server/http/bodies.py);
    # past it a new body is refused with 503 before it is read.
    max_body_bytes_total: Annotated[int, Field(ge=1024)] = 256 * 1024 * 1024
    shutdown_grace_s: NotNegative = 30.0  # SIGTERM: in-flight requests get this long to finish
    max_connections: Count = 0  # open connections; 0: the open-file limit less 64
    header_timeout_s: Seconds = 10.0  # a request head must arrive whole this soon
    body_timeout_s: Seconds = 30.0  # a request body must arrive whole this soon after its head
    keep_alive_s: Seconds = 5.0  # an idle connection between requests is closed after this
    # The headers that name a sticky session, the first one present wins. kvserve's own
    # name is one no client sends for its own purposes (opencode sends its own
    # x-session-id on every request); add "X-Session-Id" to keep older clients' header.
    session_headers: Annotated[tuple[str, ...], AfterValidator(_header_names)] = (
        "X-Kvserve-Session",
    )
    # Who may pull, delete, copy, load and unload models (server/http/management.py): "auto"
    # (with keys: an admin key; without: only on a loopback-bound server), "on" (without
    # keys: anyone), "off" (no one).
    model_management: Literal["auto", "on", "off"] = "auto"


@dataclass(frozen=True)
class AuthSection:
    api_keys: tuple[str, ...] = ()  # empty (and no admin keys): no authentication
    admin_api_keys: tuple[str, ...] = ()  # also accepted; see the whole cache, purge it

    @functools.cached_property
    def enabled(self) -> bool:
        # Cached as all_keys is: every request's caller reads it (server/http/deps.py).
        return bool(self.api_keys or self.admin_api_keys)

    @functools.cached_property
    def all_keys(self) -> tuple[str, ...]:
        # Cached: every request checks its key against these (the section is frozen).
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
class LoadingSection:
    """On-demand loads and unloads of the models (see server/models/loader.py)."""

    memory_budget_bytes: Count = 0  # weights + KV of loaded models; 0: no budget
    wait_s: Seconds = 120.0  # how long a request waits for its model to load, then 503


@dataclasses.dataclass(frozen=True)
class Settings:
    server: ServerSection = field(default_factory=ServerSection)
    engine: EngineSettings = field(default_factory=EngineSettings)
    models: tuple[ModelSection, ...] = (ModelSection(),)
    model_names: ModelNamesSection = field(default_factory=ModelNamesSection)
    cache: CacheConfig = field(default_factory=lambda: CacheConfig(disk_dir=AUTO_DISK_DIR))
    hub: HubSection = field(default_factory=HubSection)
    loading: LoadingSection = field(default_factory=LoadingSection)
    sessions: SessionLimits = field(default_factory=SessionLimits)
    responses: ResponsesSection = field(default_factory=ResponsesSection)
    replay: ReplaySection = field(default_factory=ReplaySection)
    media: MediaSection = field(default_factory=MediaSection)
    auth: AuthSection = field(default_factory=AuthSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    tracing: TracingSection = field(default_factory=TracingSection)
    mcp: McpSection = field(default_factory=McpSection)
    mcp_servers: tuple[McpServerSection, ...] = ()  # [[mcp_servers]] entries

    def masked(self) -> dict[str, Any]:
        """The effective settings for --print-config: secrets masked (every credential
        the tree holds, server/config/mask.py), paths resolved."""
        data = dataclasses.asdict(self)
        for entry, model in zip(data["models"], self.models, strict=True):
            entry["path"] = model.model_path or None
        data["cache"]["disk_dir"] = self.cache.disk_path
        for entry in data["mcp_servers"]:
            entry.pop("tenants", None)  # digests of API keys
            entry["headers"] = dict(entry["headers"])  # shown as the table it was written as
        return masked(data)


# The plain-table sections: name -> dataclass (the field of the same name on Settings).
SECTIONS: dict[str, type] = {
    "server": ServerSection,
    "engine": EngineSettings,
    "cache": CacheConfig,
    "hub": HubSection,
    "loading": LoadingSection,
    "sessions": SessionLimits,
    "responses": ResponsesSection,
    "replay": ReplaySection,
    "media": MediaSection,
    "model_names": ModelNamesSection,
    "auth": AuthSection,
    "metrics": MetricsSection,
    "logging": LoggingSection,
    "tracing": TracingSection,
    "mcp": McpSection,
}


def section(label: str, default: Any, values: Mapping[str, Any]) -> Any:
    """`default` with `values` set: the section's own checks name the key under `label`."""
    try:
        return dataclasses.replace(default, **values)
    except ValidationError as exc:  # a server section's field constraints
        error = exc.errors()[0]
        key = str(error["loc"][0])
        raise ConfigError(f"{label}.{key}: {_rule(error, type(default), key)}") from None
    except ValueError as exc:  # the engine's and the cache's "<key>: <rule>"
        raise ConfigError(f"{label}.{exc}") from None


def _rule(error: Any, cls: type, key: str) -> str:
    """A field constraint's error in the words of the engine's and the cache's checks."""
    bound = error.get("ctx", {})
    if error["type"] == "greater_than_equal":
        return "must not be negative" if bound["ge"] == 0 else f"must be at least {bound['ge']}"
    if error["type"] == "greater_than":
        return f"must be above {bound['gt']}"
    if error["type"] == "less_than_equal":
        return f"must be at most {bound['le']}"
    if error["type"] == "literal_error":
        return "one of " + ", ".join(typing.get_args(typing.get_type_hints(cls)[key]))
    return str(error["msg"])


def load_settings(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flag_names: Mapping[str, str] | None = None,
) -> Settings:
    """Build the settings. `overrides` maps "section.key" (or "model.key") to flag values;
    `flag_names` maps the same keys to the flags' names for error messages."""
    data = read_toml(path) if path else {}
    for name in data:
        if name not in SECTIONS and name not in ("model", "models", "mcp_servers"):
            raise ConfigError(f"{name}: unknown section")
    values = {name: table(name, data.get(name, {}), hints(cls)) for name, cls in SECTIONS.items()}
    model_keys = {**hints(ModelSection), **hints(EngineSettings)}
    entries = []
    for label, raw in model_entries(data):
        loras = raw.pop("loras", []) if isinstance(raw, dict) else []
        entry = table(label, raw, model_keys)
        entry["loras"] = _loras(label, loras)
        entries.append((label, entry))

    # The environment, then the flags: they beat the file, and an engine key set here
    # applies to every model; a model key needs a single model to know which one.
    forced_engine: dict[str, Any] = {}
    environ = os.environ if env is None else env
    for name, where, key, value in later_values(
        {**SECTIONS, "model": ModelSection}, environ, overrides or {}, flag_names or {}
    ):
        if where == "model":
            if len(entries) != 1:
                raise ConfigError(f"{name}: only with a single model; set it in [[models]]")
            entries[0][1][key] = value
        else:
            values[where][key] = value
            if where == "engine":
                forced_engine[key] = value

    defaults = Settings()
    sections = {name: section(name, getattr(defaults, name), values[name]) for name in SECTIONS}
    models = [_model(label, entry, values["engine"], forced_engine) for label, entry in entries]
    servers = mcp_servers(data.get("mcp_servers"))
    settings = Settings(models=tuple(models), mcp_servers=servers, **sections)
    _validate(settings, [label for label, _ in entries])
    return settings


def _loras(label: str, tables: Any) -> tuple[LoraSection, ...]:
    if not isinstance(tables, list):
        raise ConfigError(f"{label}.loras: expected [[{label.split('[')[0]}.loras]] tables")
    out = []
    for j, raw in enumerate(tables):
        key = f"{label}.loras[{j}]"
        values = table(key, raw, hints(LoraSection))
        if not values.get("id"):
            raise ConfigError(f"{key}.id: required")
        if bool(values.get("path")) == bool(values.get("hf_repo")):
            raise ConfigError(f"{key}.path: give either path or hf_repo")
        out.append(LoraSection(**values))
    return tuple(out)


def _model(
    label: str, entry: dict[str, Any], engine_file: dict[str, Any], forced: dict[str, Any]
) -> ModelSection:
    """A model's entry: its own keys, and its engine (the file's [engine], its own
    engine keys, then those the environment or a flag set)."""
    if entry.get("hf_repo") and "id" not in entry:  # named after its repository
        entry["id"] = entry["hf_repo"].partition(":")[0]
    model_keys = {f.name for f in dataclasses.fields(ModelSection)} - {"engine"}
    own = {k: v for k, v in entry.items() if k not in model_keys}
    engine = section(label, EngineSettings(), {**engine_file, **own, **forced})
    return section(label, ModelSection(engine=engine),
                   {k: v for k, v in entry.items() if k in model_keys})  # fmt: skip


def _validate(s: Settings, labels: list[str]) -> None:
    """What no one section can check on its own."""
    if s.server.port == 0:  # a free port is for tests that build ServerSection themselves
        raise ConfigError("server.port: must be at least 1")
    for key in ("level", "llama_level"):
        if getattr(s.logging, key).lower() not in LOG_LEVELS:
            raise ConfigError(f"logging.{key}: one of {', '.join(LOG_LEVELS)}")
    path = s.cache.disk_path
    if path and os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"cache.disk_dir: not a directory: {path}")
    if s.server.max_body_bytes_total < s.server.max_body_bytes:
        raise ConfigError("server.max_body_bytes_total: must be at least server.max_body_bytes")
    check_models(labels, s.models, s.hub)
    s.model_names.check(s.models)
    validate_mcp(s.mcp)


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


__all__ = [
    "SECTIONS",
    "AuthSection",
    "ConfigError",
    "HubSection",
    "LoadingSection",
    "LoggingSection",
    "LoraSection",
    "MediaSection",
    "MetricsSection",
    "ModelNamesSection",
    "ModelSection",
    "ResponsesSection",
    "ServerSection",
    "Settings",
    "TracingSection",
    "chat_template_source",
    "default_model_path",
    "disk_dir_problem",
    "hub_source",
    "lora_source",
    "load_settings",
]
