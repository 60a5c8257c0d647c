"""A worker's side of a run: its context (sink, workload stream, probes, recording), the
open-loop dispatcher, the self-monitor, and the watch on its master.

Import from the room's modules; the package itself holds nothing.
"""
