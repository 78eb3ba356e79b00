"""The downloads of `POST /api/pull`: their own threads, how many at once, how many bytes.

A download holds a thread for as long as it runs (minutes for a model). Pulls used to
take those from asyncio's default pool, which also runs grammar builds, long tokenizes
and the response store's Redis calls, so a few pulls stalled generation for everyone.
Here they get a pool of their own, `[hub] max_concurrent_pulls` threads; a pull beyond
that is refused at once (429 with Retry-After), not queued behind downloads of unknown
length. A second pull of a name already downloading follows that one and takes no
thread. Before its first byte, a download's size (from the hub's listing) is checked
against the free space of the hub cache's disk and against `[hub] max_cache_bytes`,
counting what the downloads in flight will still write; a file that does not fit is
refused (507) with a message naming its size and the limit.

Thread contract: `start`, `release` and `close` on the event loop; `check_room` on a
download's thread (`_lock` covers the reservations, which both sides touch).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from server.errors import TooManyRequests
from server.models.hub import NoRoom
from server.models.hub_models import HubName
from server.models.served import ServedModel

if TYPE_CHECKING:
    from server.config.hub import HubSection

RETRY_AFTER_S = 30  # a model download takes minutes: a client should not spin


@dataclass
class Pull:
    """One download in progress, shared by every request for the same name."""

    name: HubName
    digest: str = ""  # "sha256:<hex>" of the file, once the listing named it
    total: int = 0
    completed: int = 0
    verifying: bool = False
    task: asyncio.Future[ServedModel] = field(default_factory=asyncio.Future)

    def progress(self) -> dict[str, Any]:
        """Ollama's progress object."""
        return {
            "status": f"pulling {self.digest[7:19]}",
            "digest": self.digest,
            "total": self.total,
            "completed": self.completed,
        }


class Pulls:
    """The downloads in flight, by the name they were asked under."""

    def __init__(self, hub: HubSection) -> None:
        self.limit = hub.max_concurrent_pulls
        self.max_cache_bytes = hub.max_cache_bytes
        self.cache_dir = hub.cache_dir  # "": huggingface_hub's (HF_HUB_CACHE)
        self.executor = ThreadPoolExecutor(self.limit, "kvserve-pull")
        self.jobs: dict[str, Pull] = {}
        self._lock = threading.Lock()
        self._reserved: dict[str, int] = {}  # name -> bytes its download will write

    def start(
        self, name: HubName, run: Callable[[Pull], Coroutine[Any, Any, ServedModel]]
    ) -> Pull:
        """The pull of `name`: the one running, or a new one running `run` (429 when
        every download thread is taken)."""
        running = self.jobs.get(name.name)
        if running is not None and not running.task.done():
            return running
        self._admit(sum(not job.task.done() for job in self.jobs.values()))
        job = Pull(name)
        job.task = asyncio.ensure_future(run(job))
        self.jobs[name.name] = job
        # A client that left does not read the outcome: mark it read (no "never retrieved").
        job.task.add_done_callback(lambda t: t.cancelled() or t.exception())
        job.task.add_done_callback(lambda _: self.release(name.name))
        return job

    def _admit(self, running: int) -> None:
        if running >= self.limit:
            raise TooManyRequests(
                f"{running} pulls are downloading, the most this server runs at once "
                f"([hub] max_concurrent_pulls = {self.limit}); retry when one has finished",
                param="model",
                code="too_many_pulls",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

    def room_check(self, name: str) -> Callable[[str, int], None]:
        """The `before_download` hook of `name`'s download (server/models/hub.py `fetch`)."""
        return lambda filename, size: self.check_room(name, filename, size)

    def check_room(self, name: str, filename: str, size: int) -> None:
        """Reserve `size` bytes for `name`'s download, or raise NoRoom: more than the
        disk has free, or than the hub cache's budget leaves, once the downloads in
        flight have written theirs. A size the hub did not list (0) is not checked."""
        if size <= 0:
            return
        where = self._cache_dir()
        with self._lock:
            pending = sum(n for other, n in self._reserved.items() if other != name)
            if self.max_cache_bytes:
                held = _bytes_under(where)
                if held + pending + size > self.max_cache_bytes:
                    raise NoRoom(
                        f"{name}: {filename} is {_human(size)} ({size} bytes): the hub cache holds "
                        f"{_human(held)}{_and_pending(pending)} and its budget, [hub] "
                        f"max_cache_bytes, is {_human(self.max_cache_bytes)}"
                    )
            free = shutil.disk_usage(_existing(where)).free
            if pending + size > free:
                raise NoRoom(
                    f"{name}: {filename} is {_human(size)} ({size} bytes) and the disk of the hub "
                    f"cache ({where}) has {_human(free)} free{_and_pending(pending)}"
                )
            self._reserved[name] = size

    def release(self, name: str) -> None:
        """`name`'s download ended (done or failed): its bytes are on disk, or not."""
        with self._lock:
            self._reserved.pop(name, None)

    def close(self) -> None:
        """At shutdown: downloads under way are left to the process's exit."""
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _cache_dir(self) -> str:
        if self.cache_dir:
            return self.cache_dir
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)


def _bytes_under(folder: str) -> int:
    """What the files under `folder` take (links not followed: a snapshot's links point
    at blobs already counted; unfinished downloads count)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue  # removed meanwhile
            if not stat.S_ISLNK(st.st_mode):
                total += st.st_size
    return total


def _existing(path: str) -> str:
    """`path`, or its nearest parent that exists (the cache is made by the download)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _and_pending(pending: int) -> str:
    return f" (and pulls under way will write {_human(pending)})" if pending else ""


def _human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
