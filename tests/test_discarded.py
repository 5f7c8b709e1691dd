"""A module whose output never reached the loss, followed through one more forward (core/discarded.py): thrown away
(discarded-output, a warning in gradflow, doctor and overfit-batch), cut by an op (no-grad, an error), or returned
but left out by a named loss (no-grad, saying so)."""
import pytest
import torch
from torch import nn

from torchdiag.api import run as api_run


class Pooled(nn.Module):
    """A pooler whose output the task head never reads (FNet's and BigBird's masked-LM models do this)."""

    def __init__(self, use: str = "discard"):
        super().__init__()
        self.use = use
        self.body = nn.Linear(6, 8)
        self.pool = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        self.register_buffer("last", torch.zeros(4, 8))

    def forward(self, x):
        h = torch.relu(self.body(x))
        pooled = torch.tanh(self.pool(h))
        if self.use == "detach":
            return self.head(h) + pooled.detach()[:, :4]
        if self.use == "compare":
            return self.head(h) * (pooled[:, :4] > 0)
        if self.use == "return":
            return self.head(h), pooled
        if self.use == "topk":     # a router whose scores only pick rows: its weights never train
            return self.head(h)[pooled[:, 0].topk(2).indices]
        if self.use == "buffer":   # copied into a buffer under no_grad
            with torch.no_grad():
                self.last[:] = pooled
        if self.use == "view_as":  # only its shape is taken
            return (self.head(h) + pooled.detach()[:, :4]).view_as(pooled[:, :4])
        return self.head(h)


def findings(result):
    return {(f.code, f.severity, f.where): f for f in result.findings}


def test_a_thrown_away_output_is_a_warning_in_gradflow():
    torch.manual_seed(0)
    res = api_run("gradflow", Pooled(), (torch.randn(4, 6),))
    found = findings(res)
    assert set(found) == {("discarded-output", "warning", "pool")}
    msg = found[("discarded-output", "warning", "pool")].message
    assert "thrown away" in msg and "pool.weight" in msg and "pool.bias" in msg
    rows = {r["name"]: r for r in res.table("params").rows}
    assert rows["pool.weight"]["status"] == "discarded-output" and rows["pool.weight"]["reason"] == "discarded"
    assert rows["head.weight"]["status"] == "ok" and res.exit_code == 0


@pytest.mark.parametrize("command", ["doctor", "overfit-batch"])
def test_a_thrown_away_output_is_the_same_warning_in_doctor_and_overfit_batch(command):
    torch.manual_seed(0)
    opts = {"steps": 30} if command == "overfit-batch" else {}
    res = api_run(command, Pooled(), (torch.randn(4, 6),), **opts)
    codes = {(f.code, f.severity) for f in res.findings}
    assert ("discarded-output", "warning") in codes and not any(c == "no-grad" for c, _ in codes)
    assert next(f for f in res.findings if f.code == "discarded-output").where == "pool"


@pytest.mark.parametrize("use", ["detach", "compare", "topk", "buffer", "view_as"])
def test_an_output_used_without_a_gradient_stays_no_grad(use):
    torch.manual_seed(0)
    res = api_run("gradflow", Pooled(use), (torch.randn(4, 6),))
    assert {(f.code, f.severity, f.where) for f in res.findings} == {("no-grad", "error", "pool")}
    rows = {r["name"]: r for r in res.table("params").rows}
    assert rows["pool.weight"]["reason"] == "detached" and res.exit_code == 1
    assert "in the model's output" not in res.findings[0].message


def test_an_output_a_named_loss_leaves_out_says_so():
    torch.manual_seed(0)
    res = api_run("gradflow", Pooled("return"), (torch.randn(4, 6),), loss="cross_entropy")
    (finding,) = res.findings
    assert (finding.code, finding.where) == ("no-grad", "pool")
    assert "in the model's output, but the loss does not use that output" in finding.message
    # auto covers the pooled output: everything trains
    assert not api_run("gradflow", Pooled("return"), (torch.randn(4, 6),)).findings


def test_the_follow_up_forward_leaves_the_model_as_it_was(untouched):
    torch.manual_seed(0)
    model, x = Pooled(), torch.randn(4, 6)
    with untouched(model):
        api_run("gradflow", model, (x,))
