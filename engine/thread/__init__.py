"""The engine thread's side: everything that runs on `kvserve-engine` (and its watchdog):
the load, the step loop, scheduling, placement, the KV operations, postprocess.

The event loop reaches it only through the commands it sends and what the worker
publishes (engine/commands.py `EngineThread`). It imports nothing of engine/loop/.
"""
