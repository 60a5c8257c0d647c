"""The options of a run: the one option table (flag, campaign key, kind, default, help), the
value kinds and their checks, the parsers of option values, the cross-option rules, what a
trace workload sets, and the checked `ChatOptions` every other room reads.

Import from the room's modules; the package itself holds nothing.
"""
