"""Parsed output -> Responses-API output items and the named events that build them.

One builder serves both paths: a stream sends its events as they come, a plain request
feeds everything at once and keeps only the items, so both give the same output. Items
open and close in order: reasoning, message text and function calls each get an item
(`output_index`), a text item one content part (`content_index` 0).
"""

from __future__ import annotations

import copy
import secrets
from typing import Any

from chat.callstream import Delta
from server.serving.events import NamedEvent
from server.serving.state import ParsedOutput, coalesced


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class OutputBuilder:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._events: list[NamedEvent] = []
        self._output = ParsedOutput()  # where a function_call item reads its arguments

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
                self._open_item({"id": item_id("fc"), "type": "function_call",
                                 "status": "in_progress", "arguments": "", "call_id": d.call_id,
                                 "name": d.text})  # fmt: skip
            elif d.kind == "args" and self._open is not None:
                self._open["arguments"] = self._output.call(d.index).arguments
                self._emit("response.function_call_arguments.delta", delta=d.text)
            elif d.text and d.kind == "content":
                self._text_delta("message", "output_text", "response.output_text.delta", d.text)
            elif d.text and d.kind == "reasoning":
                self._text_delta("reasoning", "reasoning_text", "response.reasoning_text.delta",
                                 d.text)  # fmt: skip

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
        part = self._open["content"][0]  # type: ignore[index]
        part["text"] += text
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        self._emit(event, content_index=0, delta=text, **extra)

    def _close(self, status: str) -> None:
        item = self._open
        if item is None:
            return
        if item["type"] == "function_call":
            self._emit("response.function_call_arguments.done", arguments=item["arguments"],
                       name=item["name"])  # fmt: skip
        else:
            part = item["content"][0]
            if item["type"] == "message":
                self._emit("response.output_text.done", content_index=0, text=part["text"],
                           logprobs=[])  # fmt: skip
            else:
                self._emit("response.reasoning_text.done", content_index=0, text=part["text"])
            self._emit("response.content_part.done", content_index=0, part=part)
        item["status"] = status
        self._item_event("response.output_item.done")
        self._open = None


def _part(part_type: str, text: str) -> dict[str, Any]:
    if part_type == "output_text":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": part_type, "text": text}


def assistant_turn(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The output as one chat assistant message (for the stored conversation)."""
    text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    calls = [
        {"id": i["call_id"], "type": "function",
         "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in items
        if i["type"] == "function_call"
    ]  # fmt: skip
    turn: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        turn["tool_calls"] = calls
    return turn
