"""A process SIGKILLed while writing large entries leaves no partial entry behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cache import PrefixCache
from tests.cache.util import config, state_for

ROOT = Path(__file__).resolve().parents[2]
STATE_BYTES = 8 << 20
NUM_ENTRIES = 1000

# Saves 8 MiB entries forever (a full queue waits for the writer rather than dropping).
WRITER = textwrap.dedent(
    f"""
    import sys
    from cache import PrefixCache
    from tests.cache.util import config, state_for

    cache = PrefixCache(config(disk_dir=sys.argv[1], ram_bytes=0, disk_bytes=64 << 20), "ns")
    i = 0
    while True:
        tokens = [i % {NUM_ENTRIES}] * 8
        if not cache.save(tokens, state_for(tokens, {STATE_BYTES})):
            cache.flush()
        i += 1
    """
)


def test_sigkill_during_writes_leaves_no_partial_entry(tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(kv)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120  # a liveness bound, not a measurement
        while time.monotonic() < deadline and proc.poll() is None:
            names = os.listdir(kv / "ns") if (kv / "ns").exists() else []
            # Kill once three entries are complete and the next one is half written.
            if sum(n.endswith(".kv") for n in names) >= 3 and any(
                n.endswith(".tmp") for n in names
            ):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the writer process died on its own"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()

    cache = PrefixCache(config(disk_dir=str(kv), ram_bytes=0), "ns")
    try:
        assert not [n for n in os.listdir(kv / "ns") if not n.endswith(".kv")]
        hits = 0
        for i in range(NUM_ENTRIES):
            tokens = [i] * 8
            hit = cache.lookup(tokens)
            if hit is not None:
                hits += 1
                assert hit.tokens == tuple(tokens)
                assert hit.state == state_for(tokens, STATE_BYTES)
        assert hits >= 3  # the files that existed before the kill all load
        assert hits == cache.stats().disk.entries
    finally:
        cache.close()
