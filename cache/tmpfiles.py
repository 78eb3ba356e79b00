"""The disk tier's temporary files (cache/disk.py): named after their writer, so that a
leftover is told from another replica's write in flight, and the durable rename.

A temporary file is `<key>.kv.<host>-<pid>-<n>.tmp`: it is a leftover when its writer
ran on this host and is gone, or when it is older than TMP_MAX_AGE_S; otherwise it may be
another replica's write in flight, and is left alone.
"""

from __future__ import annotations

import contextlib
import os
import socket

TMP_SUFFIX = ".tmp"
TMP_MAX_AGE_S = 3600.0  # no write takes this long; an older temporary file is a leftover

HOST = socket.gethostname().replace(".", "_").replace("-", "_") or "host"
WRITER = f"{HOST}-{os.getpid()}"  # in temporary names: <key>.kv.<host>-<pid>-<n>.tmp


def is_leftover(name: str, age_s: float) -> bool:
    """A temporary file no live writer will rename: its writer ran on this host and is
    gone (pid not alive), or it is too old to be a write in flight."""
    if age_s > TMP_MAX_AGE_S:
        return True
    writer = name[: -len(TMP_SUFFIX)].rsplit(".", 1)[-1].split("-")
    if len(writer) == 2:  # <pid>-<n>: written before names carried the host
        writer = [HOST, *writer]
    if len(writer) != 3 or writer[0] != HOST or not writer[1].isdigit():
        return False  # another host's (a replica sharing the directory), or not ours
    pid = int(writer[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
