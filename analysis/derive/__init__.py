"""What each request and each window says: per-request metrics (`metrics`), the one distribution
summary (`stats`), step windows (`windows`), sessions and turns (`sessions`), open-loop slip
(`openloop`), worker health (`workers`), the request path joined with spans (`path`), the
prefix cache's state (`cachestate`) and the chunk facts, out of core or in memory
(`chunkfacts`).
"""
