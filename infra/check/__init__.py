"""`llmload check`: verify a server before any load (non-streaming, streaming, bad input,
client cancellation), and learn what it is. See checks.py."""

from infra.check.checks import CheckConfig, CheckReport, CheckResult, Learned, run_checks
from infra.check.render import render_json, render_text

__all__ = [
    "CheckConfig",
    "CheckReport",
    "CheckResult",
    "Learned",
    "render_json",
    "render_text",
    "run_checks",
]
