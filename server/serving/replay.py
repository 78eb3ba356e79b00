"""The memory of sampled tool turns, so that a turn sent back renders as it was sampled.

When a turn with tool calls finishes, its exact output text and the token ids sampled
for it are kept with the calls' ids, names and parsed arguments and a digest of the
prompt it followed (one memory per
model, a byte-bounded LRU: `[replay] max_bytes`). When a later request's messages carry
an assistant turn whose calls are all known (the same ids in the same order, names and
arguments equal as parsed JSON) and whose content is the one sampled, chat/replay.py
renders that turn from the sampled text (where the template's framing allows it), so the
prompt matches the KV the slot or the prefix cache holds. Anything else renders from the
template, as before.

Tenants never see each other's turns: every key starts with the caller's tenant.
Ollama sends no call ids back, so its turns are keyed by their calls' names and arguments
(the newest few per key; the prompt digest picks the right one).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from chat.replay import SampledTurn, prompt_digest
from engine.client import FinishReason
from server.http.deps import Caller
from server.serving.state import ChoiceState, ParsedCall

Key = tuple[Any, ...]
_ENTRY_OVERHEAD = 256  # bytes an entry costs beside its strings (objects, the key)
_BYTES_PER_ID = 36  # a sampled id in a tuple: its pointer and (past 256) its int object
_PER_SIGNATURE = 4  # turns kept under one Ollama key (names and arguments alike)


@dataclass(frozen=True, slots=True)
class _Call:
    call_id: str
    name: str
    arguments: str  # the parsed JSON value, written canonically (1 is not true)


@dataclass(frozen=True, slots=True)
class _Entry:
    turn: SampledTurn
    content: str
    calls: tuple[_Call, ...]
    size: int


class ReplayMemory:
    """A byte-bounded LRU of sampled tool turns. Lookups may come from the worker thread
    that renders a long conversation (server/serving/prepare.py), so it takes a lock."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._entries: OrderedDict[Key, list[_Entry]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def put(self, key: Key, entry: _Entry, keep: int = 1) -> None:
        if entry.size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, [])
            kept = [entry, *old[: keep - 1]]
            self.num_bytes += entry.size - sum(e.size for e in old[keep - 1 :])
            self._entries[key] = kept
            while self.num_bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.num_bytes -= sum(e.size for e in evicted)

    def get(self, key: Key) -> list[_Entry]:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return []
            self._entries.move_to_end(key)
            return list(found)


@dataclass(slots=True)
class ReplayMemories:
    """One memory per served model (by id), made on first use."""

    max_bytes: int
    _by_model: dict[str, ReplayMemory] = field(default_factory=dict)

    def of(self, model_id: str) -> ReplayMemory | None:
        if self.max_bytes <= 0:
            return None
        memory = self._by_model.get(model_id)
        if memory is None:
            memory = self._by_model[model_id] = ReplayMemory(self.max_bytes)
        return memory


def _same_id(call_id: str) -> str:
    return call_id


@dataclass(frozen=True, slots=True)
class Replay:
    """One request's view of its model's memory: its tenant's turns only.
    `id_of`: the id an API gave the client for a parsed call (Messages: `toolu_...`);
    `by_calls`: key turns by their calls' names and arguments (Ollama: no ids come back)."""

    memory: ReplayMemory
    tenant: str
    id_of: Callable[[str], str] = _same_id
    by_calls: bool = False

    def lookup(self, message: Mapping[str, Any]) -> list[SampledTurn]:
        """The sampled turns `message` (an assistant turn with tool_calls) may be."""
        try:
            calls = tuple(
                _Call(c["id"], c["function"]["name"], _canonical(c["function"]["arguments"]))
                for c in message["tool_calls"]
            )
        except (KeyError, TypeError, ValueError):
            return []  # arguments that are not JSON text: the template's rendering
        content = _text(message.get("content"))
        return [
            e.turn
            for e in self.memory.get(self._key(calls))
            if e.content == content and _same_calls(e.calls, calls, self.by_calls)
        ]

    def record(
        self,
        prompt_text: str,
        text: str,
        content: str,
        calls: list[ParsedCall],
        token_ids: tuple[int, ...] = (),
    ) -> None:
        """Keep a finished turn's output (`text`, whole; `token_ids`, the ids sampled,
        its end-of-turn token included) and what it parsed to."""
        try:
            parsed = tuple(
                _Call(self.id_of(c.call_id), c.name, _canonical(c.arguments))
                for c in calls
            )  # fmt: skip
        except ValueError:
            return  # not JSON: no client sends such a call back as it was
        strings = [text, content, *(c.call_id + c.name + c.arguments for c in parsed)]
        size = _ENTRY_OVERHEAD + sum(_bytes(t) for t in strings) + _BYTES_PER_ID * len(token_ids)
        turn = SampledTurn(text, prompt_digest(prompt_text), token_ids)
        entry = _Entry(turn, _text(content), parsed, size)
        self.memory.put(self._key(parsed), entry, _PER_SIGNATURE if self.by_calls else 1)

    def _key(self, calls: tuple[_Call, ...]) -> Key:
        if self.by_calls:
            return (self.tenant, "calls", *((c.name, c.arguments) for c in calls))
        return (self.tenant, "ids", *(c.call_id for c in calls))


def _same_calls(stored: tuple[_Call, ...], sent: tuple[_Call, ...], by_calls: bool) -> bool:
    if len(stored) != len(sent):
        return False
    return all(
        (by_calls or a.call_id == b.call_id) and a.name == b.name and a.arguments == b.arguments
        for a, b in zip(stored, sent, strict=True)
    )


def _text(content: Any) -> str:
    """An assistant content as compared: clients trim it, or send null for none."""
    return content.strip() if isinstance(content, str) else ""


def _canonical(arguments: str) -> str:
    """A call's arguments (JSON text) written one way: equal values, equal text."""
    value = json.loads(arguments) if arguments.strip() else {}
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def request_replay(
    request: Request,
    model_id: str,
    caller: Caller,
    *,
    id_of: Callable[[str], str] = _same_id,
    by_calls: bool = False,
) -> Replay | None:
    """The caller's view of a served model's memory (None: `[replay] max_bytes` is 0).
    The memories are made with the app's first chat request, from its settings."""
    state = request.app.state
    memories = getattr(state, "replay", None)
    if memories is None:
        memories = state.replay = ReplayMemories(state.settings.replay.max_bytes)
    memory = memories.of(model_id)
    return None if memory is None else Replay(memory, caller.tenant, id_of, by_calls)


@dataclass(frozen=True, slots=True)
class Recorder:
    """Records one request's finished choices (`ChoiceState.on_finish`)."""

    replay: Replay
    prompt_text: str

    def finished(self, state: ChoiceState) -> None:
        # Only a turn that ended as the model ended it and whose calls all came out
        # whole: what a client can send back exactly as it was.
        calls = state.output.calls
        ended = state.total.finish_reason is FinishReason.STOP
        if calls and ended and not state.parser.num_truncated:
            text = "".join(state.sampled)
            ids = tuple(state.sampled_ids)
            self.replay.record(self.prompt_text, text, state.output.content, calls, ids)
