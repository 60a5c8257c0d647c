"""llmload's locustfiles: the package that runs inside Locust, in rooms that import downward.

    request  ->  traffic  ->  options  ->  run  ->  sink  ->  live  ->  worker  ->  master  ->  chat.py

A room imports only from rooms to its left (tests/unit/test_import_graph.py); docs/architecture.md
says what each holds and draws a request's and an event's path through them. A room's
`__init__` holds only its docstring: import from the room's modules.
"""

ROOMS = ("request", "traffic", "options", "run", "sink", "live", "worker", "master")
