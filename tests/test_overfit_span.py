"""overfit-batch against its own random target where the last layer's span cannot hold it (span.py, fifty-fourth
session): transformers' masked-image-modelling heads (a 1x1 convolution from the hidden width to a patch's pixels,
then PixelShuffle) levelled at the SVD's floor for their shapes and were a false cannot-overfit."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

from torchdiag.diagnostics.overfit_batch.span import span_floor


def test_a_masked_image_modelling_head_is_out_of_reach_not_cannot_overfit(cli, tmp_path):
    import transformers

    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                 image_size=64, patch_size=8, encoder_stride=8)
    cfg.architectures = ["ViTForMaskedImageModeling"]
    cfg.save_pretrained(tmp_path / "mim")
    r = cli("overfit-batch", f"hf:{tmp_path / 'mim'}", "--json")
    doc = json.loads(r.stdout)
    codes = {f["code"]: f for f in doc["findings"]}
    assert r.code == 0 and "cannot-overfit" not in codes, (r.code, list(codes))
    found = codes["made-target-out-of-reach"]
    assert found["severity"] == "warning"
    assert "decoder.0" in found["message"] and "rank ≤ 33 over 128 rows of 192 values" in found["message"]
    assert doc["passed"] is False


FROZEN = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class FrozenTrunk(nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = nn.Sequential(nn.Conv2d(3, 4, 4, stride=4), nn.GELU())
            for p in self.trunk.parameters():
                p.requires_grad_(False)   # the bug: a trunk left frozen at its random init
            self.decoder = nn.Sequential(nn.Conv2d(4, 48, 1), nn.PixelShuffle(4))

        def forward(self, x):
            return self.decoder(self.trunk(x))

    def build():
        return FrozenTrunk()

    def example_inputs():
        return torch.randn(2, 3, 32, 32)
''')


@pytest.mark.parametrize("scale", [1, 30])
def test_a_frozen_trunk_under_the_same_head_stays_cannot_overfit(cli, tmp_path, scale):
    """Fixed features fit only their own dimensions' share of a random target, and the loss ends where a
    least-squares fit on them does. A review: with inputs 30x or 60x too large the first output was far off the
    target, shrinking it earned 97% of the fall from the start, and the frozen trunk passed (60x: PASS)."""
    (tmp_path / "frozen_mim.py").write_text(FROZEN.replace("torch.randn(2, 3, 32, 32)", f"{scale} * torch.randn(2, 3, 32, 32)"))
    r = cli("overfit-batch", f"{tmp_path / 'frozen_mim.py'}:build", "--json")
    doc = json.loads(r.stdout)
    codes = [f["code"] for f in doc["findings"]]
    assert r.code == 1 and doc["passed"] is False, (r.code, codes)
    assert "cannot-overfit" in codes and "made-target-out-of-reach" not in codes, codes
    assert any("the layer's inputs before training fit it to" in n for n in doc["notes"]), doc["notes"]


class _FreeRows(nn.Module):
    """Rows of free features (one parameter per value) through a Linear of h inputs, shuffled: the best any training
    reaches is the span's own floor."""

    def __init__(self, rows: int, h: int, width: int):
        super().__init__()
        self.features = nn.Parameter(torch.randn(rows, h))
        self.head = nn.Linear(h, width)
        self.order = torch.randperm(rows * width, generator=torch.Generator().manual_seed(1))

    def forward(self, x):
        return self.head(self.features + 0 * x.sum()).reshape(-1)[self.order].reshape(x.shape[0], -1)


def _adam(model, params, x, target, steps: int = 3000):
    """`steps` Adam steps at 0.02 on `params` against `target` (mse); the last loss."""
    opt = torch.optim.Adam(params, 0.02)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss


def test_the_span_floor_is_what_training_free_features_reaches():
    """The floor against a target drawn here: training the free rows and the head with Adam ends at it from above
    (a bound from below that is also reached), found through the shuffle."""
    torch.manual_seed(0)
    model = _FreeRows(rows=64, h=6, width=24)
    x = torch.randn(8, 3)
    target = torch.randn(8, 64 * 24 // 8)
    found = span_floor(model, lambda m: m(x), model(x), target)
    assert found is not None and "rank ≤ 7 over 64 rows of 24 values" in found["kind"]
    loss = _adam(model, model.parameters(), x, target)
    assert found["floor"] <= loss.item() <= 1.05 * found["floor"], (found["floor"], loss.item())


def test_a_frozen_feature_fit_is_what_training_the_head_alone_reaches():
    """`fixed`: the features before training, fitted by least squares; training only the head (the features held)
    ends there from above."""
    torch.manual_seed(0)
    model = _FreeRows(rows=64, h=6, width=24)
    x = torch.randn(8, 3)
    target = torch.randn(8, 64 * 24 // 8)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    found = span_floor(model, lambda m: m(x), model(x), target, start)
    assert found["fixed"] > found["floor"]
    model.features.requires_grad_(False)
    loss = _adam(model, model.head.parameters(), x, target)
    # from above, to float32's rounding of the loss (one CPU read 1.3e-8 under the float64 fit)
    assert found["fixed"] * (1 - 1e-6) <= loss.item() <= 1.02 * found["fixed"], (found["fixed"], loss.item())


def test_a_span_with_fewer_rows_than_values_reads_the_smaller_side():
    """8 rows of 4000 values through a Linear of 2 inputs: the floor from the 8x8 Gram matrix, against numpy's SVD
    of the centred rows (the review's 12288-wide case took 179 s on the wide side)."""
    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.feats = nn.Parameter(torch.randn(8, 2))
            self.head = nn.Linear(2, 4000)

        def forward(self, x):
            return self.head(self.feats + 0 * x.sum())

    model, x = Wide(), torch.randn(8, 1)
    target = torch.randn(8, 4000, generator=torch.Generator().manual_seed(3))
    found = span_floor(model, lambda m: m(x), model(x), target)
    t = target.double().numpy()
    sv = np.linalg.svd(t - t.mean(0), compute_uv=False)
    assert found["floor"] == pytest.approx(float((sv[2:] ** 2).sum()) / t.size, rel=1e-9)


def test_an_elementwise_op_after_the_layer_is_no_rearrangement():
    """A review: ids 0..n-1 pass through a leaky ReLU unchanged, so its rank-h claim was made of a model that is not
    rank-h. Half-integer ids on both sides of 0 tell it apart; the plain shuffle is still found."""
    class Head(nn.Module):
        def __init__(self, leaky: bool):
            super().__init__()
            self.feats, self.head, self.leaky = nn.Parameter(torch.randn(32, 4)), nn.Linear(4, 48), leaky

        def forward(self, x):
            y = self.head(self.feats + 0 * x.sum()).reshape(2, 16, 48)
            return torch.nn.functional.leaky_relu(y, 0.2) if self.leaky else y

    x, target = torch.randn(2, 3), torch.randn(2, 16, 48)
    for leaky in (False, True):
        model = Head(leaky)
        found = span_floor(model, lambda m: m(x), model(x), target)
        assert (found is None) == leaky, (leaky, found)


def test_out_of_reach_asks_more_than_an_answer_alike_for_every_sample():
    """A review: with a batch of 2 an output the same for every sample (an ignored input) gets most of the way from
    the start features' fit to the span's floor; the loss must also pass that answer's floor by a quarter of its way."""
    from torchdiag.diagnostics.overfit_batch.report import _out_of_reach
    from torchdiag.results import Result

    span = {"kind": "the span of its last layer", "floor": 0.45, "fixed": 0.63, "constant": 0.47}
    for final, warned in ((0.466, False), (0.455, True)):   # 91% and 97% of the way from 0.63 to 0.45
        result = Result("overfit-batch")
        assert _out_of_reach(result, span, 1.0, final, 0.45) is warned
        assert [f.code for f in result.findings] == (["made-target-out-of-reach"] if warned else [])
