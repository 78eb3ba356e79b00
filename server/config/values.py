"""Typed config values: TOML values and environment text checked against a field's type."""

from __future__ import annotations

import math
import re
import typing
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)


class ConfigError(ValueError):
    """A configuration problem, reported as one line naming the key."""


def coerce(key: str, value: Any, annotation: Any, *, from_text: bool) -> Any:
    """`value` as `annotation` (bool, int, float, str, tuple[str, ...]), or ConfigError.

    The type only: ranges and choices are checked where each section declares them.

    `from_text`: the value is environment text ("8", "true", "a,b"), not a TOML value."""
    if annotation is bool:
        return _bool(key, value, from_text)
    if annotation is int:
        return _int(key, value, from_text)
    if annotation is float:
        return _float(key, value, from_text)
    if annotation is str or typing.get_origin(annotation) is typing.Literal:
        if isinstance(value, str):  # a Literal's values: checked by its section
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if typing.get_origin(annotation) is tuple:
        if from_text:
            return tuple(v.strip() for v in str(value).split(",") if v.strip())
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
    raise ConfigError(f"{key}: unsupported setting type {annotation!r}")


def _bool(key: str, value: Any, from_text: bool) -> bool:
    if from_text:
        lowered = str(value).strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    elif isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _int(key: str, value: Any, from_text: bool) -> int:
    if from_text:
        try:
            return int(str(value).strip())
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: expected an integer, got {value!r}")


def _float(key: str, value: Any, from_text: bool) -> float:
    if from_text:
        try:
            number = float(str(value).strip())
        except ValueError:
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if not math.isfinite(number):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return number
