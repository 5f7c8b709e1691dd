"""A module whose output never reached the loss, followed through one more forward (core/discarded.py), so gradflow's
no-grad error says what became of it: returned by the component that holds it and thrown away by its caller
(discarded: a base model's pooler, or a forgotten skip: the two look alike, so both stay errors), dropped inside the
forward that holds it (dropped: a forgotten residual add), cut by an op (detached), or in the model's output but
left out by a named loss (left-out). doctor and overfit-batch report the same no-grad error."""
import pytest
import torch
from torch import nn

from torchdiag.api import run as api_run


class Base(nn.Module):
    """A base model returning its sequence and a pooled summary, as Hugging Face's do."""

    def __init__(self, use: str = "discard"):
        super().__init__()
        self.use = use
        self.body = nn.Linear(6, 8)
        self.pool = nn.Linear(8, 8)
        self.register_buffer("last", torch.zeros(4, 8))

    def forward(self, x):
        h = torch.relu(self.body(x))
        pooled = torch.tanh(self.pool(h))
        if self.use == "buffer":   # copied into a buffer under no_grad
            with torch.no_grad():
                self.last[:] = pooled
        return h, pooled


class ForTask(nn.Module):
    """A task head over the base model's sequence; `use` says what becomes of the pooled output."""

    def __init__(self, use: str = "discard"):
        super().__init__()
        self.use = use
        self.base = Base(use)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h, pooled = self.base(x)
        if self.use == "detach":
            return self.head(h) + pooled.detach()[:, :4]
        if self.use == "compare":
            return self.head(h) * (pooled[:, :4] > 0)
        if self.use == "return":
            return self.head(h), pooled
        if self.use == "topk":     # a router whose scores only pick rows: its weights never train
            return self.head(h)[pooled[:, 0].topk(2).indices]
        if self.use == "view_as":  # only its shape is taken
            return (self.head(h) + pooled.detach()[:, :4]).view_as(pooled[:, :4])
        return self.head(h)        # discard (and buffer): the pooled output is not read


class ForgottenResidual(nn.Module):
    """A block that computes its attention-like branch and never adds it: half the network never trains."""

    def __init__(self):
        super().__init__()
        self.norm, self.branch, self.mlp, self.head = nn.LayerNorm(8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        a = self.branch(self.norm(x))  # noqa: F841 - the bug on purpose: x = x + a is missing
        x = x + torch.relu(self.mlp(x))
        return self.head(x)


def x(rows=4, cols=6):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))


def test_an_output_its_caller_throws_away_is_named_as_such_and_stays_an_error():
    # the pooler a task head never reads and a returned skip the caller forgot to add are the same fact from
    # outside (the parameters never train): an error, whose message says what happened instead of guessing a detach
    torch.manual_seed(0)
    res = api_run("gradflow", ForTask(), (x(),))
    found = {(f.code, f.severity, f.where): f for f in res.findings}
    assert set(found) == {("no-grad", "error", "base.pool")}
    msg = found[("no-grad", "error", "base.pool")].message
    assert "discarded:" in msg and "threw that away" in msg and "base.pool.weight" in msg
    rows = {r["name"]: r for r in res.table("params").rows}
    assert rows["base.pool.weight"]["status"] == "no-grad" and rows["base.pool.weight"]["reason"] == "discarded"
    assert rows["head.weight"]["status"] == "ok" and res.exit_code == 1


@pytest.mark.parametrize("command", ["doctor", "overfit-batch"])
def test_doctor_and_overfit_batch_report_the_same_no_grad_error(command):
    torch.manual_seed(0)
    opts = {"steps": 30} if command == "overfit-batch" else {}
    res = api_run(command, ForTask(), (x(),), **opts)
    assert ("no-grad", "error") in {(f.code, f.severity) for f in res.findings} and res.exit_code == 1


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_a_branch_dropped_inside_its_own_forward_stays_an_error(command):
    # the forgotten residual add looks like a discarded pooler from outside; it differs in where the value died
    torch.manual_seed(0)
    res = api_run(command, ForgottenResidual(), (x(4, 8),))
    assert ("no-grad", "error") in {(f.code, f.severity) for f in res.findings}, [(f.code, f.where) for f in res.findings]
    assert res.exit_code == 1
    if command == "gradflow":
        rows = {r["name"]: r for r in res.table("params").rows}
        assert rows["branch.weight"]["reason"] == "dropped" and "x = x + branch" in res.findings[0].message


@pytest.mark.parametrize("use", ["detach", "compare", "topk", "buffer", "view_as"])
def test_an_output_used_without_a_gradient_stays_no_grad(use):
    torch.manual_seed(0)
    res = api_run("gradflow", ForTask(use), (x(),))
    assert {(f.code, f.severity, f.where) for f in res.findings} == {("no-grad", "error", "base.pool")}
    rows = {r["name"]: r for r in res.table("params").rows}
    assert rows["base.pool.weight"]["reason"] == "detached" and res.exit_code == 1
    assert "in the model's output" not in res.findings[0].message


def test_an_output_a_named_loss_leaves_out_says_so():
    torch.manual_seed(0)
    res = api_run("gradflow", ForTask("return"), (x(),), loss="cross_entropy")
    (finding,) = res.findings
    assert (finding.code, finding.where) == ("no-grad", "base.pool")
    assert "left-out" in finding.message and "the loss does not use that output" in finding.message
    # auto covers the pooled output: everything trains
    assert not api_run("gradflow", ForTask("return"), (x(),)).findings


def test_the_follow_up_forward_runs_in_the_judged_mode():
    # under --eval the judged pass sees the eval forward, which detaches the pooled output: a cut, whatever the
    # train-mode forward would do with it
    class EvalCut(ForTask):
        def forward(self, x):
            h, pooled = self.base(x)
            return self.head(h) + (pooled.detach()[:, :4] if not self.training else 0)

    torch.manual_seed(0)
    res = api_run("gradflow", EvalCut(), (x(),), eval_mode=True)
    assert {(f.code, f.where) for f in res.findings} == {("no-grad", "base.pool")}


def test_the_follow_up_forward_leaves_the_model_as_it_was(untouched):
    torch.manual_seed(0)
    model, inp = ForTask(), x()
    with untouched(model):
        api_run("gradflow", model, (inp,))


class AttentionPool(nn.Module):
    """A pooling head with nn.MultiheadAttention, whose forward reads out_proj's weight without calling out_proj."""

    def __init__(self):
        super().__init__()
        self.probe = nn.Parameter(torch.randn(1, 1, 8))
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, h):
        return self.attention(self.probe.expand(h.shape[0], -1, -1), h, h)[0][:, 0]


class TowerWithPool(nn.Module):
    """A vision tower returning patch features and a pooled one; the caller reads the patches (SigLIP under LLaVA)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = AttentionPool()

    def forward(self, x):
        h = torch.relu(self.body(x))
        return h, self.head(h)


class ReadsPatches(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = TowerWithPool()
        self.out = nn.Linear(8, 4)

    def forward(self, x):
        patches, _ = self.tower(x)
        return self.out(patches)


def test_a_child_used_without_being_called_shares_its_discarded_parent_s_finding():
    # out_proj never runs as a module, yet its parent ran and was thrown away: one finding for the whole head
    res = api_run("gradflow", ReadsPatches(), (torch.randn(2, 5, 6),))
    found = [(f.code, f.where) for f in res.findings if f.severity != "info"]
    assert found == [("no-grad", "tower.head")], found
    rows = {r["name"]: r for r in res.table("params").rows}
    assert rows["tower.head.attention.out_proj.weight"]["reason"] == "discarded"
    assert "5 parameter tensors" in res.findings[0].message


class Spare(nn.Module):
    """A block with a child it never calls, whose own output is used (the child is simply unused)."""

    def __init__(self, grad: bool = True):
        super().__init__()
        self.grad = grad
        self.used, self.spare = nn.Linear(6, 8), nn.Linear(8, 8)

    def forward(self, x):
        with torch.set_grad_enabled(self.grad):
            return torch.relu(self.used(x))


class Holder(nn.Module):
    def __init__(self, grad: bool = True):
        super().__init__()
        self.block, self.head = Spare(grad), nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.block(x))


@pytest.mark.parametrize("grad", [True, False])
def test_a_child_never_called_keeps_its_own_unused_finding_unless_its_parent_s_graph_was_cut(grad):
    # third review: the fold above named an unused child "detached" under a parent that ran under no_grad (fix
    # the no_grad and the child still gets nothing), hiding its own finding and --allow hint
    res = api_run("gradflow", Holder(grad), (x(),))
    found = {f.where: f for f in res.findings if f.code == "no-grad"}
    assert "block.spare" in found and "never ran" in found["block.spare"].message, [f.message for f in res.findings]
    assert ("block.used" in found) == (not grad)
