"""loss-spike's and grad-norm-explosion's hints where the learning rate rose just before them (a sweep's planted bug: a rate raised too
far, told "look at that batch; clip gradients")."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdiag


@pytest.mark.parametrize("cause", ["lr-rise", "bad-batch", "cyclic"])
def test_a_spike_just_after_the_learning_rate_rose_names_the_rise(cause):
    """A sweep's planted bug, a rate raised too far (SGD 0.02 -> 3 at step 81): the spike 3 steps later was told
    "look at that batch; clip gradients". The hint now names the rise; a corrupted batch at a steady rate keeps the
    batch's hint."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    g = torch.Generator().manual_seed(1)
    with torchdiag.watch(model, opt, every=10) as w:
        for step in range(1, 121):
            if step == 81 and cause == "lr-rise":
                for group in opt.param_groups:
                    group["lr"] = 3.0
            if cause == "cyclic":   # 0.2 for the first 20 steps, 0.02 after, back to 0.2 at step 81 (a review: a
                for group in opt.param_groups:   # rate the run trained at is no cause of a spike after it)
                    group["lr"] = 0.2 if step <= 20 or step >= 81 else 0.02
            x = torch.randn(32, 8, generator=g)
            y = (x[:, :3].sum(1) > 0).long()
            if step == 84 and cause in ("bad-batch", "cyclic"):   # scaled up and mislabelled: confidently wrong
                x, y = x * 10, 1 - y
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    spikes = [f for f in w.result().findings if f.code == "loss-spike"]
    norms = [f for f in w.result().findings if f.code == "grad-norm-explosion"]
    assert len(spikes) == 1, [f.message for f in w.result().findings]
    if cause == "lr-rise":
        assert "at step 84 " in spikes[0].message
        assert spikes[0].hint.startswith("the learning rate rose from 0.02 (step 81) to 3, a rate the run never had "
                                         "before, 3 step(s) before it")
        # (a norm explosion names the rise too: docs/watch.md's watch_diverge example, checked by test_readme)
        assert all(f.hint.startswith("the learning rate rose from 0.02 (step 81) to 3") for f in norms)
    else:
        assert spikes[0].hint == "look at that batch; clip gradients", spikes[0].hint
        assert all(f.hint.startswith("clip gradients") for f in norms)
