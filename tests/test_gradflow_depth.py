"""gradflow's depth re-check (diagnostics/gradflow/depth.py): an exploding gradient grows block by block through
the model's repeated blocks; one of the size of torchdiag's made-up loss is as large at the first block as at the
last. A sweep: the zoo's mimi and pocket_tts encoders (an MSE of latents of std 7.8 against a unit target) and the
gemma4 vision tower (cross-entropy read off hidden states of std 9) were `exploding-grad` errors."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from torchdiag.api import run as api_run

from support import load_module


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc(torch.relu(self.norm(x)))


class LargeOutput(nn.Module):
    """Six pre-norm residual blocks, a head whose logits come out `scale` times the default's."""

    def __init__(self, scale: float = 300.0, width: int = 32):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(6)])
        self.out = nn.Linear(width, 8)
        self.scale = scale

    def forward(self, x):
        return self.out(self.blocks(self.inp(x))) * self.scale


def _flat_by_hand(model, x) -> tuple[float, float]:
    """(the largest gradient norm of a parameter, the largest growth of the gradient's RMS at the blocks' outputs
    from a later block to an earlier one), under cross-entropy against random labels, in plain torch."""
    outs = []

    def keep(mod, args, out):
        out.retain_grad()
        outs.append(out)

    for b in model.blocks:
        b.register_forward_hook(keep)
    y = model(x)
    nn.functional.cross_entropy(y, torch.randint(0, 8, (len(x),))).backward()
    rms = [float(o.grad.pow(2).mean().sqrt()) for o in outs]
    grown = max(rms[i] / rms[j] for i in range(len(rms)) for j in range(i + 1, len(rms)))
    return max(float(p.grad.norm()) for p in model.parameters()), grown


def test_a_large_gradient_that_does_not_grow_through_the_depth_is_the_made_up_losss_scale():
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    biggest, grown = _flat_by_hand(LargeOutput(), x)
    assert biggest > 1e3 and grown < 3   # the thresholds' exploding norm, and no growth through the blocks
    torch.manual_seed(0)
    res = api_run("gradflow", LargeOutput(), x)
    found = {(f.code, f.severity) for f in res.findings}
    assert ("loss-scale", "info") in found and not any(s != "info" for _, s in found), found
    f = next(f for f in res.findings if f.code == "loss-scale")
    assert "made-up target" in f.message and "blocks" in f.message and res.exit_code == 0


def test_a_gradient_that_grows_block_by_block_stays_exploding():
    """broken_exploding's MLP at gain 6: its gradient grows thousands of times over its layers."""
    be = load_module("broken_exploding.py")
    res = api_run("gradflow", be.build(), be.example_inputs())
    assert res.exit_code == 1 and "loss-scale" not in {f.code for f in res.findings}


@pytest.mark.parametrize("why", ["a loss far off the target's scale", "parallel heads are no depth"])
def test_a_flat_gradient_is_not_excused_where_the_depth_or_the_scale_cannot_say(why):
    """An MSE of an output 300x too large (the loss 5e4): the output's scale is a fault of its own. Sibling modules
    that all read one input (parallel heads) are not a depth, and measure nothing."""
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    if why.startswith("a loss"):
        res = api_run("gradflow", LargeOutput(), x, loss="mse")
    else:
        class Heads(nn.Module):
            def __init__(self):
                super().__init__()
                self.heads = nn.ModuleList(nn.Linear(16, 8) for _ in range(4))

            def forward(self, x):
                return sum(h(x) for h in self.heads) * 300.0

        res = api_run("gradflow", Heads(), x)
    assert res.exit_code == 1 and "loss-scale" not in {f.code for f in res.findings}, \
        [(f.code, f.severity) for f in res.findings]


def test_the_sample_model_is_untouched_by_the_depth_recheck():
    """The re-check runs on a copy: the model's parameters and gradients are as they were."""
    torch.manual_seed(0)
    model = LargeOutput()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    api_run("gradflow", model, torch.randn(4, 16))
    assert all(torch.equal(before[n], p) and p.grad is None for n, p in model.named_parameters())

