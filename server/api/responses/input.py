"""A Responses-API request -> chat messages, tools and options for the serving core.

Input items map onto chat turns: `message` items (text parts) -> system/user/assistant
turns, consecutive `function_call` items -> one assistant turn's tool calls,
`function_call_output` -> a tool turn. `reasoning` items sent back are dropped (chat
templates do not render past reasoning either). Anything else is refused, naming it.
"""

from __future__ import annotations

from typing import Any

from chat.plan import ChatOptions
from chat.tools import Tool, tool_choice
from server.api.responses.protocol import ResponsesRequest
from server.http.errors import BadRequest, Unsupported

_TEXT_PARTS = ("input_text", "output_text", "text")


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
            continue
        if kind not in _TEXT_PARTS:
            if isinstance(kind, str):
                raise Unsupported(f"{at}.type", f"content parts of type '{kind}' are not "
                                  "supported; only text")  # fmt: skip
            raise BadRequest(f"'{at}' must be a content part with a 'type'", param=f"{at}.type")
        if not isinstance(part.get("text"), str):
            raise BadRequest(f"'{at}.text' must be a string", param=f"{at}.text")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'{where}.{key}' must be a non-empty string", param=f"{where}.{key}")
    return value


def input_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """This request's `input` as chat messages."""
    if isinstance(body.input, str):
        if not body.input:
            raise BadRequest("'input' must not be empty", param="input")
        return [{"role": "user", "content": body.input}]
    if not body.input:
        raise BadRequest("'input' must not be empty", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(body.input):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"'{where}.role' must be one of user, system, developer, "
                                 "assistant", param=f"{where}.role")  # fmt: skip
            if "content" not in item:
                raise BadRequest(f"'{where}.content' is required", param=f"{where}.content")
            text = _text_of(item["content"], f"{where}.content")
            out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function", "function": {
                "name": _string(item, "name", where), "arguments": item.get("arguments", "")}}
            if not isinstance(call["function"]["arguments"], str):  # type: ignore[index]
                raise BadRequest(f"'{where}.arguments' must be a string",
                                 param=f"{where}.arguments")  # fmt: skip
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            output = _text_of(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind in ("reasoning", "mcp_list_tools", "mcp_approval_response"):
            continue  # (approval responses: read by server/api/responses/mcp.py)
        elif kind in ("mcp_call", "mcp_approval_request"):
            out += mcp_history(item, where)
        elif isinstance(kind, str):
            raise Unsupported(f"{where}.type", f"input items of type '{kind}' are not supported")
        else:
            raise BadRequest(f"'{where}' needs a 'type' (or a 'role')", param=f"{where}.type")
    return out


def mcp_history(item: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """An MCP item sent back as input: the call (and, for an `mcp_call`, its result)."""
    call_id = _string(item, "id", where)
    arguments = item.get("arguments", "{}")
    if not isinstance(arguments, str):
        raise BadRequest(f"'{where}.arguments' must be a string", param=f"{where}.arguments")
    turns: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": _string(item, "name", where), "arguments": arguments}}]}]
    if item["type"] == "mcp_call":
        error = item.get("error")
        result = item.get("output") if error is None else f"Error: {error}"
        turns.append({"role": "tool", "tool_call_id": call_id, "content": str(result or "")})
    return turns


def response_tools(body: ResponsesRequest) -> tuple[Tool, ...]:
    """The function tools (`mcp` entries are the MCP loop's: server/api/responses/mcp.py)."""
    tools = []
    for i, tool in enumerate(body.tools or []):
        where = f"tools[{i}]"
        kind = tool.get("type")
        if kind == "mcp":
            continue
        if kind != "function":
            if isinstance(kind, str):
                raise Unsupported(f"{where}.type", f"'{kind}' tools are not available; "
                                  "only 'function' and 'mcp'")  # fmt: skip
            raise BadRequest(f"'{where}.type' is required", param=f"{where}.type")
        name = tool.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"'{where}.name' must be a string", param=f"{where}.name")
        description = tool.get("description") or ""
        if not isinstance(description, str):
            raise BadRequest(f"'{where}.description' must be a string",
                             param=f"{where}.description")  # fmt: skip
        parameters = tool.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict | bool):
            raise BadRequest(f"'{where}.parameters' must be a JSON schema object",
                             param=f"{where}.parameters")  # fmt: skip
        if tool.get("strict") not in (None, True, False):
            raise BadRequest(f"'{where}.strict' must be a boolean", param=f"{where}.strict")
        tools.append(Tool(name, description, parameters))
    return tuple(tools)


def response_options(body: ResponsesRequest) -> ChatOptions:
    fmt = body.text.format if body.text and body.text.format else None
    if fmt is not None and fmt.type == "json_schema" and fmt.schema_ is None:
        raise BadRequest("a json_schema format needs 'schema'", param="text.format.schema")
    return ChatOptions(
        tools=response_tools(body),
        tool_choice=tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=fmt.type if fmt else "text",
        json_schema=fmt.schema_ if fmt else None,
    )


def chat_param(param: str | None) -> str | None:
    """A chat-layer field name as this API spells it."""
    if param is None:
        return None
    if param.startswith("messages"):  # a rendering error: the conversation as a whole
        return "input"
    param = param.replace(".function.", ".").replace("response_format.json_schema.schema",
                                                     "text.format.schema")  # fmt: skip
    return param.replace("response_format", "text.format")
