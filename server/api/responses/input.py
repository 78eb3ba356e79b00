"""A Responses-API request -> chat messages, tools and options for the serving core.

Input items map onto chat turns: `message` items (text parts; a user message's
`input_image` parts where they are, read by server/serving/media.py) -> system/user/assistant
turns, consecutive `function_call` / `custom_tool_call` items -> one assistant turn's
tool calls (a custom tool's input as its `input` argument, a namespaced function under
the name the model knows it by: server/api/responses/tools.py), `function_call_output` /
`custom_tool_call_output` -> a tool turn. A `reasoning` item sent back with kvserve's
`encrypted_content` (server/api/responses/sealed.py) gives the next assistant turn its
`reasoning_content`; without one it is dropped (its `content` and `summary` are the
client's copy, not restored). Anything else is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chat.plan import ChatOptions
from chat.reasoning import effort_kwargs
from chat.tools import Tool, tool_choice
from server.api.responses.protocol import HostedChoice, ResponsesRequest
from server.api.responses.tools import ToolNames, custom_arguments
from server.errors import BadRequest, Unsupported
from server.serving.media import chat_part, image_from_url

# A reasoning item's encrypted_content (and its field name) -> its text, or None to drop it.
Unseal = Callable[[object, str], str | None]

_TEXT_PARTS = ("input_text", "output_text", "text")


def _text_of(content: Any, where: str, images: bool = False) -> Any:
    """The text of a content: a string, or its text parts joined; with `images` (a user
    message), one with `input_image` parts is kept as parts, text and images in order."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or a list of content parts", param=where)
    texts = []
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
            continue
        if kind == "input_image" and images:
            parts += [{"type": "text", "text": "".join(texts)}] if texts else []
            parts.append(_input_image(part, at))
            texts = []
            continue
        if kind not in _TEXT_PARTS:
            if isinstance(kind, str):
                raise Unsupported(f"{at}.type", f"content parts of type '{kind}' are not "
                                  "supported; only text")  # fmt: skip
            raise BadRequest(f"'{at}' must be a content part with a 'type'", param=f"{at}.type")
        if not isinstance(part.get("text"), str):
            raise BadRequest(f"'{at}.text' must be a string", param=f"{at}.text")
        texts.append(part["text"])
    if not parts:
        return "".join(texts)
    return parts + ([{"type": "text", "text": "".join(texts)}] if texts else [])


def _input_image(part: dict[str, Any], at: str) -> dict[str, Any]:
    """An `input_image` part: `image_url` (a data: or http(s) URL); `detail` a hint."""
    if part.get("file_id") is not None:
        raise Unsupported(f"{at}.file_id", "files are not stored here; send the image as "
                          "a data: URL in 'image_url'")  # fmt: skip
    return chat_part(image_from_url(part.get("image_url"), f"{at}.image_url",
                                    part.get("detail")))  # fmt: skip


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'{where}.{key}' must be a non-empty string", param=f"{where}.{key}")
    return value


def input_messages(
    body: ResponsesRequest, unseal: Unseal | None = None, names: ToolNames | None = None
) -> list[dict[str, Any]]:
    """This request's `input` as chat messages."""
    if isinstance(body.input, str):
        if not body.input:
            raise BadRequest("'input' must not be empty", param="input")
        return [{"role": "user", "content": body.input}]
    if not body.input:
        raise BadRequest("'input' must not be empty", param="input")
    names = names or ToolNames()
    out: list[dict[str, Any]] = []
    reasoning: list[str] = []  # restored reasoning, for the next assistant turn
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
            content = item["content"]
            text: Any = _text_of(content, f"{where}.content", images=role == "user")
            out.append({"role": "system" if role == "developer" else role, "content": text})
            if role == "assistant":
                _give_reasoning(out[-1], reasoning)
        elif kind in ("function_call", "custom_tool_call"):
            _add_call(out, _call(item, where, names))
            _give_reasoning(out[-1], reasoning)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = _string(item, "call_id", where)
            output = _text_of(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            sealed = item.get("encrypted_content")
            if sealed is not None and unseal is not None:
                restored = unseal(sealed, f"{where}.encrypted_content")
                reasoning += [restored] if restored else []
        elif kind in ("mcp_list_tools", "mcp_approval_response", "additional_tools"):
            continue  # (approval responses: mcp.py; additional tools: tools.py)
        elif kind in ("mcp_call", "mcp_approval_request"):
            out += mcp_history(item, where)
        elif isinstance(kind, str):
            raise Unsupported(f"{where}.type", f"input items of type '{kind}' are not supported")
        else:
            raise BadRequest(f"'{where}' needs a 'type' (or a 'role')", param=f"{where}.type")
    return out


def _call(item: dict[str, Any], where: str, names: ToolNames) -> dict[str, Any]:
    """A function_call / custom_tool_call item as a chat tool call."""
    name = _string(item, "name", where)
    if item["type"] == "custom_tool_call":
        text = item.get("input", "")
        if not isinstance(text, str):
            raise BadRequest(f"'{where}.input' must be a string", param=f"{where}.input")
        arguments = custom_arguments(text)
    else:
        arguments = item.get("arguments", "")
        if not isinstance(arguments, str):
            raise BadRequest(f"'{where}.arguments' must be a string", param=f"{where}.arguments")
    namespace = item.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise BadRequest(f"'{where}.namespace' must be a string", param=f"{where}.namespace")
    name = names.visible(name, namespace)
    return {"id": _string(item, "call_id", where), "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def _add_call(out: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """Consecutive calls are one assistant turn's (after its text, if it had some)."""
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _give_reasoning(turn: dict[str, Any], reasoning: list[str]) -> None:
    """The reasoning restored since the last assistant turn goes to this one."""
    if reasoning:
        turn["reasoning_content"] = (turn.get("reasoning_content") or "") + "".join(reasoning)
        reasoning.clear()


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


def response_options(body: ResponsesRequest, tools: tuple[Tool, ...]) -> ChatOptions:
    """`tools`: the request's, as `response_tools` read them (once per request, so a
    hosted tool left out is logged once)."""
    fmt = body.text.format if body.text and body.text.format else None
    if fmt is not None and fmt.type == "json_schema" and fmt.schema_ is None:
        raise BadRequest("a json_schema format needs 'schema'", param="text.format.schema")
    return ChatOptions(
        tools=tools,
        tool_choice=tool_choice(None if isinstance(body.tool_choice, HostedChoice)
                                else body.tool_choice),  # (a hosted one is refused)
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=fmt.type if fmt else "text",
        json_schema=fmt.schema_ if fmt else None,
        # reasoning.effort -> the template's thinking switches (chat/reasoning.py)
        template_kwargs=effort_kwargs(body.effort),
    )


def chat_param(param: str | None, fields: tuple[str, ...] = ()) -> str | None:
    """A chat-layer field name as this API spells it (`fields`: where each tool the model
    sees is in the request, when hosted tools were left out or namespaces flattened)."""
    if param is None:
        return None
    if param.startswith("messages"):  # a rendering error: the conversation as a whole
        return "input"
    param = param.replace(".function.", ".").replace("response_format.json_schema.schema",
                                                     "text.format.schema")  # fmt: skip
    if param.startswith("tools[") and fields:
        index, _, rest = param[6:].partition("]")
        if index.isdigit() and int(index) < len(fields):
            param = fields[int(index)] + rest
    return param.replace("response_format", "text.format")
