"""What an MCP connection leaves behind when it is not closed, counted from outside the
code under test: this process's asyncio tasks of the MCP client, its TCP connections
to a port (from /proc/net/tcp), its child processes (stdio servers)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path


def mcp_tasks() -> list[asyncio.Task[object]]:
    """Live tasks of the MCP client (connection owners "mcp:<label>", connect attempts)."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("mcp") and not t.done()]


def tcp_connections(port: int) -> int:
    """ESTABLISHED TCP connections of this process to `port` on loopback."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port and inode in inodes:
                count += 1
    return count


def child_processes() -> list[int]:
    """Live child processes of this process."""
    me, out = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(entry.name))
    return out


async def settles(value: Callable[[], object], want: object, timeout: float = 10.0) -> object:
    """`value()` once it equals `want` (clean-up runs in tasks of its own), else its last
    value after `timeout` seconds, for the assertion to show."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (got := value()) != want and loop.time() < deadline:
        await asyncio.sleep(0.05)
    return got
