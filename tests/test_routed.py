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
        said = dict(s for s in res.summary if isinstance(s, tuple))   # routed is info, yet no gradient reached them
        assert said["Trainable parameters reached"] == f"{20 - len(got)} of 20 tensors", said


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_an_expert_no_input_can_pick_stays_no_grad(command):
    model, x, _ = _case(never=5)
    res = run(command, model, (x,), **({"steps": 300} if command == "overfit-batch" else {}))
    no_grad = [f for f in res.findings if f.code == "no-grad"]
    assert no_grad and no_grad[0].severity == "error" and res.exit_code == 1, [f.message for f in res.findings]
    assert "experts.5" in no_grad[0].where + no_grad[0].message
    routed = [f for f in res.findings if f.code == "routed-by-input"]
    assert routed and "experts.5" not in routed[0].message   # the others are still told apart


class DenseTopOne(TopOne):
    """A dense mixture (a hunt): every expert runs on every sample, and the router's weight is 0 for the ones it did
    not pick, so an unpicked expert gets a gradient of exactly zero (not none). `never` as in TopOne."""

    def forward(self, x):
        logits = self.gate(x)
        if self.never is not None:
            logits = logits - 1e4 * (torch.arange(logits.shape[-1], device=x.device) == self.never)
        probs = logits.softmax(-1)
        top, idx = probs.topk(1, -1)
        weights = torch.zeros_like(probs).scatter(-1, idx, top)
        outs = torch.stack([e(x) for e in self.experts], -1)
        return self.head(x + (outs * weights[:, None, :]).sum(-1))


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_a_dense_mixture_s_unpicked_experts_are_routed_by_input_and_a_dead_one_is_not(command):
    """gradflow and doctor said zero-grad / param-not-updated (errors, exit 1), overfit-batch zero-grad and
    unchanged-params (warnings), of the 5 experts a batch of 3 picked none of."""
    torch.manual_seed(0)
    model, x = DenseTopOne(), torch.randn(3, 16)
    unpicked = _unpicked(model, x)
    assert len(unpicked) >= 4, unpicked
    kw = {"steps": 300} if command == "overfit-batch" else {}
    res = run(command, model, (x,), **kw)
    assert res.exit_code == 0 and not [f for f in res.findings if f.severity != "info"], \
        [f.message for f in res.findings]
    routed = next(f for f in res.findings if f.code == "routed-by-input")
    assert re.match(rf"{2 * len(unpicked)} parameter tensor", routed.message), routed.message
    torch.manual_seed(0)
    dead = DenseTopOne(never=6)
    res = run(command, dead, (x,), **kw)
    kept = [f for f in res.findings if f.code in ("zero-grad", "param-not-updated")]
    assert kept and "experts.6" in kept[0].where + kept[0].message, [f.message for f in res.findings]
    assert kept[0].severity == ("warning" if command == "overfit-batch" else "error")
    assert "experts.6" not in next(f for f in res.findings if f.code == "routed-by-input").message


class Sharp(nn.Module):
    """A softmax saturated to one-hot (logits 1e4 apart): zero gradients for the batch, and for the rare fresh input
    whose top logits nearly tie a gradient. A saturation, not a routing: the verdict stays."""

    def __init__(self):
        super().__init__()
        self.score, self.head = nn.Linear(8, 4), nn.Linear(8, 3)
        self.register_buffer("values", torch.randn(4, 8))

    def forward(self, x):
        return self.head(x + torch.softmax(self.score(x) * 1e4, dim=-1) @ self.values)


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_a_saturated_softmax_is_not_asked_whether_fresh_inputs_reach_it(command):
    torch.manual_seed(10)   # a draw where fresh inputs do reach it (asked, all three said routed-by-input)
    res = run(command, Sharp(), (torch.randn(4, 8),), **({"steps": 100} if command == "overfit-batch" else {}))
    kept = [f for f in res.findings if f.code in ("zero-grad", "param-not-updated") and "score" in f.where]
    assert kept, [f.message for f in res.findings]
    assert "routed-by-input" not in {f.code for f in res.findings}
