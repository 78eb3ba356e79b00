"""Parsed output -> Responses-API output items and the named events that build them.

One builder serves both paths: a stream sends its events as they come, a plain request
feeds everything at once and keeps only the items, so both give the same output. Items
open and close in order: reasoning, message text and calls each get an item
(`output_index`), a text item one content part (`content_index` 0).

A call of a custom tool is a `custom_tool_call` item with the tool's `input` (its input
event comes whole when the call closes: a call is released only once complete); a call
of a namespaced function a `function_call` with `name` and `namespace` apart. A reasoning
item carries the text as its `content` (`reasoning_text`); with `reasoning.summary` set
also as its one `summary_text` part (kvserve does not summarise: the summary is the text
itself), and with `include: ["reasoning.encrypted_content"]` the sealed copy a stateless
client sends back (server/api/responses/sealed.py).
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Callable
from typing import Any

from chat.callstream import Delta
from server.api.responses.tools import ToolNames, custom_arguments, custom_input
from server.serving.events import NamedEvent
from server.serving.state import ParsedOutput, coalesced


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class OutputBuilder:
    def __init__(
        self,
        names: ToolNames | None = None,
        seal: Callable[[str], str] | None = None,
        summary: bool = False,
    ) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._events: list[NamedEvent] = []
        self._output = ParsedOutput()  # where a function_call item reads its arguments
        self._names = names or ToolNames()
        self._seal = seal  # reasoning text -> encrypted_content (None: not asked for)
        self._summary = summary
        self._custom_args = ""  # the open custom_tool_call's arguments, as the model wrote

    def drain(self) -> list[NamedEvent]:
        events, self._events = self._events, []
        return events

    @property
    def text(self) -> str:
        return "".join(
            part["text"]
            for item in self.items
            if item["type"] == "message"
            for part in item["content"]
        )

    def feed(self, deltas: list[Delta]) -> None:
        self._output.add(deltas)
        for d in coalesced(deltas):
            if d.kind == "start":
                self._close("completed")
                self._open_item(self._call_item(d.text, d.call_id))
            elif d.kind == "args" and self._open is not None:
                arguments = self._output.call(d.index).arguments
                if self._open["type"] == "custom_tool_call":
                    self._custom_args = arguments
                    continue
                self._open["arguments"] = arguments
                self._emit("response.function_call_arguments.delta", delta=d.text)
            elif d.text and d.kind == "content":
                self._text_delta("message", "output_text", "response.output_text.delta", d.text)
            elif d.text and d.kind == "reasoning":
                self._text_delta("reasoning", "reasoning_text", "response.reasoning_text.delta",
                                 d.text)  # fmt: skip

    def _call_item(self, name: str, call_id: str) -> dict[str, Any]:
        item: dict[str, Any]
        if name in self._names.custom:
            self._custom_args = ""
            item = {"id": item_id("ctc"), "type": "custom_tool_call", "status": "in_progress",
                    "call_id": call_id, "name": name, "input": ""}  # fmt: skip
        else:
            item = {"id": item_id("fc"), "type": "function_call", "status": "in_progress",
                    "arguments": "", "call_id": call_id, "name": name}  # fmt: skip
        if name in self._names.namespaced:
            item["namespace"], item["name"] = self._names.namespaced[name]
        return item

    def close(self, status: str) -> None:
        """The end of the output: the open item closes with `status`."""
        self._close(status)

    def open_item(self, item: dict[str, Any]) -> None:
        """An item built by its caller (MCP items): the open one closes first."""
        self._close("completed")
        self._open_item(item)

    def emit(self, event: str, **payload: Any) -> None:
        """An event about the item opened by `open_item`."""
        self._emit(event, **payload)

    def done_item(self) -> None:
        """Close the item opened by `open_item`, as its caller left it."""
        self._item_event("response.output_item.done")
        self._open = None

    def _emit(self, event: str, **payload: Any) -> None:
        """An event about the open item (copied: the item keeps growing)."""
        assert self._open is not None
        head = {"item_id": self._open["id"], "output_index": len(self.items) - 1}
        self._events.append((event, {**head, **copy.deepcopy(payload)}))

    def _item_event(self, name: str) -> None:
        assert self._open is not None
        self._events.append((name, {"output_index": len(self.items) - 1,
                                    "item": copy.deepcopy(self._open)}))  # fmt: skip

    def _open_item(self, item: dict[str, Any]) -> None:
        self.items.append(item)
        self._open = item
        self._item_event("response.output_item.added")

    def _text_delta(self, kind: str, part_type: str, event: str, text: str) -> None:
        if self._open is None or self._open["type"] != kind:
            self._close("completed")
            item: dict[str, Any] = {"id": item_id("msg" if kind == "message" else "rs"),
                                    "type": kind, "status": "in_progress", "content": []}
            if kind == "message":
                item["role"] = "assistant"
            else:
                item["summary"] = []
            self._open_item(item)
            self._emit("response.content_part.added", content_index=0,
                       part=_part(part_type, ""))  # fmt: skip
            item["content"].append(_part(part_type, ""))
            if kind == "reasoning" and self._summary:
                self._emit("response.reasoning_summary_part.added", summary_index=0,
                           part=_part("summary_text", ""))  # fmt: skip
                item["summary"].append(_part("summary_text", ""))
        part = self._open["content"][0]  # type: ignore[index]
        part["text"] += text
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        self._emit(event, content_index=0, delta=text, **extra)
        if kind == "reasoning" and self._summary:
            self._open["summary"][0]["text"] += text  # type: ignore[index]
            self._emit("response.reasoning_summary_text.delta", summary_index=0, delta=text)

    def _close(self, status: str) -> None:
        item = self._open
        if item is None:
            return
        if item["type"] == "function_call":
            self._emit("response.function_call_arguments.done", arguments=item["arguments"],
                       name=item["name"])  # fmt: skip
        elif item["type"] == "custom_tool_call":
            item["input"] = custom_input(self._custom_args)
            self._emit("response.custom_tool_call_input.delta", delta=item["input"])
            self._emit("response.custom_tool_call_input.done", input=item["input"])
        else:
            part = item["content"][0]
            if item["type"] == "message":
                self._emit("response.output_text.done", content_index=0, text=part["text"],
                           logprobs=[])  # fmt: skip
            else:
                self._emit("response.reasoning_text.done", content_index=0, text=part["text"])
            self._emit("response.content_part.done", content_index=0, part=part)
            if item["type"] == "reasoning":
                self._close_reasoning(item)
        item["status"] = status
        self._item_event("response.output_item.done")
        self._open = None


    def _close_reasoning(self, item: dict[str, Any]) -> None:
        text = item["content"][0]["text"]
        if item["summary"]:
            summary = item["summary"][0]
            self._emit("response.reasoning_summary_text.done", summary_index=0, text=text)
            self._emit("response.reasoning_summary_part.done", summary_index=0, part=summary)
        if self._seal is not None:
            item["encrypted_content"] = self._seal(text)


def _part(part_type: str, text: str) -> dict[str, Any]:
    if part_type == "output_text":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": part_type, "text": text}


def assistant_turn(items: list[dict[str, Any]], names: ToolNames | None = None) -> dict[str, Any]:
    """The output as one chat assistant message (for the stored conversation): calls under
    the names the model knows them by, the reasoning as `reasoning_content`."""
    names = names or ToolNames()
    text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    reasoning = "".join(p["text"] for i in items if i["type"] == "reasoning" for p in i["content"])
    calls = []
    for item in items:
        if item["type"] == "function_call":
            name = names.visible(item["name"], item.get("namespace"))
            arguments = item["arguments"]
        elif item["type"] == "custom_tool_call":
            name = names.visible(item["name"], item.get("namespace"))
            arguments = custom_arguments(item["input"])
        else:
            continue
        calls.append({"id": item["call_id"], "type": "function",
                      "function": {"name": name, "arguments": arguments}})  # fmt: skip
    turn: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        turn["tool_calls"] = calls
    if reasoning:
        turn["reasoning_content"] = reasoning
    return turn
