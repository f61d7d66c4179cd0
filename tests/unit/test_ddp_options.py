"""What the training workers hand DDP: buffers not broadcast at every forward, said in the
keyword this torch takes without a deprecation warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from training.worker import ddp_options


@pytest.fixture
def process_group(tmp_path: Path):
    """A one-rank gloo group in this process (what Ray Train sets up on each worker)."""
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def _wrap(**options: bool) -> tuple[DistributedDataParallel, list[str]]:
    module = torch.nn.Linear(3, 2)
    module.register_buffer("table", torch.ones(2))  # as the sinusoid table
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ddp = DistributedDataParallel(module, **options)
    return ddp, [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_buffers_are_not_broadcast_and_nothing_is_deprecated(process_group):
    ddp, future = _wrap(**ddp_options())
    assert ddp.broadcast_buffers is False  # torch 2.13: the property reads forward_sync_buffers
    assert future == []


@pytest.mark.skipif(
    "forward_sync_buffers" not in ddp_options(), reason="torch before 2.13 has no other keyword"
)
def test_the_old_keyword_is_what_warned(process_group):
    _, future = _wrap(broadcast_buffers=False)
    assert any("broadcast_buffers" in message for message in future)
