"""Models of the hub cache, served beside the configured ones.

A GGUF fetched by `POST /api/pull` (or by `kvserve pull` without a server), or found in
huggingface_hub's cache when the server starts, is served under the name Ollama gives a
Hugging Face model, `hf.co/org/repo:QUANT` (`:latest` for a repository's only GGUF).
Such a model loads on its first request with the `[engine]` defaults, and is the only
kind `DELETE /api/delete` removes from disk: what the configuration names (a model's or
an adapter's `path` or `hf_repo`, the bundled default) is neither listed as pulled nor
deleted (`Configured`).

Replicas that share the hub cache directory share these models: the list follows the
directory (`rescan`, on `GET /api/tags` and `/v1/models` and when a request names a hub
model this process does not serve). It costs a walk of the cache's snapshot folders
(names only) and reads the cache further only when that changed; a model whose file
another replica deleted goes from the list once it is not loaded here. Copies
(`/api/copy`) are names in one process's memory: each replica has its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.client import EngineLike, EngineState
from server.models.served import ModelRegistry, ServedModel

if TYPE_CHECKING:
    from server.config.model_entries import ModelSection
    from server.models.loader import ModelLoader

log = logging.getLogger("kvserve.server")

PREFIXES = ("hf.co/", "huggingface.co/")
MISS_RESCAN_S = 1.0  # the least time between two looks at the hub cache for unknown names
# A file's quant tag, as a whole word of its name: "SmolLM2.Q4_K_M.gguf" -> "Q4_K_M".
_QUANT = re.compile(r"(?:^|[-._])(I?Q\d[A-Z0-9_]*|BF16|F16|F32)(?=[-.])", re.IGNORECASE)
_SHARD = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


class HubModelError(Exception):
    """A request about a hub model that cannot be done; the text names the cause."""


@dataclass(frozen=True, slots=True)
class HubName:
    """`hf.co/org/repo[:QUANT]`: `quant` empty or "latest" means the repository's only GGUF."""

    repo: str
    quant: str = ""

    @classmethod
    def parse(cls, name: str) -> HubName | None:
        """None for a name that is not a Hugging Face one (Ollama's library names)."""
        for prefix in PREFIXES:
            if name.lower().startswith(prefix):
                repo, _, tag = name[len(prefix) :].partition(":")
                if not _REPO.fullmatch(repo):
                    return None
                return cls(repo, "" if tag.lower() == "latest" else tag)
        return None

    @property
    def spec(self) -> str:
        """For server.models.hub: `org/repo[:QUANT]`."""
        return f"{self.repo}:{self.quant}" if self.quant else self.repo

    @property
    def name(self) -> str:
        return f"hf.co/{self.repo}:{self.quant or 'latest'}"


def quant_of(filename: str) -> str:
    found = _QUANT.findall(Path(filename).name)
    return found[-1].upper() if found else ""


def is_model_file(filename: str) -> bool:
    """A GGUF that is a model: not a projector, not a shard of a split file."""
    low = filename.lower()
    return low.endswith(".gguf") and "mmproj" not in low and not _SHARD.search(low)


@dataclass(frozen=True)
class Configured:
    """What the configuration owns in the hub cache: the repositories of `hf_repo` models
    and adapters, and every configured `path` (a model's or an adapter's, wherever it
    lies). Never served as a pulled model, never deleted: each maps to what owns it."""

    repos: Mapping[str, str] = field(default_factory=dict)  # repo id, lower case -> owner
    files: Mapping[str, str] = field(default_factory=dict)  # real path -> owner

    @classmethod
    def of(cls, models: Sequence[ModelSection]) -> Configured:
        repos: dict[str, str] = {}
        files: dict[str, str] = {}
        for m in models:
            owners = [(f"the configured model '{m.id}'", m.hf_repo, m.model_path)]
            owners += [(f"the adapter '{a.id}' of the configured model '{m.id}'", a.hf_repo,
                        a.path) for a in m.loras]  # fmt: skip
            for owner, repo, path in owners:
                if repo:
                    repos.setdefault(repo.partition(":")[0].lower(), owner)
                if path:
                    files.setdefault(os.path.realpath(path), owner)
        return cls(repos, files)

    def owner(self, repo: str, path: str) -> str | None:
        """What configured model or adapter holds `path` of `repo`; None: nothing does."""
        return self.repos.get(repo.lower()) or self.files.get(os.path.realpath(path))


class HubModels:
    """The hub-cache models this server serves: registered, found, deleted."""

    def __init__(
        self,
        models: ModelRegistry,
        loader: ModelLoader,
        make_engine: Callable[[str, str], EngineLike],  # (model id, GGUF path) -> engine
        cache_dir: str,
        configured: Configured,
        *,
        follow: bool = False,
    ):
        self.models = models
        self.loader = loader
        self.make_engine = make_engine
        self.cache_dir = cache_dir or None  # None: huggingface_hub's (HF_HUB_CACHE)
        self.configured = configured  # its files are never served as pulled, nor deleted
        self.copies: set[str] = set()  # names /api/copy gave (aliases, this process only)
        self.follow = follow  # rescan the directory (a server's; tests that name one)
        self._seen: frozenset[str] | None = None  # the snapshot links of the last scan
        self._deleting: set[str] = set()  # files a delete here is removing: not found
        self._missed_at = -MISS_RESCAN_S  # time.monotonic() of the last look on a miss
        if follow:
            models.on_miss = self.found

    def register(self, repo: str, path: str, *, also: str = "") -> ServedModel:
        """Serve the GGUF at `path` of `repo` (loaded on demand); the model already
        served from that file when there is one. `also`: a name it is known by too.
        A file the configuration owns is refused: it is served (or used) as configured."""
        owner = self.configured.owner(repo, path)
        if owner is not None:
            raise HubModelError(f"hf.co/{repo} is {owner}'s: it is not served as a pulled model")
        for served in self.models:
            if served.pulled and served.path == path:
                return served
        model_id = HubName(repo, quant_of(path)).name
        names = [n for n in (also,) if n and n != model_id and self.models.get(n) is None]
        if self.models.get(model_id) is not None:  # that name serves another file
            raise HubModelError(f"the name {model_id!r} is taken by another model")
        engine = self.make_engine(model_id, path)
        engine.state = EngineState.UNLOADED  # until a request needs it (as configured on_demand)
        served = ServedModel(model_id, tuple(names), engine)
        served.on_demand, served.pulled, served.path = True, True, path
        served.last_used = time.monotonic()
        self.models.add(served)
        log.info("serving %s from the hub cache (%s)", model_id, path)
        return served

    def discover(self) -> None:
        """Serve every model GGUF the hub cache holds (the newest revision of each
        repository), except what the configuration owns (its models' and adapters'
        repositories and files)."""
        from huggingface_hub import CacheNotFound, scan_cache_dir

        self._seen = _snapshot_links(self._root())
        try:
            info = scan_cache_dir(self.cache_dir)
        except CacheNotFound:
            return
        for repo in sorted(info.repos, key=lambda r: r.repo_id):
            if repo.repo_type != "model" or repo.repo_id.lower() in self.configured.repos:
                continue
            if not repo.revisions:
                continue
            newest = max(repo.revisions, key=lambda r: r.last_modified)
            owned = self.configured.owner
            files = sorted(
                (f for f in newest.files if is_model_file(f.file_name)
                 and owned(repo.repo_id, str(f.file_path)) is None),
                key=lambda f: f.file_name,
            )  # fmt: skip
            for f in files:
                if str(f.file_path) in self._deleting:
                    continue
                only = len(files) == 1 and quant_of(f.file_name)
                try:
                    self.register(repo.repo_id, str(f.file_path),
                                  also=f"hf.co/{repo.repo_id}:latest" if only else "")  # fmt: skip
                except (HubModelError, ValueError) as exc:
                    log.warning("hub cache: %s not served: %s", f.file_path, exc)

    async def delete(self, served: ServedModel) -> None:
        """Unload `served`, stop serving it and remove its file from the hub cache
        (409 while it loads or serves: server/models/loader.py `retire`)."""
        if not served.pulled:
            raise HubModelError(f"the model {served.id!r} is configured, not pulled")
        repo = HubName.parse(served.id)
        owner = self.configured.owner(repo.repo if repo else "", served.path)
        if owner is not None:
            raise HubModelError(f"its file is {owner}'s")
        self._deleting.add(served.path)  # a rescan meanwhile must not serve it again
        try:
            await self.loader.retire(served, lambda: self.models.remove(served))  # 409 if used
            remove_cached_file(served.path)
        finally:
            self._deleting.discard(served.path)

    # -- following a hub cache that other replicas write too ---------------------------

    def found(self, name: str) -> bool:
        """A request named `name`, which nothing here serves: when it is a hub name,
        look at the directory again (another replica may have pulled it), unless a look
        was taken less than `MISS_RESCAN_S` ago. Whether it did look. (The look walks
        the cache's directories on the event loop: a client naming unknown hub models
        in a loop costs one walk per interval, not one per request.)"""
        if HubName.parse(name) is None:
            return False
        now = time.monotonic()
        if now - self._missed_at < MISS_RESCAN_S:
            return False
        self._missed_at = now
        return self.rescan()

    def rescan(self) -> bool:
        """Serve what was added to the hub cache since the last look, stop serving what
        was removed from it (models not loaded here); False when not following."""
        if not self.follow:
            return False
        self._prune()
        if _snapshot_links(self._root()) != self._seen:
            self.discover()
        return True

    def _prune(self) -> None:
        for served in [m for m in self.models if m.pulled and not os.path.lexists(m.path)]:
            engine = served.engine
            idle = engine.state in (EngineState.UNLOADED, EngineState.FAILED, EngineState.STOPPED)
            if idle and not served.in_flight and not engine.busy:
                log.info("hub cache: %s was removed (%s); not served", served.id, served.path)
                self.models.remove(served)
                self.loader.forget(served)
                engine.close()  # not loaded: its cache's writer ends

    def _root(self) -> str:
        if self.cache_dir:
            return self.cache_dir
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)


def _snapshot_links(root: str) -> frozenset[str]:
    """The files of every repository's snapshots (names only: links, not blobs)."""
    found: set[str] = set()
    try:
        repos = [e.path for e in os.scandir(root) if e.name.startswith("models--")]
    except OSError:
        return frozenset()
    for repo in repos:
        for folder, _, names in os.walk(os.path.join(repo, "snapshots")):
            found.update(os.path.join(folder, n) for n in names)
    return frozenset(found)


def remove_cached_file(path: str) -> None:
    """Remove one file of huggingface_hub's cache: its snapshot link, its blob when no
    other snapshot links to it, and the repository's folder once nothing is left."""
    link = Path(path)
    snapshots = next((p for p in link.parents if p.name == "snapshots"), None)
    if snapshots is None:  # not in a hub cache layout: nothing of ours to remove
        raise HubModelError(f"{path} is not a file of the hub cache")
    blob = link.resolve()
    link.unlink(missing_ok=True)
    still_linked = any(p.is_symlink() and p.resolve() == blob for p in snapshots.rglob("*"))
    if blob != link and not still_linked:
        blob.unlink(missing_ok=True)
    for folder in sorted(snapshots.rglob("*"), key=lambda p: -len(p.parts)):
        if folder.is_dir():
            with contextlib.suppress(OSError):
                folder.rmdir()  # only empty ones
    if not any(p.is_file() or p.is_symlink() for p in snapshots.rglob("*")):
        repo_dir = snapshots.parent
        shutil.rmtree(repo_dir, ignore_errors=True)  # refs and blobs too
        shutil.rmtree(repo_dir.parent / ".locks" / repo_dir.name, ignore_errors=True)
