"""The shared kernel: the event vocabulary both sides of llmload use, and nothing heavier.

The schema and error kinds with their named subsets (`schema`), the store layout (`layout`),
storage (`storage`), the error hierarchy (`errors`), trace ids, traceparent and the engine's
OTLP spans (`spans`), the SLO grammar (`slo`) and the names of its statistics
(`percentiles`), the distribution grammar (`distribution`), the Prometheus text reading
(`prometheus`) and one instant read on the wall clock and the monotonic counter (`anchor`).
The runtime (`locustfiles/`) imports only this room of `analysis/`; no module here imports
pandas, duckdb, matplotlib or another room (tests/unit/test_import_graph.py).
"""
