"""Several runs: bootstrap intervals (`bootstrap`), significant changes between two runs
(`runs`), and several runs of one plan (`repeats`, written by `repeats_report`).
"""
