"""Options shared by every command, and the Enums of choices that are not in ``agentmem.config``."""

from __future__ import annotations

from typing import Annotated

import typer

from agentmem.config import Choice, Device
from envs import env_names

# --env: the built-in environments and the installed packages' (entry points), checked at parse time
EnvName = Choice("EnvName", [(n, n) for n in env_names()])
# --dtype of the generating jobs (rollout, eval): a weights dtype, or auto (the faster one measured on this CPU)
GenDType = Choice("GenDType", [(n, n) for n in ("auto", "float32", "bfloat16", "float16")])
DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL: sqlite:///PATH (default sqlite:///agentmem.db) or postgresql://USER@HOST/DB. "
        "Defaults to $AGENTMEM_DB.",
        show_default=False,
    ),
]
DeviceOption = Annotated[
    Device, typer.Option(help="Where models run: auto (CUDA when available, else CPU) | cpu | cuda.")
]
ThreadsOption = Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's choice).", min=1)]
ReportToOption = Annotated[
    list[str],
    typer.Option("--report-to", help="Also log each training step's metrics to an experiment tracker: tensorboard, "
                 "mlflow or wandb (repeatable or comma-separated; default none). Offline, in a folder under "
                 "OUT/RUN_ID; each needs its extra, e.g. pip install 'agentmem[tensorboard]'.", show_default=False),
]
FsdpOption = Annotated[
    bool,
    typer.Option("--fsdp", help="Under torchrun (2+ processes): shard the student with FSDP2 instead of replicating "
                 "it with DDP (NCCL on CUDA, gloo on CPU); checkpoints are gathered whole on rank 0.",
                 show_default=False),
]
