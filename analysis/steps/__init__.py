"""Per-step statistics: one row per step (and per model) from the derived per-request
arrays (`aggregate`).
"""
