"""The key before the body: a request for a route that takes an API key is refused
(401, in its API's error shape) on its headers alone, before any byte of its body is
read, buffered or parsed.

Without this, a client with no key made the server read a body of up to
`max_body_bytes` and hold it for up to `body_timeout_s` (BodyLimit), and parse it as
JSON (a model gate before the routes, and FastAPI): 16 concurrent
8 MB bodies of `[{},{},...]` took the process from 525 MB to 3.2 GB and stalled
/livez for 10 s, all to answer 401.

Every route takes a key but the open ones app.py hands over here (those the APIs' specs
mount as open: /health, /livez, /metrics, the page at /); a path
that matches no route takes one too: an unknown path is no way to make the server read
a body. The refused body is never received: uvicorn discards what arrives after the
answer, and closes the connection when nothing comes for `keep_alive_s`, or when the
rest of the body still trickles in past `header_timeout_s`
(server/process/connections.py). This is a request's one key check: the routes do
not check it again (model management's and /docs' `require_api_key` aside).
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import Unauthorized, shaped
from server.http.deps import key_accepted


class KeyFirst:
    def __init__(self, app: ASGIApp, keys: tuple[str, ...], open_routes: Iterable[BaseRoute]):
        self.app = app
        self.keys = keys
        self.open_routes = tuple(open_routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or self._open(scope):
            await self.app(scope, receive, send)
            return
        if not key_accepted(Headers(scope=scope), self.keys):
            await shaped(Unauthorized(), scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _open(self, scope: Scope) -> bool:
        return any(route.matches(scope)[0] is Match.FULL for route in self.open_routes)
