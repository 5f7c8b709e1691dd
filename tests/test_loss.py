"""The shared loss/target rule (DESIGN.md "Targets and loss"): what `auto` picks, the values it
computes (against torch.nn.functional called by hand), how the choice is described, and that a
target that does not fit the output is a usage error (exit 2), never a crash (exit 4)."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from torchdiag.core.loss import Loss
from torchdiag.errors import UsageError

from support import sample


def seeded_classes(n, c, seed=0, extra=()):
    return torch.randint(0, c, (n, *extra), generator=torch.Generator().manual_seed(seed))


def test_auto_on_logits_is_cross_entropy_against_seeded_random_classes():
    y = torch.randn(6, 4)
    loss = Loss("auto", seed=3)
    value = loss(y)
    assert float(value) == pytest.approx(float(F.cross_entropy(y, seeded_classes(6, 4, 3))))
    assert loss.chosen == "cross_entropy" and loss.describe() == "cross_entropy on output against random class targets"
    # the same target on every call (steps train against one batch)
    assert torch.equal(loss.target, seeded_classes(6, 4, 3)) and float(loss(y)) == float(value)


def test_auto_on_other_outputs():
    scalar = torch.tensor(2.5)
    loss = Loss("auto")
    assert float(loss(scalar)) == 2.5 and loss.describe() == "the scalar output itself (output)"

    out = {"ids": torch.arange(3), "loss": torch.tensor(0.75)}
    loss = Loss("auto")
    assert float(loss(out)) == 0.75 and loss.describe() == "the model's own loss (output['loss'])"

    seq = torch.randn(2, 5, 7)                    # (N, L, V): not (N, C), so mean-squared error
    loss = Loss("auto", seed=1)
    target = torch.randn((2, 5, 7), generator=torch.Generator().manual_seed(1))
    assert float(loss((torch.arange(2), seq))) == pytest.approx(float(F.mse_loss(seq, target)))
    assert loss.describe() == "mse on output[1] against a random target"

    single = torch.randn(4, 1)                   # one column is a regression output, not one class
    loss = Loss("auto")
    loss(single)
    assert loss.chosen == "mse"


def test_a_plain_dataclass_output_is_read_by_its_fields():
    """A sweep: a model returning a @dataclass was refused by every training command ("cannot pick a tensor to
    compute a loss from a Out output", exit 2); the same fields in a dict worked. Now they are read as a dict's."""
    import dataclasses

    @dataclasses.dataclass
    class Out:
        ids: torch.Tensor
        logits: torch.Tensor
        feats: torch.Tensor

    from torchdiag.core.tracking import describe

    logits, feats = torch.randn(6, 4, requires_grad=True), torch.randn(6, 3, requires_grad=True)   # both trained
    out = Out(torch.arange(6), logits, feats)
    loss = Loss("auto", seed=3)
    value = loss(out)
    from torchdiag.core import seeds

    g = torch.Generator().manual_seed(seeds.output_target(3, 1))   # the first other output's own target
    other = F.mse_loss(feats, torch.randn((6, 3), generator=g))
    assert loss.describe().startswith("cross_entropy on output['logits']") and "output['feats']" in loss.describe()
    assert float(value) == pytest.approx(float(F.cross_entropy(logits, seeded_classes(6, 4, 3)) + other), rel=1e-6)
    assert describe(out) == "Out(ids: 6 int64, logits: 6x4, feats: 6x3)"


def test_auto_with_a_given_target():
    y = torch.randn(5, 3)
    classes = torch.tensor([0, 2, 1, 1, 0])
    loss = Loss("auto", target=classes)
    assert float(loss(y)) == pytest.approx(float(F.cross_entropy(y, classes)))
    assert loss.describe() == "cross_entropy on output against the given target"

    counts = torch.tensor([[1, 0, 3]] * 5)      # integer, but the output's own shape: regression on counts
    loss = Loss("auto", target=counts)
    assert float(loss(y)) == pytest.approx(float(F.mse_loss(y, counts.float())))
    assert loss.describe() == "mse on output against the given target"


@pytest.mark.parametrize("own", ["cross_entropy", "ignored", "bfloat16", "smoothed", "entropy", "teacher", "z_loss",
                                 "other_weights"])
def test_a_scalar_beside_the_logits_that_is_their_loss_is_the_model_s_own(own):
    """A new user's nanoGPT returns (logits, loss) when given its targets: auto judged it on that loss plus a made-up
    loss on the logits, twice what it trains on. A scalar whose gradient on the logits is (softmax - one-hot) / M (a
    cross-entropy against hard targets, ignored positions aside) is the model's own loss and is used alone. A review:
    an entropy regulariser and a KL to a teacher passed the first test (a function of the softmax) and threw a
    --batch target away. Those, label smoothing, a z-loss and an auxiliary loss of other weights stay a term beside
    the logits."""
    torch.manual_seed(0)
    head, aux = torch.nn.Linear(4, 7), torch.nn.Linear(4, 1)
    x, ids = torch.randn(3, 5, 4), torch.randint(0, 7, (3, 5))
    logits = head(x).bfloat16() if own == "bfloat16" else head(x)   # (a review: its gradient's rounding, 3.5e-3)
    scalar = {"cross_entropy": lambda: F.cross_entropy(logits.view(-1, 7), ids.view(-1)),
              "bfloat16": lambda: F.cross_entropy(logits.float().view(-1, 7), ids.view(-1)),
              "ignored": lambda: F.cross_entropy(logits.view(-1, 7), ids.masked_fill(ids > 4, -100).view(-1)),
              "smoothed": lambda: F.cross_entropy(logits.view(-1, 7), ids.view(-1), label_smoothing=0.1),
              "entropy": lambda: -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean(),
              "teacher": lambda: F.kl_div(logits.log_softmax(-1), torch.rand(3, 5, 7).softmax(-1), reduction="batchmean"),
              "z_loss": lambda: torch.logsumexp(logits, -1).pow(2).mean(),
              "other_weights": lambda: aux(x).pow(2).mean()}[own]()
    loss = Loss("auto", seed=0)
    value = loss((logits, scalar))
    if own in ("cross_entropy", "ignored", "bfloat16"):
        assert value.item() == scalar.item(), (value.item(), scalar.item())
        assert loss.describe().startswith("the model's own loss (output[1]: a cross-entropy of output[0] against hard "
                                          "targets"), loss.describe()
        assert loss((logits.detach() * 0, scalar)).item() == scalar.item()   # kept for every later step
    else:
        assert value.item() > scalar.item() + 0.1 and loss.describe().endswith(" + output[1] itself"), loss.describe()


@pytest.mark.parametrize("kind", ["auto", "cross_entropy"])
def test_a_class_per_position_on_the_last_dimension(kind):
    """A new user's GPT batch: (N, T) next ids against (N, T, V) logits was refused ("Expected target size [8, 65],
    got [8, 32]"). Ids shaped as the output without its last dimension are classes along it, checked against V; the
    value is the loss people write, cross_entropy(logits.view(-1, V), ids.view(-1)). torch's own layout (N, C, T
    against (N, T)) still reads dim 1, and a target of both layouts (T == C) keeps torch's."""
    y, ids = torch.randn(3, 5, 7), torch.randint(0, 7, (3, 5))
    loss = Loss(kind, target=ids)
    assert float(loss(y)) == pytest.approx(float(F.cross_entropy(y.reshape(-1, 7), ids.reshape(-1))), rel=1e-6)
    assert "a class per position along the logits' last dimension" in loss.describe(), loss.describe()
    with pytest.raises(UsageError) as exc:
        Loss(kind, target=torch.full((3, 5), 7))(y)
    assert "holds class 7, outside [0, 7) for an output of shape (3, 5, 7)" in exc.value.message, exc.value.message
    torch_layout = torch.randint(0, 5, (3, 7))
    assert float(Loss(kind, target=torch_layout)(y)) == pytest.approx(float(F.cross_entropy(y, torch_layout)), rel=1e-6)
    square, both = torch.randn(3, 5, 5), torch.randint(0, 5, (3, 5))
    ambiguous = Loss(kind, target=both)
    assert float(ambiguous(square)) == pytest.approx(float(F.cross_entropy(square, both)), rel=1e-6)
    assert "dimension 1 taken, torch's layout" in ambiguous.describe(), ambiguous.describe()   # said (a review)
    assert "fits the classes on dimension 1 and on the last" not in Loss(kind, target=torch_layout).describe()


@pytest.mark.parametrize("target, ignore", [(torch.tensor([[0, 255], [2, 255]]), True),
                                            (torch.tensor([[0, 255], [2, 7]]), False),
                                            (torch.tensor([[255, 255], [255, 255]]), False)])
def test_an_ignore_label_is_named_as_one(target, ignore):
    """A sweep: 255, VOC's and Cityscapes' unlabelled pixels, was told to give the model 256 outputs. One value
    outside [0, C) beside targets inside it is an ignore label; two values, or nothing inside, are not said so."""
    with pytest.raises(UsageError) as exc:
        Loss("cross_entropy", target=target)(torch.randn(2, 3, 2))
    assert ("ignore_index=255" in exc.value.hint) == ignore, exc.value.hint


def test_one_based_labels_are_named_as_such_not_as_an_ignore_label():
    """A check sweep: labels 1…C with C outputs (no 0 among them) were called an ignore label C."""
    with pytest.raises(UsageError) as exc:
        Loss("cross_entropy", target=torch.tensor([1, 2, 3, 3, 1]))(torch.randn(5, 3))
    assert "labels look 1-based" in exc.value.hint and "ignore" not in exc.value.hint, exc.value.hint
    with pytest.raises(UsageError) as exc:   # 0 among them: C is one value past the classes, an ignore label maybe
        Loss("cross_entropy", target=torch.tensor([0, 2, 3, 3, 1]))(torch.randn(5, 3))
    assert "1-based" not in exc.value.hint, exc.value.hint


@pytest.mark.parametrize("target, words, not_said", [
    ([-1, -2, 0, 2], "negative targets (-2) are no class", "outputs"),
    ([-1, 0, 7, 2], "negative targets (-1) are no class", "give the last layer 4"),
    ([0, 1, 2, 6, 7], "give the last layer 8 outputs", "1-based")])
def test_negative_or_wide_targets_get_a_hint_that_fits(target, words, not_said):
    """A review: negative targets were told to give the last layer fewer outputs than it has (3 classes, -2 … 2)."""
    with pytest.raises(UsageError) as exc:
        Loss("cross_entropy", target=torch.tensor(target))(torch.randn(len(target), 3))
    assert words in exc.value.hint and not_said not in exc.value.hint, exc.value.hint


@pytest.mark.parametrize("kind,y,target,message", [
    ("auto", torch.randn(5, 3), torch.tensor([0, 1, 2, 7, 0]), "holds class 7, outside [0, 3)"),
    ("cross_entropy", torch.randn(5, 3), torch.tensor([0, -2, 1, 1, 0]), "holds class -2"),
    ("auto", torch.randn(5, 3), torch.zeros(7, dtype=torch.long), "target does not fit the output"),
    ("cross_entropy", torch.randn(5, 1), None, "C ≥ 2 classes"),
    ("cross_entropy", torch.randn(5, 1), torch.rand(5, 1), "C ≥ 2 classes"),  # a 1-class softmax: loss ≡ 0
    ("cross_entropy", torch.randn(5), None, "C ≥ 2 classes"),
    ("mse", torch.randn(5, 3), torch.randn(5), "differs from output shape"),
])
def test_targets_that_do_not_fit_are_usage_errors(kind, y, target, message):
    with pytest.raises(UsageError) as exc:
        Loss(kind, target=target)(y)
    assert message in exc.value.message and exc.value.code == 2


def test_ignore_index_is_not_out_of_range():
    y = torch.randn(4, 3)
    target = torch.tensor([0, -100, 2, 1])
    assert float(Loss("cross_entropy", target=target)(y)) == pytest.approx(float(F.cross_entropy(y, target)))


def test_cli_bad_batch_target_is_exit_2_and_choice_is_printed(cli, tmp_path):
    path = tmp_path / "data.py"
    path.write_text(textwrap.dedent("""
        import torch

        def out_of_range():
            return torch.randn(16, 784), torch.full((16,), 10)

        def wrong_batch():
            return torch.randn(16, 784), torch.zeros(9, dtype=torch.long)

        def good():
            return torch.randn(16, 784), torch.arange(16) % 10
        """))
    for command in ("nancheck", "gradflow"):
        for fn, message in (("out_of_range", "holds class 10, outside [0, 10)"),
                            ("wrong_batch", "target does not fit the output")):
            r = cli(command, sample("mlp.py:build"), "--batch", f"{path}:{fn}")
            assert r.code == 2, (command, fn, r.stderr)
            assert r.stderr.startswith("error: cross_entropy") and message in r.stderr and "Traceback" not in r.stderr
        r = cli(command, sample("mlp.py:build"), "--batch", f"{path}:good")
        assert r.code == 0 and "loss: cross_entropy on output against the given target" in r.stdout
        # -i beside --batch would be silently ignored: a usage error naming both
        r = cli(command, sample("mlp.py:build"), "--batch", f"{path}:good", "-i", "4x784")
        assert r.code == 2 and "both give the inputs" in r.stderr and "Traceback" not in r.stderr


def test_an_empty_batch_is_a_usage_error_not_a_failure_inside_torch(cli, tmp_path):
    # a batch of 0 samples reached torch's min() over nothing: an internal error for nancheck, gradflow and doctor
    (tmp_path / "empty.py").write_text("import torch\n"
                                       "def batch(): return torch.randn(0, 784), torch.zeros(0, dtype=torch.long)\n")
    for command in ("nancheck", "gradflow", "doctor", "overfit-batch"):
        r = cli(command, sample("mlp.py:build"), "--batch", f"{tmp_path}/empty.py:batch")
        assert r.code == 2 and "input[0] has shape 0x784, a batch of 0 samples" in r.stderr, (command, r.stderr)
    from torchdiag import api
    with pytest.raises(UsageError, match="a batch of 0 samples"):
        api.run("nancheck", torch.nn.Linear(3, 3), torch.randn(0, 3))


def test_a_target_of_one_value_per_sample_is_the_column_of_a_one_column_output():
    # Hugging Face's regression labels are (N,) against (N, 1) logits (its loss squeezes them); torch's mse_loss
    # would broadcast them to N x N, and the rule refused them with exit 2 (a sweep)
    g = torch.Generator().manual_seed(0)
    y, t = torch.randn(8, 1, generator=g), torch.randn(8, generator=g)
    loss = Loss("auto", target=t)
    assert float(loss(y)) == pytest.approx(float(((y[:, 0] - t) ** 2).mean()))
    assert "(its (8,) values as the output's one column)" in loss.describe()
    with pytest.raises(UsageError, match="differs from output shape"):   # (N,) against (N, 2) stays refused
        Loss("mse", target=t)(torch.randn(8, 2))


class AuxNet(torch.nn.Module):
    """Inception's contract in train mode: (logits, aux_logits), the aux head on its own branch."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(6, 6)
        self.fc = torch.nn.Linear(6, 4)
        self.aux = torch.nn.Linear(6, 4)
        self.extra = torch.nn.Linear(6, 3)

    def forward(self, x):
        h = self.body(x)
        return self.fc(h), self.aux(h), {"side": self.extra(h)}


def test_auto_covers_every_output_with_a_gradient_path():
    torch.manual_seed(0)
    model, x = AuxNet(), torch.randn(5, 6)
    loss = Loss("auto", seed=2)
    logits, aux, side = model(x)
    value = loss((logits, aux, side))
    classes = seeded_classes(5, 4, 2)
    side_target = torch.randn((5, 3), generator=torch.Generator().manual_seed(2 + 2))
    expected = F.cross_entropy(logits, classes) + F.cross_entropy(aux, classes) + F.mse_loss(side["side"], side_target)
    assert float(value) == pytest.approx(float(expected))
    value.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())   # the aux heads too
    assert loss.describe() == ("cross_entropy on output[0] against random class targets"
                               " + cross_entropy on output[1] against the same target"
                               " + mse on output[2]['side'] against a random target")
    assert loss.covered == ["output[0]", "output[1]", "output[2]['side']"]
    # the same targets on the next step
    assert float(loss(model(x))) == pytest.approx(float(expected))


def test_the_same_loss_under_no_grad_as_with_grad():
    # PatchTST returns its input's scale and patches beside its hidden states: no gradient path, so the loss
    # leaves them out; under no_grad every output looked like it had one, and the loss changed (the invariance
    # test's shifted forward, run under no_grad, saw 3.98 against 1.05 and called a cancelled key bias a dependence)
    torch.manual_seed(0)
    x, fc = torch.randn(5, 6), torch.nn.Linear(6, 3)
    out = lambda: {"hidden": fc(x), "scale": x.std(0, keepdim=True), "patches": x * 2}   # noqa: E731
    loss = Loss("auto", seed=1)
    with_grad = float(loss(out()))
    assert loss.covered == ["output['hidden']"]
    with torch.no_grad():
        assert float(loss(out())) == with_grad


def test_auxiliary_scalar_losses_are_added_and_a_model_loss_key_stays_alone():
    y = torch.randn(3, 4, requires_grad=True)
    aux_loss = (y ** 2).mean()
    loss = Loss("auto")
    value = loss((y, aux_loss))
    assert float(value) == pytest.approx(float(F.cross_entropy(y, seeded_classes(3, 4)) + aux_loss))
    assert loss.describe().endswith(" + output[1] itself")
    out = {"loss": aux_loss, "logits": y}
    loss = Loss("auto")
    assert float(loss(out)) == float(aux_loss) and loss.describe() == "the model's own loss (output['loss'])"


def test_a_named_rule_says_which_outputs_it_left_out():
    model = AuxNet()
    loss = Loss("cross_entropy")
    logits, aux, side = model(torch.randn(5, 6))
    assert float(loss((logits, aux, side))) == pytest.approx(float(F.cross_entropy(logits, seeded_classes(5, 4))))
    assert loss.describe() == ("cross_entropy on output[0] against random class targets; left out: output[1], "
                               "output[2]['side'] (--loss auto covers every output, or give --loss PATH:fn)")


def test_namedtuple_outputs_are_labelled_by_field():
    from collections import namedtuple

    Out = namedtuple("InceptionOutputs", ["logits", "aux_logits"])
    y, aux = torch.randn(2, 5, requires_grad=True), torch.randn(2, 5, requires_grad=True)
    loss = Loss("auto")
    loss(Out(y, aux))
    assert "cross_entropy on output[1] (aux_logits) against the same target" in loss.describe()


# ------------------------------------------------------------- a language model's logits: next-token loss

def test_auto_on_a_language_models_logits_is_next_token_cross_entropy():
    """Integer ids (N, T) feeding an embedding of V rows, logits (N, T, V): the ids shifted by one are the
    targets (checked against F.cross_entropy computed here), and the header says so."""
    import importlib.util

    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.loss import language_model
    spec = importlib.util.spec_from_file_location("gpt_tiny", sample("gpt_tiny.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model, (ids,) = mod.build(), mod.example_inputs()
    loss = Loss("auto")
    loss.lm = language_model(model, ModelInputs((ids,)))
    out = model(ids)
    want = F.cross_entropy(out[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
    assert torch.equal(loss(out), want)
    assert loss.chosen == "next_token" and loss.describe().startswith("next-token cross_entropy on output against input[0]")


class _Encoder(torch.nn.Module):
    """Token ids -> logits over the vocabulary through one self-attention layer: causal, or reading the whole sequence
    (a masked LM's shape)."""

    def __init__(self, causal: bool, vocab: int = 50):
        super().__init__()
        torch.manual_seed(0)
        self.causal = causal
        self.emb = torch.nn.Embedding(vocab, 16)
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(16, vocab)

    def forward(self, ids):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1]) if self.causal else None
        return self.head(self.layer(self.emb(ids), src_mask=mask, is_causal=self.causal))


@pytest.mark.parametrize("causal", [True, False])
def test_a_bidirectional_models_logits_are_judged_against_the_ids_at_their_own_positions(causal):
    """A sweep: masked LMs (RoFormer, ConvBert, YOSO, BERT) got a next-token loss and the header "a language model":
    their logits at a position see the next id in their own input, so the task was a copy (a ConvBert MLM at 1% of
    its start in 14 steps). Where a change to the last id moves the logits of earlier positions, the targets are the
    ids at their own positions (checked against F.cross_entropy computed here); a causal model keeps next-token."""
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.loss import language_model

    model = _Encoder(causal)
    ids = torch.randint(0, 50, (3, 24), generator=torch.Generator().manual_seed(1))
    loss = Loss("auto")
    loss.lm = language_model(model, ModelInputs((ids,)))
    assert model.training   # the probe left the model as it was
    out = model(ids)
    if causal:
        want = F.cross_entropy(out[:, :-1].reshape(-1, 50), ids[:, 1:].reshape(-1))
        assert loss.lm.shift == 1 and torch.equal(loss(out), want) and loss.chosen == "next_token"
        return
    want = F.cross_entropy(out.reshape(-1, 50), ids.reshape(-1))
    assert loss.lm.shift == 0 and torch.equal(loss(out), want) and loss.chosen == "own_token"
    assert loss.describe().startswith("cross_entropy on output against input[0] at the same positions (a "
                                      "bidirectional model over input[0]")


class _MaskedEncoder(_Encoder):
    """_Encoder(causal=False) that takes an attention mask of ones beside the ids (a mask fits an embedding too)."""

    def forward(self, ids, mask):
        return self.head(self.layer(self.emb(ids), src_key_padding_mask=mask == 0))


class _RandomEvalCausal(_Encoder):
    """A causal _Encoder whose forward keeps dropout on in eval (F.dropout's default training=True: MC dropout)."""

    def forward(self, ids):
        return super().forward(ids) + F.dropout(torch.ones(()), 0.5) * 0.1 * torch.randn(ids.shape[1], 1)


class _StatefulGRU(torch.nn.Module):
    """A char-RNN LM that keeps its hidden state between calls (truncated backprop) and counts its calls."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.rnn, self.head = torch.nn.Embedding(50, 16), torch.nn.GRU(16, 16, batch_first=True), \
            torch.nn.Linear(16, 50)
        self.hidden, self.calls, self.seen = None, 0, []

    def forward(self, ids):
        self.calls += 1
        self.seen.append(tuple(ids.shape))
        h, hidden = self.rnn(self.emb(ids), self.hidden)
        self.hidden = hidden.detach()
        return self.head(h)


def test_the_bidirectional_probe_reads_a_masked_model_a_random_eval_and_leaves_the_state_as_it_was():
    """A review of the probe: (a) an attention mask of ones beside the ids fit an embedding too, so the ids were one of
    several candidates, none causal, and the first was kept with next-token targets: now each is probed; (b) a causal
    model whose eval forward stays random (dropout left on) moved every position between the two forwards and was
    read as bidirectional: both draw the same numbers; (c) a recurrent LM keeping its hidden state kept the probe's
    batch-1 state and the command's first forward failed: the modules' attributes are put back."""
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.loss import language_model

    ids = torch.randint(0, 50, (3, 24), generator=torch.Generator().manual_seed(1))
    lm = language_model(_MaskedEncoder(causal=False), ModelInputs((ids, torch.ones(3, 24, dtype=torch.long))))
    assert lm.ids is ids and lm.shift == 0
    # the first sample padded from position 10 (a tokenizer's padding=True, the short sentence first): its last id
    # moves nothing, and the mask, which moves the logits, was taken for the ids (a review: a loss against the mask)
    padded = torch.ones(3, 24, dtype=torch.long)
    padded[0, 10:] = 0
    lm = language_model(_MaskedEncoder(causal=False), ModelInputs((ids, padded)))
    assert lm.ids is ids and lm.shift == 0
    lm = language_model(_MaskedEncoder(causal=False), ModelInputs((), {"mask": padded, "ids": ids}))   # mask first
    assert lm.ids is ids and lm.shift == 0
    lm = language_model(_RandomEvalCausal(causal=True), ModelInputs((ids,)))
    assert lm.shift == 1
    model = _StatefulGRU()
    model(ids)
    hidden, seen = model.hidden, list(model.seen)
    lm = language_model(model, ModelInputs((ids,)))
    assert lm.shift == 1 and model.hidden is hidden and model.calls == 1 and model.seen == seen
    model(ids)   # the next forward at the batch's own size runs


class _ReadIdsAnotherWay(_Encoder):
    """A bidirectional _Encoder that reads its ids offset, through F.embedding on the table, or transposed into a
    sequence-first layer: none hands the ids as they are to the nn.Embedding module."""

    def __init__(self, way: str):
        super().__init__(causal=False)
        self.way = way

    def forward(self, ids):
        if self.way == "offset":
            h = self.emb((ids + 1) % 50)
        elif self.way == "functional":
            h = F.embedding(ids, self.emb.weight)
        else:
            h = self.emb(ids.t()).transpose(0, 1)
        return self.head(self.layer(h))


@pytest.mark.parametrize("way", ["offset", "functional", "transposed"])
def test_a_bidirectional_model_that_reads_its_ids_another_way_is_still_one(way):
    """A review: a version that counted a candidate only where it reached an nn.Embedding as it is gave these models
    next-token targets again (a copy: 3.69 on fresh random ids after 300 steps, below chance's ln 50 = 3.91)."""
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.loss import language_model

    ids = torch.randint(0, 50, (3, 24), generator=torch.Generator().manual_seed(1))
    lm = language_model(_ReadIdsAnotherWay(way), ModelInputs((ids,)))
    assert lm.ids is ids and lm.shift == 0


def test_a_masked_lm_from_transformers_is_told_as_one(cli, tmp_path):
    """BertForMaskedLM from a small config: doctor's target row and the loss line say the ids at their own positions,
    not next tokens; overfit-batch runs on that loss."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    transformers.BertForMaskedLM(config).save_pretrained(tmp_path / "mlm")
    j = cli("doctor", f"hf:{tmp_path / 'mlm'}", "--device", "cpu", "--json").json
    assert j["loss"].startswith("cross_entropy on output['logits'] against input[0] at the same positions")
    (row,) = [r for r in j["checks"] if r["id"] == "target"]
    assert "at their own positions" in row["verdict"] and "next tokens" not in row["verdict"]


def test_what_is_not_a_language_model_keeps_mse():
    """The same (N, T, V) logits when the ids do not index the embedding (an id ≥ V), when the input is
    float, or when V is not an embedding's size: mse as before."""
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.loss import language_model

    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    y = torch.randn(2, 5, 10)
    assert language_model(model, ModelInputs((torch.full((2, 5), 10),))) is None      # id 10 is out of range
    assert language_model(model, ModelInputs((torch.zeros(2, 5),))) is None           # float input
    assert language_model(torch.nn.Linear(3, 3), ModelInputs((torch.zeros(2, 5, dtype=torch.long),))) is None
    lm = language_model(model, ModelInputs((torch.zeros(2, 5, dtype=torch.long),)))
    assert lm is not None and not lm.fits(torch.randn(2, 5, 7))                       # V = 7: no such embedding
    loss = Loss("auto")
    loss.lm = lm
    loss(torch.randn(2, 5, 7))
    assert loss.chosen == "mse"
    loss = Loss("auto")
    loss.lm = lm
    loss(y)
    assert loss.chosen == "next_token"


def test_cli_a_language_model_without_labels_overfits_at_default_settings(cli):
    """The first-hour report: a GPT-style model returning logits only failed overfit-batch under mse."""
    j = cli("overfit-batch", sample("gpt_tiny.py:build"), "--arg", "layers=1", "--json").json
    assert j["exit_code"] == 0 and j["passed"] is True, j["findings"]
    assert j["loss_rule"].startswith("next-token cross_entropy")


@pytest.mark.parametrize("command, option, words", [("nancheck", "--loss", "loss file not found: nothere.py"),
                                                    ("nancheck", "--batch", "batch file not found: nothere.py"),
                                                    ("summary", "--batch", "batch file not found: nothere.py"),
                                                    ("activations", "--batch", "batch file not found: nothere.py")])
def test_a_missing_loss_or_batch_file_is_named_for_what_it_is(cli, command, option, words):
    r = cli(command, sample("mlp.py:build"), option, "nothere.py:fn")
    assert r.code == 2 and r.stderr.startswith(f"error: {words}"), r.stderr


@pytest.mark.parametrize("command", ["summary", "activations"])
def test_summary_and_activations_take_a_batch_of_keyword_inputs(cli, tmp_path, command):
    """A sweep: a model with keyword inputs had no way into summary but an example_inputs module."""
    (tmp_path / "kw.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class KW(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.e = nn.Embedding(10, 4)\n"
        "    def forward(self, input_ids, mask):\n        return self.e(input_ids) * mask[..., None]\n\n"
        "def build():\n    return KW()\n\n"
        "def batch():\n    return {'input_ids': torch.randint(0, 10, (2, 5)), 'mask': torch.ones(2, 5)}, None\n")
    r = cli(command, f"{tmp_path}/kw.py:build", "--batch", f"{tmp_path}/kw.py:batch", "--device", "cpu", "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input_ids: 2x5 int64", "mask: 2x5 float32"], r.json["inputs"]


# ------------------------------------------------------------- an encoder-decoder's logits

class EncDec(torch.nn.Module):
    """A shared embedding, an encoder, a decoder that is causal in its own ids when `causal` (cross-attention
    to the encoder), logits over the vocabulary; returns (logits, encoder states) like HF's seq2seq output."""

    def __init__(self, causal=True, vocab=20, dim=16):
        super().__init__()
        self.causal = causal
        self.shared = torch.nn.Embedding(vocab, dim)
        self.t = torch.nn.Transformer(dim, 2, 1, 1, 32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids, decoder_input_ids):
        n = decoder_input_ids.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(n) if self.causal else None
        enc = self.t.encoder(self.shared(input_ids))
        dec = self.t.decoder(self.shared(decoder_input_ids), enc, tgt_mask=mask, tgt_is_causal=self.causal)
        return self.head(dec), enc


def test_an_encoder_decoders_logits_are_next_token_predictions_of_its_decoder_ids(untouched):
    """Both id inputs feed the shared embedding; the logits are causal in the decoder's ids only (found by
    changing each one's last position): those are the targets, checked against F.cross_entropy by hand.
    The encoder states get no loss of their own: every weight behind them already reaches the logits."""
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.loss import language_model

    torch.manual_seed(0)
    model = EncDec().train()
    ids, dec = torch.randint(0, 20, (2, 6)), torch.randint(0, 20, (2, 6))
    inputs = ModelInputs((ids, dec))
    with untouched(model):
        lm = language_model(model, inputs)
    assert lm.name == "input[1]" and lm.ids is dec and model.training
    loss = Loss("auto")
    loss.lm = lm
    logits, enc = model(ids, dec)
    value = loss((logits, enc))
    assert torch.equal(value, F.cross_entropy(logits[:, :-1].reshape(-1, 20), dec[:, 1:].reshape(-1)))
    assert loss.describe() == ("next-token cross_entropy on output[0] against input[1] shifted by one (a language "
                               "model: input[1] feeds an embedding of 20 rows, the logits' last dimension); not "
                               "added: output[1] (every weight behind it already reaches output[0])")
    # a decoder that sees every position is causal in neither: the first ids, as before
    assert language_model(EncDec(causal=False), inputs).name == "input[0]"



def test_a_scalar_output_below_zero_is_left_out_of_the_auto_loss():
    """A sweep: pytorch-tabnet returns (logits, M_loss), a sparsity term at -0.8 that its own training subtracts
    (`loss - lambda_sparse * M_loss`); added as is, the sum went below 0 and overfit-batch refused the loss torchdiag
    itself made (exit 2, "give --target-loss"). A scalar below 0 at the first call is no loss to minimise as it is:
    left out, and said; one above 0 is still the model's own auxiliary loss."""
    torch.manual_seed(0)
    head, aux = torch.nn.Linear(4, 3), torch.nn.Linear(4, 1)
    x = torch.randn(5, 4)
    logits = head(x)
    loss = Loss("auto", seed=0)
    value = loss((logits, -aux(x).square().mean() - 0.5))
    assert value.item() == pytest.approx(F.cross_entropy(logits, seeded_classes(5, 3, 0)).item(), rel=1e-6)
    assert "not added: output[1] (a scalar below 0 at the start" in loss.describe(), loss.describe()
    positive = Loss("auto", seed=0)
    positive((logits, aux(x).square().mean()))
    assert positive.describe().endswith(" + output[1] itself"), positive.describe()


@pytest.mark.parametrize("split", ["squeezed", "split", "indexed"])
def test_a_head_split_into_outputs_gets_a_term_for_each(split):
    """A sweep: ALBERT's QA head is one Linear(hidden, 2) split into start and end logits. The end logits' weights are
    all the start's, so the end got no term ("every weight behind it already reaches"), and the head's end row no
    gradient, checked and trained never. Another piece of the tensor the primary is a piece of keeps its term, and the
    end row its gradient. The hidden states the logits come from, and a softmax of them, still get none."""
    torch.manual_seed(0)
    enc, qa = torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)
    h = enc(torch.randn(3, 5, 4))
    logits = qa(h)
    start, end = {"squeezed": lambda: [t.squeeze(-1) for t in logits.split(1, -1)],
                  "split": lambda: logits.split(1, -1), "indexed": lambda: (logits[..., 0], logits[..., 1])}[split]()
    loss = Loss("auto", seed=0)
    loss({"start": start, "end": end, "hidden": h, "probs": start.softmax(-1)}).backward()
    assert loss.covered == ["output['start']", "output['end']"], loss.describe()
    assert float(qa.weight.grad[1].norm()) > 0 and float(qa.bias.grad[1].abs()) > 0
    assert loss.reached_already == {"output['hidden']", "output['probs']"}
    # a review: a view or slice of the whole primary (its last row, all of it flattened) adds nothing, and a random
    # target there fought the real loss
    whole = Loss("auto", seed=0)
    whole((logits, logits[:, -1], logits.reshape(-1)))
    assert whole.reached_already == {"output[1]", "output[2]"}, whole.describe()
    part = Loss("auto", seed=0)   # and the whole beside a part of it: its target would contradict the part's
    part((logits[..., 0], logits, logits.flatten(1)))
    assert part.reached_already == {"output[1]", "output[2]"}, part.describe()


def test_a_models_own_loss_with_one_value_per_sample_is_averaged():
    # DAC returns output['loss'] with one value per sample; reduction by mean is what a training loop does
    per_sample = torch.tensor([1.0, 3.0], requires_grad=True)
    loss = Loss("auto")
    value = loss({"loss": per_sample * 2, "audio": torch.randn(2, 8)})
    assert float(value) == pytest.approx(4.0)
    assert loss.describe().startswith("the mean of the model's own loss (output['loss'], 2 values)")



def test_auto_finds_the_tensors_one_level_down_in_a_dict_output():
    # a backbone's ModelOutput holds its feature maps as a tuple: the first map is the primary output
    maps = (torch.randn(2, 3, 4, 4, requires_grad=True), torch.randn(2, 5, 2, 2, requires_grad=True))
    loss = Loss("auto", seed=1)
    value = loss({"feature_maps": maps, "hidden_states": None})
    assert "output['feature_maps'][0]" in loss.describe()
    first = F.mse_loss(maps[0], loss.target)
    value.backward()
    assert maps[0].grad is not None and maps[1].grad is not None and float(value) > float(first)   # 2nd: its own term
    with pytest.raises(UsageError):
        Loss("auto")({"ids": torch.zeros(2, dtype=torch.long)})       # nothing floating: still the usage error


class _Parts(dict):
    """A model output as Hugging Face's ModelOutput is one: a dict with to_tuple()."""

    def to_tuple(self):
        return tuple(self.values())


def test_auto_finds_the_tensors_in_model_outputs_one_level_down():
    # InstructBLIP returns {vision_outputs, qformer_outputs, language_model_outputs}, each a ModelOutput: the first
    # tensor is the primary output, and the other parts get their own terms (nothing reaches them through it)
    vision, text = torch.randn(2, 5, 4, requires_grad=True), torch.randn(2, 3, 4, requires_grad=True)
    loss = Loss("auto", seed=1)
    value = loss({"vision_outputs": _Parts(last_hidden_state=vision), "language_model_outputs": _Parts(
        last_hidden_state=text, cache=None)})
    assert "output['vision_outputs']['last_hidden_state']" in loss.describe()
    value.backward()
    assert vision.grad is not None and text.grad is not None
    with pytest.raises(UsageError):   # a plain dict of values is not a model output: not read
        Loss("auto")({"ids": torch.zeros(2, dtype=torch.long), "debug": {"h": torch.randn(2, 3, requires_grad=True)}})


@pytest.mark.parametrize("out", [
    {"ids": torch.zeros(2, dtype=torch.long), "past_key_values": ((torch.randn(2, 3, requires_grad=True),),)},
    {"ids": torch.zeros(2, dtype=torch.long), "debug": {"logits": torch.randn(2, 3, requires_grad=True)}},
    {"ids": torch.zeros(2, dtype=torch.long), "extra": (torch.randn(2, 3),)},            # no gradient: a constant
    {"ids": torch.zeros(2, dtype=torch.long), "scale": (torch.tensor(2.0, requires_grad=True),)},   # a scalar
])
def test_auto_goes_one_level_down_only_to_a_tensor_that_could_be_an_output(out):
    # never into a cache or a dict of debug values, never to a constant or a scalar: the usage error stays
    with pytest.raises(UsageError):
        Loss("auto")(out)


def test_a_made_up_target_follows_the_seed_alone_whatever_the_output_holds():
    """Guards from a review of a reverted change (made-up targets that copied mask fills, a loss divided by its
    starting error): the auto mse target is the seeded draw everywhere and the loss is plain F.mse_loss. A -inf
    mask fill gives an inf loss, not NaN (-inf - -inf); a constant large output keeps its full gradient."""
    target = torch.randn((2, 4, 4), generator=torch.Generator().manual_seed(1))
    scores = torch.randn(2, 4, 4).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf"))
    loss = Loss("auto", seed=1)
    assert float(loss(scores)) == float("inf") and torch.equal(loss.target, target)
    const = torch.full((2, 4, 4), 5000.0, requires_grad=True)
    value = Loss("auto", seed=1)(const)
    assert float(value) == pytest.approx(float(F.mse_loss(const.detach(), target)))
    value.backward()
    assert torch.allclose(const.grad, 2 * (5000.0 - target) / const.numel())


def test_cross_entropy_on_a_models_own_scalar_loss_says_where_it_came_from():
    """A sweep: `--loss cross_entropy` on a causal LM given labels took output['loss'] (a scalar) and said only
    "got shape ()"."""
    import torch

    from torchdiag.core.loss import Loss
    from torchdiag.errors import UsageError

    out = {"loss": torch.tensor(2.3, requires_grad=True), "logits": torch.randn(2, 5, 11)}
    with pytest.raises(UsageError) as e:
        Loss("cross_entropy")(out)
    assert "returned its own loss first (output['loss'], a scalar)" in e.value.message
    assert "--loss auto" in e.value.hint
    with pytest.raises(UsageError) as e:
        Loss("cross_entropy")(torch.randn(4))
    assert "its own loss" not in e.value.message


def test_class_ids_stored_as_floats_are_named_in_the_hint():
    """A sweep: a segmentation mask of class ids as floats, (N, H, W) against (N, C, H, W), was read as a regression:
    "mse: target shape differs", no hint. Whole numbers in [0, C) one dimension short are named; others are not."""
    y = torch.randn(2, 5, 4, 4)
    ids = torch.randint(0, 5, (2, 4, 4)).float()
    with pytest.raises(UsageError) as exc:
        Loss("auto", target=ids)(y)
    assert "target.long()" in exc.value.hint, exc.value.hint
    with pytest.raises(UsageError) as exc:
        Loss("auto", target=ids + 0.5)(y)
    assert "target.long()" not in (exc.value.hint or "")


class _OverflowingSecond(torch.nn.Module):
    """A second head one of whose channels overflows float16's range (a cast after a scale of 1e9): a real fault.
    A review of a reverted change (2026-12-02): leaving an output's ±inf values out of a made-up target's term, meant
    for Grounding DINO's -inf padding, made gradflow, doctor and overfit-batch pass this model."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 3), torch.nn.Linear(8, 4)

    def forward(self, x):
        scale = torch.tensor([1.0, 1.0, 1.0, 1e9])
        return self.a(x), (self.b(x) * scale).half().float()


@pytest.mark.parametrize("command", ["gradflow", "doctor"])
def test_an_overflowing_second_output_is_not_left_out_of_the_made_up_loss(command):
    from torchdiag.api import run as api_run

    torch.manual_seed(0)
    res = api_run(command, _OverflowingSecond(), (torch.randn(4, 8),))
    assert "non-finite-loss" in {f.code for f in res.findings if f.severity == "error"}, [f.code for f in res.findings]


class _GatedWithReadOut(torch.nn.Module):
    """A review's counterexample (2026-12-02) to a reverted rule that averaged, against the same target, every
    element of the returned tuple shaped as the first whose weights the first reaches (meant for RAFT's 12 flow
    predictions): the prediction's encoder branch is multiplied by a mask of zeros (a bug), and a read-out of the
    same shape reaches the encoder; averaged in, it gave the encoder a gradient and hid the bug."""

    def __init__(self):
        super().__init__()
        self.enc, self.skip, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.register_buffer("gate", torch.zeros(8))

    def forward(self, x):
        h = torch.relu(self.enc(x))
        return self.head(h * self.gate + self.skip(x)), self.head(h)


def test_a_same_shaped_read_out_the_first_output_reaches_does_not_hide_its_zero_gradient():
    from torchdiag.api import run as api_run

    torch.manual_seed(0)
    res = api_run("gradflow", _GatedWithReadOut(), (torch.randn(4, 8),))
    assert {f.code for f in res.findings if f.severity == "error"} & {"zero-grad"}, [f.code for f in res.findings]
    assert "not added: output[1]" in res.header["loss"], res.header["loss"]


def test_a_loss_function_of_another_signature_is_a_usage_error(cli, tmp_path):
    """A sweep: `--loss f.py:none` with `def none(): ...` was exit 3 ("raised TypeError"), where a factory that cannot
    take its --arg values is exit 2. A function that cannot be called as fn(output, target) is exit 2; a TypeError
    raised inside one that can is still the user's code (exit 3)."""
    path = tmp_path / "lf.py"
    path.write_text("def none():\n    return None\n\ndef inside(out, target):\n    return len(1)\n")
    r = cli("nancheck", sample("mlp.py:build"), "--device", "cpu", "--loss", f"{path}:none")
    assert r.code == 2 and "cannot be called as fn(output, target)" in r.stderr, r.stderr
    r = cli("nancheck", sample("mlp.py:build"), "--device", "cpu", "--loss", f"{path}:inside")
    assert r.code == 3 and "inside() raised TypeError" in r.stderr, r.stderr
