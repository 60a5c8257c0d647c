"""The report object: a run's summary built from read, derive, steps and judge, and the
tables it writes (`summary`).
"""
