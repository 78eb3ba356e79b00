"""An Anthropic Messages request -> chat messages, tools and options for the serving core.

Blocks map onto chat turns: `text` blocks join into a turn's content; an assistant's
`tool_use` blocks become its tool calls (`input` as the arguments); a user's
`tool_result` blocks become tool turns (before the user's own text, in order);
`thinking` blocks sent back are dropped (templates do not render past reasoning).
`cache_control` is accepted anywhere: kvserve reuses every shared prefix by itself.
`image` blocks (base64, or a `url` source) go where they are in a user turn or a
tool_result's content, read by server/serving/media.py.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Any

from chat.plan import ChatOptions
from chat.reasoning import effort_kwargs
from chat.tools import Tool, ToolChoice
from server.api.messages.protocol import CountTokensRequest
from server.errors import BadRequest, Unsupported
from server.serving.media import chat_part, image_from_base64, image_from_url

log = logging.getLogger("kvserve.server")


def _block_type(block: Any, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise BadRequest(f"'{where}' must be a content block with a 'type'", param=f"{where}.type")
    return kind


def _text(block: dict[str, Any], where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise BadRequest(f"'{where}.text' must be a string", param=f"{where}.text")
    return block["text"]  # type: ignore[no-any-return]


def _texts(content: Any, where: str) -> str:
    """A string, or text blocks joined (system prompts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or a list of blocks", param=where)
    out = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = _block_type(block, at)
        if kind != "text":
            raise Unsupported(f"{at}.type", f"'{kind}' blocks are not supported here; only text")
        out.append(_text(block, at))
    return "\n".join(out) if where.endswith("system") else "".join(out)


def _image(block: dict[str, Any], at: str) -> dict[str, Any]:
    """An image block's source: base64 with its media_type, or a url (fetched where
    [media] allow_urls says so)."""
    raw = block.get("source")
    source: dict[str, Any] = raw if isinstance(raw, dict) else {}
    kind = source.get("type") if isinstance(raw, dict) else None
    if kind == "base64":
        return chat_part(image_from_base64(source.get("data"), source.get("media_type"),
                                           f"{at}.source"))  # fmt: skip
    if kind == "url":
        return chat_part(image_from_url(source.get("url"), f"{at}.source"))
    raise BadRequest(f"'{at}.source' must be a base64 or url image source",
                     param=f"{at}.source.type" if kind is not None else f"{at}.source")  # fmt: skip


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A tool_result's content: its text, or its text and image blocks as parts."""
    if not isinstance(content, list) or all(
        not isinstance(b, dict) or b.get("type") != "image" for b in content
    ):
        return _texts(content, where)
    out: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = _block_type(block, at)
        if kind == "image":
            out.append(_image(block, at))
        elif kind == "text":
            out.append({"type": "text", "text": _text(block, at)})
        else:
            raise Unsupported(f"{at}.type", f"'{kind}' blocks are not supported here; only "
                              "text and image")  # fmt: skip
    return out


def system_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    if body.system is None:
        return []
    text = _texts(body.system, "system")
    return [{"role": "system", "content": text}] if text else []


def _turn(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or a list of blocks", param=where)
    texts: list[dict[str, Any]] = []  # text and image parts
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image" and role == "user":
            texts.append(_image(block, at))
        elif kind == "tool_use" and role == "assistant":
            for key in ("id", "name"):
                if not isinstance(block.get(key), str) or not block[key]:
                    raise BadRequest(f"'{at}.{key}' must be a non-empty string",
                                     param=f"{at}.{key}")  # fmt: skip
            if not isinstance(block.get("input"), dict):
                raise BadRequest(f"'{at}.input' must be an object", param=f"{at}.input")
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block["input"])}})  # fmt: skip
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
                raise BadRequest(f"'{at}.tool_use_id' must be a non-empty string",
                                 param=f"{at}.tool_use_id")  # fmt: skip
            if block.get("is_error") not in (None, True, False):
                raise BadRequest(f"'{at}.is_error' must be a boolean", param=f"{at}.is_error")
            text = _parts(block.get("content", ""), f"{at}.content")
            if block.get("is_error"):  # the model reads that the call failed
                text = f"Error: {text}" if isinstance(text, str) else [
                    {"type": "text", "text": "Error: "}, *text]
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": text})  # fmt: skip
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        elif kind in ("tool_use", "tool_result", "thinking", "redacted_thinking", "image"):
            owner = "user" if kind in ("tool_result", "image") else "assistant"
            raise BadRequest(f"'{kind}' blocks belong in {owner} turns", param=f"{at}.type")
        else:
            raise Unsupported(f"{at}.type", f"'{kind}' blocks are not supported; only text, "
                              "image, tool_use, tool_result and thinking")  # fmt: skip
    out = list(results)
    if texts or (not results and not calls):
        out.append({"role": role, "content": _joined(texts)})
    if calls:
        if out and out[-1]["role"] == "assistant":
            out[-1]["tool_calls"] = calls
        else:
            out.append({"role": "assistant", "content": None, "tool_calls": calls})
    return out


def _joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text parts as one string; with an image among them, the parts."""
    if any(p["type"] == "image" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    out = system_messages(body)
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise BadRequest(f"'{where}.role' must be 'user', 'assistant' or 'system'",
                             param=f"{where}.role")  # fmt: skip
        if "content" not in message:
            raise BadRequest(f"'{where}.content' is required", param=f"{where}.content")
        if role == "system":  # Claude Code sends reminders so: a system turn in its place
            out.append({"role": "system", "content": _texts(message["content"],
                                                            f"{where}.content")})  # fmt: skip
            continue
        out += _turn(role, message["content"], f"{where}.content")
    return out


# Anthropic's server tools (its tool reference: web search, web fetch, code execution,
# advisor, tool search), each type versioned by a date: run on Anthropic's side, so
# nothing here can run them. As the Responses API's hosted tools
# (server/api/responses/tools.py): left out of what the model sees with a log line, and
# refused where tool_choice names one. Its client tools (bash_*, text_editor_*, memory_*,
# computer_*) are the client's to run, on a schema Anthropic fixes: still a 400, so an
# agent that counts on one learns it is missing (declared as a custom tool, it works).
SERVER_TOOL = re.compile(
    r"(web_search|web_fetch|code_execution|advisor|tool_search_tool_regex|tool_search_tool_bm25)"
    r"_\d{8}"
)


def server_tools(body: CountTokensRequest) -> dict[str, dict[str, Any]]:
    """The server tools the request sends, by field (`tools[i]`)."""
    return {f"tools[{i}]": tool for i, tool in enumerate(body.tools or [])
            if SERVER_TOOL.fullmatch(str(tool.get("type", "")))}  # fmt: skip


def tool_fields(body: CountTokensRequest) -> tuple[str, ...]:
    """Where each tool the model sees is in the request (server tools left out)."""
    dropped = server_tools(body)
    return tuple(f for f in (f"tools[{i}]" for i in range(len(body.tools or [])))
                 if f not in dropped)  # fmt: skip


def message_tools(body: CountTokensRequest) -> tuple[Tool, ...]:
    """The tools the model sees: the custom ones (server tools left out, logged)."""
    dropped = server_tools(body)
    if dropped:
        log.info("messages: server tools left out (kvserve cannot run them): %s",
                 ", ".join(f"{where} ({t['type']})" for where, t in dropped.items()))  # fmt: skip
    tools = []
    for i, tool in enumerate(body.tools or []):
        where = f"tools[{i}]"
        if where in dropped:
            continue
        kind = tool.get("type", "custom")
        if kind != "custom":
            raise Unsupported(f"{where}.type", f"'{kind}' tools are not available; only "
                              "custom tools with an input_schema (server tools such as "
                              "web_search_20250305 are left out)")  # fmt: skip
        name, description = tool.get("name"), tool.get("description") or ""
        if not isinstance(name, str):
            raise BadRequest(f"'{where}.name' must be a string", param=f"{where}.name")
        if not isinstance(description, str):
            raise BadRequest(f"'{where}.description' must be a string",
                             param=f"{where}.description")  # fmt: skip
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise BadRequest(f"'{where}.input_schema' must be a JSON schema object",
                             param=f"{where}.input_schema")  # fmt: skip
        tools.append(Tool(name, description, schema))
    return tuple(tools)


def message_options(body: CountTokensRequest) -> ChatOptions:
    choice = body.tool_choice
    named = [t for t in server_tools(body).values()
             if choice is not None and choice.type == "tool" and t.get("name") == choice.name]
    if named:  # the client made a tool required that nothing here can run
        raise Unsupported("tool_choice.name", f"'{named[0]['name']}' is a server tool "
                          f"({named[0]['type']}) that kvserve cannot run: it is left out of "
                          "what the model sees")  # fmt: skip
    mode = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
    tool_choice = ToolChoice("auto") if choice is None else ToolChoice(
        mode[choice.type], choice.name if choice.type == "tool" else None)  # type: ignore[arg-type]
    # An effort sets the template's thinking switches (chat/reasoning.py); `thinking`
    # says whether to think at all, and wins over the effort where they disagree.
    kwargs: dict[str, Any] = effort_kwargs(body.output_config.effort if body.output_config
                                           else None)  # fmt: skip
    if body.thinking is not None:  # adaptive: the model decides, so thinking stays on
        kwargs["enable_thinking"] = body.thinking.type != "disabled"
    fmt = body.output_config.format if body.output_config else None
    return ChatOptions(
        tools=message_tools(body),
        tool_choice=tool_choice,
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
        response_format="json_schema" if fmt is not None else "text",
        json_schema=fmt.schema_ if fmt is not None else None,
        template_kwargs=kwargs,
    )


def chat_param(param: str | None, fields: tuple[str, ...] = ()) -> str | None:
    """A chat-layer field name as this API spells it (`fields`: where each tool the model
    sees is in the request, when server tools were left out)."""
    if param is None:
        return None
    param = param.replace(".function.parameters", ".input_schema").replace(".function.", ".")
    if param.startswith("tools[") and fields:
        index, _, rest = param[6:].partition("]")
        if index.isdigit() and int(index) < len(fields):
            param = fields[int(index)] + rest
    return param.replace("response_format.json_schema.schema", "output_config.format.schema")


def param_names(body: CountTokensRequest) -> Callable[[str | None], str | None]:
    """`chat_param` for this request's tools."""
    fields = tool_fields(body)
    return lambda param: chat_param(param, fields)
