"""Default inputs that look like real data (issue 14): token ids in the range of the embedding that
consumes them, masks of ones, decoder ids for encoder-decoder forwards, a missing input named in the
error; the probe that finds the embeddings leaves no trace."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from torchdiag.core.inputs import (
    ModelInputs,
    embedding_consumers,
    parse_input_spec,
    realistic_inputs,
)
from torchdiag.core.tracking import run_forward
from torchdiag.errors import ModelError

from support import one_error_line


class TinyBert(nn.Module):
    """BERT's embedding layout: a 1000-word vocabulary, 2 segments, 128 positions."""

    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(1000, 8)
        self.token_type_embeddings = nn.Embedding(2, 8)
        self.position_embeddings = nn.Embedding(128, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is not None and not bool((attention_mask == 1).all()):
            raise ValueError("padding is not expected in this test")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        pos = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        x = self.word_embeddings(input_ids.view(-1, input_ids.shape[-1]))  # a view, as GPT-2 does
        x = x + self.token_type_embeddings(token_type_ids) + self.position_embeddings(pos)
        return self.head(x[:, 0])


class TinySeq2Seq(nn.Module):
    """T5's contract: the decoder needs its own ids (no default), a shared embedding."""

    def __init__(self, vocab=300):
        super().__init__()
        self.shared = nn.Embedding(vocab, 8)
        self.lm_head = nn.Linear(8, vocab)

    def decode(self, input_ids=None, inputs_embeds=None):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        return self.shared(input_ids)

    def forward(self, input_ids, decoder_input_ids=None):
        enc = self.shared(input_ids).mean(1, keepdim=True)
        return self.lm_head(self.decoder(input_ids=decoder_input_ids) + enc)


class Decoder(nn.Module):
    def __init__(self, parent_shared):
        super().__init__()
        self.parent_shared = [parent_shared]

    def forward(self, input_ids=None, inputs_embeds=None):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        return self.parent_shared[0](input_ids)


def seq2seq(vocab=300):
    m = TinySeq2Seq(vocab)
    m.decoder = Decoder(m.shared)
    return m


def make(model, *specs, seed=0):
    parsed = [parse_input_spec(s) for s in specs]
    from torchdiag.core.inputs import make_tensor

    gen = torch.Generator().manual_seed(seed)
    tensors, notes = [], []
    for p in parsed:
        t, note = make_tensor(p, torch.device("cpu"), gen, model)
        tensors.append(t)
        notes.append(note)
    return realistic_inputs(model, tensors, parsed, notes, torch.device("cpu"), seed)


def test_token_ids_span_the_embedding_that_consumes_them_not_the_smallest():
    model = TinyBert()
    ids, mask, segments = make(model, "2x64:int64", "2x64:int64", "2x64:int64").args
    # word ids over the vocabulary: with 128 draws from [0, 1000) the largest is far above 2
    assert 100 < int(ids.max()) < 1000 and int(ids.min()) >= 0
    assert torch.equal(mask, torch.ones(2, 64, dtype=torch.int64))   # attention_mask: attend everywhere
    assert set(segments.unique().tolist()) == {0, 1}                  # token_type_ids: their own 2 rows
    notes = make(model, "2x64:int64", "2x64:int64", "2x64:int64").notes
    assert notes[0] == "input_ids: integer values in [0, 1000) (the nn.Embedding that consumes it: word_embeddings)"
    assert notes[1] == "attention_mask: all ones (attend to every position)"
    assert "token_type_embeddings" in notes[2]
    model(ids, mask, segments)   # and the model accepts them


def test_an_explicit_range_is_kept_and_unconsumed_ints_keep_the_safe_range():
    model = TinyBert()
    (ids,) = make(model, "4x16:int64[5,7)").args
    assert set(ids.unique().tolist()) <= {5, 6}

    class Labels(nn.Module):   # the int input reaches no embedding: the smallest vocabulary is kept
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(7, 4)

        def forward(self, labels):
            return self.emb.weight.sum() * labels.float().mean()

    inputs = make(Labels(), "3x50:int64")
    assert int(inputs.args[0].max()) < 7 and "smallest nn.Embedding" in inputs.notes[0]


def test_encoder_decoder_gets_decoder_ids_in_the_shared_vocabulary():
    model = seq2seq(300)
    inputs = make(model, "2x40:int64")
    assert set(inputs.kwargs) == {"decoder_input_ids"}
    dec = inputs.kwargs["decoder_input_ids"]
    assert dec.shape == (2, 40) and dec.dtype == torch.int64 and 7 < int(dec.max()) < 300
    assert any("decoder_input_ids" in n and "[0, 300)" in n for n in inputs.notes)
    assert inputs.call(model).shape == (2, 40, 300)


def test_encoder_decoder_on_meta_gets_meta_decoder_ids():
    """On meta (summary/flops of a T5) the ids have no values, but the decoder still needs its input."""
    from torchdiag.core.inputs import realistic_inputs

    model = seq2seq(300).to("meta")
    spec = parse_input_spec("2x40:int64")
    ids = torch.empty(2, 40, dtype=torch.int64, device="meta")
    inputs = realistic_inputs(model, [ids], [spec], [None], torch.device("meta"), 0)
    dec = inputs.kwargs["decoder_input_ids"]
    assert dec.device.type == "meta" and dec.shape == (2, 40) and dec.dtype == torch.int64
    assert inputs.call(model).shape == (2, 40, 300)


def test_a_missing_decoder_input_is_named_in_the_error():
    model = seq2seq()
    with pytest.raises(ModelError) as exc:
        run_forward(model, ModelInputs((torch.randint(0, 300, (2, 5)),)))
    err = exc.value
    assert "not given decoder_input_ids" in err.message and "decoder received input_ids=None" in err.message
    assert "decoder_input_ids" in err.hint and err.where == "decoder"


def test_the_probe_stops_early_and_leaves_no_trace():
    calls = []

    class BNAfter(nn.Module):   # a BatchNorm that runs only if the probe does not stop
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 4)
            self.bn = nn.BatchNorm1d(4)

        def forward(self, ids, other):
            x = self.emb(ids).mean(1)
            calls.append(1)
            return self.bn(x + other.float().mean())

    model = BNAfter().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = ModelInputs((torch.randint(0, 5, (4, 6)), torch.randint(0, 5, (4, 1))))
    rng = torch.random.get_rng_state()
    found = embedding_consumers(model, inputs, ["input[0]"])
    assert found == {"input[0]": ("emb", 50)} and calls == []           # stopped at the embedding
    found = embedding_consumers(model, inputs, ["input[0]", "input[1]"])  # input[1] reaches none: full run
    assert found == {"input[0]": ("emb", 50)} and calls == [1]
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)        # BatchNorm statistics restored
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_a_bool_padding_mask_is_nothing_padded():
    class Enc(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 8)

        def forward(self, input_ids, src_key_padding_mask):
            return self.emb(input_ids).masked_fill(src_key_padding_mask[..., None], 0)

    ids, mask = make(Enc(), "2x9:int64", "2x9:bool").args
    assert mask.dtype == torch.bool and not bool(mask.any())


class TiedLMHead(nn.Module):
    """An LM head with tied embeddings and its own loss, like transformers' (output.loss, output.logits).
    shift=False is XLNet's head: it predicts the token at each position, so labels = the input ids is a copy
    task the tied embeddings solve at initialisation."""

    def __init__(self, shift: bool, vocab: int = 50, d: int = 16):
        super().__init__()
        self.emb, self.mix, self.shift = nn.Embedding(vocab, d), nn.Linear(d, d), shift

    def forward(self, input_ids, labels=None):
        from types import SimpleNamespace

        h = self.emb(input_ids)
        logits = (h + self.mix(h)) @ self.emb.weight.T
        if self.shift:
            logits_, labels_ = logits[:, :-1], labels[:, 1:]
        else:
            logits_, labels_ = logits, labels
        loss = nn.functional.cross_entropy(logits_.flatten(0, 1), labels_.flatten(), ignore_index=-100)
        return SimpleNamespace(loss=loss, logits=logits)


@pytest.mark.parametrize("shift", [True, False])
def test_labels_of_a_head_that_does_not_shift_them_are_the_next_ids(shift):
    from torchdiag.core.inputs import _next_if_unshifted

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 12))
    inputs = ModelInputs((ids,), {"labels": ids.clone()}, notes=["labels: the input ids (the model's own loss)"])
    _next_if_unshifted(inputs, TiedLMHead(shift))
    labels = inputs.kwargs["labels"]
    if shift:      # a causal LM shifts them itself: left as they are
        assert torch.equal(labels, ids) and inputs.notes == ["labels: the input ids (the model's own loss)"]
    else:
        assert torch.equal(labels[:, :-1], ids[:, 1:]) and bool((labels[:, -1] == -100).all())
        assert len(inputs.notes) == 1 and inputs.notes[0].startswith("labels: the next input id"), inputs.notes


class Grounded(nn.Module):
    """A detector that reads text beside its pixels (Grounding DINO's layout): the default layout makes the
    keyword input_ids all zeros, the word embedding's padding index, so no word was read and the word
    embedding got exactly zero gradient. Type ids keep their zeros."""

    def __init__(self):
        super().__init__()
        self.words, self.types = nn.Embedding(500, 8, padding_idx=0), nn.Embedding(2, 8)
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, pixel_values, input_ids=None, token_type_ids=None):
        text = self.words(input_ids) + self.types(token_type_ids)
        return self.conv(pixel_values).mean((2, 3)) + text.mean(1)


def test_keyword_token_ids_made_as_zeros_span_their_embedding():
    model = Grounded()
    zeros = torch.zeros(2, 16, dtype=torch.int64)
    inputs = realistic_inputs(model, [torch.randn(2, 3, 8, 8)], [parse_input_spec("2x3x8x8")], [None],
                              torch.device("cpu"), 0, keywords={"input_ids": zeros, "token_type_ids": zeros.clone()})
    ids = inputs.kwargs["input_ids"]
    assert 50 < int(ids.max()) < 500 and int(ids.min()) >= 0
    assert not bool(inputs.kwargs["token_type_ids"].any())
    assert any(n.startswith("input_ids: integer values in [0, 500)") for n in inputs.notes), inputs.notes


class PerFrameText(nn.Module):
    """InstructBLIP-Video's layout: the Q-Former's text ids are repeated once per frame before its word embedding
    reads them, so the tensor it gets is not the one given; made as zeros they were all its padding index, and
    the word embedding got exactly zero gradient (the zoo's instructblipvideo row)."""

    def __init__(self, frames=4):
        super().__init__()
        self.frames = frames
        self.words = nn.Embedding(300, 8, padding_idx=0)
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, pixel_values, qformer_input_ids=None):   # pixels (B, frames, C, H, W)
        b = pixel_values.shape[0]
        image = self.conv(pixel_values.flatten(0, 1)).mean((2, 3))            # (B·frames, 8)
        text = self.words(qformer_input_ids.repeat_interleave(self.frames, 0))  # (B·frames, T, 8)
        return (image + text.mean(1)).view(b, self.frames, 8).mean(1)


@pytest.mark.parametrize("repeat", ["interleave", "whole"])
def test_keyword_ids_made_as_zeros_are_found_where_the_model_repeats_them(repeat):
    model = PerFrameText()
    if repeat == "whole":
        model.forward = lambda pixel_values, qformer_input_ids=None: model.words(qformer_input_ids.repeat(4, 1)).mean()
    zeros = torch.zeros(2, 16, dtype=torch.int64)
    inputs = realistic_inputs(model, [torch.randn(2, 4, 3, 8, 8)], [parse_input_spec("2x4x3x8x8")], [None],
                              torch.device("cpu"), 0, keywords={"qformer_input_ids": zeros})
    ids = inputs.kwargs["qformer_input_ids"]
    assert 30 < int(ids.max()) < 300 and int(ids.min()) >= 0 and float((ids == 0).float().mean()) < 0.1
    assert any(n.startswith("qformer_input_ids: integer values in [0, 300)") for n in inputs.notes), inputs.notes


def test_keyword_ids_no_embedding_reads_keep_their_zeros():
    class Unread(nn.Module):
        def __init__(self):
            super().__init__()
            self.words, self.conv = nn.Embedding(300, 8), nn.Conv2d(3, 8, 3)

        def forward(self, pixel_values, mask_ids=None):   # ids that are only compared, never looked up
            return self.conv(pixel_values).mean((2, 3)) * (mask_ids == 0).float().mean()

    zeros = torch.zeros(2, 16, dtype=torch.int64)
    inputs = realistic_inputs(Unread(), [torch.randn(2, 3, 8, 8)], [parse_input_spec("2x3x8x8")], [None],
                              torch.device("cpu"), 0, keywords={"mask_ids": zeros})
    assert inputs.kwargs["mask_ids"] is zeros


def test_labels_of_int32_ids_are_compared_as_class_indices():
    from torchdiag.core.inputs import _next_if_unshifted

    class Int32Head(TiedLMHead):   # a user's -i ...:int32 ids; the model's own loss casts them
        def forward(self, input_ids, labels=None):
            return super().forward(input_ids, labels.long())

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 12), dtype=torch.int32)
    inputs = ModelInputs((ids,), {"labels": ids.clone()}, notes=["labels: the input ids (the model's own loss)"])
    _next_if_unshifted(inputs, Int32Head(False))
    assert inputs.kwargs["labels"].dtype == torch.int32 and torch.equal(inputs.kwargs["labels"][:, :-1], ids[:, 1:])


def test_every_forward_gets_the_first_values_even_when_the_model_writes_into_them():
    from torchdiag.core.inputs import ModelInputs

    class Doubles(torch.nn.Module):
        def forward(self, x, scale=None):
            x.mul_(2)
            return x.sum() + (0 if scale is None else scale.sum())

    x = torch.ones(3)
    inputs = ModelInputs((x,), {"scale": torch.zeros(2)})
    outs = [float(inputs.call(Doubles())) for _ in range(5)]
    assert outs == [6.0] * 5                      # without the fresh copy: 6, 12, 24, 48, 96
    assert inputs.written() == ["input[0]"]       # the keyword input was only read
    held = inputs.args[0]
    loss = (held * torch.ones(3, requires_grad=True)).sum()
    inputs.call(Doubles())                        # a new tensor is put in: the old one keeps its version
    loss.backward()


def test_the_width_a_refusing_linear_reads_is_of_the_input_it_was_handed():
    from torchdiag.core import input_width
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.tracking import ModuleTracker

    class Two(torch.nn.Module):     # two inputs of one shape; only the second meets the layer, which reads 6
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 3)

        def forward(self, a, b=None):
            return a.sum() + self.fc(b).sum()

    model = Two()
    inputs = ModelInputs((torch.randn(2, 4),), {"b": torch.randn(2, 4)})
    tracker = ModuleTracker(model, record_shapes=False)
    with pytest.raises(RuntimeError) as caught, tracker:
        inputs.call(model)
    assert input_width.refused(tracker, inputs, caught.value) == ("b", 6)
    wide = input_width.widened(inputs, "b", 6, seed=0)
    assert wide.kwargs["b"].shape == (2, 6) and wide.args[0] is inputs.args[0]
    model(*wide.args, **wide.kwargs)                  # runs now


def test_an_in_place_write_that_changes_no_value_is_not_an_edit():
    # hf FSMT: shift_tokens_right does input_ids.masked_fill_(input_ids == -100, pad) on the caller's ids; with no
    # -100 among them the version moves and no value does
    from torchdiag.core.inputs import ModelInputs

    class Fills(torch.nn.Module):
        def forward(self, ids):
            ids.masked_fill_(ids == -100, 1)
            return ids.float().sum()

    clean = ModelInputs((torch.tensor([[5, 6, 7]]),))
    for _ in range(3):
        assert float(clean.call(Fills())) == 18.0
    assert clean.written() == []
    marked = ModelInputs((torch.tensor([[5, -100, 7]]),))
    assert [float(marked.call(Fills())) for _ in range(2)] == [13.0, 13.0] and marked.written() == ["input[0]"]


def test_a_width_is_asked_only_of_the_linear_whose_error_ended_the_forward_and_of_the_tensor_it_got():
    # a review: an earlier Linear error the model caught left its call open on the tracker; and under --dtype the
    # probe hands cast copies, so the tensor itself (not the first input of its shape) must be the one named
    from torchdiag.core import optional_inputs
    from torchdiag.core.inputs import ModelInputs

    class Caught(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.fb = torch.nn.Linear(6, 3), torch.nn.Linear(4, 3)

        def forward(self, x):
            try:
                return self.fc(x)
            except RuntimeError:
                self.fb(x)
                raise ValueError("needs extra=") from None

    assert optional_inputs.probe(Caught(), ModelInputs((torch.randn(2, 4),))).width is None

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 3)

        def forward(self, a, b=None):
            return a.sum() + self.fc(b).sum()

    two = ModelInputs((torch.randn(2, 4),), {"b": torch.randn(2, 4)})
    assert optional_inputs.probe(Two().to(torch.bfloat16), two, "bfloat16").width == ("b", 6)


def test_a_write_of_nothing_still_gets_a_fresh_tensor_and_signed_zeros_and_nans_are_values():
    from torchdiag.core.inputs import ModelInputs

    class Fill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, x):
            x.masked_fill_(x == -100, 0)
            return self.fc(x).sum()

    inputs, model = ModelInputs((torch.tensor([[1.0, float("nan"), 3.0]]),)), Fill()
    first = inputs.call(model)
    inputs.call(model)
    first.backward()                       # the first graph's saved input was not written again
    assert inputs.written() == []          # NaN where NaN was: nothing changed

    class Flip(torch.nn.Module):
        def forward(self, x):
            y = 1 / x
            x.add_(0.0)                    # -0.0 + 0.0 is +0.0: one bit changed
            return y

    signed = ModelInputs((torch.tensor([-0.0, 1.0]),))
    assert [signed.call(Flip())[0].item() for _ in range(3)] == [float("-inf")] * 3
    assert signed.written() == ["input[0]"]


ENC_DEC = '''
import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        return self.emb(input_ids)


class EncDec(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.decoder = nn.Embedding(50, 8), Decoder()

    def forward(self, input_ids, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None):
        memory = self.enc(input_ids)
        return self.decoder(input_ids=decoder_input_ids, attention_mask=decoder_attention_mask).sum() + memory.sum()


def build():
    return EncDec()


def example_inputs():
    return {"input_ids": torch.randint(0, 50, (2, 6))}
'''


def test_a_missing_decoder_input_is_named_not_a_mask_the_decoder_does_not_need(cli, tmp_path):
    """A review (T5 given input_ids only): the decoder got input_ids=None and attention_mask=None, and the hint said
    to pass attention_mask; its error names input_ids, so decoder_input_ids is the one to pass."""
    (tmp_path / "encdec.py").write_text(ENC_DEC)
    res = cli("summary", f"{tmp_path / 'encdec.py'}:build")
    assert res.code == 3, res.stderr
    assert "was not given decoder_input_ids (" in res.stderr, res.stderr
    assert "hint: pass decoder_input_ids as a keyword input" in res.stderr, res.stderr


CONFIG_ERROR = '''
import torch
import torch.nn as nn


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.config = nn.Embedding(50, 8), type("Config", (), {})()

    def forward(self, input_ids, attention_mask=None):
        return self.emb(input_ids)[:, : self.config.num_hidden_layers]


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Inner()

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.model(input_ids, attention_mask=attention_mask)


def build():
    return Outer()


def example_inputs():
    return {"input_ids": torch.randint(0, 50, (2, 6))}
'''


def test_an_error_no_none_made_is_not_blamed_on_a_missing_input(cli, tmp_path):
    """BLT built from its config raised "'BltConfig' object has no attribute 'num_hidden_layers'" and was told its
    forward was not given attention_mask (it had received None there): the error is its config's, not a None's."""
    (tmp_path / "cfg.py").write_text(CONFIG_ERROR)
    res = cli("summary", f"{tmp_path / 'cfg.py'}:build")
    assert res.code == 3 and "has no attribute 'num_hidden_layers'" in res.stderr, res.stderr
    assert "was not given" not in res.stderr and "keyword input" not in res.stderr, res.stderr


def test_a_list_of_images_is_that_many_samples_where_its_maker_says_so():
    """A sweep: profile read torchvision detection's two 3x320x320 images as a batch of 3 (their channels), and its
    throughput 1.5x too high. torchdiag's own list of images says how many samples it is; a list the user gives keeps
    the leading size (a review: an FPN head's three levels of 8 were read as 3 samples)."""
    from torchdiag.core.sources import _one_image, _two_images

    assert ModelInputs(_two_images(), {}, samples=_two_images.samples).batch_size == 2
    assert ModelInputs(_one_image(), {}, samples=_one_image.samples).map(lambda t: t).batch_size == 1
    levels = [torch.rand(8, 16, 32, 32), torch.rand(8, 16, 16, 16), torch.rand(8, 16, 8, 8)]
    assert ModelInputs((levels,), {}).batch_size == 8
    assert ModelInputs((torch.rand(5, 3, 8, 8),), {}).batch_size == 5


def test_torchdiags_own_list_of_images_is_credited_to_its_source_not_to_example_inputs():
    """A sweep: a torchvision detection model's header and JSON said `inputs (example_inputs())`, a function the user
    never wrote; the source (the zoo's default, and why) is said as for every other zoo model."""
    from types import SimpleNamespace

    from torchdiag.core.inputs import resolve_inputs
    from torchdiag.core.sources import _one_image

    why = "torchvision:x default (a list of one 3x320x320 image)"
    loaded = SimpleNamespace(model=nn.Identity(), module=SimpleNamespace(example_inputs=_one_image), input_source=why,
                             default_inputs=())
    assert resolve_inputs(None, loaded, torch.device("cpu")).source == why

    def example_inputs():   # the user's own keeps its name
        return (torch.rand(2, 3),)

    loaded.module = SimpleNamespace(example_inputs=example_inputs)
    assert resolve_inputs(None, loaded, torch.device("cpu")).source == "example_inputs()"


class TablePerColumn(torch.nn.Module):
    """A tabular model: one embedding per categorical column, of different sizes (a sweep: the ids took the first
    table's range, 11, and the third, of 3 rows, refused them)."""

    def __init__(self):
        super().__init__()
        self.embs = torch.nn.ModuleList(torch.nn.Embedding(c, 4) for c in (11, 7, 3, 5))
        self.head = torch.nn.Linear(16 + 6, 2)

    def forward(self, x_cat, x_num):
        return self.head(torch.cat([e(x_cat[:, i]) for i, e in enumerate(self.embs)] + [x_num], 1))


def test_ids_read_by_a_table_per_column_fit_the_smallest_table():
    from torchdiag.core.inputs import ModelInputs

    inputs = ModelInputs((torch.zeros(16, 4, dtype=torch.long), torch.randn(16, 6)), {})
    assert embedding_consumers(TablePerColumn(), inputs, ["input[0]"]) == {"input[0]": ("embs.2", 3)}


class NextToken(nn.Module):
    """x-transformers' AutoregressiveWrapper: the ids rebuilt by torch.where (padding swapped) and cut to the next-token
    inputs before the token table; a position table of 64 rows is the model's smallest."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(256, 8), nn.Embedding(64, 8)

    def forward(self, x):
        inp = torch.where(x == -100, 0, x)[:, :-1]
        return self.tokens(inp) + self.positions(torch.arange(inp.shape[1]))


class SharedTable(nn.Module):
    """FT-Transformer-style categories: 2 reserved rows, then 10, 5 and 6 rows for three columns in one table."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(2 + 10 + 5 + 6, 4)
        self.register_buffer("offsets", torch.tensor([2, 12, 17]))
        self.tiny = nn.Embedding(3, 4)   # the smallest table, not what the ids reach

    def forward(self, x):
        return self.table(x + self.offsets).sum() + self.tiny.weight.sum()


def test_ids_made_anew_or_offset_per_column_are_still_found():
    """A sweep: ids copied by torch.where and cut (x-transformers) were given the position table's 64 rows, not the
    token table's 256; ids offset per column into one table (FT-Transformer) were not found at all."""
    from torchdiag.core.inputs import ModelInputs

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (2, 32), generator=g)
    assert embedding_consumers(NextToken(), ModelInputs((ids,), {}), ["input[0]"]) == {"input[0]": ("tokens", 256)}
    cols = torch.randint(0, 5, (4, 3), generator=g)
    # the rows each column can take: 10, 5 and 23 - 17 = 6; every column's ids must fit the narrowest
    assert embedding_consumers(SharedTable(), ModelInputs((cols,), {}), ["input[0]"]) == {"input[0]": ("table", 5)}
    one = cols[:1]   # one row: any tensor of its shape would be "the same along the batch", so nothing is said
    assert embedding_consumers(SharedTable(), ModelInputs((one,), {}), ["input[0]"]) == {}


class PaddedIds(nn.Module):
    """Ids padded to 16 with a constant before the lookup (Longformer pads to its attention window), beside a
    one-column condition id and positions from arange looked up first (a review's: position ids start with 0)."""

    def __init__(self):
        super().__init__()
        self.pos, self.tok, self.cond = nn.Embedding(64, 4), nn.Embedding(300, 4), nn.Embedding(2, 4)

    def forward(self, ids, cond):
        p = self.pos(torch.arange(16).expand(ids.shape[0], 16))
        padded = nn.functional.pad(ids, (0, 16 - ids.shape[1]), value=1)
        return (self.tok(padded) + p).sum() + self.cond(cond).sum()


def test_ids_a_model_pads_before_its_lookup_are_found_and_a_short_id_is_not_matched_by_chance():
    from torchdiag.core.inputs import ModelInputs

    g = torch.Generator().manual_seed(0)
    ids, cond = torch.randint(0, 2, (1, 10), generator=g), torch.zeros(1, 1, dtype=torch.int64)
    found = embedding_consumers(PaddedIds(), ModelInputs((ids, cond), {}), ["input[0]", "input[1]"])
    assert found == {"input[0]": ("tok", 300), "input[1]": ("cond", 2)}, found


def test_inputs_joined_by_a_comma_are_told_to_take_one_option_each():
    """A sweep: `-i 1x10,1x7` was told only that dimensions are integers joined by 'x'."""
    from torchdiag.errors import UsageError

    with pytest.raises(UsageError) as e:
        parse_input_spec("1x10,1x7:int64")
    assert e.value.hint == "give each input its own -i: -i 1x10 -i 1x7:int64"


LOOKUP = '''
import torch
import torch.nn as nn


class Lookup(nn.Module):
    """Each id first picks a row of a 5-entry buffer (a per-category map), then the table: ids past 4 fail."""

    def __init__(self):
        super().__init__()
        self.register_buffer("rows", torch.arange(5) * 6)
        self.table = nn.Embedding(31, 4)

    def forward(self, x):
        return self.table(self.rows[x])


def build():
    return Lookup()
'''


def test_an_index_error_on_guessed_ids_says_they_were_guessed(cli, tmp_path):
    """A sweep: FT-Transformer's ids index a buffer before any nn.Embedding; the probe saw no table read them, the
    smallest table's range was guessed, and the run said only "the model's own code raised" (exit 3). The model runs
    on ids in its range."""
    (tmp_path / "lookup.py").write_text(LOOKUP)
    spec = f"{tmp_path / 'lookup.py'}:build"
    res = cli("gradflow", spec, "-i", "4x3:int64", "--device", "cpu")
    assert res.code == 3, res.stderr
    one_error_line(res)
    assert ("hint: the integer input values in [0, 31) (smallest nn.Embedding (table: 31)) were torchdiag's guess"
            in res.stderr), res.stderr
    assert cli("gradflow", spec, "-i", "4x3:int64[0,5)", "--device", "cpu").code == 0


HEADS = '''
import torch
import torch.nn as nn


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(4, 2), nn.Linear(4, 2)])

    def forward(self, x, k):
        return self.heads[3](x) + k.sum()


def build():
    return Heads()
'''


def test_an_index_error_of_the_models_own_list_is_not_blamed_on_guessed_ids(cli, tmp_path):
    """A review: heads[3] of a ModuleList of 2 raised "index 3 is out of range" whatever the ids hold, and the hint
    said the guessed ids were the cause."""
    (tmp_path / "heads.py").write_text(HEADS)
    res = cli("summary", f"{tmp_path / 'heads.py'}:build", "-i", "2x4", "-i", "2x3:int64", "--device", "cpu")
    assert res.code == 3 and "hint: the model's own code raised" in res.stderr, res.stderr
