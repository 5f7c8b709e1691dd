"""activations: statistics against hand-computed values, pictures of exact size and content."""
import math

import pytest

from torchdiag.api import run
from torchdiag.render.activations import write_images

from support import load, one_error_line, sample

CNN = sample("cnn.py:build")


def _png(path):
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG"
        im.load()
        return im.size, im.mode  # (width, height)


# The frame of a labelled picture (torchdiag/pictures.py), restated here so the sizes below are arithmetic:
TITLE, MARGIN, BAR, STRIP = 46, 10, 84, 14     # title band, border, colour-bar band, index strip above a row


def _words(path) -> dict:
    """The PNG's text chunks, and whether its title band and each index strip hold drawn text (dark pixels)."""
    from PIL import Image

    with Image.open(path) as im:
        text = dict(im.text)
        arr = __import__("numpy").asarray(im.convert("L"))
    text["_title_inked"] = bool((arr[:TITLE] < 100).sum() > 200)
    return text | {"_arr": arr}


def test_stats_match_hand_computation(untouched):
    import numpy as np
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs
    model = nn.Sequential(nn.ReLU(), nn.Sigmoid(), nn.Tanh())
    x = torch.tensor([[-10.0, -1.0, 0.0, 1.0, 10.0, 20.0]])
    with untouched(model):
        res = run("activations", model, ModelInputs((x,), {}))
    rows = {r["name"]: r for r in res.table("modules").rows}
    relu = np.array([0, 0, 0, 1, 10, 20], dtype=float)
    r = rows["0"]
    assert r["shape"] == "1x6" and r["type"] == "ReLU"
    assert r["mean"] == pytest.approx(relu.mean()) and r["std"] == pytest.approx(relu.std())
    assert (r["min"], r["max"]) == (0.0, 20.0)
    assert r["zero_fraction"] == pytest.approx(3 / 6) and r["saturated_fraction"] is None
    sig = 1 / (1 + np.exp(-relu))          # 0.5, 0.5, 0.5, 0.731, 0.99995, 1.0
    s = rows["1"]
    assert s["mean"] == pytest.approx(sig.mean()) and s["saturated_fraction"] == pytest.approx(2 / 6)
    t = rows["2"]                           # tanh of sigmoid outputs: all in (0.46, 0.77) → none saturated
    assert t["saturated_fraction"] == 0.0 and t["max"] == pytest.approx(math.tanh(sig.max()))
    assert rows["(model)"]["calls"] == 1
    assert not res.findings


def test_saturated_and_dead_and_nonfinite_findings():
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs
    class Log(nn.Module):
        def forward(self, x):
            return torch.log(x)

    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Sigmoid())
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.fill_(-1.0)   # every ReLU output is 0 → dead
    res = run("activations", model, ModelInputs((torch.randn(8, 4),), {}))
    codes = {(f.code, f.where) for f in res.findings}
    assert ("dead-activations", "1") in codes and res.exit_code == 0
    model2 = nn.Sequential(nn.Linear(4, 32), nn.Tanh())
    with torch.no_grad():
        model2[0].weight.fill_(50.0)
    res2 = run("activations", model2, ModelInputs((torch.ones(8, 4),), {}))
    assert ("saturated-activations", "1") in {(f.code, f.where) for f in res2.findings}
    res3 = run("activations", nn.Sequential(nn.Identity(), Log()), ModelInputs((-torch.ones(2, 3),), {}))
    f = [f for f in res3.findings if f.code == "non-finite-activation"]
    assert f and f[0].where == "1" and res3.exit_code == 1


class _ZeroInitBlock:
    """timm's zero-init residual (cs3darknet, resnet50_gn): a branch's last norm has its weight at 0, so the norm,
    its activation and the drop-path after it output exactly zero; a sweep found 70 `dead-activations` warnings
    ("dead ReLUs") on a healthy cs3darknet_m, each zero output said once per module it passed."""

    @staticmethod
    def build(depth=3):
        import torch
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.norm = nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(2, 8)
                self.act, self.drop = nn.ReLU(), nn.Dropout(0.0)
                nn.init.zeros_(self.norm.weight)

            def forward(self, x):   # the activation after the sum, as timm's blocks: the zero norm gets a gradient
                return self.act(x + self.drop(self.norm(self.conv(x))))

        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), *[Block() for _ in range(depth)])


def test_a_zero_initialised_norm_is_info_said_once_with_what_passes_it_on():
    import torch

    from torchdiag.core.inputs import ModelInputs

    res = run("activations", _ZeroInitBlock.build(), ModelInputs((torch.randn(2, 3, 8, 8),), {}))
    assert res.exit_code == 0 and not [f for f in res.findings if f.severity != "info"], res.findings
    (f,) = [f for f in res.findings if f.code == "zero-init"]
    assert f.members == ["1.norm", "2.norm", "3.norm"] and "their weight is zero at initialisation" in f.message
    assert "3 module(s) pass the zeros on (1.drop, 2.drop, 3.drop)" in f.message


def test_a_zero_gate_behind_another_zero_gate_is_info():
    """A sweep: timm gcresnext50ts' GlobalContext adds a context through fc2, zero at initialisation, before the
    block's last BatchNorm, whose gain is zero too: no gradient reached fc2 until that gain opened, so fc2 was
    `dead-activations` (16 warnings). A short run on a copy lets the gradient through: both are `zero-init`."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    class Block(nn.Module):
        def __init__(self, c=8):
            super().__init__()
            self.conv1, self.fc1, self.fc2 = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, 4, 1), nn.Conv2d(4, c, 1)
            self.conv3, self.bn3 = nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)
            for p in (self.fc2.weight, self.fc2.bias, self.bn3.weight):
                nn.init.zeros_(p)

        def forward(self, x):
            y = self.conv1(x)
            y = y + self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True))))
            return torch.relu(x + self.bn3(self.conv3(y)))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Block())
    res = run("activations", model, ModelInputs((torch.randn(4, 3, 16, 16),), {}))
    assert res.exit_code == 0 and not [f for f in res.findings if f.severity != "info"], \
        [f.message for f in res.findings]
    assert {f.where for f in res.findings if f.code == "zero-init"} == {"1.fc2", "1.bn3"}


def test_the_short_run_does_not_wake_a_dead_block_by_a_faint_gradient():
    """A review of the short run: each parameter was moved 1e-3 whatever its gradient, so a shortcut bias of -3e-4
    whose only gradient was 1e-6-faint flipped and woke a block whose ReLU is dead (2,000 plain SGD steps leave it
    dead): `zero-init` info. The step is a gradient's now, its largest move 1e-3: the warning stays."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    class Block(nn.Module):
        def __init__(self, c=16):
            super().__init__()
            self.conv, self.bn = nn.Linear(c, c), nn.BatchNorm1d(c)
            nn.init.zeros_(self.bn.weight)

        def forward(self, x, s):
            return F.relu(self.bn(self.conv(x)) + s)

    class Net(nn.Module):
        def __init__(self, c=16):
            super().__init__()
            self.stem, self.shift, self.block = nn.Linear(8, c), nn.Linear(8, c), Block(c)
            self.head, self.aux = nn.Linear(c, 4), nn.Linear(c, 4)
            with torch.no_grad():
                self.shift.weight.zero_()
                self.shift.bias.fill_(-3e-4)
                self.aux.weight.mul_(1e-6)

        def forward(self, x):
            s = self.shift(x)
            return self.head(self.block(torch.relu(self.stem(x)), s)) + self.aux(s)

    torch.manual_seed(0)
    res = run("activations", Net(), ModelInputs((torch.randn(16, 8),), {}))
    assert [(f.code, f.severity, f.where) for f in res.findings] == [("dead-activations", "warning", "block.bn")], \
        [f.message for f in res.findings]


@pytest.mark.parametrize("norm", [True, False])
def test_saturation_only_untouched_batch_norm_statistics_make_is_info(norm):
    """A sweep: timm efficientnetv2_rw_t's squeeze-excitation gates were 55-99% saturated in eval mode (16 warnings),
    where its fresh BatchNorm layers normalise with mean 0 and variance 1, and 0% with the batch's statistics. Asked
    again with those: info, both fractions said. Without the BatchNorm the same saturation is the model's: a warning."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    torch.manual_seed(0)
    lin = nn.Linear(16, 64)
    with torch.no_grad():
        lin.weight.mul_(40)
    model = nn.Sequential(lin, nn.BatchNorm1d(64) if norm else nn.Identity(), nn.Sigmoid(), nn.Linear(64, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = run("activations", model, ModelInputs((torch.randn(8, 16),), {}))
    (f,) = [f for f in res.findings if f.code == "saturated-activations"]
    assert f.where == "2" and f.severity == ("info" if norm else "warning"), f.message
    if norm:
        assert "in eval mode only" in f.message and "with the batch's own statistics" in f.message
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())   # the copy's statistics moved
    if norm:   # a review: statistics loaded from a checkpoint without the count (0) are fitted, not as initialised
        with torch.no_grad():
            model[1].running_var.fill_(1e-3)
        (f,) = [f for f in run("activations", model, ModelInputs((torch.randn(8, 16),), {})).findings
                if f.code == "saturated-activations"]
        assert f.severity == "warning", f.message


class _Dead:
    """Dead units the old per-module warning caught, which a zero-init gate must not hide (a review's cases)."""

    @staticmethod
    def relu_after_zero_norm():   # the norm's zero weight feeds a ReLU's zero: no gradient reaches it, ever
        block = _ZeroInitBlock.build(depth=1)
        block[1].forward = lambda x: x + block[1].act(block[1].norm(block[1].conv(x)))
        return block

    @staticmethod
    def inplace_relu():
        import torch
        from torch import nn

        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(inplace=True), nn.Linear(32, 2))
        with torch.no_grad():
            m[0].bias.fill_(-50.0)
        return m

    @staticmethod
    def functional_relu_with_zero_bias():   # F.relu inside a module whose Linear has the ordinary zero bias
        import torch
        from torch import nn

        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(32, 64)
                nn.init.zeros_(self.fc.bias)
                with torch.no_grad():
                    self.fc.weight.copy_(-self.fc.weight.abs())

            def forward(self, x):
                return torch.relu(self.fc(x))

        return nn.Sequential(nn.Linear(16, 32), nn.Sigmoid(), MLP(), nn.Linear(64, 4))

    @staticmethod
    def zero_layer(frozen=False):   # a zeroed hidden layer before a ReLU never trains
        from torch import nn

        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
        nn.init.zeros_(m[2].weight)
        nn.init.zeros_(m[2].bias)
        m[2].requires_grad_(not frozen)
        return m

    @staticmethod
    def shared_relu():   # one ReLU: after a zero-init norm, then after a dead Linear (its second call)
        import torch
        from torch import nn

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.norm, self.dead = nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 16)
                nn.init.zeros_(self.norm.weight)
                with torch.no_grad():
                    self.dead.bias.fill_(-50.0)
                self.act, self.head = nn.ReLU(), nn.Linear(32, 2)

            def forward(self, x):
                a = x + self.act(self.norm(self.conv(x)))
                return self.head(torch.cat([a, self.act(self.dead(x))], -1))

        return M()


@pytest.mark.parametrize("case", ["relu_after_zero_norm", "inplace_relu", "functional_relu_with_zero_bias",
                                  "zero_layer", "frozen_zero_layer", "shared_relu"])
def test_dead_units_a_zero_gate_does_not_hide(case):
    import torch

    from torchdiag.core.inputs import ModelInputs

    torch.manual_seed(0)
    model = _Dead.zero_layer(frozen=True) if case == "frozen_zero_layer" else getattr(_Dead, case)()
    shape = (2, 3, 8, 8) if case == "relu_after_zero_norm" else (8, 16)
    res = run("activations", model, ModelInputs((torch.randn(*shape),), {}))
    warned = [f.where for f in res.findings if f.code == "dead-activations"]
    assert warned and not [f for f in res.findings if f.code == "zero-init"], [(f.code, f.where) for f in res.findings]
    if case == "shared_relu":
        assert "act" in warned


def test_a_zero_output_made_by_a_keyword_mask_is_not_a_gate():
    """The re-run keeps the call's keywords: run without its all-zero mask, the copy's output was not zero, and the
    block's zero bias was blamed (a review)."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)
            nn.init.zeros_(self.proj.bias)

        def forward(self, x, mask=None):
            return self.proj(x) if mask is None else self.proj(x) * mask

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.block, self.head = nn.Linear(16, 16), Masked(), nn.Linear(16, 2)

        def forward(self, x, mask):
            return self.head(self.block(self.inp(x), mask=mask))

    torch.manual_seed(0)
    res = run("activations", M(), ModelInputs((torch.randn(4, 8, 16), torch.zeros(4, 8, 1)), {}))
    assert [(f.code, f.where) for f in res.findings] == [("dead-activations", "block")]


def test_a_dead_relu_after_a_zero_init_norm_is_still_a_warning_where_its_own_inputs_die():
    """The control: a ReLU whose inputs are all negative has no parameter to draw; a norm whose weight is not 0
    but whose bias pushes every value below 0 is dead ReLUs, not a gate."""
    import torch

    from torchdiag.core.inputs import ModelInputs

    model = _ZeroInitBlock.build(depth=1)
    with torch.no_grad():
        model[1].norm.weight.fill_(0.1)
        model[1].norm.bias.fill_(-5.0)
    res = run("activations", model, ModelInputs((torch.randn(2, 3, 8, 8),), {}))
    assert [(f.code, f.where) for f in res.findings if f.severity != "info"] == [("dead-activations", "1.act")]
    assert "1 module(s) pass its zeros on (1)" in res.findings[0].message   # the block (act after its sum)


def test_zero_outputs_inside_an_origin_are_not_said_to_pass_its_zeros_on():
    """A sweep: XCodec2's attention made zeros from a zero hidden state and a position input that was not zero; its
    q/k/v projections, called inside it before it returned, were said to "pass its zeros on"."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    class Att(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x - x)   # zero in, zero out: inside the origin, not after it

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.att, self.act = Att(), nn.ReLU()

        def forward(self, x):
            return self.act(self.att(x))

    torch.manual_seed(0)
    with torch.no_grad():
        model = Net()
        model.att.proj.bias.zero_()
    res = run("activations", model, ModelInputs((torch.randn(4, 8),), {}))
    (f,) = [f for f in res.findings if f.code == "dead-activations"]
    assert f.where == "att" and "1 module(s) inside it output zeros too (att.proj)" in f.message, f.message
    assert "1 module(s) pass its zeros on (act)" in f.message, f.message


def test_relu6_zeros_are_not_saturation():
    """ReLU6's clip at 0 is a ReLU's zero (half of a healthy MobileNetV2's outputs): only its top, 6, saturates."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU6())
    res = run("activations", model, ModelInputs((torch.randn(16, 4),), {}))
    row = {r["name"]: r for r in res.table("modules").rows}["1"]
    assert 0.3 < row["zero_fraction"] < 0.7 and row["saturated_fraction"] == 0.0 and not res.findings
    with torch.no_grad():
        model[0].bias.fill_(10.0)
    res = run("activations", model, ModelInputs((torch.randn(16, 4),), {}))
    assert ("saturated-activations", "1") in {(f.code, f.where) for f in res.findings}


def test_cli_json_and_pictures(cli, tmp_path):

    out = tmp_path / "act"
    r = cli("activations", CNN, "--layer", "features.0", "--layer", "features.3", "--images", out, "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    for key in ("modules", "layers", "images", "findings", "exit_code", "modules_recorded"):
        assert key in doc
    rows = {m["name"]: m for m in doc["modules"]}
    assert rows["features.0"]["shape"] == "8x16x32x32" and rows["head.1"]["shape"] == "8x10"
    assert rows["features.1"]["zero_fraction"] > 0.3        # ReLU of a zero-mean conv output
    # feature maps: 16 channels of 32×32, enlarged ×2 to 64 px, 4×4 grid, 2-px gaps, a 14-px index strip
    # above each row: 4*(64+14) + 3*2 = 318 tall, 262 wide; framed: 46 + 318 + 10 = 374 by max(480, 10+262+84)
    assert _png(out / "features.0_features.png") == ((480, 374), "RGB")
    # first-layer filters: 16 RGB 3×3 filters ×14 → 42 px (≥ 32), 4×4 grid → 4*(42+14)+6 = 230; no colour bar
    assert _png(out / "features.0_filters.png") == ((480, 46 + 230 + 10), "RGB")
    # 16→32 conv: 16 rows (256 tiles cap / 16 inputs) × 16 inputs of 42 px → 702 square, output filter named
    # in a 44-px band at the left, input channel in a 14-px band above: 46+14+702+10 by 44+702+84
    assert _png(out / "features.3_filters.png") == ((830, 772), "RGB")
    # 32 channels of 16×16 ×3 = 48 px, 6×6 grid → 6*(48+14)+5*2 = 382 tall, 298 wide
    assert _png(out / "features.3_features.png") == ((480, 46 + 382 + 10), "RGB")
    # every picture names the command, the layer and the model: in its text chunks and drawn in its title band
    for layer, what in (("features.0", "feature maps"), ("features.0", "filters"), ("features.3", "feature maps"),
                        ("features.3", "filters")):
        words = _words(out / f"{layer}_{'features' if what == 'feature maps' else 'filters'}.png")
        assert words["Title"] == f"activations · layer {layer} · {what}"
        assert (words["Command"], words["Layer"], words["Model"]) == ("activations", layer, CNN)
        assert CNN in words["Description"] and words["_title_inked"]
    assert "16 of 32 filters of size 3×3, rows: output filter, columns: input channel" in words["Description"]


def test_first_layer_filters_in_colour_and_feature_map_content(tmp_path):
    import numpy as np
    import torch
    from matplotlib import colormaps
    from PIL import Image

    model, inputs = load("cnn.py:build")
    write_images(run("activations", model, inputs, layers=["features.0"], images=True), tmp_path)
    # tile (o=1) top-left pixel is w[1,:,0,0] mapped from [-max|w|, max|w|] to [0,255], RGB order; tiles are
    # 42 px (3×3 ×14, nearest: the whole 14×14 block is that weight) below a 14-px index strip, in a 10-px border
    w = model.features[0].weight.detach().numpy()
    m = np.abs(w).max()
    expect = (np.clip(w[1, :, 0, 0] / (2 * m) + 0.5, 0, 1) * 255 + 0.5).astype(np.uint8)
    grid = np.asarray(Image.open(tmp_path / "features.0_filters.png"))
    x0, y0 = MARGIN + 42 + 2, TITLE + STRIP
    assert (grid[y0:y0 + 14, x0:x0 + 14] == expect).all()
    assert (grid[y0:y0 + 14, x0 + 14] != expect).any()                   # the next weight starts at ×14
    strip = grid[TITLE:TITLE + STRIP, x0:x0 + 42]
    assert (strip.min(axis=2) < 100).sum() > 5 and (grid[y0 - STRIP - 1, x0:x0 + 42] == 255).all()  # "1" written above
    # feature-map tile 0 = channel 0 of sample 0, on one colour scale shared by the 16 channels (viridis)
    with torch.no_grad():
        out = model.features[0](inputs.args[0])[0].numpy().astype(np.float64)
    lo, hi = out.min(), out.max()
    a = out[0]
    maps = np.asarray(Image.open(tmp_path / "features.0_features.png"))
    for i, j in (np.unravel_index(a.argmax(), a.shape), np.unravel_index(a.argmin(), a.shape), (5, 7)):
        expect = (np.array(colormaps["viridis"]((a[i, j] - lo) / (hi - lo))[:3]) * 255 + 0.5).astype(np.uint8)
        assert list(maps[TITLE + STRIP + 2 * i, MARGIN + 2 * j]) == list(expect)
    # the colour bar at the right of the grid (262 px wide + 12-px gap, 14 px) runs from viridis(max) to viridis(min)
    bar = maps[TITLE + 3:TITLE + 318 - 3, MARGIN + 262 + 12 + 7].astype(int)
    for row, v in ((bar[0], 1.0), (bar[-1], 0.0)):
        assert np.abs(row - np.array(colormaps["viridis"](v)[:3]) * 255).max() < 12
    words = _words(tmp_path / "features.0_features.png")
    assert f"shared colour scale {lo:.4g} … {hi:.4g}" in words["Description"]


def test_tensorboard_histograms_and_images(cli, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    r = cli("activations", CNN, "--tb", tmp_path)
    assert r.code == 0, r.stderr
    acc = EventAccumulator(str(tmp_path / "activations"), size_guidance={"histograms": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "activations/features.1" in tags["histograms"] and "activations/head.1" in tags["histograms"]
    assert {"activations/features.0/feature_maps", "activations/features.0/filters",
            "activations/features.3/filters"} <= set(tags["images"])
    img = acc.Images("activations/features.0/feature_maps")[0]
    assert (img.width, img.height) == (480, 374)             # the same labelled figure as the PNG


def test_model_untouched_by_cli_path(untouched):
    model, inputs = load("cnn.py:build")
    model.train()
    with untouched(model):
        run("activations", model, inputs, layers=["features.0"], tb=True)


def test_bad_input_bad_layer_and_cuda_exit_2(cli, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # CPU-only machine for every case, even on a GPU box
    r = cli("activations", CNN, "-i", "8xq")
    assert r.code == 2
    one_error_line(r)
    r = cli("activations", CNN, "--layer", "features.9", "--images", tmp_path)
    assert r.code == 2 and "features.9" in r.stderr
    one_error_line(r)
    r = cli("activations", CNN, "--device", "cuda")
    assert r.code == 2 and "not available" in r.stderr
    one_error_line(r)


def test_missing_matplotlib_is_a_usage_error(cli, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = cli("activations", CNN, "--images", tmp_path)
    assert r.code == 2 and "matplotlib" in r.stderr and "pip install" in r.stderr
    one_error_line(r)


@pytest.mark.cuda
def test_cuda_run(cli):
    r = cli("activations", CNN, "--device", "cuda", "--json")
    assert r.code == 0 and r.json["device"].startswith("cuda")


def test_images_path_that_is_a_file_is_exit_2_before_loading(cli, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for spec in (CNN, sample("broken_factory.py:raises")):     # the factory raises: exit 3 if loaded
        r = cli("activations", spec, "--images", afile)
        assert r.code == 2, r.stderr
        one_error_line(r)
        assert r.stderr.startswith(f"error: --images {afile}: is a file"), r.stderr
    assert afile.read_text() == "mine"


def test_grayscale_and_depthwise_filters_in_a_square_grid(tmp_path):
    """One input channel (MNIST-style first layer, depthwise conv): one tile per filter in a
    ceil(sqrt(n)) grid (was a single column 862 px tall)."""
    import numpy as np
    import torch
    from PIL import Image
    from torch import nn

    from torchdiag.core.inputs import ModelInputs
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.Conv2d(32, 32, 3, groups=32))
    res = run("activations", model, ModelInputs((torch.randn(2, 1, 28, 28),), {}), layers=["0", "2"], images=True)
    write_images(res, tmp_path)
    # 32 tiles of 5×5 ×8 = 40 px in a 6×6 grid: 6*(40+14) + 5*2 = 334 tall; depthwise 3×3 ×14 = 42 px: 346
    assert _png(tmp_path / "0_filters.png") == ((480, 46 + 334 + 10), "RGB")
    assert _png(tmp_path / "2_filters.png") == ((480, 46 + 346 + 10), "RGB")
    w = model[0].weight.detach().numpy()
    m = np.abs(w).max()
    grid = np.asarray(Image.open(tmp_path / "0_filters.png"))
    # tile 7 sits at row 1, column 1 of the grid; its top-left 8×8 block is w[7, 0, 0, 0] in gray
    expect = int(np.clip(w[7, 0, 0, 0] / (2 * m) + 0.5, 0, 1) * 255 + 0.5)
    y, x = TITLE + (40 + STRIP + 2) + STRIP, MARGIN + 40 + 2
    assert (grid[y:y + 8, x:x + 8] == expect).all()
    # a gray colour bar for the weight: white (+max|w|) at its top, black (−max|w|) at its bottom
    bar = grid[TITLE + 3:TITLE + 334 - 3, MARGIN + 250 + 12 + 7].astype(int)
    assert bar[0].min() > 240 and bar[-1].max() < 15
    assert "32 filters of size 5×5, one input channel each" in _words(tmp_path / "0_filters.png")["Description"]
    assert not any("filters of the first" in n for n in res.notes)


def test_filter_truncation_is_noted(tmp_path):
    model, inputs = load("cnn.py:build")
    res = run("activations", model, inputs, layers=["features.3"], images=True)
    # 16→32 conv: 256 tiles = 16 output filters × 16 input channels
    assert "features.3: filters of the first 16 of 32 output channels shown" in res.notes


def test_readme_pictures_are_what_the_code_draws(cli, tmp_path, monkeypatch):
    """docs/images/activations_*.png are the README command's output (docs/images/regenerate.sh), run as the
    script runs it: from the repository root, with the model spec the title shows."""
    from support import ROOT, assert_readme_picture

    monkeypatch.chdir(ROOT)
    r = cli("activations", "sample_models/cnn.py:build", "--layer", "features.0", "--images", tmp_path)
    assert r.code == 0, r.stderr
    for doc, made in (("activations_features.png", "features.0_features.png"),
                      ("activations_filters.png", "features.0_filters.png")):
        assert_readme_picture(doc, tmp_path / made)


def test_bad_options_exit_2_before_loading_and_named_per_caller(cli, tmp_path):
    import torch
    from torch import nn

    from torchdiag.errors import OptionError

    r = cli("activations", sample("broken_factory.py:raises"), "--eps", "0.9")   # exit 3 if it were loaded
    assert r.code == 2 and "--eps" in r.stderr and "Traceback" not in r.stderr   # typer's range check
    model, x = nn.Sequential(nn.ReLU()), torch.randn(2, 3)
    with pytest.raises(OptionError, match=r"^eps: must be ≤ 0.5, got 0.9"):
        run("activations", model, x, eps=0.9)
    # images once took a folder: files are written by the renderer now, and the error says so
    with pytest.raises(OptionError, match=r"^images: takes True or False") as e:
        run("activations", model, x, images=str(tmp_path))
    assert "torchdiag.render.activations.write_images" in e.value.hint


def test_cli_json_gives_the_paths_written(cli, tmp_path):
    r = cli("activations", CNN, "--layer", "features.0", "--images", tmp_path / "act", "--json")
    assert r.code == 0, r.stderr
    paths = [e["path"] for e in r.json["images"]]
    assert paths == [str(tmp_path / "act" / "features.0_features.png"), str(tmp_path / "act" / "features.0_filters.png")]
    assert sorted(p.name for p in (tmp_path / "act").iterdir()) == ["features.0_features.png", "features.0_filters.png"]
    text = cli("activations", CNN, "--layer", "features.0", "--images", tmp_path / "act")
    # words, not line breaks: the console wraps at its width, and the tmp path's length (pytest-xdist) moves the break
    assert f"2 PNG file(s) in {tmp_path / 'act'}" in " ".join(text.stdout.split())


def test_picture_sizes_are_known_before_drawing_and_drawn_in_render(tmp_path):
    """The diagnostic describes its pictures (no matplotlib there) and reports their sizes; render draws them
    to exactly those sizes, once, when they are written."""
    from PIL import Image

    model, inputs = load("cnn.py:build")
    res = run("activations", model, inputs, layers=["features.0", "features.3"], images=True)
    assert "pictures" not in res.artefacts and not res.images        # nothing drawn yet
    entries = res.data["images"]
    assert [(e["layer"], e["kind"]) for e in entries] == [("features.0", "feature_maps"), ("features.0", "filters_rgb"),
                                                        ("features.3", "feature_maps"), ("features.3", "filters_gray")]
    # the framed sizes of test_cli_json_and_pictures
    assert [(e["height"], e["width"]) for e in entries] == [(374, 480), (286, 480), (438, 480), (772, 830)]
    write_images(res, tmp_path)
    files = ["features.0_features.png", "features.0_filters.png", "features.3_features.png", "features.3_filters.png"]
    for entry, name in zip(entries, files):
        with Image.open(tmp_path / name) as im:
            assert im.size == (entry["width"], entry["height"])
    assert [n for n, *_ in res.artefacts["pictures"]] == files
    write_images(res, tmp_path / "again")                            # drawn once: no second set of pictures
    assert len(res.artefacts["pictures"]) == 4


def test_non_finite_activations_are_magenta_and_counted(tmp_path):
    """A NaN in a feature map is drawn magenta (viridis never is) and counted in the words; the finite
    values keep the shared scale."""
    import numpy as np
    import torch
    from PIL import Image
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    x = torch.randn(1, 2, 8, 8)
    x[0, 1, 3, 4] = float("nan")
    res = run("activations", nn.Sequential(nn.Identity()), ModelInputs((x,), {}), layers=["0"], images=True)
    write_images(res, tmp_path)
    # 2 tiles of 8×8 ×6 = 48 px (≥ 48 on the larger side) in a 2×1 grid, index strip above the row
    arr = np.asarray(Image.open(tmp_path / "0_features.png"))
    y, x0 = TITLE + STRIP + 3 * 6, MARGIN + 48 + 2 + 4 * 6
    assert (arr[y:y + 6, x0:x0 + 6] == [255, 0, 255]).all()
    assert not (arr[y:y + 6, x0 + 6:x0 + 12] == [255, 0, 255]).all(axis=2).any()
    words = _words(tmp_path / "0_features.png")
    assert "1 NaN/Inf in magenta" in words["Description"] and words["Model"] == "model given from Python"
    finite = x[torch.isfinite(x)]
    assert f"shared colour scale {float(finite.min()):.4g} … {float(finite.max()):.4g}" in words["Description"]


def test_pictures_and_histograms_of_a_layer_followed_by_an_in_place_op_are_its_output(tmp_path):
    """A sweep: bn1's feature maps (ReLU(inplace=True) after it) were drawn from 0: a view kept, written by the ReLU."""
    import torch

    model, inputs = load("resnet.py:resnet18", inputs=["2x3x32x32"])
    res = run("activations", model, inputs, layers=["bn1"], images=True, tb=True)
    write_images(res, tmp_path)
    with torch.no_grad():
        model.eval()
        out = model.bn1(model.conv1(inputs.args[0]))[0]
    lo, hi = float(out.min()), float(out.max())
    assert lo < 0 and f"shared colour scale {lo:.4g} … {hi:.4g}" in _words(tmp_path / "bn1_features.png")["Description"]
    assert float(res.histograms["activations/bn1"].min()) < 0


def test_a_zero_initialised_table_read_without_inputs_is_zero_init():
    """transformers' Swin: `SwinRelativePositionBias.forward(self)` reads a position-bias table initialised at zero by
    index; its output is exactly zero and follows no input (it has none). Activations warned `dead-activations` on
    every attention layer of a freshly built Swin (Grounding DINO's backbone): the table trains, by design."""
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs

    class Bias(nn.Module):
        def __init__(self, heads=2, n=4):
            super().__init__()
            self.table = nn.Parameter(torch.zeros(2 * n - 1, heads))
            idx = torch.arange(n)
            self.register_buffer("index", (idx[:, None] - idx[None, :] + n - 1), persistent=False)

        def forward(self):
            return self.table[self.index].permute(2, 0, 1).unsqueeze(0)

    class Attention(nn.Module):
        def __init__(self, dim=8, heads=2):
            super().__init__()
            self.qkv, self.bias, self.heads = nn.Linear(dim, 3 * dim), Bias(heads), heads

        def forward(self, x):
            b, n, d = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2) + self.bias()).softmax(-1)
            return (att @ v).transpose(1, 2).reshape(b, n, d)

    torch.manual_seed(0)
    res = run("activations", nn.Sequential(nn.Linear(8, 8), Attention()), ModelInputs((torch.randn(2, 4, 8),), {}))
    assert not [f for f in res.findings if f.severity != "info"], [(f.code, f.where) for f in res.findings]
    (f,) = [f for f in res.findings if f.code == "zero-init"]
    assert f.where == "1.bias" and "the module reads no input" in f.message, f.message
    dead = nn.Sequential(nn.Linear(8, 8), Attention())
    dead[1].bias.table.requires_grad_(False)   # a frozen zero table never trains: the warning stays
    res = run("activations", dead, ModelInputs((torch.randn(2, 4, 8),), {}))
    assert [f for f in res.findings if f.code == "dead-activations" and f.severity == "warning"]
