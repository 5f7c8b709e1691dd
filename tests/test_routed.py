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


class ByFlag(nn.Module):
    """Tabular data whose column 0 is a 0/1 flag: expert 0 for flag 0, expert 1 for flag 1, and expert 2 for a flag
    above 1.5, which no row of 0/1 data ever has: a dead branch (a wrong threshold), a real bug."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        flag = x[:, 0]
        out = torch.zeros_like(x)
        for e, sel in enumerate((flag < 0.5, (flag >= 0.5) & (flag <= 1.5), flag > 1.5)):
            if sel.any():
                out[sel] = self.experts[e](x[sel])
        return self.head(out)


def _flagged_batch():
    torch.manual_seed(0)
    x = torch.randn(6, 6) * 3            # features of a wide spread beside the flag (the whole tensor's std: 2.7)
    x[:, 0] = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    return x


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_fresh_inputs_stay_inside_the_batch_s_own_values(command):
    """A hostile review: fresh Gaussian values of the flag's mean and spread went above 1.5, and the dead expert was
    routed-by-input (info, exit 0). Fresh inputs are new combinations of the batch's own values: flags stay 0/1."""
    res = run(command, ByFlag(), (_flagged_batch(),), **({"steps": 100} if command == "overfit-batch" else {}))
    no_grad = [f for f in res.findings if f.code == "no-grad"]
    assert no_grad and "experts.2" in no_grad[0].where + no_grad[0].message, [f.message for f in res.findings]
    assert res.exit_code == 1
    assert not [f for f in res.findings if f.code == "routed-by-input" and "experts.2" in f.message]


class ByCategory(nn.Module):
    """Integer inputs: column 0 a category in {0, 1}, column 1 a token id in 0..9. Category 2 has an expert the
    data never selects."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, ids):
        h = self.embed(ids[:, 1])
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            sel = ids[:, 0] == e
            if sel.any():
                out[sel] = expert(h[sel])
        return self.head(out)


def test_fresh_integer_inputs_keep_each_column_s_own_values():
    """A hostile review: ids were drawn over the whole tensor's [0, 9], which invented category 2 for column 0."""
    ids = torch.tensor([[0, 3], [1, 9], [0, 7], [1, 0], [0, 5], [1, 2]])
    res = run("gradflow", ByCategory(), (ids,))
    assert res.exit_code == 1 and any(f.code == "no-grad" and "experts.2" in f.where + f.message
                                      for f in res.findings), [f.message for f in res.findings]


def test_resampled_values_are_the_batch_s_own_finite_values_per_entry():
    from torchdiag.core.fresh import resampled_batches
    from torchdiag.core.inputs import ModelInputs

    torch.manual_seed(0)
    x = torch.rand(5, 3, 4, 4)           # distinct values: the sample each entry came from can be read back
    x[0, 1, 2, 3] = float("nan")         # a missing value: never drawn while the entry has a finite one
    mask = torch.arange(5).view(5, 1, 1, 1).expand(5, 3, 4, 4).contiguous()   # each entry's sample index
    batches = resampled_batches(ModelInputs((x,), {"mask": mask}), seed=0, samples=40)
    assert len(batches) == 8
    for b in batches:
        y, m = b.args[0], b.kwargs["mask"]
        assert y.shape == x.shape and y.isfinite().all()
        hits = y.unsqueeze(0) == x.unsqueeze(1)            # (the batch's sample, entry)
        assert hits.any(0).all()                           # every entry is one of the batch's values there
        paired = hits.float().argmax(0) == m               # the mask, of one shape, drawn from that same sample,
        paired[:, 1, 2, 3] = True                          # but where a NaN was redrawn
        assert paired.all()
    assert any(not torch.equal(b.args[0], x) for b in batches)
    assert resampled_batches(ModelInputs((x[:1],), {}), seed=0, samples=40) == []   # one sample: nothing new


def test_a_non_finite_gradient_reaches_nothing():
    from torchdiag.core.unreached import _got

    a, b, c = (nn.Parameter(torch.zeros(3)) for _ in range(3))
    a.grad, b.grad, c.grad = torch.tensor([1.0, float("nan"), 0.0]), torch.ones(3), torch.zeros(3)
    assert _got({"a": a, "b": b, "c": c}, ["a", "b", "c"], nonzero=False) == {"b", "c"}
    assert _got({"a": a, "b": b, "c": c}, ["a", "b", "c"], nonzero=True) == {"b"}


class Timed(nn.Module):
    """Rows must come sorted by their time stamp (column 0), so fresh inputs (rows mixed) are refused; layer 1 is
    dropped at random in train mode (LayerDrop); expert 1 only runs for a flag (column 1) above 1.5, which no row
    has."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        if not bool((x[1:, 0] >= x[:-1, 0]).all()):
            raise ValueError("rows must be sorted by time")
        h = x
        for i, layer in enumerate(self.layers):
            if i == 1 and self.training and torch.rand([]) < 0.7:
                continue
            h = layer(h)
        out = torch.zeros_like(h)
        for e, sel in enumerate((x[:, 1] <= 1.5, x[:, 1] > 1.5)):
            if sel.any():
                out[sel] = self.experts[e](h[sel])
        return self.head(out)


@pytest.mark.parametrize("command", ["gradflow", "doctor"])
def test_a_forward_that_refuses_fresh_inputs_keeps_what_other_draws_found(command):
    """A hostile review: one try block held both re-checks, so the fresh inputs' failure threw away the layer another
    random draw had reached, and the LayerDrop-skipped layer was a no-grad error again."""
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    x[:, 0], x[:, 1] = torch.arange(6.0), torch.tensor([0.0, 1, 0, 1, 1, 0])
    res = run(command, Timed(), (x,))
    codes = {(f.code, f.where) for f in res.findings}
    assert ("skipped-at-random", "layers.1") in codes, codes     # seed 0: the judged pass drops layer 1
    no_grad = [f for f in res.findings if f.code == "no-grad"]
    assert len(no_grad) == 1 and "experts.1" in no_grad[0].message and "layers.1" not in no_grad[0].message
    assert any("not re-checked on fresh inputs" in n and "sorted by time" in n for n in res.notes), res.notes


def test_gradflow_says_which_kind_of_missing_gradient_was_routed_and_how_to_reach_it():
    """A review: gradflow's title always said "no gradient, or one of zeros", and its finding had no hint (doctor's
    and overfit-batch's had)."""
    model, x, _ = _case()
    plain = next(f for f in run("gradflow", model, (x,)).findings if f.code == "routed-by-input")
    torch.manual_seed(0)
    dense = next(f for f in run("gradflow", DenseTopOne(), (torch.randn(3, 16),)).findings
                 if f.code == "routed-by-input")
    assert "got no gradient only because" in plain.message and "zeros" not in plain.message, plain.message
    assert "got a gradient of zeros only because" in dense.message, dense.message
    assert plain.hint and plain.hint == dense.hint and "batch large enough" in plain.hint


class ReluGated(nn.Module):
    """Each branch scaled by its own ReLU gate; gate 2 shut for every sample of the batch (its pre-activation's largest
    value over the batch just below 0), open for some mixtures of the batch's values: a dead gate, not a router."""

    def __init__(self, x):
        super().__init__()
        self.gates = nn.ModuleList(nn.Linear(8, 1) for _ in range(3))
        self.branches = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 2)
        with torch.no_grad():
            for g in self.gates[:2]:
                g.bias.fill_(5.0)
            self.gates[2].bias -= self.gates[2](x).max() + 0.01

    def forward(self, x):
        return self.head(sum(torch.relu(g(x)) * b(x) for g, b in zip(self.gates, self.branches)))


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_a_branch_behind_a_dead_relu_gate_is_not_routed(command):
    """A review: the gate's own parameters were zero-grad (dead units), while the branch it multiplies by 0 was
    routed-by-input (info): fresh inputs that open the branch open the gate too. Both keep their verdict."""
    torch.manual_seed(0)
    x = torch.randn(6, 8)
    torch.manual_seed(1)
    res = run(command, ReluGated(x), (x,), **({"steps": 100} if command == "overfit-batch" else {}))
    assert "routed-by-input" not in {f.code for f in res.findings}, [f.message for f in res.findings]
    assert res.exit_code == 1
    assert any("saturation" in n and "gates.2" in n for n in res.notes), res.notes


class TokenMoE(nn.Module):
    """Top-2 routing per token (Mixtral-like) behind token and position embeddings and attention. `never`: an expert
    the router can never pick (its logit sliced off), a real bug. `masked`: each layer's output at padded positions is
    zeroed after the experts' rows were added in (an expert picked only by padded tokens gets a gradient of zeros)."""

    def __init__(self, never=False, masked=False, vocab=100, d=32, experts=8):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(16, d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.gate = nn.ModuleList(nn.Linear(d, experts, bias=False) for _ in range(2))
        self.experts = nn.ModuleList(nn.ModuleList(nn.Linear(d, d) for _ in range(experts)) for _ in range(2))
        self.head = nn.Linear(d, vocab)
        self.never, self.masked = never, masked

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids) + self.pos(torch.arange(input_ids.shape[1]))
        h = h + self.attn(h, h, h, key_padding_mask=attention_mask == 0, need_weights=False)[0]
        for gate, experts in zip(self.gate, self.experts):
            x = h.reshape(-1, h.shape[-1])
            logits = gate(x)[:, :-1] if self.never else gate(x)
            w, idx = logits.softmax(-1).topk(2, -1)
            out = torch.zeros_like(x)
            for e, expert in enumerate(experts):
                tok, slot = (idx == e).nonzero(as_tuple=True)
                if len(tok):
                    out.index_add_(0, tok, expert(x[tok]) * w[tok, slot, None])
            out = out.view(h.shape)
            h = h + (out * attention_mask[..., None] if self.masked else out)
        return self.head(h)


def _tokens(seed, masked=False):
    torch.manual_seed(seed)
    ids, y = torch.randint(0, 100, (2, 4)), torch.randint(0, 100, (2, 4))
    mask = torch.ones(2, 4, dtype=torch.long)
    if masked:
        mask[1, 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}, y


def _lm_loss(out, y):
    return nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_two_short_sequences_reach_experts_through_tokens_of_the_whole_vocabulary(command):
    """A hostile review: two sequences of four ids gave each position only the batch's two ids, so no fresh batch sent
    a token anywhere new, and unpicked experts were no-grad errors in 4 of 5 seeds. Ids the forward looks up whole in
    one table are drawn from the table's rows."""
    inputs, y = _tokens(0)
    extra = {"steps": 30} if command == "overfit-batch" else {}
    res = run(command, TokenMoE(), inputs, target=y, loss=_lm_loss, **extra)
    routed = [f for f in res.findings if f.code == "routed-by-input"]
    assert routed and not [f for f in res.findings if f.code in ("no-grad", "zero-grad")], \
        [f.message for f in res.findings]


def test_an_expert_the_router_cannot_pick_stays_no_grad_with_tokens_of_the_whole_vocabulary():
    inputs, y = _tokens(0)
    res = run("gradflow", TokenMoE(never=True), inputs, target=y, loss=_lm_loss)
    assert res.exit_code == 1 and any(f.code == "no-grad" and ".7" in f.where + f.message for f in res.findings), \
        [f.message for f in res.findings]
    assert not [f for f in res.findings if f.code == "routed-by-input" and "experts.0.7" in f.message]


def test_an_expert_only_padded_tokens_picked_is_routed_by_input_not_zero_grad():
    """A review: the expert's rows were added with index_add and then masked out, so its gradient was exactly zero,
    stopped at the index_add; that op only moves rows, and a fresh batch's real tokens reach it."""
    for seed in range(6):
        inputs, y = _tokens(seed, masked=True)
        res = run("gradflow", TokenMoE(masked=True), inputs, target=y, loss=_lm_loss)
        assert res.exit_code == 0 and not [f for f in res.findings if f.severity != "info"], \
            (seed, [f.message for f in res.findings])


def test_token_ids_looked_up_whole_are_found_and_a_category_column_is_not():
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.unreached import one_table

    inputs, _ = _tokens(0)
    assert one_table(TokenMoE(), ModelInputs((), inputs)) == {"input_ids": 100}
    ids = torch.tensor([[0, 3], [1, 9], [0, 7]])
    assert one_table(ByCategory(), ModelInputs((ids,), {})) == {}   # embed(ids[:, 1]): one column of it


def test_a_one_hot_input_stays_one_hot_so_a_router_that_sums_it_stays_broken():
    """A review: a router took `task.sum(-1)` (always 1) for the task's argmax, so three of four experts never ran;
    fresh one-hot rows drawn entry by entry became multi-hot, sent samples to them, and the bug was routed, info."""

    class SummedTask(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.experts = nn.Linear(8, 16), nn.ModuleList(nn.Linear(16, 4) for _ in range(4))

        def forward(self, x, task):
            h, idx = torch.relu(self.inp(x)), task.sum(-1).long()   # the bug: argmax meant
            out = torch.zeros(x.shape[0], 4)
            for e, expert in enumerate(self.experts):
                if (idx == e).any():
                    out[idx == e] = expert(h[idx == e])
            return out

    torch.manual_seed(0)
    x, task = torch.randn(16, 8), nn.functional.one_hot(torch.arange(16) % 4, 4).float()
    for command in ("gradflow", "doctor"):
        res = run(command, SummedTask(), (x, task), target=torch.randn(16, 4), loss="mse")
        assert res.exit_code == 1 and any(f.code == "no-grad" for f in res.findings), \
            (command, [f.message for f in res.findings])
        assert not [f for f in res.findings if f.code == "routed-by-input"]


def test_one_hot_rows_are_drawn_whole_and_token_ids_from_the_table_up_to_the_batch_s_largest():
    from torchdiag.core.fresh import resampled_batches
    from torchdiag.core.inputs import ModelInputs

    task = nn.functional.one_hot(torch.tensor([0, 3, 1, 3]), 4).float()
    rows = torch.softmax(torch.randn(4, 4), -1)          # rows that only sum alike, of the one-hot's shape: by entry
    ids = torch.tensor([[1, 6, 7, 2], [1, 9, 10, 3], [1, 5, 5, 4], [1, 6, 6, 0]])   # a BOS id first
    mask = torch.tensor([[1, 1, 1, 0]] * 4)
    batches = resampled_batches(ModelInputs((task, ids, rows), {"mask": mask}), seed=0, samples=400,
                                vocab={"input[1]": 50})
    assert all(b.args[0].sum(-1).eq(1).all() and b.args[0].amax(-1).eq(1).all() for b in batches)   # still one-hot
    assert any((b.args[2].sum(-1) - 1).abs().max() > 1e-3 for b in batches)                   # mixed across rows
    drawn = torch.cat([b.args[1] for b in batches])
    assert drawn[:, 0].eq(1).all()                                    # what every sample holds there stays
    assert set(drawn[:, 1:].unique().tolist()) == set(range(11))      # any row up to the batch's largest id, 10
    assert all(torch.equal(b.kwargs["mask"], mask) for b in batches)   # the mask's own values at each position


class _BosRouted(nn.Module):
    """Every token routed by the first token's embedding (the bug: `gate(h[:, :1])` for `gate(h)`); real batches start
    with the same BOS id, so the same experts run every time."""

    def __init__(self):
        super().__init__()
        self.emb, self.gate = nn.Embedding(100, 32), nn.Linear(32, 8, bias=False)
        self.experts, self.head = nn.ModuleList(nn.Linear(32, 32) for _ in range(8)), nn.Linear(32, 100)

    def forward(self, input_ids):
        h = self.emb(input_ids)
        w, idx = self.gate(h[:, :1]).expand(-1, h.shape[1], -1).softmax(-1).topk(2, -1)
        x, w, idx = h.reshape(-1, h.shape[-1]), w.reshape(-1, 2), idx.reshape(-1, 2)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if len(tok):
                out.index_add_(0, tok, expert(x[tok]) * w[tok, slot, None])
        return self.head(h + out.view(h.shape))


def test_a_router_that_reads_only_the_bos_token_stays_no_grad():
    """A review: ids drawn anywhere in the table put random tokens first, and this bug became routed, info."""
    torch.manual_seed(0)
    ids = torch.randint(2, 100, (4, 6))
    ids[:, 0] = 1
    res = run("gradflow", _BosRouted(), (ids,), target=torch.randint(0, 100, (4, 6)), loss=_lm_loss)
    assert res.exit_code == 1 and not [f for f in res.findings if f.code == "routed-by-input"], \
        [f.message for f in res.findings]


class _Clamped(TokenMoE):
    """Looks up its ids after a clamp that changes nothing: the same values, in a new tensor."""

    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids.clamp(min=0), attention_mask)


def test_ids_looked_up_after_a_clamp_are_still_drawn_from_the_table():
    inputs, y = _tokens(0)
    res = run("gradflow", _Clamped(), inputs, target=y, loss=_lm_loss)
    assert res.exit_code == 0 and [f for f in res.findings if f.code == "routed-by-input"], \
        [f.message for f in res.findings]


class _Placeholder(TokenMoE):
    """Refuses ids 7 and 8 (image placeholder tokens with no image given), which the batch does not hold: a fresh batch
    drawn from the table may (about half of them here)."""

    def forward(self, input_ids, attention_mask):
        if ((input_ids == 7) | (input_ids == 8)).any():
            raise ValueError("image token without an image")
        return super().forward(input_ids, attention_mask)


def test_a_forward_that_refuses_some_token_of_its_table_skips_those_fresh_batches():
    """A fresh batch drawn from the whole table may hold a token the model reserves: that batch reaches nothing, the
    others are asked, and a note counts the refused ones."""
    torch.manual_seed(2)
    ids, y = torch.randint(10, 100, (2, 8)), torch.randint(0, 100, (2, 8))
    inputs = {"input_ids": ids, "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    res = run("gradflow", _Placeholder(experts=16), inputs, target=y, loss=_lm_loss)
    assert res.exit_code == 0 and [f for f in res.findings if f.code == "routed-by-input"], \
        [f.message for f in res.findings]
    assert [n for n in res.notes if re.search(r"the forward refused \d+ of the \d+ fresh batches", n)], res.notes


class _PaddedTable(nn.Module):
    """A table of 128 rows for a vocabulary of 100 (padded to a multiple of 64), a per-token buffer of the real size
    indexed by the ids, and a sequence routed by the sum of its tokens' tags."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(128, 16)
        self.register_buffer("tag", torch.arange(100) % 2)
        self.experts, self.head = nn.ModuleList(nn.Linear(16, 16) for _ in range(4)), nn.Linear(16, 3)

    def forward(self, ids):
        h, idx = self.emb(ids).mean(1), self.tag[ids].sum(-1) % 4
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            if (idx == e).any():
                out[idx == e] = expert(h[idx == e])
        return self.head(h + out)


def test_token_ids_are_drawn_below_the_batch_s_largest_not_the_table_s_padded_rows():
    """A review: ids up to 127 indexed the 100-entry buffer out of bounds, and the expert the batch left was no-grad."""
    ids = torch.tensor([[0, 2, 4, 6], [1, 3, 5, 6], [0, 3, 4, 6], [1, 3, 5, 7]])   # tags sum to experts 0, 3, 1, 0
    res = run("gradflow", _PaddedTable(), (ids,), target=torch.tensor([0, 1, 2, 0]), loss=nn.functional.cross_entropy)
    assert res.exit_code == 0 and [f for f in res.findings if f.code == "routed-by-input"], \
        [f.message for f in res.findings]
    assert not [n for n in res.notes if "refused" in n], res.notes


def test_a_batch_of_identical_samples_makes_nothing_fresh():
    from torchdiag.core.fresh import resampled_batches
    from torchdiag.core.inputs import ModelInputs

    same = ModelInputs((torch.ones(4, 3), torch.zeros(4, 5, dtype=torch.long)), {})
    assert resampled_batches(same, seed=0, samples=40, vocab={"input[1]": 10}) == []
    one_differs = ModelInputs((torch.ones(4, 3), torch.tensor([[0] * 5] * 3 + [[1] * 5])), {})
    assert len(resampled_batches(one_differs, seed=0, samples=40)) == 10


class _BosRoutedMasked(_BosRouted):
    """The same bug, given the attention mask too (it does not read it)."""

    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids)


def test_a_router_reading_the_first_token_of_left_padded_rows_stays_no_grad():
    """A review: with left padding the first id is PAD or BOS, not one id everywhere, and the position was drawn from
    the table. An id the batch holds once per sample or more is special: a position holding one keeps the batch's."""
    torch.manual_seed(0)
    ids, mask = torch.randint(2, 100, (4, 6)), torch.ones(4, 6, dtype=torch.long)
    for i, pads in enumerate([0, 2, 0, 3]):
        ids[i, :pads], mask[i, :pads], ids[i, pads] = 0, 0, 1
    res = run("gradflow", _BosRoutedMasked(), {"input_ids": ids, "attention_mask": mask},
              target=torch.randint(0, 100, (4, 6)), loss=_lm_loss)
    assert res.exit_code == 1 and not [f for f in res.findings if f.code == "routed-by-input"], \
        [f.message for f in res.findings]




class _Bucket(nn.Module):
    """A hash router written `ids // 13` where `ids % 8` was meant: on words below 30, experts 3–7 never run."""

    def __init__(self):
        super().__init__()
        self.emb, self.experts = nn.Embedding(100, 16), nn.ModuleList(nn.Linear(16, 16) for _ in range(8))
        self.head = nn.Linear(16, 100)

    def forward(self, input_ids):
        h = self.emb(input_ids)
        x, idx = h.reshape(-1, 16), (input_ids // 13).reshape(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok = (idx == e).nonzero(as_tuple=True)[0]
            if len(tok):
                out.index_add_(0, tok, expert(x[tok]))
        return self.head(h + out.view(h.shape))


def test_a_padding_id_at_the_top_of_the_vocabulary_does_not_widen_the_drawn_ids():
    """A review: GPT-2-style padding (the last id, 99) on one sample's tail set the drawn range, and a bucketing bug
    only ids above the words reach was routed, info."""
    torch.manual_seed(0)
    ids = torch.randint(1, 30, (4, 8))
    ids[1, 5:] = 99
    res = run("gradflow", _Bucket(), (ids,), target=torch.randint(0, 100, (4, 8)), loss=_lm_loss)
    assert res.exit_code == 1 and not [f for f in res.findings if f.code == "routed-by-input"], \
        [f.message for f in res.findings]


class _Bert(nn.Module):
    """Word, token-type and position embeddings into a top-2 mixture, BERT-style inputs."""

    def __init__(self):
        super().__init__()
        self.word, self.tt, self.pos = nn.Embedding(100, 32), nn.Embedding(2, 32), nn.Embedding(32, 32)
        self.gate, self.experts = nn.Linear(32, 8, bias=False), nn.ModuleList(nn.Linear(32, 32) for _ in range(8))
        self.head = nn.Linear(32, 100)

    def forward(self, input_ids, attention_mask, token_type_ids, position_ids):
        h = self.word(input_ids) + self.tt(token_type_ids) + self.pos(position_ids)
        x = h.reshape(-1, 32)
        w, idx = self.gate(x).softmax(-1).topk(2, -1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if len(tok):
                out.index_add_(0, tok, expert(x[tok]) * w[tok, slot, None])
        return self.head(h + out.view(h.shape) * attention_mask[..., None])


def test_a_special_id_in_one_sample_keeps_itself_not_its_position():
    """A review: padding on one sample's tail made those positions keep the batch's ids for every sample, and with
    CLS and SEP kept too, two sequences of six had two positions left to vary: a false no-grad."""
    torch.manual_seed(2)
    model = _Bert()
    ids = torch.randint(3, 100, (2, 6))
    ids[:, 0], ids[:, 3] = 1, 2                   # CLS, SEP
    mask = torch.ones(2, 6, dtype=torch.long)
    ids[-1, -2:], mask[-1, -2:] = 0, 0            # padding
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": (torch.arange(6) > 3).long().expand(2, 6),
              "position_ids": torch.arange(6).expand(2, 6)}
    res = run("gradflow", model, inputs, target=torch.randint(0, 100, (2, 6)), loss=_lm_loss)
    assert res.exit_code == 0, [f.message for f in res.findings]


class _Offset(TokenMoE):
    """Looks up its ids past two reserved rows (`emb(ids + 2)`), in a table two rows larger."""

    def __init__(self):
        super().__init__(vocab=102)

    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids + 2, attention_mask)


def _drawn_from_the_table(make) -> None:
    """The model's ids are found as one table of 100 rows, and its unpicked experts are routed (exit 0)."""
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.unreached import one_table

    inputs, y = _tokens(0)
    assert one_table(make(), ModelInputs((), inputs)) == {"input_ids": 100}
    res = run("gradflow", make(), inputs, target=y, loss=_lm_loss)
    assert res.exit_code == 0 and [f for f in res.findings if f.code == "routed-by-input"], \
        [f.message for f in res.findings]


def test_ids_looked_up_past_an_offset_are_drawn_from_the_rows_they_can_reach():
    """A review: an offset lookup fell back to per-position draws (7 of 25 false errors on a padded mixture)."""
    _drawn_from_the_table(_Offset)


class _MatmulTable(nn.Module):
    """A lookup by a one-hot matmul (`one_hot(ids, V).float() @ table`): no nn.Embedding."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(100, 32))

    def forward(self, ids):
        return nn.functional.one_hot(ids, 100).float() @ self.weight


class _ByMatmul(TokenMoE):
    def __init__(self):
        super().__init__()
        self.emb = _MatmulTable()


def test_ids_looked_up_by_a_one_hot_matmul_are_drawn_from_the_table():
    """A review: a lookup by matmul fell back to per-position draws (14 of 25 false errors on a padded mixture)."""
    _drawn_from_the_table(_ByMatmul)
