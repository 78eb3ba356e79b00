"""`[media]`: what one request may send as images (read by server/serving/media.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass


@pydantic_dataclass(frozen=True)
class MediaSection:
    """`[media]`: what one request may send as images."""

    max_images: Annotated[int, Field(ge=0)] = 16  # per request; 0: no images at all
    max_image_bytes: Annotated[int, Field(ge=1024)] = 10 * 1024 * 1024  # decoded or fetched
    # width x height as the file's header declares it, read before anything decodes it:
    # a few-MB PNG of a blank 25k x 25k picture unpacks to ~1.9 GB. 4096 x 4096 takes a
    # 12 MP photo, a 4K or 5K screenshot; the projector shrinks every image to its own size.
    max_image_pixels: Annotated[int, Field(ge=1)] = 4096 * 4096
    # Fetch http(s) image URLs. Off by default: a client could make the server read any
    # address it can reach (internal ones included). Data URLs and base64 need nothing.
    allow_urls: bool = False
    url_timeout_s: Annotated[float, Field(gt=0)] = 10.0  # a whole fetch, redirects included
