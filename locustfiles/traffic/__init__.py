"""What to send and when: workload mixes and datasets, prompts of exact lengths, sessions
and agents' turns, open-loop arrival schedules, recorded traces replayed, and the spread of
a varying number.

Import from the room's modules; the package itself holds nothing.
"""
