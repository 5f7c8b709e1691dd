"""Forwards that do odd things to the modules our hooks are on. A submodule applied under a torch.func transform (`torch.vmap(self.phi)(h)`: a per-element function of a set, a
per-sample head). Inside the transform its tensors are batched wrappers: a forward hook that reads or keeps one stops
the forward (they must not escape it; they have no storage). A review found gradflow and nancheck stopping with an
internal error and doctor and activations blaming the model; the model trains in plain torch (Adam: 1.36 to 2.5e-6
in 50 steps). The transformed calls are not measured, and a note says which."""
from __future__ import annotations

import pytest

MODEL = '''
import torch
from torch import nn


class SetHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(8, 16)
        self.phi = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.vmap(self.phi)(self.enc(x))
        return self.out(h.mean(1))


def build():
    return SetHead()
'''


@pytest.mark.parametrize("command", ["nancheck", "gradflow", "doctor", "activations"])
def test_a_vmapped_submodule_is_run_not_measured_and_said(cli, tmp_path, command):
    f = tmp_path / "set_head.py"
    f.write_text(MODEL)
    r = cli(command, f"{f}:build", "-i", "4x5x8", "--json")
    assert r.code == 0, r.stderr
    note = next(n for n in r.json["notes"] if "torch.func transform" in n)
    assert note.startswith("4 module(s) ran inside a torch.func transform") and "phi.0" in note
    assert not [f for f in r.json["findings"] if f["severity"] != "info"]


class LazyTarget:
    """A BYOL-style model whose target encoder is made in its first forward with copy.deepcopy (byol-pytorch does):
    the copy takes the hooks on the online encoder with it. Before: nancheck and gradflow failed in that deepcopy
    (hooks that were bound methods carried their recorder, holding non-leaf tensors and graph nodes), and the hooks
    stayed on the copied modules after every command."""

    @staticmethod
    def build():
        import copy

        import torch
        from torch import nn

        class BYOL(nn.Module):
            def __init__(self):
                super().__init__()
                self.online = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
                self.pred = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
                self.target = None

            def forward(self, x):
                if self.target is None:
                    self.target = copy.deepcopy(self.online)
                    for p in self.target.parameters():
                        p.requires_grad_(False)
                p = self.pred(self.online(x))
                with torch.no_grad():
                    z = self.target(x.flip(0))
                return (2 - 2 * torch.nn.functional.cosine_similarity(p, z, dim=-1)).mean()

        return BYOL()


@pytest.mark.parametrize("command", ["summary", "flops", "nancheck", "gradflow"])
def test_a_part_deep_copied_in_forward_runs_and_keeps_no_hook_of_ours(command):
    import torch

    import torchdiag

    torch.manual_seed(0)
    model = LazyTarget.build()
    result = getattr(torchdiag, command)(model, torch.randn(4, 16))
    assert model.target is not None
    assert not [f.code for f in result.findings if str(f.severity).lower().endswith(("error", "warning"))]
    left = {n: len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
            for n, m in model.named_modules()}
    assert not any(left.values()), left


NAN_INSIDE = '''
import torch
from torch import nn


class Phi(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(16, 16)

    def forward(self, t):
        return torch.log(self.l(t) - 100.0)   # NaN: the log of values far below 0


class SetHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(8, 16)
        self.phi = Phi()
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        return self.out(torch.vmap(self.phi)(self.enc(x)).mean(1))


def build():
    return SetHead()
'''


def test_a_nan_made_inside_a_vmapped_submodule_names_it_as_unmeasured(cli, tmp_path):
    """A review: the NaN made in phi (run under torch.vmap, unmeasured) was said to arise in the root's own forward
    code, "not in a submodule"."""
    f = tmp_path / "nan_inside.py"
    f.write_text(NAN_INSIDE)
    r = cli("nancheck", f"{f}:build", "-i", "4x5x8", "--json")
    assert r.code == 1, r.stderr
    (out,) = [x for x in r.json["findings"] if x["code"] == "non-finite-output"]
    assert "a submodule it ran inside a torch.func transform (phi, phi.l" in out["message"], out["message"]
    assert "not in a submodule" not in out["message"] and "under the transform" in out["hint"]
