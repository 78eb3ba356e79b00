"""Secrets out of `--print-config`: one walk over the whole settings tree, so that a new
setting is masked by the same rules without anyone remembering to.

- a key named like a secret (`api_keys`, `token`, `password`, `secret`, `credentials`,
  not `..._env`, which names a variable) has its values shown as "***";
- `headers` show their names only (their values are auth tokens);
- in every string, a URL's credentials (`redis://user:***@host`, `https://***@host`)
  and secret-looking query parameters (`?password=***`, `&access_token=***`);
- in a command line (a stdio MCP server's `command` and `args`), the value of an option
  or a variable whose name looks like a secret (`--api-key ***`, `GITHUB_TOKEN=***`).
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
_SECRET_KEY = re.compile(r"(?:^|_)(?:api_?keys?|token|secrets?|passwords?|passwd|credentials?)$")
_COMMAND_KEYS = ("command", "args")
_SECRET_WORD = r"[\w-]*(?:token|secret|password|passwd|pwd|api[-_]?key|credential|auth)[\w-]*"
_USERINFO = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)(?P<info>[^/?#@\s]*)@", re.IGNORECASE)
_QUERY = re.compile(rf"(?P<name>[?&;](?:{_SECRET_WORD}|key|sig|signature)=)[^&#\s]*", re.IGNORECASE)
_ASSIGNED = re.compile(rf"(?P<name>(?:^|(?<=[\s,]))-{{0,2}}{_SECRET_WORD}[=\s]\s*)[^\s,]+",
                       re.IGNORECASE)  # fmt: skip
_FLAG = re.compile(rf"^-{{1,2}}{_SECRET_WORD}$", re.IGNORECASE)


def mask_text(text: str) -> str:
    """`text` with the credentials it may carry masked (the module docstring's rules)."""

    def userinfo(match: re.Match[str]) -> str:
        user, sep, _ = match["info"].partition(":")
        return match["scheme"] + (f"{user}:{MASK}@" if sep else f"{MASK}@")

    text = _USERINFO.sub(userinfo, text)
    return _QUERY.sub(lambda m: m["name"] + MASK, text)


def mask_command(text: str) -> str:
    """A command line with `--token x`, `--token=x` and `TOKEN=x` masked as well."""
    return _ASSIGNED.sub(lambda m: m["name"] + MASK, mask_text(text))


def _masked_args(items: list[Any]) -> list[Any]:
    """A program's arguments: each masked as a command line, and the one after an option
    such as `--token` too."""
    out: list[Any] = []
    for i, item in enumerate(items):
        follows_flag = i > 0 and isinstance(items[i - 1], str) and _FLAG.match(items[i - 1])
        out.append(MASK if follows_flag else mask_command(item) if isinstance(item, str) else item)
    return out


def _secret_values(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [MASK] * len(value)
    return MASK if value else value


def _headers(value: Any) -> Any:
    """Header names kept, values masked: "name=value" strings, a name -> value table, or
    (name, value) pairs."""
    if isinstance(value, dict):
        return dict.fromkeys(value, MASK)
    shown: list[Any] = []
    for entry in value or ():
        if isinstance(entry, str):
            shown.append(entry.partition("=")[0] + "=" + MASK)
        elif isinstance(entry, list | tuple) and entry:
            shown.append([entry[0], MASK])
    return shown


def masked(value: Any, key: str = "") -> Any:
    """`value` (the settings as `dataclasses.asdict` gives them) with every secret masked."""
    if key == "headers":
        return _headers(value)
    if isinstance(value, dict):
        return {k: masked(v, str(k)) for k, v in value.items()}
    if _SECRET_KEY.search(key.lower()) and not key.endswith("_env"):
        return _secret_values(value)
    if key in _COMMAND_KEYS:
        return _masked_args(list(value)) if isinstance(value, list | tuple) else mask_command(value)
    if isinstance(value, list | tuple):
        return [masked(item) for item in value]
    if isinstance(value, str):
        return mask_text(value)
    return value
