"""The batched llama.cpp engine: one thread owns the context; asyncio talks to it.

The package's face is engine.client, the seam the server imports: the same names."""

from engine import client
from engine.client import *  # noqa: F403

__all__ = client.__all__
