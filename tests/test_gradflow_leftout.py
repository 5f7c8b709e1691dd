"""gradflow's `left-out-output` (diagnostics/gradflow/leftout.py): the auto loss leaves out an output whose every
weight the output it reads already reaches, and conditional DETR's `ref_point_head` was `vanishing-grad` on the zoo
because its path to the decoder's states is weak while the detection head reads `reference_points` directly. A
vanishing gradient left after the other re-checks is asked again with a made-up MSE on the left-out outputs alone."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from torchdiag.api import run as api_run


class RefPoints(nn.Module):
    """A body and a reference-point head, as conditional DETR: the points are returned, and enter the body's first
    column 1e-7 weakly, so every weight behind them reaches the output the loss reads. `weak_both`: the head's
    logits are scaled by 1e-7 too, so its path to the points is as weak."""

    def __init__(self, weak_both: bool):
        super().__init__()
        self.weak_both = weak_both
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        self.ref = nn.Linear(8, 2)

    def forward(self, x):
        points = (self.ref(x) * (1e-7 if self.weak_both else 1.0)).sigmoid()
        h = self.body(x)
        return {"last_hidden_state": torch.cat([h[:, :1] + 1e-7 * points[:, :1], h[:, 1:]], 1),
                "reference_points": points}


def _ratio_through_points(model, x) -> float:
    """Independent truth: ref.weight's grad/weight under an MSE on the points alone."""
    work = RefPoints(model.weak_both)
    work.load_state_dict(model.state_dict())
    points = work(x)["reference_points"]
    nn.functional.mse_loss(points, torch.randn(points.shape)).backward()
    return float(work.ref.weight.grad.norm() / work.ref.weight.norm())


@pytest.mark.parametrize("weak_both", [False, True])
def test_a_gradient_weak_only_towards_the_output_read_is_left_out_output(weak_both):
    torch.manual_seed(0)
    model, x = RefPoints(weak_both), torch.randn(16, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = api_run("gradflow", model, (x,))
    assert "not added: output['reference_points']" in res.header["loss"], res.header["loss"]
    rows = {r["name"]: r for r in res.to_dict()["params"]}
    assert rows["ref.weight"]["grad_weight_ratio"] < 1e-7   # vanishing under the loss that was read
    found = {(f.severity, f.code) for f in res.findings if f.where and f.where.startswith("ref")}
    if weak_both:   # weak towards the points too: the warning stands
        assert _ratio_through_points(model, x) < 1e-7
        assert ("warning", "vanishing-grad") in found, found
    else:
        assert _ratio_through_points(model, x) > 1e-4
        assert found == {("info", "left-out-output")}, found
        assert rows["ref.weight"]["status"] == "left-out-output" and res.exit_code == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())   # the model is not changed
