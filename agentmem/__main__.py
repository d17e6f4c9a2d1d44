"""``python -m agentmem``: the CLI, as the ``agentmem`` script runs it; what ``torchrun -m agentmem`` starts
in each process: ``torchrun --nproc-per-node N -m agentmem -- distill ...``. The ``--`` keeps torchrun's
parser off the command's flags (it would read ``--run`` as its own ``--run-path``); a ``--`` that reaches
here is dropped."""

import sys

from cli.app import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["--"]:
        del sys.argv[1]
    main()
