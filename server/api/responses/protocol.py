"""OpenAI Responses API request model (POST /v1/responses).

Scalars are validated here; `input` items and `tools` are taken as JSON and read by
`server/api/responses/input.py`, which names the exact item and field it refuses.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from server.api.common import McpToolChoice as McpChoice
from server.api.common import Probability, RequestModel
from server.http.errors import Unsupported
from server.serving.request_sampling import RequestSampling


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
    type: Literal["function"]
    name: str


class Reasoning(RequestModel):
    effort: str | None = None
    summary: str | None = None


# Defined by OpenAI for /v1/responses, not implemented here: refused when set.
RESPONSES_UNSUPPORTED = (
    "background", "conversation", "prompt", "include", "max_tool_calls", "top_logprobs",
    "prompt_cache_key", "safety_identifier", "context_management", "moderation", "image",
)  # fmt: skip


class ResponsesRequest(RequestModel):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | McpChoice | None = None
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
        return RequestSampling(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            seed=self.seed, stop=tuple(self.stop or ()), cache_salt=self.cache_salt,
            session_id=session_id,
        )  # fmt: skip

    def refuse_unsupported(self) -> None:
        extra = self.model_extra or {}
        for name in RESPONSES_UNSUPPORTED:
            if extra.get(name) not in (None, False, [], {}):
                raise Unsupported(name, "not implemented by this server")
        if self.reasoning is not None and self.reasoning.effort not in (None, "none"):
            raise Unsupported(
                "reasoning.effort", "the reasoning effort of local models is not adjustable"
            )
        if self.reasoning is not None and self.reasoning.summary not in (None,):
            raise Unsupported("reasoning.summary", "reasoning summaries are not produced")
        if self.truncation == "auto":
            raise Unsupported("truncation", "only 'disabled'")
        if self.service_tier not in (None, "auto", "default"):
            raise Unsupported("service_tier", "only 'auto' or 'default'")
        if self.text is not None and self.text.verbosity not in (None, "medium"):
            raise Unsupported("text.verbosity", "only 'medium'")
