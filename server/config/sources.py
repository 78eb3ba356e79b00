"""Where settings come from: the TOML file's tables, the environment, the flags.

Generic over the section dataclasses (their type hints say what each key is); the
sections themselves, and what makes a value valid, live with their dataclasses."""

from __future__ import annotations

import tomllib
import typing
from collections.abc import Mapping
from typing import Any

from server.config.values import ConfigError, coerce


def hints(cls: type) -> dict[str, Any]:
    """A section's keys and their types (nested tables excluded: read on their own)."""
    return {k: v for k, v in typing.get_type_hints(cls).items() if k not in ("engine", "loras")}


def read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config: file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config: {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None


def table(name: str, values: Any, keys: Mapping[str, Any]) -> dict[str, Any]:
    """A TOML table's values, each checked against its key's type."""
    if not isinstance(values, dict):
        raise ConfigError(f"{name}: expected a table")
    out = {}
    for key, value in values.items():
        if key not in keys:
            raise ConfigError(f"{name}.{key}: unknown key")
        out[key] = coerce(f"{name}.{key}", value, keys[key], from_text=False)
    return out


def model_entries(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, raw table) of each model in the file: [[models]], or [model] shorthand."""
    if "model" in data and "models" in data:
        raise ConfigError("model: use either one [model] table or [[models]] entries, not both")
    if "models" not in data:  # a [model] table, or nothing: the defaults' single model
        return [("model", data.get("model", {}))]
    entries = data["models"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError("models: expected one or more [[models]] tables")
    return [(f"models[{i}]", entry) for i, entry in enumerate(entries)]


def later_values(
    sections: Mapping[str, type],
    env: Mapping[str, str],
    overrides: Mapping[str, Any],
    flag_names: Mapping[str, str],
) -> list[tuple[str, str, str, Any]]:
    """(name to report, section, key, typed value) of what the environment
    (KVSERVE_<SECTION>_<KEY>) and then the flags ("section.key") set, in that order."""
    raw: list[tuple[str, str, str, Any, bool]] = []
    for section, cls in sections.items():
        for key in hints(cls):
            name = f"KVSERVE_{section.upper()}_{key.upper()}"
            if name in env:
                raw.append((name, section, key, env[name], True))
    for dotted, value in overrides.items():
        section, key = dotted.split(".", 1)
        raw.append((flag_names.get(dotted, dotted), section, key, value, isinstance(value, str)))
    return [
        (name, section, key, coerce(name, value, hints(sections[section])[key], from_text=text))
        for name, section, key, value, text in raw
    ]
