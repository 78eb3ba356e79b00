"""A Responses request's `tools` -> the tools the model sees, and how its calls are named
back (server/api/responses/output.py).

- `function`: as it is.
- `custom` (free-form input, e.g. Codex's `apply_patch`): shown to the model as a function
  with one string parameter, `input`, whose value is the tool's input; its call comes
  back as a `custom_tool_call` item with that string as `input`. A `grammar` format
  (`syntax` "lark" or "regex") is converted (chat/lark.py) when the request is read, so
  that a grammar kvserve cannot take is a 400 naming it, described to the model in the
  parameter, and carried on the Tool (`grammar`): every call format's grammar holds the
  string to it (chat/callformat.py `json_arguments`, the XML format's raw text).
- `namespace` (Codex's groups of tools: `{name, description, tools: [function | custom]}`):
  each member is shown as `<namespace>__<name>`; its call comes back as a `function_call`
  (or `custom_tool_call`) with `name` and `namespace` apart, as the Responses API writes it.
- Codex 0.171 may send its tools not in `tools` but in an `additional_tools` input item
  (`{"type": "additional_tools", "role": "developer", "tools": [...]}`): they are read
  the same way, named `input[i].tools[j]` in errors.
- Hosted tools kvserve cannot run (web search, file search, code interpreter, ...): left
  out of what the model sees, with a log line; a `tool_choice` naming one is a 400.
- `mcp`: run by the server (server/api/responses/mcp.py), skipped here.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from chat.gbnf import RuleSet
from chat.lark import tool_input_gbnf
from chat.textgrammar import TextGrammarError
from chat.tools import INPUT, InputGrammar, Tool
from server.errors import BadRequest, Unsupported

log = logging.getLogger("kvserve.server")

# Tools OpenAI runs on its side (or the client runs with a fixed schema kvserve's models
# were not trained on): nothing here can run them, so the model does not see them.
HOSTED = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
    "file_search", "code_interpreter", "image_generation", "computer_use_preview",
    "computer_use", "local_shell", "shell", "apply_patch", "tool_search",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class ToolNames:
    """What a model-visible tool name stands for in the Responses API's items."""

    custom: frozenset[str] = frozenset()
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> (ns, name)
    fields: tuple[str, ...] = ()  # where each tool the model sees is in the request

    def visible(self, name: str, namespace: str | None) -> str:
        """The name the model knows a (namespaced) function by."""
        return name if not namespace else namespaced_name(namespace, name)


def namespaced_name(namespace: str, name: str) -> str:
    """`<namespace>__<name>` (Codex's own flat form of an MCP tool's name), kept to the
    64 characters a function name may have by a hash of what is cut."""
    full = f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"
    if len(full) <= 64:
        return full
    return f"{full[:55]}_{hashlib.sha256(full.encode()).hexdigest()[:8]}"


def custom_parameters(description: str) -> dict[str, Any]:
    return {"type": "object", "properties": {INPUT: {"type": "string", "description": description}},
            "required": [INPUT], "additionalProperties": False}  # fmt: skip


def custom_arguments(text: str) -> str:
    """A custom tool's input as the arguments of the function the model sees."""
    return json.dumps({INPUT: text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """The input of a custom tool's call, from the arguments the model wrote."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value[INPUT] if isinstance(value, dict) and isinstance(value.get(INPUT), str) else (
        arguments)  # fmt: skip


def _string(tool: dict[str, Any], key: str, where: str, required: bool = True) -> str:
    value = tool.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"'{where}.{key}' must be a string", param=f"{where}.{key}")
    return value


def _function(tool: dict[str, Any], where: str, name: str | None = None) -> Tool:
    parameters = tool.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict | bool):
        raise BadRequest(f"'{where}.parameters' must be a JSON schema object",
                         param=f"{where}.parameters")  # fmt: skip
    if tool.get("strict") not in (None, True, False):
        raise BadRequest(f"'{where}.strict' must be a boolean", param=f"{where}.strict")
    return Tool(name or _string(tool, "name", where), _string(tool, "description", where, False),
                parameters)  # fmt: skip


def _custom(tool: dict[str, Any], where: str, name: str | None = None) -> Tool:
    name = name or _string(tool, "name", where)
    described = "The tool's whole input, as free text."
    grammar = None
    fmt = tool.get("format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") in ("text", "grammar")):
        raise BadRequest(f"'{where}.format.type' must be 'text' or 'grammar'",
                         param=f"{where}.format.type")  # fmt: skip
    if fmt is not None and fmt["type"] == "grammar":
        syntax = _string(fmt, "syntax", f"{where}.format")
        definition = _string(fmt, "definition", f"{where}.format")
        if syntax not in ("lark", "regex"):
            raise Unsupported(f"{where}.format.syntax", "only 'lark' and 'regex' grammars")
        try:  # converted once here so that a grammar kvserve cannot take is this 400
            tool_input_gbnf(syntax, definition, RuleSet(), "c-")
        except TextGrammarError as exc:
            raise BadRequest(str(exc), param=f"{where}.format.definition") from None
        described += f" It must be a sentence of this {syntax} grammar:\n{definition}"
        grammar = InputGrammar(syntax, definition)
    return Tool(name, _string(tool, "description", where, False), custom_parameters(described),
                grammar)  # fmt: skip


def request_tools(
    tools: list[dict[str, Any]] | None, items: str | list[dict[str, Any]]
) -> list[tuple[str, Any]]:
    """Every tool of a request, with the field that holds it: `tools`, then those of
    `additional_tools` input items."""
    out: list[tuple[str, Any]] = [(f"tools[{i}]", t) for i, t in enumerate(tools or [])]
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            more = item.get("tools")
            if not isinstance(more, list):
                raise BadRequest(f"'input[{i}].tools' must be a list", param=f"input[{i}].tools")
            out += [(f"input[{i}].tools[{j}]", t) for j, t in enumerate(more)]
    return out


def response_tools(entries: list[tuple[str, Any]]) -> tuple[tuple[Tool, ...], ToolNames]:
    """The tools the model sees, and what their names stand for."""
    tools: list[Tool] = []
    custom: set[str] = set()
    namespaced: dict[str, tuple[str, str]] = {}
    fields: list[str] = []
    for where, tool in entries:
        if not isinstance(tool, dict):
            raise BadRequest(f"'{where}' must be a tool object", param=where)
        kind = tool.get("type")
        if kind in ("function", "custom"):
            tools.append(_function(tool, where) if kind == "function" else _custom(tool, where))
            fields.append(where)
            if kind == "custom":
                custom.add(tools[-1].name)
        elif kind == "namespace":
            namespace = _string(tool, "name", where)
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise BadRequest(f"'{where}.tools' must be a list", param=f"{where}.tools")
            for j, member in enumerate(inner):
                at = f"{where}.tools[{j}]"
                kind = member.get("type") if isinstance(member, dict) else None
                if kind not in ("function", "custom"):
                    raise Unsupported(f"{at}.type", "a namespace holds function and custom "
                                      "tools only")  # fmt: skip
                name = namespaced_name(namespace, _string(member, "name", at))
                tools.append(_function(member, at, name) if kind == "function"
                             else _custom(member, at, name))  # fmt: skip
                namespaced[name] = (namespace, member["name"])
                fields.append(at)
                if kind == "custom":
                    custom.add(name)
        elif kind in HOSTED:
            log.info("responses: %s (a '%s' tool) left out: kvserve cannot run it", where, kind)
        elif kind != "mcp":
            if isinstance(kind, str):
                raise Unsupported(f"{where}.type", f"'{kind}' tools are not available; only "
                                  "function, custom, namespace and mcp")  # fmt: skip
            raise BadRequest(f"'{where}.type' is required", param=f"{where}.type")
    return tuple(tools), ToolNames(frozenset(custom), namespaced, tuple(fields))
