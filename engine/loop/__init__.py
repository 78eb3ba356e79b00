"""The engine's event-loop side: what runs on asyncio's thread (and the lookup threads it
starts) for one engine: requests checked and queued, the outputs fanned back out, the
sessions' registry, the prefix cache's reports and purges.

It talks to the engine thread only through the shared modules: the commands it sends
and `EngineThread`, what the thread publishes (engine/commands.py), and the types both
read (engine/types.py, engine/sequence.py, ...). It imports nothing of engine/thread/.
"""
