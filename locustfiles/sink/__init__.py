"""Where a worker's rows go: buffers encoded to Parquet parts, a local spool, the store,
nothing lost; and the start-up warm-up that keeps first-use costs out of the run.

Import from the room's modules; the package itself holds nothing.
"""
