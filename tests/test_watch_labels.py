"""Labels a loss cannot mean. labels-are-inputs (a sweep's planted bug, missed): a language model trained on
`cross_entropy(model(x), x)` is asked for the token it is given, learns to copy, and its loss falls; nothing said.
watch holds the cross-entropy's targets (from the loss's graph, however it was called) against the ids the model
read: the same, position for position, is the warning. Shifted labels, labels a model shifts itself (Hugging Face's
labels=input_ids) and a masked LM's masked inputs are not; a masked LM whose inputs were left unmasked is.
ctc-blank-in-targets: CTC labels holding the loss's blank index."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchdiag

V, T = 50, 16


class LM(nn.Module):
    """A recurrent LM; given targets, it returns its own loss (nanoGPT's `model(idx, targets)`)."""

    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(V, 32), nn.GRU(32, 32, batch_first=True), nn.Linear(32, V)

    def forward(self, x, targets=None):
        logits = self.head(self.rnn(self.emb(x))[0])
        return logits if targets is None else F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def _loss(mode: str, model, x, y):
    if mode == "unshifted":
        return F.cross_entropy(model(x).reshape(-1, V), x.reshape(-1))
    if mode == "shifted":
        return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    if mode == "module":
        return nn.CrossEntropyLoss()(model(x).transpose(1, 2), x)
    return model(x, y if mode == "inside" else x)   # the model's own loss


def _run(mode: str):
    torch.manual_seed(0)
    model = LM()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    g = torch.Generator().manual_seed(0)
    with torchdiag.watch(model, opt, every=10) as w:
        for _ in range(80):   # the copy learned: the loss a tenth of its start (3.9 -> 0.01)
            seq = (torch.randint(0, V, (8, 1), generator=g) + torch.arange(T + 1)) % V   # counting: learnable
            x, y = seq[:, :-1], seq[:, 1:]
            loss = _loss(mode, model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w.result()


def _said(result):
    return [f for f in result.findings if f.code == "labels-are-inputs"]


@pytest.mark.parametrize("mode", ["unshifted", "module", "inside-unshifted"])
def test_labels_that_are_the_inputs_are_said(mode):
    found = _said(_run(mode))
    assert len(found) == 1 and found[0].severity == "warning"
    assert "looked up in an embedding (8×16)" in found[0].message and "at 16 of the 16 steps looked at" in found[0].message
    assert "ids[:, 1:]" in found[0].hint


@pytest.mark.parametrize("mode", ["shifted", "inside"])
def test_shifted_labels_are_not(mode):
    r = _run(mode)
    assert not _said(r) and r.series["loss"][-1] < r.series["loss"][0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["whisper", "t5-embeds", "tagger-labels-first"])
def test_models_given_labels_as_their_only_or_first_ids_are_not_said(mode):
    """A review: the first integer argument was taken for the ids the model reads. Whisper (input_features, labels)
    and T5 given inputs_embeds have `labels` as their only one, shift it into their decoder themselves and score it
    unshifted, rightly; a tagger given labels= before input_ids: each was said, and the hint would have broken them.
    The ids the model read are the ones its embeddings looked up."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)

    def ids():
        return torch.randint(3, 100, (8, 12), generator=g)

    if mode == "whisper":
        model = t.WhisperForConditionalGeneration(t.WhisperConfig(
            vocab_size=100, num_mel_bins=16, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
            max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1))
        batch = lambda: {"input_features": torch.randn(8, 16, 32, generator=g), "labels": ids()}   # noqa: E731
    elif mode == "t5-embeds":
        model = t.T5ForConditionalGeneration(t.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=1,
                                                        num_decoder_layers=1, num_heads=2, decoder_start_token_id=0,
                                                        pad_token_id=0))
        batch = lambda: {"inputs_embeds": torch.randn(8, 12, 32, generator=g), "labels": ids()}   # noqa: E731
    else:
        model = t.BertForTokenClassification(t.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=64, num_labels=9))
        batch = lambda: {"labels": torch.randint(0, 9, (8, 12), generator=g), "input_ids": ids()}   # noqa: E731
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    with torchdiag.watch(model, opt, every=5) as w:
        for _ in range(8):
            out = model(**batch())
            opt.zero_grad()
            out.loss.backward()
            opt.step()
    assert not _said(w.result()), [f.message for f in _said(w.result())]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["gpt2", "bert", "bert-unmasked"])
def test_hugging_face_models(mode):
    """GPT-2 given labels=input_ids shifts them itself; BERT's masked positions are [MASK] in its input. A masked LM
    whose inputs were left unmasked is asked for tokens it sees: said."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if mode == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=60, n_positions=32, n_embd=32,
                                                                     n_layer=1, n_head=2))
    else:
        model = transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32))
    opt = torch.optim.AdamW(model.parameters(), 2e-2)
    g = torch.Generator().manual_seed(0)
    with torchdiag.watch(model, opt, every=10) as w:
        for _ in range(60):   # long enough for the unmasked one to learn its copy (4.1 -> 0.02)
            ids = (torch.randint(0, 57, (8, 1), generator=g) + torch.arange(T)) % 57 + 3
            if mode == "gpt2":
                out = model(input_ids=ids, labels=ids)
            else:
                masked = torch.rand(ids.shape, generator=g) < 0.15
                masked[:, 0] = True   # (some position scored in every row)
                labels = torch.where(masked, ids, -100)
                seen = ids if mode == "bert-unmasked" else torch.where(masked, 1, ids)
                out = model(input_ids=seen, attention_mask=torch.ones_like(ids), labels=labels)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
    found = _said(w.result())
    assert [f.severity for f in found] == (["warning"] if mode == "bert-unmasked" else []), \
        [f.message for f in found]


C, FRAMES, S = 8, 20, 4


@pytest.mark.parametrize("blank,layout", [(0, "padded"), (C - 1, "padded"), (C - 1, "concatenated")])
def test_a_ctc_blank_among_the_labels_is_said(blank, layout):
    """A sweep's planted bug: labels 1..7 with CTCLoss(blank=7), the loss went below 0 and watch was silent. The
    count is the labels equal to the blank within their lengths (the padded layout's last position is padding, past
    each length, and set to the blank on purpose: not counted)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(C, 32), nn.Tanh(), nn.Linear(32, C), nn.LogSoftmax(-1))
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    ctc = nn.CTCLoss(blank=blank, zero_infinity=True)
    g = torch.Generator().manual_seed(0)
    counted = 0
    with torchdiag.watch(model, opt, every=5) as w:
        for step in range(20):
            labels = torch.randint(1, C, (6, S), generator=g)
            x = torch.zeros(6, FRAMES, C)
            x[torch.arange(6)[:, None], torch.arange(S) * 5, labels] = 1
            lengths = torch.full((6,), S - 1)
            if step == 0:
                counted = int((labels[:, :S - 1] == blank).sum())
            if layout == "padded":
                targets = labels.clone()
                targets[:, S - 1] = blank   # padding past each length
            else:
                targets = labels[:, :S - 1].reshape(-1)
            loss = ctc(model(x).transpose(0, 1), targets, torch.full((6,), FRAMES), lengths)
            opt.zero_grad()
            loss.backward()
            opt.step()
    found = [f for f in w.result().findings if f.code == "ctc-blank-in-targets"]
    if blank == 0:
        assert not found
        return
    assert counted > 0 and len(found) == 1 and found[0].severity == "warning"
    assert f"blank index {blank} at step 1 ({counted} of the {6 * (S - 1)} label positions)" in found[0].message
    assert "blank=0" in found[0].hint


class Masked(nn.Module):
    """Scores each position against the id it was given, but sees only the ids before it (a PixelCNN's masked
    convolutions): an autoregressive model whose labels are its inputs, rightly. A review: said."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(V, 32), nn.Linear(32, V)

    def forward(self, x):
        h = self.emb(x)
        return self.head(torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1))   # position t reads t-1 only


def test_a_model_that_masks_the_id_it_scores_learns_no_copy_and_is_not_said():
    torch.manual_seed(0)
    model = Masked()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    g = torch.Generator().manual_seed(0)
    with torchdiag.watch(model, opt, every=10) as w:
        for _ in range(80):
            x = torch.randint(0, V, (8, T), generator=g)   # random ids: nothing to learn from the one before
            loss = F.cross_entropy(model(x).reshape(-1, V), x.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    r = w.result()
    assert not _said(r) and r.series["loss"][-1] > 0.5 * r.series["loss"][0]
