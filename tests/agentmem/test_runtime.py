"""``agentmem.runtime``: a process group the launcher already started (Ray Train's ``TorchTrainer`` starts it
before the job runs) is adopted, not started twice, once its size agrees with ``WORLD_SIZE``."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from agentmem.errors import ConfigError
from agentmem.runtime import _start_process_group
from agentmem.testing.serving import free_port


@pytest.fixture
def group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_started_group_is_adopted_when_its_size_agrees(group):
    _start_process_group("cpu", 1)  # a second init_process_group would raise
    assert dist.is_initialized() and dist.get_world_size() == 1


def test_a_started_group_of_another_size_is_refused(group):
    with pytest.raises(ConfigError, match="WORLD_SIZE=2 but this process's torch.distributed group has 1"):
        _start_process_group("cpu", 2)
