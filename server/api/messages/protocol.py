"""Anthropic Messages API request models (POST /v1/messages, /v1/messages/count_tokens).

Scalars are validated here; `system`, `messages` and `tools` content blocks are read by
`server/api/messages/input.py`, which names the exact block and field it refuses.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import Field

from chat.reasoning import EFFORTS
from server.api.common import Probability, RequestModel
from server.errors import BadRequest, Unsupported
from server.serving.engine_requests import RequestSampling, sampler_settings

log = logging.getLogger("kvserve.server")


class ToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(RequestModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=1)] | None = None
    # "omitted": thinking blocks come back with an empty `thinking` text (streamed with
    # no thinking_delta), as Anthropic sends them; the model thinks as before.
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(RequestModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] | bool = Field(alias="schema")


class OutputConfig(RequestModel):
    effort: str | None = None
    format: OutputFormat | None = None


class Metadata(RequestModel):
    user_id: Annotated[str, Field(max_length=256)] | None = None


# Defined by Anthropic, not implemented here: refused when set, since each changes what
# the answer means. (mcp_servers is read by server/api/messages/mcp.py)
MESSAGES_UNSUPPORTED = ("container",)
# Hints that change nothing here, accepted and logged: `context_management` asks the
# API to clear old tool results or thinking server-side once the context grows past a
# threshold (Claude Code sends it on every request); kvserve keeps every turn it is
# sent, and a prompt that does not fit is still refused (or cut, by drop_oldest).
MESSAGES_HINTS = ("context_management",)
# The `anthropic-beta` header names the beta features a request may use (Claude Code
# sends a dozen on every request: claude-code, interleaved-thinking, context-management,
# effort, ...): hints here, logged once per request. Only the MCP connector's is read
# (server/api/messages/mcp.py): it is what lets a request name `mcp_servers`.
MCP_BETA = "mcp-client-2025-04-04"


def betas(header: str) -> list[str]:
    """An `anthropic-beta` header's values (comma-separated)."""
    return [b.strip() for b in header.split(",") if b.strip()]


def log_beta_hints(header: str) -> None:
    hints = [b for b in betas(header) if b != MCP_BETA]
    if hints:
        log.info("messages: accepting anthropic-beta hints that change nothing here: %s",
                 ", ".join(hints))  # fmt: skip


class CountTokensRequest(RequestModel):
    HINTS = MESSAGES_HINTS
    model: str
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None  # a caching hint: kvserve caches every prefix

    def refuse_unsupported(self) -> None:
        extra = self.model_extra or {}
        hints = sorted(name for name in MESSAGES_HINTS if extra.get(name) is not None)
        if hints:
            log.info("messages: accepting hints that change nothing here: %s", hints)
        effort = self.output_config.effort if self.output_config else None
        if effort is not None and effort not in EFFORTS:
            raise BadRequest(f"'output_config.effort' must be one of {', '.join(EFFORTS)}",
                             param="output_config.effort")  # fmt: skip
        if extra.get("speed") not in (None, "standard"):
            raise Unsupported("speed", "only 'standard'")
        for name in MESSAGES_UNSUPPORTED:
            if extra.get(name) not in (None, [], {}):
                raise Unsupported(name, "not implemented by this server")
        choice = self.tool_choice
        if choice is not None and choice.type == "tool" and not choice.name:
            raise BadRequest("a 'tool' tool_choice needs 'name'", param="tool_choice.name")
        thinking = self.thinking
        if thinking is not None and thinking.type == "enabled" and thinking.budget_tokens is None:
            raise BadRequest("enabled thinking needs 'budget_tokens'",
                             param="thinking.budget_tokens")  # fmt: skip


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1, max_length=1000)]],
                              Field(max_length=16)] | None = None  # fmt: skip
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    stream: bool = False
    service_tier: Literal["auto", "standard_only"] | None = None

    @property
    def has_mcp(self) -> bool:
        """Anthropic's MCP connector (`mcp_servers`): server/api/messages/mcp.py runs it."""
        return (self.model_extra or {}).get("mcp_servers") not in (None, [])

    def sampling_record(self, session_id: str | None) -> RequestSampling:
        """The sampler fields Anthropic defines, as the serving core reads them."""
        params = sampler_settings({"temperature": self.temperature, "top_p": self.top_p,
                                   "top_k": self.top_k})  # fmt: skip
        return RequestSampling(params, stop=tuple(self.stop_sequences or ()),
                               session_id=session_id)  # fmt: skip

    @property
    def omits_thinking(self) -> bool:
        """`thinking.display: "omitted"`: the thinking blocks' text is left out."""
        return self.thinking is not None and self.thinking.display == "omitted"

    @property
    def thinking_budget(self) -> int | None:
        """Enabled thinking's budget_tokens, enforced by the engine (llama-server's
        reading: server/serving/thinking.py); disabled thinking is budget 0 there."""
        enabled = self.thinking is not None and self.thinking.type == "enabled"
        return self.thinking.budget_tokens if enabled and self.thinking else None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        budget = self.thinking.budget_tokens if self.thinking else None
        if budget is not None and budget >= self.max_tokens:
            raise BadRequest("'thinking.budget_tokens' must be less than 'max_tokens'",
                             param="thinking.budget_tokens")  # fmt: skip
