"""A backbone pretrained by its own optimizer (let go), then wrapped with a head and fine-tuned (a sweep's two-stage
runs). Frozen for the first stage with its pretraining gradients left in .grad (no zero_grad after pretraining, as is
common), it was an info "got gradients while no optimizer held them ... the updates were lost": a frozen tensor's
.grad is stale, nothing was lost. Unfrozen with add_param_group forgotten, its 4 tensors were "8 parameter tensors",
each under the backbone's name and the model's. And early stopping's best weights kept without a copy."""
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


@pytest.mark.parametrize("keep", ["reference", "copy", "other-model"])
def test_reloading_the_best_kept_without_a_copy_restores_nothing(keep):
    """A sweep's planted bug: early stopping kept `best = model.state_dict()` (the live tensors) and "reloaded the
    best" 4 times, each a no-op, nothing said. A copy, or another model's state dict (an EMA's), is a real load."""
    import copy

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    other = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), 0.1)
    with torchdiag.watch(model, opt, every=8) as w:
        best = None
        for epoch in range(4):
            for i in range(0, 256, 32):
                opt.zero_grad()
                F.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
                opt.step()
            if epoch == 0:
                best = {"reference": model.state_dict(), "copy": copy.deepcopy(model.state_dict()),
                        "other-model": other.state_dict()}[keep]
            elif epoch == 2:
                before = [p.detach().clone() for p in model.parameters()]
                model.load_state_dict(best)
                same = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
                assert same == (keep == "reference")   # the fact, in plain torch
    assert not hasattr(torch.nn.Module.load_state_dict, "_torchdiag_original")   # unwrapped at the end
    found = [f for f in w.result().findings if f.code == "reload-restores-nothing"]
    if keep == "reference":
        assert len(found) == 1 and found[0].severity == "warning" and "after step 24" in found[0].message
        assert "copy.deepcopy(model.state_dict())" in found[0].hint
    else:
        assert not found
