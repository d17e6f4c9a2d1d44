"""Jobs: one module per job, each ``run_<job>(store, config, runtime, ...)`` with one pydantic config.

A job validates everything it can before loading a model, records itself as a run (with its process id
and a heartbeat, so a killed run can be told from a live one), does its work in short transactions and
ends the run ``finished``, ``failed`` (with the error) or ``interrupted``. The CLI only parses flags,
calls a job and prints what it returns.
"""
