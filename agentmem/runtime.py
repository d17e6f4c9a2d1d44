"""The process a job runs in: device, threads, default dtype, and its rank and world size.

Every job takes a ``Runtime``; nothing else in the library decides the device or assumes a CPU. A job's
config says what to compute (and in which dtype, since that changes results); the runtime says where.

Rank and world size come from the launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, as
``torchrun`` sets them); with one process they are 0 and 1 and ``all_reduce_sum`` is the identity.
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
    threads: int | None = None  # torch intra-op threads (None: torch's choice)
    dtype: DType | None = None  # overrides each job's configured dtype when set
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    _reduce: Any = field(default=None, repr=False, compare=False)  # injected all-reduce (tests)

    @classmethod
    def create(cls, device: Device | str = Device.auto, threads: int | None = None,
               dtype: DType | str | None = None) -> Runtime:
        """Resolve ``device`` (``auto``: CUDA when available, else CPU), apply ``threads`` to torch, read the
        rank and world size from the environment. Raises ConfigError for an unusable choice."""
        import torch

        choice = Device(device) if str(device) in Device._value2member_map_ else None
        rank, world, local = (_env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0))
        if threads is not None:
            if threads < 1:
                raise ConfigError(f"--threads must be >= 1, got {threads}")
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
        return cls(device=resolved, threads=threads, dtype=DType(dtype) if dtype else None, rank=rank,
                   world_size=world, local_rank=local)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def torch_device(self):
        import torch

        return torch.device(self.device)

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

    def with_reduce(self, reduce) -> Runtime:
        """A copy whose ``all_reduce_sum`` is ``reduce`` (to simulate several processes in one)."""
        from dataclasses import replace

        return replace(self, _reduce=reduce)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, got {raw!r}") from None


CPU = Runtime()
