"""OpenAI Responses API request model (POST /v1/responses).

Scalars are validated here; `input` items and `tools` are taken as JSON and read by
`server/api/responses/input.py`, which names the exact item and field it refuses.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import Field

from chat.reasoning import EFFORTS
from server.api.common import McpToolChoice as McpChoice
from server.api.common import Probability, RequestModel
from server.errors import BadRequest, Unsupported
from server.serving.engine_requests import RequestSampling, sampler_settings

log = logging.getLogger("kvserve.server")


class TextFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(RequestModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class NamedFunctionChoice(RequestModel):
    type: Literal["function", "custom"]
    name: str


class HostedChoice(RequestModel):
    """A tool_choice naming a hosted tool (web search, ...): refused, kvserve cannot run it."""

    type: str


class Reasoning(RequestModel):
    effort: str | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


# Defined by OpenAI for /v1/responses, not implemented here: refused when set.
RESPONSES_UNSUPPORTED = (
    "background", "conversation", "prompt", "max_tool_calls", "top_logprobs", "moderation",
    "image",
)  # fmt: skip
# `include` values: what kvserve returns, and what can never be there (the items they
# add to are those of hosted tools, which kvserve leaves out, or input images, refused).
INCLUDE_HONOURED = frozenset({"reasoning.encrypted_content"})
INCLUDE_VACUOUS = frozenset({
    "web_search_call.action.sources", "web_search_call.results", "file_search_call.results",
    "code_interpreter_call.outputs", "computer_call_output.output.image_url",
    "message.input_image.image_url",
})  # fmt: skip


class ResponsesRequest(RequestModel):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: (Literal["none", "auto", "required"] | NamedFunctionChoice | McpChoice
                  | HostedChoice | None) = None  # fmt: skip
    parallel_tool_calls: bool = True
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Probability | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]],
                        Field(max_length=16)] | None = None  # fmt: skip
    user: str | None = None
    reasoning: Reasoning | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    include: Annotated[list[str], Field(max_length=16)] | None = None
    prompt_cache_key: str | None = None  # kvserve keys its prefix cache by the tokens
    safety_identifier: str | None = None
    context_management: Any = None  # server-side compaction: kvserve does none
    # kvserve / llama.cpp extras that map one to one onto the sampler
    seed: int | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Probability | None = None
    stop: Annotated[list[Annotated[str, Field(min_length=1, max_length=1000)]],
                    Field(max_length=16)] | None = None  # fmt: skip
    cache_salt: Annotated[str, Field(max_length=256)] | None = None

    @property
    def has_mcp(self) -> bool:
        """The MCP loop's request (server/api/responses/mcp.py): mcp tools, an mcp
        tool_choice, or approvals."""
        items = self.input if isinstance(self.input, list) else []
        return (any(t.get("type") == "mcp" for t in self.tools or [])
                or isinstance(self.tool_choice, McpChoice)
                or any(i.get("type") == "mcp_approval_response" for i in items))  # fmt: skip

    def sampling_record(self, session_id: str | None) -> RequestSampling:
        """The sampler fields of a turn (on `session_id`), as the serving core reads them."""
        params = sampler_settings({"temperature": self.temperature, "top_p": self.top_p,
                                   "top_k": self.top_k, "min_p": self.min_p, "seed": self.seed})
        return RequestSampling(params, stop=tuple(self.stop or ()), cache_salt=self.cache_salt,
                               session_id=session_id)  # fmt: skip

    @property
    def encrypted_reasoning(self) -> bool:
        return "reasoning.encrypted_content" in (self.include or [])

    @property
    def effort(self) -> str | None:
        return self.reasoning.effort if self.reasoning else None

    def refuse_unsupported(self) -> None:
        extra = self.model_extra or {}
        for name in RESPONSES_UNSUPPORTED:
            if extra.get(name) not in (None, False, [], {}):
                raise Unsupported(name, "not implemented by this server")
        if self.effort is not None and self.effort not in EFFORTS:
            raise BadRequest(f"'reasoning.effort' must be one of {', '.join(EFFORTS)}",
                             param="reasoning.effort")  # fmt: skip
        for value in self.include or []:
            if value not in INCLUDE_HONOURED | INCLUDE_VACUOUS:
                raise Unsupported("include", f"'{value}' is not returned by this server; "
                                  "only 'reasoning.encrypted_content'")  # fmt: skip
        if isinstance(self.tool_choice, HostedChoice):
            kind = self.tool_choice.type
            if kind in ("function", "custom", "mcp"):
                raise BadRequest(f"a '{kind}' tool_choice needs its fields ('name')",
                                 param="tool_choice")  # fmt: skip
            raise Unsupported("tool_choice", f"'{kind}' names a tool this server cannot run "
                              "(hosted tools are left out)")  # fmt: skip
        if self.truncation == "auto":
            raise Unsupported("truncation", "only 'disabled'")

    def log_hints(self) -> None:
        """The hints that are set: accepted, changing nothing here (docs/api.md, Responses)."""
        values: dict[str, Any] = {"prompt_cache_key": self.prompt_cache_key,
                  "safety_identifier": self.safety_identifier,
                  "context_management": self.context_management,
                  "service_tier": self.service_tier,
                  "text.verbosity": self.text.verbosity if self.text else None,
                  "reasoning.summary": self.reasoning.summary if self.reasoning else None}
        for part, model in (("reasoning", self.reasoning), ("text", self.text)):
            for key in (model.model_extra or {}) if model is not None else {}:
                values[f"{part}.{key}"] = True  # e.g. Codex's reasoning.context
        hints = sorted(name for name, value in values.items() if value is not None)
        if hints:
            log.info("responses: accepted hints that change nothing here: %s", ", ".join(hints))
