"""A Hugging Face hub stand-in on loopback: the few routes huggingface_hub calls.

- GET /api/models/{org}/{name}[/revision/{rev}]: model_info (with `blobs`: sizes, sha256)
- HEAD/GET /{org}/{name}/resolve/{rev}/{file}: the file, with the headers hf_hub_download
  reads (X-Repo-Commit, ETag / X-Linked-Etag, Content-Length / X-Linked-Size) and Range.
Unknown repos and files answer 404 with the X-Error-Code the real hub sends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubFile:
    path: Path  # the bytes served
    sha256: str = ""  # what the listing claims; empty: the true digest

    def claimed(self) -> str:
        return self.sha256 or hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass
class StandIn:
    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    downloads: list[str] = field(default_factory=list)  # file GETs, in order
    authorizations: list[str] = field(default_factory=list)  # Authorization headers seen
    url: str = ""
    outage: int = 0  # non-zero: every request answers this status (a hub outage)
    # An Event: a file's bytes wait until it is set (downloads in flight, as long as a
    # test needs); the file is named in `downloads` when its GET arrives.
    hold: threading.Event | None = None


def _handler(hub: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _not_found(self, code: str) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            self._serve(body=True)

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def _serve(self, body: bool) -> None:
            if self.headers.get("Authorization"):
                hub.authorizations.append(self.headers["Authorization"])
            if hub.outage:
                self.send_response(hub.outage)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            path = unquote(urlsplit(self.path).path)
            api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
            if api:
                return self._info(api.group(1))
            res = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if res:
                return self._file(res.group(1), res.group(3), body)
            self._not_found("RepoNotFound")

        def _info(self, repo: str) -> None:
            files = hub.repos.get(repo)
            if files is None:
                return self._not_found("RepoNotFound")
            siblings = []
            for name, f in files.items():
                size = f.path.stat().st_size
                lfs = {"size": size, "sha256": f.claimed(), "pointerSize": 134}
                siblings.append({"rfilename": name, "size": size, "lfs": lfs})
            data = json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _file(self, repo: str, name: str, body: bool) -> None:
            if repo not in hub.repos:
                return self._not_found("RepoNotFound")
            f = hub.repos[repo].get(name)
            if f is None:
                return self._not_found("EntryNotFound")
            data = f.path.read_bytes()
            start = 0
            rng = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
            if rng:
                start = int(rng.group(1))
            etag = f'"{f.claimed()}"'
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", etag)
            self.send_header("X-Linked-Etag", etag)
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if body:
                hub.downloads.append(name)
                if hub.hold is not None:
                    hub.hold.wait(60)
                self.wfile.write(data[start:])

    return Handler


def start(hub: StandIn) -> tuple[StandIn, ThreadingHTTPServer]:
    """Serve `hub` on a free loopback port in a daemon thread; `server.shutdown()` stops it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return hub, server


@contextlib.contextmanager
def serving(hub: StandIn) -> Iterator[StandIn]:
    """`hub` served (see `start`) while the block runs, then stopped."""
    stand_in, server = start(hub)
    try:
        yield stand_in
    finally:
        server.shutdown()
        server.server_close()


def fake_gguf(directory: Path) -> Path:
    """A file that is a GGUF by its magic only: what the downloads move, not a model."""
    path = directory / "served.gguf"
    path.write_bytes(b"GGUF" + os.urandom(300_000))
    return path


def point_hub_at(stand_in: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub in this process talks to `stand_in` (what HF_ENDPOINT sets when it
    is imported: a server process reads it so)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", stand_in.url)
    template = stand_in.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
