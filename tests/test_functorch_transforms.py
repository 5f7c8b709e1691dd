"""A submodule applied under a torch.func transform (`torch.vmap(self.phi)(h)`: a per-element function of a set, a
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
