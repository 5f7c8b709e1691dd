"""A backbone pretrained by its own optimizer (let go), then wrapped with a head and fine-tuned (a sweep's two-stage
runs). Frozen for the first stage with its pretraining gradients left in .grad (no zero_grad after pretraining, as is
common), it was an info "got gradients while no optimizer held them ... the updates were lost": a frozen tensor's
.grad is stale, nothing was lost. Unfrozen with add_param_group forgotten, its 4 tensors were "8 parameter tensors",
each under the backbone's name and the model's."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdiag


def _run(forget: bool, given: bool):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    backbone = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
    dec = nn.Linear(16, 16)

    def stages(w=None):
        pre = torch.optim.Adam([*backbone.parameters(), *dec.parameters()], 1e-3)
        for i in range(0, 512, 32):   # an autoencoder's pretraining; its gradients stay in .grad
            pre.zero_grad()
            F.mse_loss(dec(backbone(x[i:i + 32])), x[i:i + 32]).backward()
            pre.step()
        model = nn.Sequential(backbone, nn.Linear(16, 2))
        backbone.requires_grad_(False)
        opt = torch.optim.Adam(model[1].parameters(), 3e-3)
        return model, opt

    def fine_tune(model, opt):
        for epoch in range(4):
            if epoch == 2:
                backbone.requires_grad_(True)
                if not forget:
                    opt.add_param_group({"params": backbone.parameters(), "lr": 5e-4})
            for i in range(0, 512, 32):
                opt.zero_grad()
                F.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
                opt.step()

    if given:
        model, opt = stages()
        with torchdiag.watch(model, opt, every=8) as w:
            fine_tune(model, opt)
    else:   # nothing given: watch finds the backbone (pretraining) and the model around it
        with torchdiag.watch(every=8) as w:
            fine_tune(*stages())
    return [f for f in w.result().findings if f.code == "not-in-optimizer"]


@pytest.mark.parametrize("given", [True, False], ids=["given", "found"])
def test_a_frozen_backbones_stale_gradients_lose_nothing(given):
    assert not _run(forget=False, given=given), "a frozen tensor's stale .grad read as lost updates"


def test_a_forgotten_param_group_names_each_tensor_once():
    found = _run(forget=True, given=False)
    assert len(found) == 1 and found[0].severity == "warning", [f.message for f in found]
    assert found[0].message.startswith("4 parameter tensors (") and len(found[0].members) == 4
