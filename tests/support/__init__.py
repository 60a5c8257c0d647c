"""Shared pytest fixtures, one module per area (loaded as plugins by tests/conftest.py)."""
