"""Judging steps and runs: the verdict (`verdict`), the capacity search's reading of steps
(`search`), and how a staircase cut short is worded (`stopping`).
"""
