"""The tiered KV cache (RAM, then disk): not built yet.

Today a finished sequence's KV prefix stays in its engine slot and is reused by the next
prompt that shares it (engine/scheduler.py); the tiered store that outlives slots and
restarts comes with the cache issue.
"""
