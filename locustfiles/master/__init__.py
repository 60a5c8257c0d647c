"""The master's side of a run: the coordinator (run id, manifest, steps, clocks, finish),
the staircase and capacity search, Locust's shape hook, the preflight, the target's metrics.

Import from the room's modules; the package itself holds nothing.
"""
