"""A message's content given as parts (text and images) -> the text a template renders.

The server reads each API's image parts into one common part, `{"type": "image",
"image": <the image, opaque here>, "param": <its path in the request>}`; here each
becomes the model's media marker in the text (llama.cpp's mtmd puts the image's own
tokens there, with whatever the model wraps an image in), and the images are collected
in the order their markers appear, which is the order the engine reads them in.
"""

from __future__ import annotations

from typing import Any

from chat.tools import ChatInputError


def with_media_markers(
    messages: list[dict[str, Any]], marker: str
) -> tuple[list[dict[str, Any]], tuple[Any, ...]]:
    """Content given as parts joined into its text, an image part as `marker` (mtmd
    puts the image's own tokens there); the images in the order they appear. A message
    whose content is a string is kept as it is."""
    if not any(isinstance(m.get("content"), list) for m in messages):
        return messages, ()
    media: list[Any] = []
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") == "image":
                    if not marker:
                        raise ChatInputError("this model takes no images (it has no vision "
                                             "projector)", param=part.get("param", "messages"))
                    texts.append(marker)
                    media.append(part.get("image"))
                else:
                    texts.append(part.get("text") or "")
            message = {**message, "content": "".join(texts)}
        out.append(message)
    return out, tuple(media)
