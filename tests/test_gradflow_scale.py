"""gradflow's `loss-scale` (diagnostics/gradflow/scale.py): torchdiag's own regression loss reads the output at
whatever scale it comes out, and an MSE of latents of std 7.8 against a unit target made `exploding-grad` errors on
the zoo's healthy mimi and pocket_tts encoders. An exploding gradient left after the other re-checks is asked again
with the outputs at their own scale (divided by the RMS of the one the loss reads): within the thresholds there, it
is the made-up loss's reading of the scale (info)."""
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


class Latent(nn.Module):
    """An encoder whose latents come out `gain` times larger by design (a fixed output gain: RMS 17 at 30)."""

    def __init__(self, gain: float = 30.0, width: int = 64):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(4)])
        self.out = nn.Linear(width, 4)
        self.gain = gain

    def forward(self, x):
        return self.out(self.blocks(self.inp(x))) * self.gain


def _inputs():
    return torch.randn(2, 256, 16, generator=torch.Generator().manual_seed(1))


def _by_hand(model, x, divide: bool) -> tuple[float, float]:
    """out.weight's (grad norm, grad/weight) under an MSE against a unit normal target, in plain torch; with
    `divide`, the output divided by its own RMS first."""
    y = model(x)
    if divide:
        y = y / y.detach().pow(2).mean().sqrt()
    t = torch.randn(y.shape, generator=torch.Generator().manual_seed(0))
    g, = torch.autograd.grad(nn.functional.mse_loss(y, t), [model.out.weight])
    return float(g.norm()), float(g.norm() / model.out.weight.detach().norm())


def test_a_gradient_large_only_as_the_made_up_loss_reads_the_outputs_scale_is_loss_scale():
    torch.manual_seed(0)
    model, x = Latent(), _inputs()
    (norm, _), (unit, ratio) = _by_hand(model, x, False), _by_hand(model, x, True)
    assert norm > 1e3 and unit < 1e3 and ratio < 100   # over --exploding as read, within at the output's own scale
    res = api_run("gradflow", model, x)
    f = next(f for f in res.findings if f.code == "loss-scale")
    assert f.severity == "info" and "out.weight" in (f.members or [f.where]) and res.exit_code == 0, f.message
    assert "made-up target" in f.message and not any(g.severity != "info" for g in res.findings)


def test_an_exploding_gradient_of_the_model_stays_an_error():
    """broken_exploding's MLP at gain 6: its logits reach ~1e5 (an output far off any target's scale)."""
    be = load_module("broken_exploding.py")
    res = api_run("gradflow", be.build(), be.example_inputs())
    assert res.exit_code == 1 and "loss-scale" not in {f.code for f in res.findings}


class GrowingStem(nn.Module):
    """A review's: broken_exploding's MLP (gain 3.3) as a Sequential stem, then healthy residual blocks and a head:
    the stem's activations grow ~2x a layer and the logits come out with an RMS in the hundreds."""

    def __init__(self):
        super().__init__()
        mlp = load_module("broken_exploding.py").DeepMLP(gain=3.3)
        self.stem = nn.Sequential(*[m for lin in mlp.layers for m in (lin, nn.ReLU())])
        self.blocks = nn.Sequential(*[Block(64) for _ in range(3)])
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


class WithAux(nn.Module):
    """A review's: a regression output of RMS ~25 and a second output (or the model's own regulariser term) whose
    branch's gradients explode on their own, with no made-up target on them."""

    def __init__(self, term: bool):
        super().__init__()
        self.term = term
        self.body, self.head, self.aux = nn.Linear(32, 64), nn.Linear(64, 4), nn.Linear(64, 8)
        with torch.no_grad():
            self.head.weight.mul_(150.0)
            self.aux.weight.mul_(200.0)

    def forward(self, x):
        h = torch.relu(self.body(x))
        a = self.aux(h)
        return self.head(h).unsqueeze(-1), (a.pow(2).mean() if self.term else a)


@pytest.mark.parametrize("case", ["an output far off the target's scale", "a stem that explodes, read by cross-entropy",
                                  "the user's named loss", "a second output", "the model's own term"])
def test_a_large_gradient_is_not_excused_where_the_scale_cannot_say(case):
    """An output far beyond the unit target's scale (RMS > 30) is a fault of its own, whatever the gradient at unit
    scale; cross-entropy's gradient at the logits is bounded whatever the labels, so its scale is the model's (a
    review: an exploding stem before flat blocks was excused); a loss the user named (`--loss mse`) is theirs, its
    scale too; a second output or the model's own term, whose exploding gradients no made-up target sets, was
    divided by the first output's RMS and excused (reviews)."""
    torch.manual_seed(0)
    if case.startswith("an output"):
        model, x, opts = Latent(gain=300.0), _inputs(), {}
    elif case.startswith("a stem"):
        model, x, opts = GrowingStem(), torch.randn(16, 32), {}
    elif case == "the user's named loss":
        model, x, opts = Latent(), _inputs(), {"loss": "mse"}
    else:
        model, x, opts = WithAux(term=case.startswith("the model's")), torch.randn(16, 32), {}
    with torch.no_grad():
        y = model(x)
        y = y if isinstance(y, torch.Tensor) else y[0]
        assert (y.pow(2).mean().sqrt() > 30) == case.startswith(("an output", "a stem"))
    res = api_run("gradflow", model, x, **opts)
    assert res.exit_code == 1 and "loss-scale" not in {f.code for f in res.findings}, \
        [(f.code, f.severity) for f in res.findings]


def test_the_model_is_untouched_by_the_rescaled_pass():
    torch.manual_seed(0)
    model = Latent()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    api_run("gradflow", model, _inputs())
    assert all(torch.equal(before[n], p) and p.grad is None for n, p in model.named_parameters())
    assert not model._forward_hooks


class Detector(Latent):
    """A review's OWL-ViT detection head, in small: class logits of RMS ~17 whose padded queries hold finfo.min (a
    fill the loss leaves out), and boxes through a sigmoid: two MSE terms against made-up targets. The fills made the
    logits' RMS 1e37, and a second term stopped the question: `exploding-grad` errors on a healthy model."""

    def __init__(self):
        super().__init__()
        self.box = nn.Linear(64, 4)
        pad = torch.zeros(256, 1, dtype=torch.bool)
        pad[200:] = True
        self.register_buffer("pad", pad)

    def forward(self, x):
        h = self.blocks(self.inp(x))
        logits = (self.out(h) * self.gain).masked_fill(self.pad, torch.finfo(torch.float32).min)
        return {"logits": logits, "boxes": torch.sigmoid(self.box(h))}


def test_every_made_up_mse_term_is_read_at_its_own_scale_with_its_fills_left_out():
    torch.manual_seed(0)
    model, x = Detector(), _inputs()
    with torch.no_grad():
        y = model(x)["logits"][:, :200]
        assert 1 < float(y.pow(2).mean().sqrt()) <= 30   # the premise: the logits' own scale, fills left out
    res = api_run("gradflow", model, x)
    assert "values left out" in res.header["loss"] and "output['boxes']" in res.header["loss"], res.header["loss"]
    f = next(f for f in res.findings if f.code == "loss-scale")
    assert f.severity == "info" and res.exit_code == 0, [(g.code, g.severity, g.message[:80]) for g in res.findings]
