"""gradcam: closed-form CAM, maximum inside the only region that matters, valid pictures."""
import re
import textwrap

import pytest

from torchdiag.api import run

from support import load, one_error_line, sample

REGION = sample("gradcam_region.py:build")


@pytest.fixture
def image(tmp_path):
    """A 32×32 RGB image, bright and textured everywhere (so every region has content)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    arr = (rng.uniform(0.3, 1.0, (32, 32, 3)) * 255).astype(np.uint8)
    path = tmp_path / "img.png"
    Image.fromarray(arr).save(path)
    return path


# The gradcam figure (torchdiag/pictures.py), restated so sizes are arithmetic: title band, panel names, border,
# gap between panels, colour-bar band; panels are enlarged (nearest) until their shorter side is ≥ 192 px.
TITLE, NAMES, MARGIN, GAP, BAR = 46, 16, 10, 10, 84


def _jet(v):
    import numpy as np
    from matplotlib import colormaps

    return (np.array(colormaps["jet"](v)[:3]) * 255 + 0.5).astype(np.uint8)


def _region_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gradcam_region_t", sample("gradcam_region.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cam_equals_closed_form_for_gap_linear(image, untouched):
    """With global average pooling then a linear layer, Grad-CAM is CAM: ReLU(Σ_c W[k,c]·A_c)/(h·w)."""
    import numpy as np
    import torch

    from torchdiag.core.image_file import load_rgb
    from torchdiag.diagnostics import gradcam as diag

    model, _ = load("gradcam_region.py:build")
    x = diag.image_tensor(load_rgb(image), (0, 0, 0), (1, 1, 1), torch.device("cpu"))
    with torch.no_grad():
        a = model.features(model.window(x))[0]            # C×h×w at features.3
        logits = model(x)[0]
    for k in (None, 2):
        with untouched(model):
            cam, heat, got_logits, used = diag.grad_cam(model, x, "features.3", k)
        used_expect = int(logits.argmax()) if k is None else k
        assert used == used_expect
        w = model.head.weight[used].detach()
        expect = torch.relu((w[:, None, None] * a).sum(0)) / (a.shape[1] * a.shape[2])
        assert torch.allclose(cam, expect, atol=1e-6)
        h = heat.numpy()
        assert h.min() >= 0.0 and h.max() <= 1.0
        if expect.max() > 0:
            assert h.max() == pytest.approx(1.0)
            assert np.allclose(h, (expect / expect.max()).numpy(), atol=1e-5)


def test_maximum_inside_the_only_region_that_matters(image, untouched):

    mod = _region_module()
    rows, cols, reach = mod.REGION[0], mod.REGION[1], mod.REACH
    model, _ = load("gradcam_region.py:build")

    with untouched(model):
        res = run("gradcam", model, None, layer="features.3", image=str(image))
    h = res.artefacts["heatmap"]
    r, c = res.data["heatmap_peak"]
    assert rows.start <= r < rows.stop and cols.start <= c < cols.stop
    outside = h.copy()
    outside[rows.start - reach:, cols.start - reach:] = 0
    assert outside.max() == 0.0                   # pixels that cannot matter get no heat
    inside = h[rows, cols]
    assert inside.mean() > 0.2 and h.max() == pytest.approx(1.0)


def test_cli_writes_valid_png_and_tensorboard(cli, image, tmp_path):
    import numpy as np
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "cam.png"
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", image, "--out", out, "--tb", tmp_path / "tb", "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    for key in ("target_class", "score", "probability", "heatmap_peak", "top_classes", "out", "layer", "image_size"):
        assert key in doc
    assert doc["heatmap_max"] == pytest.approx(1.0) and doc["heatmap_min"] >= 0.0
    r0, c0 = doc["heatmap_peak"]
    assert r0 >= 16 and c0 >= 16
    with Image.open(out) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        # 32 px panels enlarged ×6 to 192; three panels 10 px apart, names above, title band, colour bar:
        # 10 + 3*192 + 2*10 + 84 = 690 wide, 46 + 16 + 192 + 10 = 264 tall (it was a 388×128 strip)
        assert im.size == (690, 264) == (doc["out_size"][1], doc["out_size"][0])
        arr, text = np.asarray(im), dict(im.text)
    k = doc["target_class"]
    assert text["Title"] == f"gradcam · layer features.3 · class {k}"
    assert (text["Command"], text["Model"], text["Layer"], text["Class index"]) == ("gradcam", REGION, "features.3", str(k))
    assert f"logit {doc['score']:.4g}, p={doc['probability']:.3f}" in text["Description"]
    # the bare size (a sweep: the header's whole note went in, cut in the middle by the subtitle's room)
    assert f"image {doc['image_size'].split(' (')[0]}, drawn ×6" in text["Description"], text["Description"]
    assert (arr[:TITLE].min(axis=2) < 100).sum() > 200                     # the title is drawn, not only stored
    src = np.asarray(Image.open(image))
    top, left = TITLE + NAMES, MARGIN
    assert (arr[top:top + 6, left:left + 6] == src[0, 0]).all()            # first panel: the original, ×6 nearest
    assert (arr[top + 6 * 17:top + 6 * 18, left + 6 * 9:left + 6 * 10] == src[17, 9]).all()
    heat = doc["heatmap_peak"]
    x0 = MARGIN + 192 + GAP                                                # second panel: the heatmap through jet
    assert (arr[top + 6 * heat[0], x0 + 6 * heat[1]] == _jet(1.0)).all()
    bar = arr[top + 3:top + 192 - 3, MARGIN + 3 * 192 + 2 * GAP + 12 + 7].astype(int)
    near = lambda px, lo, hi: min(np.abs(px - _jet(v)).max() for v in np.linspace(lo, hi, 41)) < 12  # noqa: E731
    assert near(bar[0], 0.95, 1.0) and near(bar[-1], 0.0, 0.05)            # its colour bar: 1 at the top, 0 below
    acc = EventAccumulator(str(tmp_path / "tb" / "gradcam"), size_guidance={"images": 0})
    acc.Reload()
    assert {"gradcam/original", "gradcam/heatmap", "gradcam/overlay", "gradcam/figure"} <= set(acc.Tags()["images"])
    fig = acc.Images("gradcam/figure")[0]
    assert (fig.width, fig.height) == (690, 264)


def test_class_name_from_the_model_config(image, tmp_path):
    """A model that names its classes (config.id2label, the Hugging Face convention): the name is in the
    result, the title and the PNG text; without it, only the index."""
    from types import SimpleNamespace

    from PIL import Image

    from torchdiag.render.gradcam import write_out

    model, _ = load("gradcam_region.py:build")
    plain = run("gradcam", model, None, layer="features.3", image=image, target_class=1, out=True)
    assert "class_name" not in plain.data
    model.config = SimpleNamespace(id2label={0: "circle", 1: "square", 2: "noise", 3: "empty"})
    res = run("gradcam", model, None, layer="features.3", image=image, target_class=1, out=True)
    assert res.data["class_name"] == "square" and ("Explained class", "1 (square)") == (
        res.summary[0][0], res.summary[0][1].split(" (logit")[0])
    write_out(res, tmp_path / "cam.png")
    with Image.open(tmp_path / "cam.png") as im:
        assert im.text["Title"] == "gradcam · layer features.3 · class 1 (square)"
        assert im.text["Class name"] == "square" and im.text["Class index"] == "1"


def test_resize_and_normalisation(tmp_path):
    import numpy as np
    import torch
    from PIL import Image

    from torchdiag.core.image_file import load_rgb
    from torchdiag.diagnostics import gradcam as diag

    arr = np.full((48, 64, 3), 255, dtype=np.uint8)
    path = tmp_path / "white.png"
    Image.fromarray(arr).save(path)
    rgb = load_rgb(path, (32, 32))
    assert rgb.shape == (32, 32, 3)
    x = diag.image_tensor(rgb, (0.5, 0.25, 0.0), (0.25, 0.5, 2.0), torch.device("cpu"))
    assert x.shape == (1, 3, 32, 32)
    assert torch.allclose(x[0, :, 0, 0], torch.tensor([2.0, 1.5, 0.5]))   # (1 - mean) / std


def test_cli_size_option(cli, tmp_path):
    import numpy as np
    from PIL import Image

    path = tmp_path / "big.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 80, 3), dtype=np.uint8)).save(path)
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", path, "--size", "32", "--mean", "0.5,0.5,0.5",
            "--std", "0.5", "--json")
    assert r.code == 0, r.stderr
    assert r.json["image_size"] == "32x32" and "0.5" in r.json["normalisation"]


def test_usage_errors(cli, image, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # CPU-only machine for every case, even on a GPU box
    r = cli("gradcam", REGION, "--layer", "features.3")
    assert r.code == 2 and "--image" in r.stderr
    one_error_line(r)
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", tmp_path / "nope.png")
    assert r.code == 2 and "not found" in r.stderr
    one_error_line(r)
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", tmp_path)   # a sweep: "image file not found"
    assert r.code == 2 and "is a directory" in r.stderr
    one_error_line(r)
    r = cli("gradcam", REGION, "--layer", "feature.3", "--image", image)
    assert r.code == 2 and "features.3" in r.stderr
    one_error_line(r)
    r = cli("gradcam", REGION, "--layer", "head", "--image", image)     # 2-D output
    assert r.code == 2 and "N×C×H×W" in r.stderr
    one_error_line(r)
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", image, "--target-class", "9")
    assert r.code == 2 and "out of range" in r.stderr
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", image, "--mean", "1,2")
    assert r.code == 2
    one_error_line(r)
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", image, "--device", "cuda")
    assert r.code == 2 and "not available" in r.stderr
    one_error_line(r)


def test_the_text_report_needs_no_matplotlib(cli, image, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", image, "--json")
    assert r.code == 0, r.stderr
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", image, "--out", tmp_path / "cam.png")
    assert r.code == 2 and "writing Grad-CAM pictures needs matplotlib" in r.stderr


def test_frozen_model_untouched_and_no_grads(image, untouched):


    model, _ = load("gradcam_region.py:build")
    for p in model.parameters():
        p.requires_grad_(False)
    with untouched(model):
        res = run("gradcam", model, None, layer="features.3", image=str(image))
    assert res.data["heatmap_max"] == pytest.approx(1.0)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.cuda
def test_cuda(cli, image):
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", image, "--device", "cuda")
    assert r.code == 0


@pytest.mark.parametrize("name,message", [
    ("cam.jpg", "unsupported file type '.jpg'"),     # only PNG is written (was PNG bytes named .jpg)
    ("cam", "unsupported file type '(none)'"),
    ("adir", "is a directory"),
    ("missing/cam.png", "does not exist"),            # was created
])
def test_out_path_is_checked_before_loading(cli, image, tmp_path, name, message):
    (tmp_path / "adir").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    r = cli("gradcam", sample("broken_factory.py:raises"), "--layer", "features.3", "--image", image,
            "--out", tmp_path / name)                 # the factory raises: exit 3 if it were loaded
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert r.stderr.startswith("error: --out") and message in r.stderr.splitlines()[0], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_meta_device_needs_real_values(cli, image, tmp_path):
    r = cli("gradcam", REGION, "--layer", "features.3", "--image", image, "--device", "meta",
            "--out", tmp_path / "cam.png")
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert "needs real values" in r.stderr and "--device cpu" in r.stderr
    assert not (tmp_path / "cam.png").exists()


def test_inplace_relu_after_the_layer(untouched):
    """Conv → ReLU(inplace=True) (torchvision VGG/ResNet) with --layer on the conv: was exit 3
    ('a leaf Variable that requires grad is being used in an in-place operation'). Closed form for
    conv → ReLU → global average pool → linear: ∂y_k/∂A_c(i,j) = W[k,c]·[A_c(i,j) > 0]/(h·w)."""
    import torch
    from torch import nn

    from torchdiag.diagnostics import gradcam as diag

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(inplace=True),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3))
    x = torch.rand(1, 3, 8, 8)
    with torch.no_grad():
        a = model[0](x)[0]                                   # C×h×w, before the in-place ReLU
        k = int(model(x)[0].argmax())
    # α_c = mean over h×w of W[k,c]·[A_c > 0]/(h·w)
    alpha = model[4].weight[k].detach() * (a > 0).float().mean(dim=(1, 2)) / (a.shape[1] * a.shape[2])
    expect = torch.relu((alpha[:, None, None] * a).sum(0))
    info = {}
    with untouched(model):
        cam, heat, _, used = diag.grad_cam(model, x, "0", None, info)
    assert used == k and info["calls"] == 1
    assert torch.allclose(cam, expect, atol=1e-6)           # A itself was not changed by the in-place ReLU
    assert heat.min() >= 0 and heat.max() <= 1


def test_resnet_bn1_before_inplace_relu_cli(cli, image):
    r = cli("gradcam", sample("resnet.py:build"), "--layer", "bn1", "--image", image, "--json")
    assert r.code == 0, r.stderr
    assert r.json["heatmap_max"] == pytest.approx(1.0) and r.json["layer_calls"] == 1


def test_layer_called_twice_is_noted(image):
    from torch import nn


    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.head = nn.Linear(3, 2)

        def forward(self, x):
            return self.head(self.conv(self.conv(x)).mean(dim=(2, 3)))

    res = run("gradcam", Twice(), None, layer="conv", image=str(image))
    assert res.data["layer_calls"] == 2 and any("2 times" in n for n in res.notes)


GRAY = '''
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 10))
'''


def test_grayscale_model_with_channels_1(cli, tmp_path, untouched):
    """--channels 1: the image is read as grayscale, normalised with one mean/std; a 1-channel model
    gave exit 3 with a hint about -i, which gradcam does not have."""
    import numpy as np
    import torch
    from PIL import Image


    (tmp_path / "gray.py").write_text(GRAY)
    arr = np.random.default_rng(2).integers(0, 256, (16, 16), dtype=np.uint8)
    Image.fromarray(arr).save(tmp_path / "digit.png")
    spec = f"{tmp_path}/gray.py:build"
    r = cli("gradcam", spec, "--layer", "0", "--image", tmp_path / "digit.png")          # RGB into a 1-channel conv
    assert r.code == 3 and "--channels 1" in r.stderr and "1x3x16x16" in r.stderr, r.stderr
    one_error_line(r)
    r = cli("gradcam", spec, "--layer", "0", "--image", tmp_path / "digit.png", "--channels", "1",
            "--mean", "0.1307", "--std", "0.3081", "--out", tmp_path / "cam.png", "--json")
    assert r.code == 0, r.stderr
    assert r.json["channels"] == "grayscale" and "[0.1307]" in r.json["normalisation"]
    with Image.open(tmp_path / "cam.png") as im:        # 16 px ×12 = 192 per panel, pictures in RGB
        assert im.size == (MARGIN + 3 * 192 + 2 * GAP + BAR, TITLE + NAMES + 192 + MARGIN) and im.mode == "RGB"
    # closed form (conv → GAP → linear): CAM = ReLU(Σ_c W[k,c]·A_c)/(h·w), input (x/255 − m)/s
    ns = {}
    exec(GRAY, ns)
    model = ns["build"]()                                # the same weights (seeded) as the CLI's
    x = ((torch.from_numpy(arr).double() / 255 - 0.1307) / 0.3081).float()[None, None]
    with torch.no_grad():
        a = model[0](x)[0]
        k = int(model(x)[0].argmax())
    expect = torch.relu((model[3].weight[k].detach()[:, None, None] * a).sum(0)) / 256
    with untouched(model):
        res = run("gradcam", model, None, layer="0", image=str(tmp_path / "digit.png"),
                  channels=1, mean=(0.1307,), std=(0.3081,))
    assert res.data["target_class"] == k
    assert np.allclose(res.artefacts["heatmap"], (expect / expect.max()).numpy(), atol=1e-5)


@pytest.mark.parametrize("args,message", [
    (["--channels", "1", "--mean", "0.5,0.5,0.5"], "need 1 number (grayscale), got 3"),
    (["--mean", "0.5,0.5"], "need 3 numbers (R,G,B), got 2"),
    (["--channels", "2"], "--channels: 2 is not 3 (RGB) or 1 (grayscale)"),
    (["--std", "0.5,0,0.5"], "divides by zero"),
    (["--size", "0x4"], "--size: '0x4' is not H or HxW"),
])
def test_preprocessing_options_checked_before_loading(cli, image, args, message):
    r = cli("gradcam", sample("broken_factory.py:raises"), "--layer", "x", "--image", image, *args)
    assert r.code == 2, r.stderr                  # the factory raises: exit 3 if it were loaded
    one_error_line(r)
    assert message in r.stderr.splitlines()[0], r.stderr


def test_readme_picture_is_what_the_code_draws(cli, tmp_path, monkeypatch):
    """docs/images/gradcam.png is the README command's output (docs/images/regenerate.sh), run as the
    script runs it: from the repository root, with the model spec the title shows."""
    from support import ROOT, assert_readme_picture

    monkeypatch.chdir(ROOT)
    out = tmp_path / "cam.png"
    r = cli("gradcam", "sample_models/gradcam_region.py:build", "--layer", "features.3", "--image", "docs/images/sample_input.png",
            "--out", out)
    assert r.code == 0, r.stderr
    assert_readme_picture("gradcam.png", out)


def _png_header_only(path, width, height):
    """A valid PNG header claiming width×height (8-bit RGB) with one tiny IDAT: a decompression bomb
    as far as the header goes, a few dozen bytes on disk."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("width,height", [(30000, 30000), (12000, 12000)])   # beyond PIL's guard; within it, beyond ours
def test_decompression_bomb_is_image_too_large_before_loading(cli, tmp_path, monkeypatch, width, height):
    import torchdiag.diagnostics.gradcam as diag

    monkeypatch.setattr(diag, "memory_limit", lambda: 2 * 2**30)     # the same answer on any machine
    bomb = _png_header_only(tmp_path / "bomb.png", width, height)
    r = cli("gradcam", sample("broken_factory.py:raises"), "--layer", "x", "--image", bomb)   # exit 3 if loaded
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert "image too large" in r.stderr.splitlines()[0] and "Traceback" not in r.stderr


def test_size_is_checked_against_memory_before_loading(cli, image, monkeypatch):
    from torchdiag.errors import OptionError

    r = cli("gradcam", sample("broken_factory.py:raises"), "--layer", "x", "--image", image, "--size", "100000")
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert r.stderr.startswith("error: --size: 100000x100000 pixels would take about"), r.stderr
    with pytest.raises(OptionError, match=r"^size: 100000x100000 pixels"):
        run("gradcam", None, None, layer="x", image=image, size=100000)


def test_preprocessing_is_one_validation_for_every_caller(image, tmp_path):
    """cli/gradcam.py and run() checked channels/mean/std twice and the API reshaped them a third time:
    now Options does it once, for text (the CLI), lists and tuples alike, naming the option per caller."""
    from torchdiag.diagnostics.gradcam import Options
    from torchdiag.errors import OptionError, UsageError

    for mean in ("0.5,0.25,0", [0.5, 0.25, 0], (0.5, 0.25, 0.0)):
        assert Options(layer="l", image=str(image), mean=mean).mean == (0.5, 0.25, 0.0)
    assert Options(layer="l", image=str(image), std=2).std == (2.0, 2.0, 2.0)
    assert Options(layer="l", image=str(image), channels=1, mean=[0.1307]).mean == (0.1307,)
    assert Options(layer="l", image=str(image), size="32x48").size == (32, 48)
    assert Options(layer="l", image=str(image), size=(32, 48)).size == (32, 48)
    for kw, message in (({"mean": [1, 2]}, "mean: '1,2': need 3 numbers (R,G,B), got 2"),
                        ({"std": (0.5, 0, 0.5)}, "std: 0.5,0,0.5: a standard deviation of 0 divides by zero"),
                        ({"channels": 2}, "channels: 2 is not 3 (RGB) or 1 (grayscale)"),
                        ({"mean": "a,b"}, "mean: 'a,b' is not 3 numbers (R,G,B)"),
                        ({"size": "0x4"}, "size: '0x4' is not H or HxW"),
                        ({"target_class": -1}, "target_class: must be ≥ 0"),
                        ({"image": str(tmp_path / "nope.png")}, "image file not found")):
        with pytest.raises(UsageError, match="^" + re.escape(message)):    # OptionError is a UsageError
            Options(**({"layer": "l", "image": str(image)} | kw))
    with pytest.raises(OptionError, match="^out: takes True or False") as e:
        Options(layer="l", image=str(image), out=str(tmp_path / "cam.png"))
    assert "torchdiag.render.gradcam.write_out" in e.value.hint


def test_heatmap_in_artefacts_and_out_written_by_the_renderer(image, tmp_path):
    from PIL import Image

    from torchdiag.render.gradcam import write_out

    model, _ = load("gradcam_region.py:build")
    res = run("gradcam", model, None, layer="features.3", image=image, out=True)
    assert not list(tmp_path.glob("*.png"))[1:]                 # only the input image: nothing written yet
    heat = res.artefacts["heatmap"]
    assert heat.shape == (32, 32) and heat.max() == pytest.approx(1.0)
    assert write_out(res, tmp_path / "cam.png") == str(tmp_path / "cam.png")
    with Image.open(tmp_path / "cam.png") as im:
        assert im.size == (690, 264) and [res.data["out_size"][1], res.data["out_size"][0]] == [690, 264]


def test_a_channels_last_layer_is_read_as_such(image):
    """A sweep: timm's Swin stages output N×H×W×C; a 7×768 "map" was drawn. A layer that permutes a conv's output to
    channels-last explains the class exactly as the conv itself does."""
    import torch
    from torch import nn

    class Last(nn.Module):
        def forward(self, x):
            return x.permute(0, 2, 3, 1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.last, self.head = nn.Conv2d(3, 24, 4, stride=4), Last(), nn.Linear(24, 5)

        def forward(self, x):
            return self.head(torch.relu(self.last(self.conv(x))).mean(dim=(1, 2)))

    torch.manual_seed(0)
    model = Net()
    first = run("gradcam", model, None, layer="conv", image=str(image), target_class=2)
    last = run("gradcam", model, None, layer="last", image=str(image), target_class=2)
    assert last.data["cam_shape"] == first.data["cam_shape"] == [8, 8]
    assert last.data["cam_peak"] == first.data["cam_peak"] and any("channels-last" in n for n in last.notes)
    assert abs(last.data["heatmap_mean"] - first.data["heatmap_mean"]) < 1e-6


@pytest.mark.parametrize("prefix,width", [(0, 24), (1, 24), (2, 24), (0, 64)])
def test_a_vision_transformers_tokens_are_read_as_its_patch_grid(image, prefix, width):
    """A new user's hour: a ViT block's N×197×768 output was refused ("choose a convolutional layer", which a ViT has
    none of after its patch embedding). Tokens after `prefix` class/distillation tokens are the patch grid: a layer
    that flattens a conv's 8×8 map into tokens (row-major, as ViTs do) behind learned prefix tokens explains the class
    exactly as the conv itself does. After the last block a class-token head reads only the prefix: said as such.
    64 tokens beside a width of 64 (a second review: refused as a channel count) are tokens too."""
    import torch
    from torch import nn

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(width))   # a block's own parameter of the width: 64 beside 64 tokens

        def forward(self, x, cls):
            return torch.cat([cls.expand(x.shape[0], -1, -1), x.flatten(2).transpose(1, 2)], 1) * self.scale

    class Net(nn.Module):
        def __init__(self, read_cls=False):
            super().__init__()
            self.conv, self.tokens, self.head = nn.Conv2d(3, width, 4, stride=4), Tokens(), nn.Linear(width, 5)
            self.cls, self.read_cls = nn.Parameter(torch.randn(1, prefix, width)), read_cls

        def forward(self, x):
            t = torch.relu(self.tokens(self.conv(x), self.cls))
            return self.head(t[:, 0] if self.read_cls else t[:, prefix:].mean(1) + t[:, :prefix].sum(1))

    torch.manual_seed(0)
    model = Net()
    conv = run("gradcam", model, None, layer="conv", image=str(image), target_class=2)
    tokens = run("gradcam", model, None, layer="tokens", image=str(image), target_class=2)
    assert tokens.data["cam_shape"] == conv.data["cam_shape"] == [8, 8] and not tokens.findings
    assert tokens.data["cam_peak"] == conv.data["cam_peak"]
    assert abs(tokens.data["heatmap_mean"] - conv.data["heatmap_mean"]) < 1e-6
    assert any("its last 8×8 read as the image's patch grid" in n for n in tokens.notes), tokens.notes
    if prefix:
        torch.manual_seed(0)
        cls_only = run("gradcam", Net(read_cls=True), None, layer="tokens", image=str(image), target_class=2)
        assert [f.code for f in cls_only.findings] == ["empty-cam"] and "reads only its first" in cls_only.findings[0].message


def test_a_one_by_one_map_is_said_to_hold_no_place_and_the_explained_class_is_in_the_table(image):
    """A sweep: a layer after global pooling gave a flat heatmap with a 'peak' of float noise, said as a place; a
    class asked for outside the top 5 had no row."""
    model, _ = load("gradcam_region.py:build")
    res = run("gradcam", model, None, layer="features.3", image=str(image), topk=2, target_class=3)
    rows = res.table("top_classes").rows
    assert len(rows) == 3 and rows[-1]["class"] == 3 and rows[-1]["_mark"] == "◀ explained", rows
    from torch import nn

    pooled = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    res = run("gradcam", pooled, None, layer="1", image=str(image))
    assert [f.code for f in res.findings] == ["no-spatial-map"]


def test_a_pooled_map_whose_channels_match_its_height_is_not_channels_last(image):
    """A review: a CRNN-like 1×16×16×8 map (16 channels, MaxPool2d((2, 4))) was read as channels-last, its
    channels × height drawn. Channels-last needs more channels than height and width."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.MaxPool2d((2, 4)), nn.Conv2d(16, 16, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    res = run("gradcam", model, None, layer="3", image=str(image))
    assert res.data["cam_shape"] == [16, 8] and not any("channels-last" in n for n in res.notes)


TWO_INPUTS = '''
import torch, torch.nn as nn
class Net(nn.Module):   # an image and a timestep
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.emb, self.head = nn.Linear(1, 8), nn.Linear(8, 5)
    def forward(self, x, t):
        h = torch.relu(self.conv1(x)) + self.emb(t.float().view(-1, 1))[:, :, None, None]
        return self.head(torch.relu(self.conv2(h)).mean((2, 3)))
def build():
    return Net()
'''


def test_a_model_taking_more_than_the_image_gets_its_other_inputs(cli, tmp_path, image):
    """A sweep: a model whose forward takes an image and a timestep failed (exit 3, "missing 1 required positional
    argument"). Its example_inputs() give the others, the image in place of their image tensor, each cut to one sample;
    without them, one clear line that says what to define."""
    path = tmp_path / "two.py"
    path.write_text(TWO_INPUTS)
    r = cli("gradcam", f"{path}:build", "--layer", "conv2", "--image", image, "--size", "32", "--device", "cpu")
    assert r.code == 2 and "takes 2 inputs (x, t)" in r.stderr and "example_inputs()" in r.stderr, r.stderr
    one_error_line(r)
    path.write_text(TWO_INPUTS + "def example_inputs():\n    return (torch.randn(4, 3, 32, 32), torch.arange(4))\n")
    r = cli("gradcam", f"{path}:build", "--layer", "conv2", "--image", image, "--size", "32", "--device", "cpu", "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input[0]: 1x3x32x32 float32", "input[1]: 1 int64"], r.json["inputs"]
    # the score is the one of model(image, t[:1]) computed here, on the model built as the command builds it
    import numpy as np
    import torch
    from PIL import Image

    from torchdiag.core.loading import load_model

    model = load_model(f"{path}:build", [], torch.device("cpu"), 0).model.eval()
    x = torch.from_numpy(np.asarray(Image.open(image).convert("RGB"), dtype=np.float32) / 255).permute(2, 0, 1)[None]
    with torch.no_grad():
        logits = model(x, torch.arange(4)[:1])
    assert r.json["target_class"] == int(logits.argmax()) and r.json["score"] == pytest.approx(float(logits.max()),
                                                                                                rel=1e-5)


VIDEO = """
import torch
from torch import nn


def build():
    return nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 5))


def example_inputs():
    return (torch.randn(2, 3, 4, 16, 16),)
"""


FRAMES = """
class Frames(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x):
        if x.dim() == 5:   # N x C x T x H x W: the frames folded into the batch, their scores averaged
            n, c, t, h, w = x.shape
            return self.forward(x.transpose(1, 2).reshape(n * t, c, h, w)).view(n, t, -1).mean(1)
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))
"""


def test_a_model_of_clips_is_refused_as_usage(cli, tmp_path, image):
    """A sweep: torchvision's r3d_18 took the image file as a 4-D tensor that its Conv3d read as an unbatched clip of
    one channel: exit 3 (the model's own code), with a hint to set --size or --channels, neither of which helps."""
    path = tmp_path / "video.py"
    path.write_text(VIDEO)
    r = cli("gradcam", f"{path}:build", "--layer", "0", "--image", image, "--device", "cpu")
    assert r.code == 2 and "still image" in r.stderr and "2x3x4x16x16" in r.stderr, r.stderr
    one_error_line(r)
    # a frame-wise video model (a 2-D CNN on each frame, scores averaged) takes a still image too: mapped (a review)
    path.write_text(VIDEO.replace("def build():", FRAMES + "\n\ndef build():\n    return Frames()\n\n\ndef unused():"))
    r = cli("gradcam", f"{path}:build", "--layer", "conv", "--image", image, "--device", "cpu", "--json")
    assert r.code == 0 and r.json["heatmap_max"] == pytest.approx(1.0), r.stderr
    r = cli("gradcam", f"{path}:build", "--layer", "conv", "--image", image, "--device", "cpu", "-k", "99")
    assert r.code == 2 and "out of range" in r.stderr and "still image" not in r.stderr, r.stderr   # an option's own
    # a one-channel scan model reads the grey image as one unbatched volume, runs, and gives scores of no batch: the
    # same refusal, not "needs (N, classes) scores" alone (a review)
    path.write_text(VIDEO.replace("nn.Conv3d(3, 4", "nn.Conv3d(1, 4").replace("torch.randn(2, 3, 4", "torch.randn(2, 1, 4"))
    r = cli("gradcam", f"{path}:build", "--layer", "0", "--image", image, "--channels", "1", "--device", "cpu")
    assert r.code == 2 and "still image" in r.stderr and "2x1x4x16x16" in r.stderr, r.stderr
    # a scan model whose head is a 1x1x1 convolution gives the image (5, 1) scores: refused before -k is read (a
    # review: "-k 3 is out of range: the model has 1 classes", and without -k "class 0, p=1.000", exit 0)
    path.write_text(VIDEO.replace("nn.Conv3d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), "
                                  "nn.Linear(4, 5)", "nn.Conv3d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv3d(4, 5, 1), "
                                  "nn.AdaptiveAvgPool3d(1), nn.Flatten()").replace("torch.randn(2, 3, 4", "torch.randn(2, 1, 4"))
    for more in ([], ["-k", "3"]):
        r = cli("gradcam", f"{path}:build", "--layer", "0", "--image", image, "--channels", "1", "--device", "cpu", *more)
        assert r.code == 2 and "scores of shape (5, 1), not (1, 5)" in r.stderr, r.stderr


def test_two_image_like_inputs_are_refused_not_guessed(cli, tmp_path, image):
    """A review: a mask (N×1×H×W) before a grayscale image took the image's place, and the map was another's (exit 0).
    Two tensors that could be the image: one clear line. Keyword example inputs and a forward of *args are read too."""
    path = tmp_path / "mask.py"
    path.write_text(textwrap.dedent('''
        import torch, torch.nn as nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(1, 4, 3, padding=1)
                self.head = nn.Linear(4, 3)
            def forward(self, mask, x):
                return self.head(torch.relu(self.conv(x * mask)).mean((2, 3)))
        def build():
            return Net()
        def example_inputs():
            return (torch.ones(2, 1, 32, 32), torch.randn(2, 1, 32, 32))
    '''))
    r = cli("gradcam", f"{path}:build", "--layer", "conv", "--image", image, "--size", "32", "--channels", "1")
    assert r.code == 2 and "cannot tell which is the" in r.stderr, r.stderr
    path.write_text(textwrap.dedent('''
        import torch, torch.nn as nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 4, 3, padding=1)
                self.head = nn.Linear(4 + 2, 3)
            def forward(self, *args, **kwargs):
                h = torch.relu(self.conv(kwargs["pixels"])).mean((2, 3))
                return self.head(torch.cat([h, kwargs["meta"]], 1))
        def build():
            return Net()
        def example_inputs():
            return {"pixels": torch.randn(2, 3, 32, 32), "meta": torch.randn(2, 2)}
    '''))
    r = cli("gradcam", f"{path}:build", "--layer", "conv", "--image", image, "--size", "32", "--json")
    assert r.code == 0 and r.json["inputs"] == ["pixels: 1x3x32x32 float32", "meta: 1x2 float32"], (r.stderr, r.stdout[-300:])


def test_a_block_that_concatenates_branches_keeps_its_map(image):
    """A review: GoogLeNet's inception4a (512×16×16, no parameter of size 512 and one of 16) was drawn as a 512×16 map,
    channels as height. The map is the block's 16×16."""
    import torch
    from torch import nn

    class Inception(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(8, 48, 1), nn.Conv2d(8, 16, 3, padding=1)

        def forward(self, x):
            return torch.cat([self.a(x), self.b(x)], 1)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 2, 2), nn.ReLU(), Inception(), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(64, 10))
    res = run("gradcam", model, None, layer="2", image=str(image))
    assert res.data["cam_shape"] == [16, 16] and not any("channels-last" in n for n in res.notes), res.data


def test_a_layer_without_parameters_keeps_the_map_of_the_convolution_before_it(tmp_path):
    """A sweep: gradcam on a ReLU after a stride-(2, 1) convolution drew an 8×16 "map" (channels as height, said to be
    channels-last) of an N×8×16×64 output; the same tensor at the convolution gave 16×64."""
    import numpy as np
    import torch
    from PIL import Image
    from torch import nn

    path = tmp_path / "wide.png"
    Image.fromarray((np.random.default_rng(0).uniform(0.3, 1.0, (32, 64, 3)) * 255).astype(np.uint8)).save(path)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.act = nn.Conv2d(3, 8, 3, stride=(2, 1), padding=1), nn.ReLU()
            self.conv2, self.fc = nn.Conv2d(8, 64, 3, padding=1), nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(torch.relu(self.conv2(self.act(self.conv1(x)))).mean((2, 3)))

    torch.manual_seed(0)
    model = Net()
    for layer in ("act", "conv1"):
        res = run("gradcam", model, None, layer=layer, image=str(path))
        assert res.data["cam_shape"] == [16, 64] and not any("channels-last" in n for n in res.notes), (layer, res.data)


BUILT_FOR_48 = '''
import torch
from torch import nn


def build():
    layers = []
    for c_in, c_out in [(3, 8), (8, 8), (8, 8), (8, 8)]:   # four stride-2 convolutions: 48 -> 3, 16 -> 1
        layers += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def example_inputs():
    return torch.rand(2, 3, 48, 48)
'''


@pytest.mark.parametrize("own_inputs", [True, False])
def test_an_image_file_is_resized_to_the_models_own_input_size(cli, tmp_path, own_inputs):
    # a sweep: a 32x32 file fed at its own size to timm and torchvision models built for 224 gave seven of them a 1x1
    # map, told "choose a layer before the global pooling" (the layer was before it), and two raised (exit 3)
    import numpy as np
    from PIL import Image

    text = BUILT_FOR_48 if own_inputs else BUILT_FOR_48.split("def example_inputs")[0]
    (tmp_path / "net.py").write_text(textwrap.dedent(text))
    path = tmp_path / "small.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(path)
    r = cli("gradcam", f"{tmp_path / 'net.py'}:build", "--layer", "6", "--image", path, "--json")
    assert r.code == 0, r.stderr
    if own_inputs:   # 48 / 2**4 = 3 rows of the map, as the model is built for
        assert r.json["image_size"].startswith("48x48 (the model's input size: example_inputs()"), r.json["image_size"]
        assert r.json["cam_shape"] == [3, 3] and not r.json["findings"], r.json
    else:            # no input of its own: the file's size, and its 1x1 map is said
        assert r.json["image_size"] == "16x16" and r.json["cam_shape"] == [1, 1], r.json
        assert [f["code"] for f in r.json["findings"]] == ["no-spatial-map"]
        # a new user's hour: a "peak" at a pixel the resize's rounding picked, beside the flat-map warning
        assert r.json["heatmap_peak"] is None and r.json["cam_peak"] is None, r.json
    given = cli("gradcam", f"{tmp_path / 'net.py'}:build", "--layer", "6", "--image", path, "--size", "16", "--json")
    assert given.code == 0 and given.json["image_size"] == "16x16" and given.json["cam_shape"] == [1, 1], given.stderr


def _fake_timm(monkeypatch, mean, std):
    """A `timm` whose one model is a small CNN built from seed 5 and whose pretrained_cfg says 3x32x32, mean, std."""
    import sys
    import types

    import torch
    from torch import nn

    def create_model(name, pretrained=False, **kw):
        torch.manual_seed(5)
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))

    cfg = types.SimpleNamespace(input_size=(3, 32, 32), mean=mean, std=std)
    fake = types.ModuleType("timm")
    fake.list_models, fake.create_model = lambda *a, **k: ["fakenet"], create_model
    fake.models = types.SimpleNamespace(get_pretrained_cfg=lambda name: cfg)
    monkeypatch.setitem(sys.modules, "timm", fake)
    return create_model


@pytest.mark.parametrize("given", [(), ("--mean", "0")])
def test_a_specs_own_normalisation_is_used_unless_given(cli, monkeypatch, image, given):
    """A new user's hour: the image size was read from a timm spec's pretrained_cfg (a torchvision spec's
    transforms()), its mean and std were not: an image fed to loaded weights off their distribution, mean 0 and std 1
    said. The logit is the model's on the image normalised by hand with what was given, else the cfg's."""
    import numpy as np
    import torch
    from PIL import Image

    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    build = _fake_timm(monkeypatch, mean, std)
    r = cli("gradcam", "timm:fakenet", "--layer", "2", "--image", image, "--device", "cpu", "-k", "1", *given, "--json")
    assert r.code == 0, r.stderr
    used_mean = (0.0, 0.0, 0.0) if given else mean
    pixels = torch.tensor(np.asarray(Image.open(image).convert("RGB")), dtype=torch.float32).permute(2, 0, 1) / 255
    x = ((pixels - torch.tensor(used_mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1))[None]
    with torch.no_grad():
        assert r.json["score"] == pytest.approx(float(build("fakenet").eval()(x)[0, 1]), rel=1e-5)
    said = r.json["normalisation"]
    assert f"/ {list(std)}" in said and ("(std: the model's, its pretrained_cfg" if given else "(mean and std: the model's") \
        in said, said


@pytest.mark.parametrize("kind", ["conv1d", "columns"])
def test_a_3d_output_that_is_no_patch_grid_is_refused(image, kind):
    """A review: a Conv1d's N×64×L output (64 channels read as an 8x8 grid) and a transformer over an image's
    columns (N×(2 + 64)×C read as 2 prefix tokens and an 8x8 grid) drew maps; they are refused as before: 64 is the
    layer's channel count, and no Conv2d of the model cuts the image into patches of that grid."""
    import torch
    from torch import nn

    class Rows(nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "conv1d":   # 32x32 RGB as 96 channels of 32 rows, to 64 channels: N×64×32
                self.layer = nn.Conv1d(96, 64, 3, padding=1)
            else:                  # 66 tokens of 8 features from a conv that keeps the image's size
                self.stem, self.layer = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 8)
            self.head = nn.Linear(64 if kind == "conv1d" else 8, 5)

        def forward(self, x):
            if kind == "conv1d":
                return self.head(self.layer(x.permute(0, 1, 3, 2).reshape(x.shape[0], 96, 32)).mean(2))
            t = self.stem(x).flatten(2).transpose(1, 2)[:, :66]
            return self.head(self.layer(t).mean(1))

    torch.manual_seed(0)
    with pytest.raises(Exception, match="Grad-CAM needs N×C×H×W"):
        run("gradcam", Rows(), None, layer="layer", image=str(image), target_class=2)


def test_a_conv1d_beside_a_patchify_stem_is_no_token_grid(image):
    """A third review: with a ConvNeXt-like 4x4 stride-4 stem in the model, a Conv1d's N×64×64 output was read as an
    8x8 grid of tokens (a map uncorrelated with the true one): a convolution's 64 output channels are channels."""
    import torch
    from torch import nn

    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.layer = nn.Conv2d(3, 8, 4, stride=4), nn.Conv1d(8, 64, 3, padding=1)
            self.head = nn.Linear(64, 5)

        def forward(self, x):
            return self.head(self.layer(self.stem(x).flatten(2)).mean(2))   # 32x32 -> 8x8 -> N×8×64 -> N×64×64

    torch.manual_seed(0)
    with pytest.raises(Exception, match="Grad-CAM needs N×C×H×W"):
        run("gradcam", Mixed(), None, layer="layer", image=str(image), target_class=2)


def test_a_parameter_free_token_layer_after_a_patch_conv_of_as_many_channels_is_tokens(image):
    """A fourth review: 64 tokens of width 64 right after the patch Conv2d (a layer without parameters, its input
    made by the conv) were refused as a convolution's channels; N×64×64 after a Conv2d reads as a ViT's tokens, and
    explains the class as the conv does. A Conv1d's channels stay refused (the third review's case)."""
    import torch
    from torch import nn

    class Flat(nn.Module):
        def forward(self, x):
            return x.flatten(2).transpose(1, 2)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.tokens, self.head = nn.Conv2d(3, 64, 4, stride=4), Flat(), nn.Linear(64, 5)

        def forward(self, x):
            return self.head(torch.relu(self.tokens(self.conv(x))).mean(1))

    torch.manual_seed(0)
    model = Net()
    conv = run("gradcam", model, None, layer="conv", image=str(image), target_class=2)
    tokens = run("gradcam", model, None, layer="tokens", image=str(image), target_class=2)
    assert tokens.data["cam_shape"] == conv.data["cam_shape"] == [8, 8] and tokens.data["cam_peak"] == conv.data["cam_peak"]
