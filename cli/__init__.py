"""The ``agentmem`` command line: flags, environment variables, logging, progress bars and exit codes.

Only this package imports typer. Library code raises typed errors; ``cli.app.main`` turns them into one
line on stderr and a non-zero exit code (set ``AGENTMEM_DEBUG=1`` for the traceback).
"""
