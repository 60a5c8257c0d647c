"""Live statistics: per-step sketches on workers, merged exactly on the master; the LLM tab,
the live page, /llmload/metrics, the headless step lines and the report at the end.

Import from the room's modules; the package itself holds nothing.
"""
