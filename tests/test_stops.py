"""Where a zero gradient stops (core/stops.py, issue 26): the module that cuts the path, found by measuring the
gradients at every module's input and output, and the zero value inside it that closes it, found by opening it.
Hand-built cases whose cause is known by construction."""
import torch
from torch import nn

from torchdiag.api import run


class FrozenScale(nn.Module):
    """A frozen normalisation's affine part held as buffers (as a frozen BatchNorm does), its scale at 0."""

    def __init__(self, c):
        super().__init__()
        self.register_buffer("weight", torch.zeros(c))
        self.register_buffer("bias", torch.zeros(c))    # also 0 everywhere, but it does not close anything

    def forward(self, x):
        return x * self.weight + self.bias


class FrozenZeroResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.branch = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), FrozenScale(16))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = self.stem(x)
        return self.head(h + self.branch(h))


class Round(nn.Module):
    def forward(self, x):
        return torch.round(x)


class RoundedModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.r, self.head = nn.Linear(8, 8), Round(), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.r(self.enc(x)))


class ZeroQueries(nn.Module):
    """DETR's first decoder layer: its value projection reads queries that are zeros by construction."""

    def __init__(self):
        super().__init__()
        self.q, self.body, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.body(x) + self.q(torch.zeros_like(x)))


def errors(res):
    return [f for f in res.findings if f.severity == "error"]


def gradflow(model):
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    res = run("gradflow", model, (torch.randn(4, 8),))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())   # the copy was opened, not this
    return res


def test_a_zero_buffer_that_closes_the_path_is_named():
    res = gradflow(FrozenZeroResidual())
    (f,) = errors(res)
    assert f.code == "zero-grad" and f.where == "branch"
    assert "the gradient stops at branch.2 (FrozenScale)" in f.message
    assert "its buffer `weight` is 0 everywhere, and set to 1 on a copy the module passes a gradient" in f.message
    assert "`bias`" not in f.message   # also 0, but it does not open anything
    assert "non-zero init" in f.hint


def test_a_module_with_a_zero_derivative_op_is_named():
    (f,) = errors(gradflow(RoundedModule()))
    assert f.where == "enc" and "the gradient stops at r (Round)" in f.message
    assert "inside it a `round` op passes none" in f.message


def test_a_zero_derivative_op_outside_any_module_names_the_last_module_passed():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(torch.round(self.enc(x) * 4) / 4)

    (f,) = errors(gradflow(Functional()))
    assert "the gradient stops at a `round` op on its path" in f.message
    assert "the output of enc (Sequential), the last module it passes, already gets none" in f.message
    assert "the `round` op" in f.hint


def test_a_zero_derivative_op_in_the_owners_own_forward_is_named():
    class SoftmaxOfOne(nn.Module):   # SwiftFormer's additive attention: a softmax over an axis of size 1
        def __init__(self):
            super().__init__()
            self.w_g = nn.Parameter(torch.randn(8, 1))
            self.proj = nn.Linear(8, 3)

        def forward(self, x):
            return self.proj(x * torch.softmax(x @ self.w_g, dim=-1))

    (f,) = errors(gradflow(SoftmaxOfOne()))
    assert f.where == "w_g" and "the gradient stops at a `softmax` op on its path" in f.message


def test_a_weight_fed_zeros_is_said_so():
    (f,) = errors(gradflow(ZeroQueries()))
    assert f.where == "q.weight"   # q.bias learns: only the weight multiplies the zeros
    assert "its module q (Linear) gets an input of 0 everywhere, and a weight that multiplies zero" in f.message


def test_doctor_says_where_the_gradient_stops():
    torch.manual_seed(0)
    res = run("doctor", FrozenZeroResidual(), (torch.randn(4, 8),))
    stuck = [f for f in res.findings if f.code == "param-not-updated"]
    # one module's parameters alike: one finding on the module, naming them (a sweep: two errors word for word)
    assert [(f.where, f.members) for f in stuck] == [("branch.0", ["branch.0.weight", "branch.0.bias"])]
    assert all("the gradient stops at branch.2 (FrozenScale)" in f.message for f in stuck)
    assert "a hook, mask or multiplication by 0" not in stuck[0].message   # the stop found is the cause


def test_a_healthy_model_pays_nothing():
    res = gradflow(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)))
    assert not any("zero gradient(s) stop" in n for n in res.notes)


# ---- the hostile review's cases (each wrong, or a crash, in the first version)

class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("g", torch.zeros(8))

    def forward(self, a, b):          # one input cut, the other passes
        return a * self.g + b


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.other, self.gate, self.head = nn.Linear(8, 8), nn.Linear(8, 8), Gate(), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.gate(self.enc(x), self.other(x)))


def test_a_module_that_cuts_one_of_its_inputs_is_the_stopper():
    (f,) = errors(gradflow(TwoInputs()))
    assert f.where == "enc" and "the gradient stops at gate (Gate)" in f.message and "buffer `g`" in f.message


def test_an_output_chunk_nobody_reads_does_not_crash():
    class QKV(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 24)

        def forward(self, x):
            return self.proj(x).chunk(3, dim=-1)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.enc, self.head = QKV(), nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            q, _, v = self.qkv(x)
            return self.head(q + v + torch.round(self.enc(x)))

    (f,) = errors(gradflow(M()))
    assert f.where == "enc" and "`round` op" in f.message


def test_a_scale_written_in_place_and_a_dataclass_output_are_followed():
    from dataclasses import dataclass

    @dataclass
    class Out:
        h: torch.Tensor

    class InPlace(FrozenScale):      # timm's LayerScale(inplace=True)
        def forward(self, x):
            return Out(x.mul_(self.weight))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.sc, self.head = nn.Linear(8, 8), InPlace(8), nn.Linear(8, 3)

        def forward(self, x):
            return self.head(x @ torch.eye(8) + self.sc(self.lin(x)).h)

    (f,) = errors(gradflow(M()))
    assert "the gradient stops at sc (InPlace)" in f.message and "buffer `weight`" in f.message


def test_the_op_named_is_the_one_inside_the_stopping_module():
    class Sign(nn.Module):
        def forward(self, x):
            return torch.sign(x * 3)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.q, self.head = nn.Linear(8, 8), Sign(), nn.Linear(8, 3)

        def forward(self, x):
            h = self.enc(x)
            return self.head(torch.round(h) + self.q(h))

    (f,) = errors(gradflow(M()))
    assert "stops at q (Sign)" in f.message and "`sign` op" in f.message and "round" not in f.message


def test_a_zero_that_is_not_the_modules_own_is_named_from_what_the_op_saved():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8))
            self.register_buffer("g", torch.zeros(8))
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(x + x * self.w * self.g)

    (f,) = errors(gradflow(M()))
    assert f.where == "w" and "the op's saved operand, buffer `g` of (root), is 0 everywhere" in f.message


def test_a_zero_scale_before_an_activation_names_what_made_the_zeros():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.scale, self.act, self.head = nn.Linear(8, 8), FrozenScale(8), nn.ReLU(), nn.Linear(8, 3)

        def forward(self, x):
            return self.head(x + self.act(self.scale(self.lin(x))))

    f = next(f for f in errors(gradflow(M())) if f.where == "lin")
    assert "stops at act (ReLU)" in f.message and "what it reads is 0 everywhere (made by scale (FrozenScale))" in f.message


def test_the_parameters_of_one_group_that_stop_in_different_places_are_each_told():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.fs, self.r = nn.Linear(8, 8), nn.Linear(8, 8), FrozenScale(8), Round()

        def forward(self, x):
            return self.fs(self.a(x)) + self.r(self.b(x))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.blk, self.head = Block(), nn.Linear(8, 3)

        def forward(self, x):
            return self.head(x + self.blk(x))

    (f,) = errors(gradflow(M()))
    assert "blk.a.weight, blk.a.bias: the gradient stops at blk.fs (FrozenScale)" in f.message
    assert "blk.b.weight, blk.b.bias: the gradient stops at blk.r (Round)" in f.message


def test_the_callers_random_state_is_kept():
    class Dropped(FrozenScale):
        def forward(self, x):
            return torch.nn.functional.dropout(x, 0.1) * self.weight

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.st, self.head = nn.Linear(8, 8), Dropped(8), nn.Linear(8, 3)

        def forward(self, x):
            return self.head(x + self.st(self.lin(x)))

    model = M()
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    state = torch.random.get_rng_state()
    res = run("gradflow", model, (x,))
    assert any("stops at st (Dropped)" in f.message for f in errors(res))
    assert torch.equal(torch.random.get_rng_state(), state)


def test_an_embedding_that_only_looks_up_its_padding_index_is_said_so():
    class Ids(nn.Module):   # RoCBert: missing pronunciation/shape ids are filled with zeros, its padding index
        def __init__(self):
            super().__init__()
            self.word, self.extra, self.head = nn.Embedding(50, 8), nn.Embedding(10, 8, padding_idx=0), nn.Linear(8, 3)

        def forward(self, ids, extra_ids=None):
            extra_ids = torch.zeros_like(ids) if extra_ids is None else extra_ids
            return self.head((self.word(ids) + self.extra(extra_ids)).mean(1))

    torch.manual_seed(0)
    (f,) = errors(run("gradflow", Ids(), (torch.randint(1, 50, (4, 6)),)))
    assert f.where == "extra" and "every index it looks up is its padding index (0)" in f.message
    assert "give it real ids" in f.hint


class _TypedIds(nn.Module):
    """Word ids plus token-type ids read by a table whose padding index is 0; `zeroed`: the forward multiplies the
    type ids by 0 itself (the model's doing, as LXMERT's zeros filled in for a missing token_type_ids)."""

    def __init__(self, zeroed: bool = False):
        super().__init__()
        self.zeroed = zeroed
        self.word, self.types, self.head = nn.Embedding(50, 8), nn.Embedding(3, 8, padding_idx=0), nn.Linear(8, 3)

    def forward(self, ids, types):
        return self.head((self.word(ids) + self.types(types * 0 if self.zeroed else types)).mean(1))


def test_padding_ids_torchdiag_made_up_are_not_judged():
    # all-zero token type ids torchdiag made up, against a table whose padding index is 0: a fact of the made-up
    # inputs, info in both commands; the user's own ids keep the error (the test above)
    from torchdiag.core.inputs import ModelInputs

    torch.manual_seed(0)
    ids = torch.randint(1, 50, (4, 6))
    for command in ("gradflow", "doctor"):
        made_up = ModelInputs((ids, torch.zeros_like(ids)), {}, "hf defaults", chosen=True)
        res = run(command, _TypedIds(), made_up)
        assert not errors(res) and res.exit_code == 0, [f.message for f in errors(res)]
        (f,) = [f for f in res.findings if f.code == "not-reached"]
        assert f.severity == "info" and "padding index (0)" in f.message and "types" in f.message
        given = run(command, _TypedIds(), (ids, torch.zeros_like(ids)))
        assert any("types" in f.where for f in errors(given)), command


def test_padding_ids_the_forward_makes_itself_stay_an_error_on_made_up_inputs():
    # a review: ids the forward zeroes itself are the model's doing, whatever inputs torchdiag made up
    from torchdiag.core.inputs import ModelInputs

    torch.manual_seed(0)
    ids = torch.randint(1, 50, (4, 6))
    made_up = ModelInputs((ids, torch.randint(1, 3, (4, 6))), {}, "hf defaults", chosen=True)
    (f,) = errors(run("gradflow", _TypedIds(zeroed=True), made_up))
    assert f.where == "types" and "padding index (0)" in f.message


def test_two_zeros_that_keep_each_other_at_zero_are_both_said():
    class Deadlock(nn.Module):   # a zero-initialised branch times a zero trainable scale: neither can move
        def __init__(self):
            super().__init__()
            self.a, self.scale, self.head = nn.Linear(8, 8), nn.Parameter(torch.zeros(8)), nn.Linear(8, 3)
            nn.init.zeros_(self.a.weight)
            nn.init.zeros_(self.a.bias)

        def forward(self, x):
            return self.head(x + self.a(x) * self.scale)

    f = next(f for f in errors(gradflow(Deadlock())) if f.where == "a")
    assert "parameter `scale` of (root), is 0 everywhere and gets no gradient either" in f.message


def test_the_module_passed_is_on_the_parameters_own_path():
    class Attn(nn.Module):   # every key masked but the first: the other keys' projection gets no gradient
        def __init__(self):
            super().__init__()
            self.q, self.k, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            s = self.q(x) @ self.k(x).transpose(-1, -2)
            mask = torch.ones_like(s, dtype=torch.bool)
            mask[..., 0] = False
            return self.head(s.masked_fill(mask, -1e9).softmax(-1) @ x)

    torch.manual_seed(0)
    found = {f.where: f.message for f in errors(run("gradflow", Attn(), (torch.randn(2, 5, 8),)))}
    assert "the output of k (Linear), the last module it passes" in found["k"]


def test_a_softmax_saturated_to_one_hot_is_said_so():
    class Sharp(nn.Module):   # logits 1e4 apart: the softmax is exactly one-hot and passes no gradient
        def __init__(self, scale):
            super().__init__()
            self.scale, self.score, self.head = scale, nn.Linear(8, 4), nn.Linear(8, 3)
            self.register_buffer("values", torch.randn(4, 8))

        def forward(self, x):
            return self.head(x + torch.softmax(self.score(x) * self.scale, dim=-1) @ self.values)

    (f,) = [f for f in errors(gradflow(Sharp(1e4))) if f.where == "score"]
    assert "`softmax` op" in f.message and "its output is one-hot" in f.message and "temperature" in f.hint
    assert not errors(gradflow(Sharp(1.0)))   # the same model with logits of an ordinary scale: healthy


def test_a_causal_attention_read_at_its_first_position_says_which_rows_are_one_hot():
    """A sweep: a BERT config with is_decoder=true under a classification head (pooled at the first token, which
    causal attention lets see itself alone) was told of dead units or a round/argmax at the softmax. 2 of the 10 rows
    (the first query of each of 2 samples) are one-hot; the loss reads only those: its query and key get none."""
    class Causal(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):
            s = self.q(x) @ self.k(x).transpose(-1, -2)
            future = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)
            return self.head((s.masked_fill(future, float("-inf")).softmax(-1) @ x)[:, 0])

    torch.manual_seed(0)
    found = {f.where: f for f in errors(run("gradflow", Causal(), (torch.randn(2, 5, 8),)))}
    assert set(found) == {"q", "k"}, list(found)
    assert "2 of 10 rows of its output are one-hot" in found["q"].message, found["q"].message
    assert "causal attention" in found["q"].hint and "dead units" not in found["q"].hint
