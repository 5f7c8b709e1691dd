"""A model already sharded by fully_shard, handed to torchdiag (the Python API, or returned by a factory): one
usage error (exit 2) naming what to do, never a DTensor error from inside a diagnostic. One process, a gloo group
of world size 1 (fully_shard needs a process group and a device mesh)."""
from __future__ import annotations

import pytest
import torch

dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def sharded():
    from torch.distributed.device_mesh import init_device_mesh

    fsdp = pytest.importorskip("torch.distributed.fsdp")
    if not hasattr(fsdp, "fully_shard"):
        pytest.skip("this torch has no fully_shard")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        fsdp.fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        assert hasattr(next(model.parameters()), "full_tensor")     # the premise: DTensor parameters
        yield model
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("command", ["gradflow", "nancheck", "doctor"])
def test_python_api_refuses_a_sharded_model(sharded, command):
    import torchdiag
    from torchdiag.errors import UsageError

    with pytest.raises(UsageError) as err:
        getattr(torchdiag, command)(sharded, torch.randn(4, 8))
    assert "sharded by FSDP" in err.value.message and "--wrap fsdp" in err.value.hint


def test_factory_returning_a_sharded_model_is_a_usage_error(sharded, tmp_path):
    from torchdiag.core.loading import load_model
    from torchdiag.errors import UsageError

    factory = tmp_path / "fsdp_factory.py"     # shards what it builds, in the group the fixture made
    factory.write_text("import torch\n"
                       "from torch.distributed.device_mesh import init_device_mesh\n"
                       "from torch.distributed.fsdp import fully_shard\n\n"
                       "def build():\n"
                       "    m = torch.nn.Linear(8, 2)\n"
                       "    fully_shard(m, mesh=init_device_mesh('cpu', (1,)))\n"
                       "    return m\n")
    with pytest.raises(UsageError) as err:
        load_model(f"{factory}:build", device=torch.device("cpu"))
    assert err.value.message.startswith("the model build() returned is sharded by FSDP")
