"""The Jinja environment chat templates run in: a sandbox that renders what the
templates in the wild expect (as transformers and llama.cpp render them).

- A missing attribute or key is empty, also when chained (`a.b.c`) or added to a
  string: a tool parameter without a `description` must not fail the request.
- A null written out (`{{ message.content }}` of a turn that only calls tools) is
  empty too, not Python's "None" in the prompt; so is a trimmed one (Command R+'s
  `message.content|trim`).
- `{% break %}` / `{% continue %}` and transformers' `{% generation %}` block exist;
  `tojson` takes `indent`, `ensure_ascii`, `separators`, `sort_keys`; `strftime_now`.
- The sandbox stays (a template is untrusted: no access to Python internals). It is
  the mutable one because real templates build lists (`ns.calls.append(..)`): the
  renderer hands it deep copies, so a template can only change its own objects.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import SandboxedEnvironment


class EmptyUndefined(jinja2.ChainableUndefined):
    """Undefined that acts as an empty value in every expression a template may build."""

    __slots__ = ()

    def __add__(self, other: Any) -> Any:
        return other

    def __radd__(self, other: Any) -> Any:
        return other


class GenerationBlock(Extension):
    """transformers' `{% generation %}..{% endgeneration %}`: marks the assistant's
    tokens for training masks; rendering is the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    # Not jinja2's own `tojson`: that one HTML-escapes <, >, & and ' (a prompt is no page).
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=tuple(separators) if separators else None,
        sort_keys=sort_keys,
        default=_undefined_as_null,
    )


def _undefined_as_null(value: Any) -> Any:
    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, Iterator):  # `x | map(..) | tojson`: a generator, as a list
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _none_as_empty(value: Any) -> Any:
    return "" if value is None else value


def _trim(value: Any, chars: str | None = None) -> str:
    return "" if value is None else str(value).strip(chars)


class _Sandbox(SandboxedEnvironment):
    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # Fail loudly rather than render an empty value: the template is hostile.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__} is unsafe")


def make_environment(raise_exception: Callable[[str], None]) -> jinja2.Environment:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=EmptyUndefined,
        finalize=_none_as_empty,
        extensions=["jinja2.ext.loopcontrols", GenerationBlock],
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    env.filters["trim"] = _trim
    return env
