"""Findings read most severe first, then in the model's order (core/places.py), in the table and in JSON."""
from __future__ import annotations

import torch
from torch import nn

from torchdiag.core.places import model_places, place, sort_findings
from torchdiag.results import Finding


def model():
    return nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))


def test_places_follow_registration_with_parameters_after_their_module():
    p = model_places(model())
    assert list(p) == ["0", "0.weight", "0.bias", "1", "1.0", "1.1", "1.1.weight", "1.1.bias"]
    assert p["0.bias"] < p["1.1"] < p["1.1.bias"]


def test_a_where_is_placed_by_its_first_name_or_its_enclosing_module():
    p = model_places(model())
    assert place("1.1 (Linear)", p) == p["1.1"]
    assert place("1.1.weight, 0.bias", p) == p["1.1.weight"]
    assert place("1.1.some_buffer", p) == p["1.1"]          # not a parameter: its module
    assert place("input[0]", p) == len(p)                     # not in the model: after it
    assert place("", p) == len(p) + 1                         # the whole model: last of all


def test_sorted_by_severity_then_place_and_stable_otherwise():
    p = model_places(model())
    fs = [Finding("cannot-overfit", "error", "", "m"), Finding("b", "info", "0", "m"),
          Finding("no-grad", "error", "1.1.weight", "m"), Finding("w", "warning", "1.1", "m"),
          Finding("no-grad", "error", "0.weight", "m"), Finding("x", "info", "0", "second at the same place")]
    got = [(f.code, f.where) for f in sort_findings(fs, p)]
    assert got == [("no-grad", "0.weight"), ("no-grad", "1.1.weight"), ("cannot-overfit", ""), ("w", "1.1"),
                   ("b", "0"), ("x", "0")]


def test_a_command_returns_its_findings_sorted(tmp_path):
    """gradflow on a model with a dead branch and an unused layer: JSON order is severity, then place."""
    import torchdiag

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.unused = nn.Linear(3, 3)
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 2)

        def forward(self, x):
            return self.b(self.a(x).detach())

    r = torchdiag.gradflow(M(), torch.randn(4, 3))
    rank = {"error": 0, "warning": 1, "info": 2}
    keys = [(rank[f.severity], place(f.where, model_places(M()))) for f in r.findings]
    assert keys == sorted(keys) and r.findings
