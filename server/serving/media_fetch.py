"""Fetching an image a request names by http(s) URL (`[media] allow_urls`).

The body is streamed and the fetch stops as soon as it passes `max_image_bytes` (a
Content-Length over the limit is refused before a byte of the body is read); the
whole fetch, redirects included, has `url_timeout_s`. Every failure is a 400 naming
the part: the client named a URL that does not give an image, which is its input.
"""

from __future__ import annotations

import asyncio

import httpx

from server.errors import BadRequest

MAX_REDIRECTS = 5
# Content types a server may answer an image with besides image/*: a file server that
# does not know the type says so.
_GENERIC_TYPES = ("application/octet-stream", "binary/octet-stream", "")


def _client(timeout_s: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=timeout_s, follow_redirects=True,
                             max_redirects=MAX_REDIRECTS)  # fmt: skip


async def fetch_image(url: str, param: str, max_bytes: int, timeout_s: float) -> bytes:
    """The bytes at `url`, at most `max_bytes` of them, within `timeout_s`."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _fetch(url, param, max_bytes, timeout_s)
    except TimeoutError:
        raise BadRequest(f"'{param}': fetching {url} took longer than {timeout_s:g} s "
                         "([media] url_timeout_s)", param=param) from None  # fmt: skip
    except httpx.TimeoutException:
        raise BadRequest(f"'{param}': fetching {url} took longer than {timeout_s:g} s "
                         "([media] url_timeout_s)", param=param) from None  # fmt: skip
    except httpx.HTTPError as exc:
        raise BadRequest(f"'{param}': {url} could not be fetched: {exc}", param=param) from None


async def _fetch(url: str, param: str, max_bytes: int, timeout_s: float) -> bytes:
    async with _client(timeout_s) as client, client.stream("GET", url) as response:
        if response.status_code != 200:
            raise BadRequest(f"'{param}': {url} answered HTTP {response.status_code}",
                             param=param)  # fmt: skip
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if not kind.startswith("image/") and kind not in _GENERIC_TYPES:
            raise BadRequest(f"'{param}': {url} is '{kind}', not an image", param=param)
        too_large = BadRequest(f"'{param}': the image at {url} is larger than {max_bytes:,} "
                               "bytes ([media] max_image_bytes)", param=param)  # fmt: skip
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_bytes:
            raise too_large
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise too_large
        return bytes(body)
