"""A fake engine that plays an agent's model through one tool loop, whatever the client.

The agent programs send many requests (titles, summaries, the turn itself) in an order of
their own, sometimes at once; a list of replies taken in turn would give the tool call to
whichever came first. This engine answers each request from what its prompt holds
instead: the final answer once the tool's output (a secret only the tool can read) is in
the prompt, a call of the client's shell tool while the prompt offers that tool, and a
short plain answer to anything else.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.engine import Generation
from engine.types import GenerateRequest
from tests.fakes import FakeEngine

# Enough for Claude Code's first request (about 80k characters of system prompt, tool
# schemas and messages; a fake token is a byte) plus the max_tokens the clients ask for
# (Claude Code 128000, opencode and Qwen Code 32000): the fake checks the context as the
# real engine does, and these tests are about the protocol, not the clamp.
AGENT_N_CTX = 400_000
PLAIN_ANSWER = "Agent session"


class ToolLoopEngine(FakeEngine):
    """Calls `tool` with `arguments` until `secret` reaches a prompt, then says `final`;
    each answer `prefill_delay` seconds late."""

    def __init__(self, *, tool: str, arguments: dict[str, Any], secret: str, final: str,
                 prefill_delay: float = 0.0):  # fmt: skip
        super().__init__(n_ctx=AGENT_N_CTX, n_seq_max=4, max_queue=8)
        # Seconds every request waits before its first token, as a long cold prompt's
        # prefill does: the stream says nothing but its heartbeats meanwhile.
        self.prefill_delay = prefill_delay
        self.tool = tool
        self.call = json.dumps({"tool_calls": [{"name": tool, "arguments": arguments}]})
        self.secret = secret
        self.final = final
        self.prompts: list[str] = []  # every prompt seen, as text

    async def generate(self, requests: Sequence[GenerateRequest]) -> Generation:
        # A fake token is a byte (tests/fakes.py); ids past 255 are special tokens.
        prompt = bytes(t for t in requests[0].prompt_tokens if t < 256).decode(errors="replace")
        self.prompts.append(prompt)
        if self.secret in prompt:
            reply = self.final
        elif f'{{"name": "{self.tool}"' in prompt:  # the template's rendering of the tool
            reply = self.call
        else:
            reply = PLAIN_ANSWER
        self.replies = [reply]  # FakeEngine answers this request with it
        return await super().generate(requests)

    def saw_tool_result(self) -> bool:
        """Whether a prompt carried the tool's output back to the model."""
        return any(self.secret in p for p in self.prompts)
