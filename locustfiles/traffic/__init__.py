"""What to send and when: workload mixes and datasets, prompts of exact lengths, sessions
and agents' turns, open-loop arrival schedules, recorded traces replayed, and the spread of
a varying number."""

from __future__ import annotations

from locustfiles import public_face

__all__ = [
    "Conversation",
    "Distribution",
    "PromptBuilder",
    "RequestSpec",
    "Schedule",
    "Session",
    "Spread",
    "TraceReplay",
    "Turn",
    "Workload",
    "parse_distribution",
    "parse_spread",
    "load_trace",
    "parse_workload",
    "prompt_hash",
]

__getattr__ = public_face(
    __name__,
    {
        "Conversation": "workloads",
        "Distribution": "distribution",
        "PromptBuilder": "prompts",
        "RequestSpec": "workloads",
        "Schedule": "arrivals",
        "Session": "sessions",
        "Spread": "spread",
        "TraceReplay": "trace",
        "Turn": "sessions",
        "Workload": "workloads",
        "parse_distribution": "distribution",
        "parse_spread": "spread",
        "load_trace": "trace",
        "parse_workload": "workloads",
        "prompt_hash": "prompts",
    },
)
