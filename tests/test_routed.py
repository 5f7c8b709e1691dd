"""Parameters an input-routed forward leaves without a gradient (a hunt: a top-1 MoE over 8 experts, batch 6, was a
no-grad error in gradflow, doctor and overfit-batch, which had memorised the batch). Fresh inputs of the batch's kind
reach an expert the router picks for some inputs (routed-by-input, info); one it never picks stays no-grad."""
import re

import pytest
import torch
from torch import nn

from torchdiag.api import run


class TopOne(nn.Module):
    """Top-1 routing: each sample runs only the expert its gate picks. `never`: an expert the gate can never pick
    (its logit far below the others' for every input): dead, a real bug."""

    def __init__(self, experts=8, never=None):
        super().__init__()
        self.gate = nn.Linear(16, experts)
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(experts))
        self.head = nn.Linear(16, 4)
        self.never = never

    def forward(self, x):
        logits = self.gate(x)
        if self.never is not None:
            logits = logits - 1e4 * nn.functional.one_hot(torch.tensor(self.never), logits.shape[-1])
        w, idx = logits.softmax(-1).max(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = idx == e
            if sel.any():
                out[sel] = expert(x[sel]) * w[sel, None]
        return self.head(x + out)


def _unpicked(model, x):
    with torch.no_grad():
        picked = set(model.gate(x).argmax(-1).tolist())
    return [e for e in range(len(model.experts)) if e not in picked]


def _case(never=None):
    torch.manual_seed(0)
    model, x = TopOne(never=never), torch.randn(3, 16)
    unpicked = _unpicked(model, x)
    assert len(unpicked) >= 4, unpicked   # the case is real: 3 samples, 8 experts
    return model, x, unpicked


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_experts_a_small_batch_does_not_pick_are_routed_by_input_not_no_grad(command):
    model, x, unpicked = _case()
    res = run(command, model, (x,), **({"steps": 300} if command == "overfit-batch" else {}))
    codes = {f.code: f for f in res.findings}
    assert "no-grad" not in codes and res.exit_code == 0, [f.message for f in res.findings]
    routed = codes["routed-by-input"]
    assert routed.severity == "info"
    assert re.match(rf"{2 * len(unpicked)} parameter tensor", routed.message), routed.message   # each weight, bias
    if command == "gradflow":
        got = {r["name"] for r in res.table("params").rows if r["status"] == "routed-by-input"}
        assert got == {f"experts.{e}.{k}" for e in unpicked for k in ("weight", "bias")}


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_an_expert_no_input_can_pick_stays_no_grad(command):
    model, x, _ = _case(never=5)
    res = run(command, model, (x,), **({"steps": 300} if command == "overfit-batch" else {}))
    no_grad = [f for f in res.findings if f.code == "no-grad"]
    assert no_grad and no_grad[0].severity == "error" and res.exit_code == 1, [f.message for f in res.findings]
    assert "experts.5" in no_grad[0].where + no_grad[0].message
    routed = [f for f in res.findings if f.code == "routed-by-input"]
    assert routed and "experts.5" not in routed[0].message   # the others are still told apart
