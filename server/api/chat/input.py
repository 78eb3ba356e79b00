"""OpenAI chat requests -> chat/ messages and options; parsed output -> message / delta shapes."""

from __future__ import annotations

import logging
from typing import Any, Literal

from chat.callstream import Delta
from chat.plan import ChatOptions, OutputParser
from chat.reasoning import effort_kwargs
from chat.tools import tool_choice
from server.api.chat.protocol import ChatCompletionRequest, ContentPart
from server.api.common import function_tool
from server.serving.media import chat_part, image_from_url
from server.serving.state import ParsedOutput, openai_calls, parsed

log = logging.getLogger("kvserve.server")


def chat_messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The messages in chat/'s form: text parts joined; a message with images keeps its
    parts, each image an ImagePart (server/serving/media.py reads them)."""
    out = []
    for i, message in enumerate(body.messages):
        content: Any = message.content
        if isinstance(content, list):
            content = _content(content, f"messages[{i}].content")
        # Templates written before the 'developer' role know it as 'system'.
        role = "system" if message.role == "developer" else message.role
        item: dict[str, Any] = {"role": role, "content": content}
        if content is None and not message.tool_calls:
            item["content"] = ""
        if message.name is not None:
            item["name"] = message.name
        if message.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "type": "function", "function": c.function.model_dump()}
                for c in message.tool_calls
            ]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _content(parts: list[ContentPart], where: str) -> str | list[dict[str, Any]]:
    if all(part.type != "image_url" for part in parts):
        return "".join(part.text or "" for part in parts)
    out: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        if part.type != "image_url":
            out.append({"type": "text", "text": part.text or ""})
            continue
        at = f"{where}[{j}].image_url"
        ref = part.image_url  # {"url", "detail"}; a bare string as vLLM and others take it
        if isinstance(ref, dict):
            out.append(chat_part(image_from_url(ref.get("url"), at, ref.get("detail"))))
        else:
            out.append(chat_part(image_from_url(ref, at)))
    return out


def chat_options(body: ChatCompletionRequest) -> ChatOptions:
    tools = tuple(
        function_tool(t.function)
        for t in body.tools or []
        if t.function is not None  # (mcp entries: server/api/chat/mcp.py)
    )
    fmt = body.response_format
    response_format: Literal["text", "json_object", "json_schema"] = fmt.type if fmt else "text"
    schema = fmt.json_schema.schema_ if fmt and fmt.json_schema else None
    if body.reasoning_effort is not None:  # a no-op on a template without these switches
        log.info("reasoning_effort %r: template kwargs %s", body.reasoning_effort,
                 effort_kwargs(body.reasoning_effort))  # fmt: skip
    other = body.constraint  # another server's JSON constraint is the response format
    if other is not None and other.schema is not None:
        response_format = "json_object" if other.param.endswith("json_object") else "json_schema"
        schema = other.schema
    return ChatOptions(
        tools=tools,
        tool_choice=tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=response_format,
        json_schema=schema,
        reasoning_format="none" if body.reasoning_format == "none" else "auto",
        # The effort sets the template's thinking switches; explicit kwargs win.
        template_kwargs={
            **effort_kwargs(body.reasoning_effort),
            **(body.chat_template_kwargs or {}),
        },
    )


def stream_deltas(deltas: list[Delta]) -> list[dict[str, Any]]:
    """OpenAI chunk deltas from the parsed pieces of one increment. A call's first
    chunk carries only its id, type and name (arguments ""); fragments follow."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for d in deltas:
        if d.kind == "start":
            if current:
                out.append(current)
            out.append({"tool_calls": [{
                "index": d.index,
                "id": d.call_id,
                "type": "function",
                "function": {"name": d.text, "arguments": ""},
            }]})  # fmt: skip
            current = {}
        elif d.kind == "args":
            calls = current.setdefault("tool_calls", [])
            if calls and calls[-1]["index"] == d.index:
                calls[-1]["function"]["arguments"] += d.text
            else:
                calls.append({"index": d.index, "function": {"arguments": d.text}})
        else:
            key = "content" if d.kind == "content" else "reasoning_content"
            current[key] = current.get(key, "") + d.text
    if current:
        out.append(current)
    return out


def message(parser: OutputParser, text: str) -> dict[str, Any]:
    """The full assistant message of one choice (same parser as the stream)."""
    return chat_message(parsed(parser.feed(text) + parser.finish()))


def chat_message(result: ParsedOutput) -> dict[str, Any]:
    """OpenAI chat's assistant message from a choice's parsed output."""
    content, reasoning, calls = result.content, result.reasoning, openai_calls(result.calls)
    out: dict[str, Any] = {
        "role": "assistant",
        "content": None if calls and not content else content,
        "refusal": None,
    }
    if reasoning:
        out["reasoning_content"] = reasoning
    if calls:
        out["tool_calls"] = calls
    return out
