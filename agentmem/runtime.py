"""The process a job runs in: device, threads, default dtype, and its rank and world size.

Every job takes a ``Runtime``; nothing else in the library decides the device or assumes a CPU. A job's
config says what to compute (and in which dtype, since that changes results); the runtime says where.

Rank and world size come from the launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``, as ``torchrun`` sets them, and Ray Train's workers too); with one process they
are 0 and 1 and the collectives (``all_reduce_sum``, ``broadcast``, ``barrier``) are the identity. With several,
``create`` starts the process group (gloo on CPU, NCCL on CUDA), or adopts the one Ray Train started, and
``close`` ends it. ``fsdp``: shard the trained
student with FSDP2 instead of replicating it with DDP (gloo on CPU, NCCL on CUDA).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from agentmem.config import Device, DType
from agentmem.errors import ConfigError


@dataclass(frozen=True)
class Runtime:
    device: str = "cpu"  # a torch device string, resolved: "cpu", "cuda", "cuda:1"
    threads: int | None = None  # torch intra-op threads (None: torch's choice, e.g. OMP_NUM_THREADS)
    dtype: DType | None = None  # overrides each job's configured dtype when set
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    fsdp: bool = False
    _reduce: Any = field(default=None, repr=False, compare=False)  # injected all-reduce (tests)

    @classmethod
    def create(cls, device: Device | str = Device.auto, threads: int | None = None,
               dtype: DType | str | None = None, fsdp: bool = False) -> Runtime:
        """Resolve ``device`` (``auto``: CUDA when available, else CPU), apply ``threads`` (default:
        ``default_threads()``) to torch, read the
        rank and world size from the environment and, with several processes, start the process group.
        Raises ConfigError for an unusable choice (``fsdp`` in one process), before any model loads."""
        import torch

        choice = Device(device) if str(device) in Device._value2member_map_ else None
        rank, world, local = (_env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0))
        if threads is not None and threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {threads}")
        threads = threads or default_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        if choice is Device.auto:
            resolved = f"cuda:{local}" if torch.cuda.is_available() and world > 1 else \
                ("cuda" if torch.cuda.is_available() else "cpu")
        elif choice is Device.cpu:
            resolved = "cpu"
        else:
            name = str(device)
            if not name.startswith("cuda"):
                raise ConfigError(f"--device must be one of auto, cpu, cuda (or cuda:N), got {name!r}")
            if not torch.cuda.is_available():
                raise ConfigError(f"--device {name}: CUDA is not available on this machine (use cpu or auto)")
            resolved = f"cuda:{local}" if name == "cuda" and world > 1 else name
        if fsdp and world < 2:
            raise ConfigError("--fsdp shards the student over several processes: run the command under "
                              "torchrun --nproc-per-node N, or with --ray --train-workers N (N >= 2)")
        runtime = cls(device=resolved, threads=threads, dtype=DType(dtype) if dtype else None, rank=rank,
                      world_size=world, local_rank=local, fsdp=fsdp)
        if world > 1:
            _start_process_group(resolved, world)
        return runtime

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def dtype_for(self, configured: DType | str) -> DType:
        """The dtype a job computes in: the runtime override when set, else the job's configured one."""
        return self.dtype or DType(configured)

    def all_reduce_sum(self, value):
        """Sum a tensor over all processes (in place and returned). One process: the tensor itself."""
        if self._reduce is not None:
            return self._reduce(value)
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(f"WORLD_SIZE={self.world_size} but torch.distributed is not initialised: start "
                              "the job with torchrun")
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    @property
    def process_group(self) -> bool:
        """Whether the processes talk through torch.distributed (several, started by torchrun)."""
        if self.world_size == 1 or self._reduce is not None:
            return False
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def broadcast(self, value):
        """Rank 0's ``value`` (any picklable object) on every process; also a barrier."""
        if self.world_size == 1:
            return value
        self.require_group()
        import torch.distributed as dist

        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            self.require_group()
            import torch.distributed as dist

            dist.barrier()

    def close(self, *, sync: bool = True) -> None:
        """End the process group ``create`` started (nothing with one process). With ``sync`` every process
        first waits for the others (a barrier): gloo aborts a process that tears its group down while a peer
        still talks to it ("terminate called without an active exception"). A job that failed passes
        ``sync=False``, so a failing rank never waits on peers that may never arrive."""
        if self.process_group:
            import torch.distributed as dist

            if sync:
                dist.barrier()
            dist.destroy_process_group()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(sync=exc_type is None)

    def require_group(self) -> None:
        if not self.process_group:
            raise ConfigError(f"WORLD_SIZE={self.world_size} but torch.distributed is not initialised: start "
                              "the job with torchrun")

    def with_reduce(self, reduce) -> Runtime:
        """A copy whose ``all_reduce_sum`` is ``reduce`` (to simulate several processes in one)."""
        from dataclasses import replace

        return replace(self, _reduce=reduce)


def _start_process_group(device: str, world: int) -> None:
    """Join the group torchrun describes in the environment (``env://``): NCCL on CUDA, gloo on CPU. A group this
    process already has (Ray Train's ``TorchTrainer`` starts it, and sets torchrun's variables, before the job
    runs) is adopted as it is, once its size is checked against ``WORLD_SIZE``."""
    import torch
    import torch.distributed as dist

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    if dist.is_initialized():
        if dist.get_world_size() != world:
            raise ConfigError(f"WORLD_SIZE={world} but this process's torch.distributed group has "
                              f"{dist.get_world_size()} processes")
        return
    if device.startswith("cuda"):
        dist.init_process_group("nccl", device_id=torch.device(device))
    else:
        dist.init_process_group("gloo")


def default_threads() -> int | None:
    """Intra-op threads when none are given: the cores this process may run on (its CPU affinity, which a
    container or ``taskset`` narrows while ``os.cpu_count`` does not), shared among the local processes of
    a torchrun job. None (torch's own choice) when ``OMP_NUM_THREADS`` is set or affinity is unknown."""
    if os.environ.get("OMP_NUM_THREADS") or not hasattr(os, "sched_getaffinity"):
        return None
    return max(1, len(os.sched_getaffinity(0)) // max(1, _env_int("LOCAL_WORLD_SIZE", 1)))


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, got {raw!r}") from None


CPU = Runtime()
