"""attention: captured weights equal softmax(QKᵀ/√d) computed by hand; pictures of exact size."""
import math

import pytest

from torchdiag.api import run
from torchdiag.render.attention import write_images

from support import load, one_error_line, sample

VIT = sample("vit.py:build")


def _manual_mha(mha, x):
    """Per-head weights of a self-attention nn.MultiheadAttention (batch_first) from its in_proj."""
    import torch

    d, h = mha.embed_dim, mha.num_heads
    q = x @ mha.in_proj_weight[:d].T + mha.in_proj_bias[:d]
    k = x @ mha.in_proj_weight[d:2 * d].T + mha.in_proj_bias[d:2 * d]
    n, L, _ = x.shape
    q = q.view(n, L, h, d // h).transpose(1, 2)
    k = k.view(n, L, h, d // h).transpose(1, 2)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)


def test_vit_weights_match_hand_computation(untouched):
    import torch

    model, inputs = load("vit.py:build")
    seen = {}
    handle = model.layers[0].self_attention.register_forward_hook(lambda m, a, o: seen.update(x=a[0].detach()))
    with torch.no_grad():
        expected_out = model(*inputs.args)
    handle.remove()
    with untouched(model):
        res = run("attention", model, inputs)
    caps = {c.key: c for c in res.artefacts["captures"]}
    assert list(caps) == ["layers.0.self_attention", "layers.1.self_attention"]
    with torch.no_grad():
        expect = _manual_mha(model.layers[0].self_attention, seen["x"])
    assert caps["layers.0.self_attention"].weights.shape == (2, 4, 17, 17)
    assert torch.allclose(caps["layers.0.self_attention"].weights, expect, atol=1e-5)
    layer = res.table("layers").rows[0]
    assert layer["heads"] == 4 and layer["queries"] == 17 and layer["row_sum_error"] < 1e-5
    # the model computes the same output as without the diagnostic (need_weights=False honoured)
    with torch.no_grad():
        assert torch.allclose(model(*inputs.args), expected_out, atol=1e-5)


def test_uniform_attention_closed_form():
    """Zero query/key projections → every query attends uniformly: entropy = log S, max = 1/S."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs
    class SelfAttn(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
            with torch.no_grad():
                self.mha.in_proj_weight[:16].zero_()
                self.mha.in_proj_bias.zero_()

        def forward(self, x):
            return self.mha(x, x, x)[0]

    S = 5
    res = run("attention", SelfAttn(), ModelInputs((torch.randn(3, S, 8),), {}))
    heads = res.table("heads").rows
    assert len(heads) == 2
    for h in heads:
        assert h["entropy"] == pytest.approx(math.log(S)) and h["entropy_fraction"] == pytest.approx(1.0)
        assert h["max_weight"] == pytest.approx(1 / S) and h["first_key"] == pytest.approx(1 / S)
        assert h["diagonal"] == pytest.approx(1 / S)


def test_encoder_layer_fast_path_and_returned_weights(untouched):
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs
    class ReturnsWeights(nn.Module):
        def forward(self, x):
            w = torch.softmax(x @ x.transpose(-2, -1), -1)
            return w @ x, w

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2,
                                             enable_nested_tensor=False)
            self.mine = ReturnsWeights()

        def forward(self, x):
            return self.mine(self.enc(x))[0]

    model = Net().eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        before = model(x)
    with untouched(model):
        res = run("attention", model, ModelInputs((x,), {}))
    rows = {r["layer"]: r for r in res.table("layers").rows}
    assert set(rows) == {"enc.layers.0.self_attn", "enc.layers.1.self_attn", "mine"}
    assert rows["mine"]["source"] == "module output" and rows["mine"]["heads"] == 1
    with torch.no_grad():
        assert torch.allclose(model(x), before, atol=1e-5)
        h = model.enc(x)
        expect = torch.softmax(h @ h.transpose(-2, -1), -1)
    got = next(c for c in res.artefacts["captures"] if c.key == "mine").weights[:, 0]
    assert torch.allclose(got, expect, atol=1e-5)


def test_sdpa_causal_weights_and_patch_restored():
    import torch
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    model, inputs = load("transformer_lm.py:build", inputs=["1x6:int64"])
    res = run("attention", model, inputs)
    assert F.scaled_dot_product_attention is original
    caps = res.artefacts["captures"]
    assert [c.key for c in caps] == ["blocks.0.attn", "blocks.1.attn"]
    w = caps[0].weights[0]                         # heads × 6 × 6
    assert torch.allclose(w.sum(-1), torch.ones(4, 6), atol=1e-5)
    assert float(w.triu(1).abs().max()) == 0.0      # causal: no weight on future tokens
    assert torch.allclose(w[:, 0, 0], torch.ones(4))
    # by hand from the block's qkv projection
    seen = {}
    hd = model.blocks[0].attn.qkv.register_forward_hook(lambda m, a, o: seen.update(qkv=o.detach()))
    with torch.no_grad():
        inputs.call(model)
    hd.remove()
    q, k, _ = seen["qkv"].view(1, 6, 3, 4, 16).permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-2, -1) / 4.0).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    assert torch.allclose(caps[0].weights, torch.softmax(scores, -1), atol=1e-5)


def test_cli_pictures_tokens_and_json(cli, tmp_path):
    import numpy as np
    from matplotlib import colormaps
    from PIL import Image

    from torchdiag.pictures import attention_size

    out = tmp_path / "attn"
    tokens = ",".join(f"t{i}" for i in range(17))
    r = cli("attention", VIT, "--images", out, "--tokens", tokens, "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    for key in ("layers", "heads", "images", "attention_layers", "findings", "exit_code"):
        assert key in doc
    assert doc["attention_layers"] == 2 and len(doc["heads"]) == 8
    for name in ("layers.0.self_attention", "layers.1.self_attention"):
        with Image.open(out / f"attention_{name}.png") as im:
            assert im.format == "PNG" and im.mode == "RGB"
            # 4 heads × 2.6 in + 0.8 in at 100 dpi, 3.3 in high (two title lines above the head names)
            assert im.size == (1120, 330) and attention_size(4) == (330, 1120)
            text, arr = dict(im.text), np.asarray(im)
            top = np.asarray(im.convert("L"))[:46]
        # the colour bar (x 93.5–94.7% of the width, from 66 px below the top to 40 px above the bottom):
        # viridis from the largest weight at its top to 0 at its bottom
        bar = arr[66 + 4:330 - 40 - 4, int(0.941 * 1120)].astype(int)
        viridis = [(np.array(colormaps["viridis"](v)[:3]) * 255) for v in np.linspace(0, 1, 101)]
        assert min(np.abs(bar[0] - c).max() for c in viridis[95:]) < 12
        assert min(np.abs(bar[-1] - c).max() for c in viridis[:6]) < 12
        # the command, layer, sample and model: in the PNG's text chunks and drawn in its title band
        assert text["Title"] == f"attention · layer {name} · sample 0"
        assert (text["Command"], text["Layer"], text["Model"], text["Sample"], text["Heads"]) == (
            "attention", name, VIT, "0", "4")
        assert VIT in text["Description"] and "rows: queries, columns: keys" in text["Description"]
        assert (top < 100).sum() > 200


def test_tensorboard_images(cli, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    r = cli("attention", VIT, "--tb", tmp_path)
    assert r.code == 0, r.stderr
    acc = EventAccumulator(str(tmp_path / "attention"), size_guidance={"images": 0})
    acc.Reload()
    assert {"attention/layers.0.self_attention", "attention/layers.1.self_attention"} <= set(acc.Tags()["images"])


class _OwnSoftmax:
    """Attention the model's code computes itself (DeBERTa's disentangled attention, CaiT's talking heads): a sweep
    found `attention` exiting 2, "no attention weights found", on DeBERTa and DeBERTa-v2."""

    @staticmethod
    def build(returns=False, mask=None):
        import torch
        from torch import nn

        class Att(nn.Module):
            def __init__(self):
                super().__init__()
                self.qk = nn.Linear(8, 16)

            def forward(self, x):   # (N, L, 8) -> 2 heads of 4
                q, k = self.qk(x).view(x.shape[0], x.shape[1], 2, 2, 4).permute(2, 0, 3, 1, 4)
                scores = q @ k.transpose(-2, -1) / 2.0
                if mask is not None:
                    scores = scores + mask
                w = torch.softmax(scores, dim=-1)
                out = (w @ k).transpose(1, 2).reshape(x.shape[0], x.shape[1], 8)
                return (out, w) if returns else out

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.att, self.head = Att(), nn.Linear(8, 3)

            def forward(self, x):
                out = self.att(x)
                return self.head(out[0] if returns else out)

        torch.manual_seed(0)
        return Net()


def test_a_softmax_the_model_computes_is_captured_once():
    import torch

    from torchdiag.core.inputs import ModelInputs

    x = torch.randn(2, 5, 8)
    model = _OwnSoftmax.build()
    res = run("attention", model, ModelInputs((x,), {}))
    (cap,) = res.artefacts["captures"]
    with torch.no_grad():
        q, k = model.att.qk(x).view(2, 5, 2, 2, 4).permute(2, 0, 3, 1, 4)
        expected = torch.softmax(q @ k.transpose(-2, -1) / 2.0, dim=-1)
    assert cap.key == "att" and cap.source == "softmax" and torch.allclose(cap.weights, expected, atol=1e-6)
    # a module that returns the weights its softmax made: one capture, from its output
    (cap,) = run("attention", _OwnSoftmax.build(returns=True), ModelInputs((x,), {})).artefacts["captures"]
    assert cap.source == "module output"


def test_sampling_weights_a_deformable_attention_returns_are_not_attention():
    """A sweep: HF D-FINE's deformable attention returns (output, softmax(Linear(x))), N×queries×heads×points; it was
    taken for attention weights read N×H×L×S (300 "heads" of 4 queries). A softmax of what was no q·kᵀ is not
    attention, returned or not; the model's real attention beside it is still found."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    class Deformable(nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = nn.Linear(8, 4 * 12)

        def forward(self, x):   # x: N×Q×8
            w = torch.softmax(self.weights(x).reshape(*x.shape[:2], 4, 12), dim=-1)
            return x * w.mean((-1, -2), keepdim=True).squeeze(-1), w

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.deform = Deformable()
            self.qk = nn.Linear(8, 16)

        def forward(self, x):
            out, _ = self.deform(x)
            q, k = self.qk(out).view(*x.shape[:2], 2, 8).permute(2, 0, 1, 3).unsqueeze(2)
            return torch.softmax(q @ k.transpose(-2, -1), dim=-1).squeeze(1) @ x

    torch.manual_seed(0)
    caps = run("attention", Net(), ModelInputs((torch.randn(1, 30, 8),), {})).artefacts["captures"]
    assert [(c.key, c.source, tuple(c.weights.shape)) for c in caps] == [("(model)", "softmax", (1, 1, 30, 30))]


@pytest.mark.parametrize("output_attentions", [False, True])
def test_weights_handed_up_by_outer_modules_are_one_capture(output_attentions):
    """BERT's BertAttention returns its BertSelfAttention's weights, and BertModel all of them under
    output_attentions: each layer's weights once, named where they were made (each row was listed 2-3 times)."""
    import torch
    from transformers import BertConfig, BertModel

    from torchdiag.core.inputs import ModelInputs

    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100,
                     attn_implementation="eager", output_attentions=output_attentions)
    ids = torch.randint(0, 100, (2, 6))
    model = BertModel(cfg).eval()
    caps = run("attention", model, ModelInputs((ids,), {})).artefacts["captures"]
    assert [c.key for c in caps] == ["encoder.layer.0.attention.self", "encoder.layer.1.attention.self"]
    with torch.no_grad():
        truth = model(ids, output_attentions=True).attentions
    assert all(torch.allclose(c.weights, t, atol=1e-6) for c, t in zip(caps, truth))


def test_keys_an_additive_mask_hides_are_not_visible():
    """Swin's shifted windows add −100 to the logits of keys outside a query's window: weights of ~e^-100, not 0.
    Counted as visible, an untrained model's uniform heads read 82–96% (a sweep); they are masked keys."""
    import torch

    from torchdiag.core.inputs import ModelInputs

    mask = torch.zeros(5, 5)
    mask[:, 3:] = -100.0   # each query sees keys 0-2
    model = _OwnSoftmax.build(mask=mask)
    with torch.no_grad():
        model.att.qk.weight.zero_()
        model.att.qk.bias.zero_()   # q = k = 0: uniform over the visible keys
    res = run("attention", model, ModelInputs((torch.randn(2, 5, 8),), {}))
    for h in res.table("heads").rows:
        assert h["entropy_fraction"] == pytest.approx(1.0) and h["entropy"] == pytest.approx(math.log(3))


def test_the_softmax_source_takes_only_attention_and_each_once():
    """A review of the softmax source: a layer that returns its self-attention weights lost its cross-attention
    capture, a softmax of a Linear's output (Deformable DETR's sampling weights, a router, a channels-last
    segmentation head) was taken for attention, and a module that calls SDPA and also computes the weights for a
    picture was counted twice."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    def heads(t):   # (N, L, 8) -> (N, 2, L, 4)
        return t.view(t.shape[0], t.shape[1], 2, 4).transpose(1, 2)

    class Layer(nn.Module):   # returns (x, its self-attention weights); its cross-attention is not returned
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x, mem):
            w_self = torch.softmax(heads(self.q(x)) @ heads(self.k(x)).transpose(-1, -2), dim=-1)
            w_cross = torch.softmax(heads(self.q(x)) @ heads(self.k(mem)).transpose(-1, -2), dim=-1)
            return x + (w_cross @ heads(self.k(mem))).transpose(1, 2).reshape(x.shape), w_self

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer, self.router = Layer(), nn.Linear(8, 4 * 3)
            self.plot = nn.Linear(8, 8)

        def forward(self, x, mem):
            x, _ = self.layer(x, mem)
            gates = torch.softmax(self.router(x).view(x.shape[0], x.shape[1], 4, 3), dim=-1)   # a router: not attention
            q = heads(self.plot(x))
            out = F.scaled_dot_product_attention(q, q, q)
            _ = torch.softmax(q @ q.transpose(-1, -2) / 2.0, dim=-1)   # the same weights, for a picture
            return out.sum() + gates.sum()

    torch.manual_seed(0)
    res = run("attention", Decoder(), ModelInputs((torch.randn(2, 5, 8), torch.randn(2, 7, 8)), {}))
    got = [(c.key, c.source, tuple(c.weights.shape)) for c in res.artefacts["captures"]]
    assert got == [("layer", "module output", (2, 2, 5, 5)), ("layer#2", "softmax", (2, 2, 5, 7)),
                   ("(model)", "F.scaled_dot_product_attention", (2, 2, 5, 5))], got


def test_a_softmax_over_heads_folded_into_the_batch_is_attention_per_head():
    """A sweep: `attention` on transformers' FSMT exited 2, "no attention weights found": fairseq's layout folds the
    heads into the batch, (N·H)×L×S scores from torch.bmm, a softmax over a 3-D tensor. Each row is a head of one
    sample, in the model's order (a review: a head-outer fold, torch.cat(q.split(d, -1)), split as sample-outer hid a
    dead head), said in a note when the batch has several samples; a module that returns them viewed N×H×L×S gives
    the split (a review: FSMT under output_attentions counted each layer twice). A 3-D softmax of a Linear's output
    (a router) is still not attention."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    class Fairseq(nn.Module):   # (N, L, 12) -> 3 heads of 4, bmm on (N·3, L, 4), samples outer
        def __init__(self, returns=False):
            super().__init__()
            self.returns = returns
            self.q, self.k, self.router = nn.Linear(12, 12), nn.Linear(12, 12), nn.Linear(12, 5)

        def fold(self, t):
            return t.view(t.shape[0], t.shape[1], 3, 4).transpose(1, 2).reshape(t.shape[0] * 3, t.shape[1], 4)

        def forward(self, x):
            w = torch.nn.functional.softmax(torch.bmm(self.fold(self.q(x)), self.fold(self.k(x)).transpose(1, 2)), -1)
            gates = torch.softmax(self.router(x), dim=-1)   # (N, L, 5): not attention
            return (w.sum() + gates.sum(), w.view(x.shape[0], 3, 6, 6)) if self.returns else w.sum() + gates.sum()

    torch.manual_seed(0)
    model, x = Fairseq(), torch.randn(2, 6, 12)
    res = run("attention", model, ModelInputs((x,), {}))
    (cap,) = res.artefacts["captures"]
    with torch.no_grad():
        q = model.q(x).view(2, 6, 3, 4).transpose(1, 2)
        k = model.k(x).view(2, 6, 3, 4).transpose(1, 2)
        expected = torch.softmax(q @ k.transpose(-2, -1), dim=-1)   # (N, H, L, S), by hand
    assert cap.source == "softmax" and tuple(cap.weights.shape) == (1, 6, 6, 6)
    assert torch.allclose(cap.weights, expected.reshape(1, 6, 6, 6), atol=1e-6)
    assert any("folded" in n for n in res.notes), res.notes
    model.returns = True
    (cap,) = run("attention", model, ModelInputs((x,), {})).artefacts["captures"]
    assert cap.source == "module output" and torch.allclose(cap.weights, expected, atol=1e-6)


def test_a_softmax_capture_is_a_copy_of_the_models_tensor():
    """The model may change its weights in place after the softmax (a gate, a masked_fill_): the capture keeps
    the softmax's values (on a CPU, .float().cpu() of a float32 tensor was the model's own tensor)."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    class Gated(nn.Module):
        def forward(self, x):   # (N, 2, L, 4)
            w = torch.softmax(x @ x.transpose(-1, -2), dim=-1)
            expected.append(w.clone())
            w.mul_(0.5)
            return w @ x

    expected: list = []
    res = run("attention", Gated(), ModelInputs((torch.randn(2, 2, 5, 4),), {}))
    (cap,) = res.artefacts["captures"]
    assert torch.equal(cap.weights, expected[0])


def test_a_peaked_head_is_not_read_as_masked():
    """Logit gaps of 70-80 (a trained, peaked head) leave weights of 1e-35…1e-31, not a mask's e^-100: a head
    splitting each query between 2 of 32 keys reads log 2 / log 32 (a review: 100% under an e^-60 threshold)."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    class Peaked(nn.Module):
        def forward(self, x, y):   # scores of 1×1×4×32 from a matmul, set to 0 on 2 keys and −75 on the rest
            logits = torch.full((1, 1, 4, 32), -75.0)
            logits[..., :2] = 0.0
            w = torch.softmax((x @ y) * 0 + logits, dim=-1)
            return w.sum()

    res = run("attention", Peaked(), ModelInputs((torch.randn(1, 1, 4, 3), torch.randn(1, 1, 3, 32)), {}))
    (h,) = res.table("heads").rows
    assert h["entropy_fraction"] == pytest.approx(math.log(2) / math.log(32), rel=1e-4)


def test_usage_errors(cli, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # CPU-only machine for every case, even on a GPU box
    r = cli("attention", VIT, "--tokens", "a,b,c")
    assert r.code == 2 and "3 labels" in r.stderr
    one_error_line(r)
    r = cli("attention", VIT, "--tokens", "")   # a review: "" was one empty label
    assert r.code == 2 and "gave 0 labels" in r.stderr, r.stderr
    r = cli("attention", sample("cnn.py:build"))
    assert r.code == 2 and "no attention weights" in r.stderr
    one_error_line(r)
    r = cli("attention", VIT, "-i", "2x3x32xx")
    assert r.code == 2
    one_error_line(r)
    r = cli("attention", VIT, "--device", "cuda")
    assert r.code == 2 and "not available" in r.stderr
    one_error_line(r)


@pytest.mark.cuda
def test_cuda(cli):
    r = cli("attention", VIT, "--device", "cuda")
    assert r.code == 0


def test_images_path_that_is_a_file_is_exit_2_before_loading(cli, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for spec in (VIT, sample("broken_factory.py:raises")):     # the factory raises: exit 3 if loaded
        r = cli("attention", spec, "--images", afile)
        assert r.code == 2, r.stderr
        one_error_line(r)
        assert r.stderr.startswith(f"error: --images {afile}: is a file"), r.stderr
    assert afile.read_text() == "mine"


def test_entropy_fraction_counts_only_visible_keys():
    """Causal uniform attention is 100% of its possible entropy (was log(i+1)/log(S) averaged: 63.7% for
    8 tokens); a query seeing one key is left out of the fraction, not of the entropy."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from torchdiag.core.inputs import ModelInputs
    class CausalZero(nn.Module):
        def forward(self, x):                     # q = k = 0 → every visible key gets the same weight
            z = torch.zeros(x.shape[0], 2, 8, 4)
            return F.scaled_dot_product_attention(z, z, z, is_causal=True) + x.mean()

    res = run("attention", CausalZero(), ModelInputs((torch.randn(1, 3),), {}))
    for h in res.table("heads").rows:
        assert h["entropy_fraction"] == pytest.approx(1.0)
        assert h["entropy"] == pytest.approx(sum(math.log(i + 1) for i in range(8)) / 8)
        assert h["first_key"] == pytest.approx(sum(1 / (i + 1) for i in range(8)) / 8)

    W = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.25, 0.25]])

    class Given(nn.Module):
        def forward(self, x):
            return x, W.expand(x.shape[0], 3, 3)

    res = run("attention", Given(), ModelInputs((torch.randn(1, 3),), {}))
    (h,) = res.table("heads").rows
    third = (0.5 * math.log(2) + 2 * 0.25 * math.log(4)) / math.log(3)
    assert h["entropy_fraction"] == pytest.approx((1.0 + third) / 2)
    assert h["entropy"] == pytest.approx((0 + math.log(2) + 1.5 * math.log(2)) / 3)


def test_readme_picture_is_what_the_code_draws(cli, tmp_path, monkeypatch):
    """docs/images/attention.png is the README command's output (docs/images/regenerate.sh), run as the
    script runs it: from the repository root, with the model spec the title shows."""
    from support import ROOT, assert_readme_picture

    monkeypatch.chdir(ROOT)
    r = cli("attention", "sample_models/transformer_lm.py:build", "-i", "1x8:int64",
            "--tokens", "the,cat,sat,on,the,mat,.,EOS", "--images", tmp_path)
    assert r.code == 0, r.stderr
    assert_readme_picture("attention.png", tmp_path / "attention_blocks.0.attn.png")


def test_tokens_on_a_long_sequence_are_noted(tmp_path):
    model, inputs = load("transformer_lm.py:build", "context=80", inputs=["1x65:int64"])
    res = run("attention", model, inputs, tokens=[f"t{i}" for i in range(65)], images=True)
    assert any("up to 64 tokens" in n and "blocks.0.attn" in n for n in res.notes)
    res = run("attention", model, inputs, tokens=[f"t{i}" for i in range(65)])   # no pictures: nothing to say
    assert not any("up to 64" in n for n in res.notes)


def test_bad_options_exit_2_before_loading_and_named_per_caller(cli, tmp_path):

    from torchdiag.errors import OptionError

    r = cli("attention", sample("broken_factory.py:raises"), "--sample", "-1")   # exit 3 if it were loaded
    assert r.code == 2 and "--sample" in r.stderr and "Traceback" not in r.stderr
    model, inputs = load("vit.py:build")
    with pytest.raises(OptionError, match=r"^sample: must be ≥ 0, got -1"):
        run("attention", model, inputs, sample=-1)
    with pytest.raises(OptionError, match=r"^sample: 2 is out of range: batch size 2"):
        run("attention", model, inputs, sample=2)              # known only after the forward pass
    r = cli("attention", VIT, "--sample", "2")
    assert r.code == 2 and r.stderr.startswith("error: --sample: 2 is out of range"), r.stderr
    with pytest.raises(OptionError, match=r"^images: takes True or False") as e:
        run("attention", model, inputs, images=str(tmp_path))
    assert "torchdiag.render.attention.write_images" in e.value.hint


def test_pictures_from_python_and_paths_in_json(cli, tmp_path):
    model, inputs = load("vit.py:build")
    res = run("attention", model, inputs, images=True)
    assert [e["layer"] for e in res.data["images"]] == ["layers.0.self_attention", "layers.1.self_attention"]
    assert write_images(res, tmp_path / "py") == str(tmp_path / "py")
    assert sorted(p.name for p in (tmp_path / "py").iterdir()) == [
        "attention_layers.0.self_attention.png", "attention_layers.1.self_attention.png"]
    r = cli("attention", VIT, "--images", tmp_path / "cli", "--json")
    assert [e["path"] for e in r.json["images"]] == [
        str(tmp_path / "cli" / "attention_layers.0.self_attention.png"),
        str(tmp_path / "cli" / "attention_layers.1.self_attention.png")]
    import numpy as np
    from PIL import Image

    for name in ("attention_layers.0.self_attention.png", "attention_layers.1.self_attention.png"):
        with Image.open(tmp_path / "cli" / name) as a, Image.open(tmp_path / "py" / name) as b:
            # the same heatmaps; only the model's name differs (a spec from the CLI, an object from Python)
            assert (np.asarray(a)[46:] == np.asarray(b)[46:]).all()
            assert (a.text["Model"], b.text["Model"]) == (VIT, "model given from Python")


def test_picture_sizes_are_known_before_drawing_and_drawn_in_render(tmp_path):
    """Sizes in data["images"] before anything is drawn; render draws the same sizes, for PNG and TensorBoard."""
    from PIL import Image

    from torchdiag.render.images import drawn

    model, inputs = load("vit.py:build")
    res = run("attention", model, inputs, images=True, tb=True)
    assert "pictures" not in res.artefacts and not res.images        # nothing drawn yet
    assert [(e["height"], e["width"]) for e in res.data["images"]] == [(330, 1120), (330, 1120)]
    drawn(res)
    assert {k: v.shape for k, v in res.images.items()} == {
        "attention/layers.0.self_attention": (330, 1120, 3), "attention/layers.1.self_attention": (330, 1120, 3)}
    write_images(res, tmp_path)
    for e in res.data["images"]:
        with Image.open(tmp_path / f"attention_{e['layer']}.png") as im:
            assert im.size == (e["width"], e["height"])
