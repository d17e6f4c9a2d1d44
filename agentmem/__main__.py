"""``python -m agentmem``: the CLI, as the ``agentmem`` script runs it; what ``torchrun -m agentmem`` starts
in each process: ``torchrun --nproc-per-node N -m agentmem -- distill ...``. The ``--`` keeps torchrun's
parser off the command's flags (it would read ``--run`` as its own ``--run-path``); a ``--`` that reaches
here is dropped.

Under torchrun (``WORLD_SIZE`` above 1) a process ends without the interpreter's final teardown: it runs the
``atexit`` handlers (trackers, logging), flushes its streams and leaves with ``os._exit``. Tearing down the
interpreter after the gloo process group is gone aborts about one CPU worker in ten with "terminate called
without an active exception" (a C++ thread destroyed unjoined), which torchrun reports as a failed job after
every step and checkpoint was written."""

import atexit
import os
import sys
import traceback

from cli.app import main


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def run_worker() -> None:
    """``main`` in one torchrun process, then ``os._exit`` with its exit status."""
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - printed as Python would, then the same status
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--"]:
        del sys.argv[1]
    if int(os.environ.get("WORLD_SIZE") or 1) > 1:
        run_worker()
    else:
        main()
