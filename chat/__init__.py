"""Chat templates (and, later, reasoning split, tool-call formats, JSON schema -> GBNF)."""

from chat.template import CHATML, ChatTemplate, RenderedPrompt, TemplateError

__all__ = ["CHATML", "ChatTemplate", "RenderedPrompt", "TemplateError"]
