"""The constraint fields of the other popular servers, on Chat Completions and Completions:
vLLM's `guided_json`, `guided_choice`, `guided_regex`, `guided_grammar` and its newer
`structured_outputs: {json | regex | choice | grammar | json_object}`, SGLang's `regex`
and `ebnf`. Each becomes the grammar kvserve already builds (docs/tools.md, "Constraint
fields of other servers"):

- a JSON schema (`guided_json`, `structured_outputs.json`; `json_object`): exactly
  `response_format` json_schema (json_object), so with tools it is the document beside
  the calls;
- a choice: the output is exactly one of the strings;
- a regex (chat/regex.py `regex_to_gbnf`): the whole output matches it, as vLLM's does;
- a grammar (`guided_grammar`, `structured_outputs.grammar`, SGLang's `ebnf`) is read as
  GBNF: xgrammar's EBNF, which both vLLM and SGLang use by default, is llama.cpp's GBNF
  (`root ::= ...`); a grammar GBNF cannot read (Lark's `start: ...`, ISO EBNF) is a 400
  naming the field.

One constraint per request: a second one (another of these, `response_format`, kvserve's
`grammar`, or a grammar beside tools) is a 400 naming it. The hints
(`guided_whitespace_pattern`, `guided_decoding_backend`, `structured_outputs`'
`whitespace_pattern` and `disable_*`) change nothing here: accepted and logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, PrivateAttr

from chat.gbnf import literal
from chat.gbnf_read import GbnfError, parse_gbnf
from chat.regex import PatternError, regex_to_gbnf
from chat.schema import SchemaError, check_schema, json_object_gbnf, schema_to_gbnf
from server.api.common import RequestModel
from server.errors import BadRequest, Unsupported

log = logging.getLogger("kvserve.server")

GrammarText = Annotated[str, Field(max_length=256 * 1024)]  # as kvserve's own `grammar`
Choices = Annotated[
    list[Annotated[str, Field(max_length=4096)]], Field(min_length=1, max_length=1024)
]
Schema = dict[str, Any] | bool | str  # vLLM also takes the schema as JSON text
_HINTS = ("whitespace_pattern", "disable_any_whitespace", "disable_additional_properties",
          "disable_fallback")  # fmt: skip


class StructuredOutputs(RequestModel):
    """vLLM's `structured_outputs` (StructuredOutputsParams): one of its constraints."""

    json_: Schema | None = Field(default=None, alias="json")
    regex: GrammarText | None = None
    choice: Choices | None = None
    grammar: GrammarText | None = None
    json_object: bool | None = None


@dataclass(frozen=True, slots=True)
class Constraint:
    param: str  # the field as the client named it
    gbnf: str  # the complete grammar
    schema: Any = None  # for a JSON constraint: the schema (chat: the response_format path)


class ConstraintFields(RequestModel):
    """The fields, and the one constraint they set (`constraint`, read when the request
    is parsed by `read_constraint`)."""

    guided_json: Schema | None = None
    guided_choice: Choices | None = None
    guided_regex: GrammarText | None = None
    guided_grammar: GrammarText | None = None
    guided_whitespace_pattern: str | None = None  # a hint
    guided_decoding_backend: str | None = None  # a hint
    structured_outputs: StructuredOutputs | None = None
    regex: GrammarText | None = None  # SGLang
    ebnf: GrammarText | None = None  # SGLang
    _constraint: Constraint | None = PrivateAttr(default=None)

    @property
    def constraint(self) -> Constraint | None:
        return self._constraint

    def read_constraint(self, set_before: Sequence[tuple[str, bool]]) -> None:
        """Read the other servers' fields into `constraint`. `set_before`: the API's own
        constraint fields, in order, and whether each is set; any field set after
        another is refused, naming it."""
        fields = self._fields()
        taken = [name for name, is_set in set_before if is_set]
        if taken and fields:
            raise _second(fields[0][0], taken[0])
        if len(fields) > 1:
            raise _second(fields[1][0], fields[0][0])
        self._log_hints()
        if fields:
            self._constraint = _convert(*fields[0])

    def _fields(self) -> list[tuple[str, Any]]:
        out = [(name, getattr(self, name)) for name in
               ("guided_json", "guided_choice", "guided_regex", "guided_grammar")]  # fmt: skip
        so = self.structured_outputs
        if so is not None:
            if so.model_extra and "structural_tag" in so.model_extra:
                raise Unsupported(
                    "structured_outputs.structural_tag",
                    "structural tags are not implemented; tools with tool_choice constrain calls",
                )
            json_object = {"type": "object"} if so.json_object else None
            out += [
                (f"structured_outputs.{name}", value)
                for name, value in (("json", so.json_), ("json_object", json_object),
                    ("regex", so.regex), ("choice", so.choice), ("grammar", so.grammar))
            ]  # fmt: skip
        out += [("regex", self.regex), ("ebnf", self.ebnf)]
        return [(name, value) for name, value in out if value is not None]

    def _log_hints(self) -> None:
        hints = {name: getattr(self, name) for name in
                 ("guided_whitespace_pattern", "guided_decoding_backend")}  # fmt: skip
        if self.structured_outputs and self.structured_outputs.model_extra:
            extra = self.structured_outputs.model_extra
            hints |= {f"structured_outputs.{k}": extra[k] for k in _HINTS if k in extra}
        hints = {k: v for k, v in hints.items() if v is not None}
        if hints:
            log.info("constraint hints accepted, no effect here: %s", sorted(hints))


def _second(param: str, first: str) -> BadRequest:
    return BadRequest(f"'{param}' cannot be combined with '{first}': one constraint per "
                      "request", param=param)  # fmt: skip


def _convert(param: str, value: Any) -> Constraint:
    """The grammar of one field's value; a value it cannot be is a 400 naming the field."""
    kind = param.rsplit(".", 1)[-1].removeprefix("guided_")
    try:
        if kind == "json_object":
            return Constraint(param, json_object_gbnf(), {"type": "object"})
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            check_schema(schema)
            return Constraint(param, schema_to_gbnf(schema), schema)
        if kind == "choice":
            return Constraint(param, "root ::= " + " | ".join(map(literal, value)) + "\n")
        if kind == "regex":
            return Constraint(param, regex_to_gbnf(value))
        parse_gbnf(value)  # a grammar (guided_grammar, structured_outputs.grammar, ebnf)
        return Constraint(param, value)
    except (SchemaError, PatternError, GbnfError, ValueError) as exc:  # ValueError: bad JSON
        what = {"json": "a JSON schema", "regex": "a regex kvserve reads"}.get(kind, "GBNF")
        raise BadRequest(f"'{param}' is not {what}: {exc}", param=param) from None
