"""Chat templates, reasoning split, tool-call formats, JSON schema -> GBNF, output parsing."""

from chat.callstream import Delta
from chat.formats import GrammarSpec, ToolFormat, detect_format
from chat.plan import ChatOptions, ChatPlan, OutputParser, plan_chat
from chat.schema import SchemaError, schema_to_gbnf
from chat.template import CHATML, ChatTemplate, RenderedPrompt, TemplateError
from chat.tools import ChatInputError, Tool, ToolChoice

__all__ = [
    "CHATML",
    "ChatInputError",
    "ChatOptions",
    "ChatPlan",
    "ChatTemplate",
    "Delta",
    "GrammarSpec",
    "OutputParser",
    "RenderedPrompt",
    "SchemaError",
    "TemplateError",
    "Tool",
    "ToolChoice",
    "ToolFormat",
    "detect_format",
    "plan_chat",
    "schema_to_gbnf",
]
