"""Ollama's `keep_alive`: how long a model stays loaded once idle, and who may change it.

The value, as Ollama reads it: a Go duration ("5m", "1h30m") or seconds; negative keeps
the model loaded for good, 0 unloads it once idle. It is parsed with the request body
(a bad one is a 400 naming `keep_alive`, before anything loads or runs).

A model is loaded once for every caller, so how long it stays is server-wide: the
operator's `idle_unload_s` (0: never unloaded), or what a manager set. Setting it is
model management (server/http/management.py, which checks it with the caller's other
rights): a caller who may manage models sets it with any request (until a manager sets
it again; 0 lasts until the unload it asks for, then the configured value is back). Any
other caller's keep_alive must ask for what the model does now (a client that always
sends the server's own value works); one that would change it is a 403 naming the field,
so one tenant's `0` cannot make every tenant reload and a negative value cannot outlast
the operator's `idle_unload_s`. A request without keep_alive changes nothing (Ollama
would restore its default: on a shared server one tenant's request must not undo the
operator's or an admin's choice).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import PlainValidator

from server.errors import BadRequest

if TYPE_CHECKING:
    from server.models.served import ServedModel

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
          "h": 3600.0}  # fmt: skip
# One way to match each number (`\d+\.?\d*` split a run of digits every way: a long
# string without a unit took minutes to refuse).
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_keep_alive(value: Any) -> float | None:
    """Seconds to keep the model loaded once idle (inf: for ever); None if not given.
    As Ollama reads it: a number is seconds; a string is a Go duration (or whole
    seconds); negative: for ever."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadRequest("'keep_alive' must be a duration such as \"5m\" or a number of "
                         "seconds", param="keep_alive")  # fmt: skip
    if isinstance(value, str):
        seconds = _go_duration(value.strip())
    elif isinstance(value, float) and math.isnan(value):
        raise BadRequest("'keep_alive' must be a number", param="keep_alive")
    else:
        seconds = _whole_seconds(value)
    return math.inf if seconds < 0 or seconds > LONGEST_S else seconds


# The longest duration Ollama's Go server can hold (an int64 of nanoseconds, ~292 years):
# anything longer keeps the model for ever, as there. Kept finite past it, an expiry date
# (`/api/ps`) or a timer would overflow the clock's range (3e103 s was a 500).
LONGEST_S = (2**63 - 1) / 1e9


def _whole_seconds(value: int | float) -> float:
    """A number of seconds, whole, as a float. A JSON integer has no bound: one past a
    float's range (`1` and 400 zeros; float() and math's functions raise OverflowError
    on it) means for ever, as `1e400` (read as inf) does."""
    if isinstance(value, float):
        return value if math.isinf(value) else float(int(value))
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _go_duration(text: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body.isascii() and body.isdigit():
        # Bare seconds, as Ollama's OLLAMA_KEEP_ALIVE takes them ("-1", "300"); float()
        # of a string has no digit limit and reads one past its range as inf.
        return sign * float(body)
    total, at = 0.0, 0
    while at < len(body):  # each part where the last ended: linear in the text
        match = _PART.match(body, at)
        if match is None:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        at = match.end()
    if not body or at != len(body):
        raise BadRequest(f"'keep_alive' {text!r} is not a duration (such as \"5m\", \"1h30m\" "
                         "or \"-1\")", param="keep_alive")  # fmt: skip
    return sign * total


# A request body's field: parsed as the body is (its 400 before the route's model
# dependency loads anything); seconds, inf for ever, None when absent.
KeepAlive = Annotated[
    float | None, PlainValidator(parse_keep_alive, json_schema_input_type=str | float | None)
]


def residency(seconds: float) -> float | None:
    """A keep_alive as the model's `unload_after_s` (None: never unloaded)."""
    return None if math.isinf(seconds) else seconds


def describe(after_s: float | None) -> str:
    if after_s is None:
        return "kept loaded"
    if after_s == 0:
        return "unloaded once idle"
    return f"unloaded after {after_s:g} s idle"


def apply_keep_alive(served: ServedModel, seconds: float | None) -> None:
    """Set how long `served` stays loaded once idle (after check_keep_alive, once the
    request has passed every other check); None leaves it as it is."""
    if seconds is not None:
        served.keep_alive_s = seconds
