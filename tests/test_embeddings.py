"""embeddings: projector files hold exactly the layer's outputs and the batch's labels."""
import pytest

from torchdiag.api import run
from torchdiag.render.embeddings import write_projector

from support import load, one_error_line, sample

CNN = sample("cnn.py:build")

BATCH = '''
import torch
def batch():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(12) % 3
    x = torch.randn(12, 3, 32, 32, generator=g) * 0.2
    for c in range(3):
        x[y == c, c] += 2.0
    return x, y
'''


def _tsv(path):
    import numpy as np

    return np.loadtxt(path, delimiter="\t", ndmin=2)


def test_projector_tensors_equal_layer_output(tmp_path, untouched):
    import numpy as np
    import torch

    model, inputs = load("cnn.py:build")
    with untouched(model):
        res = run("embeddings", model, inputs, layer="head.0")
    assert not list(tmp_path.iterdir())                   # data only: the renderer writes the files
    assert write_projector(res, tmp_path) == str(tmp_path / "embeddings")
    with torch.no_grad():
        model.eval()
        expect = model.features(inputs.args[0]).flatten(1).numpy()
    run_dir = tmp_path / "embeddings"
    assert (run_dir / "projector_config.pbtxt").is_file()
    got = _tsv(run_dir / "00000" / "head.0" / "tensors.tsv")
    assert got.shape == (8, 2048) and np.allclose(got, expect, atol=1e-4)
    assert (run_dir / "00000" / "head.0" / "sprite.png").is_file()      # image inputs → sprite
    assert res.data["samples"] == 8 and res.data["dim"] == 2048 and res.data["labels"] is False


def test_cli_labels_from_batch_function(cli, tmp_path):
    (tmp_path / "data.py").write_text(BATCH)
    r = cli("embeddings", CNN, "--layer", "features", "--batch", f"{tmp_path}/data.py:batch", "--tb", tmp_path / "tb",
            "--images", tmp_path / "img", "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    for key in ("layer", "samples", "dim", "reduction", "labels", "projector_dir", "classes", "samples",
                "nearest_neighbour_same_label", "pca_image", "findings", "exit_code"):
        assert key in doc
    assert doc["samples"] == 12 and doc["dim"] == 32 and doc["reduction"].startswith("global average pool")
    meta = (tmp_path / "tb" / "embeddings" / "00000" / "features" / "metadata.tsv").read_text().split()
    assert meta == [str(i % 3) for i in range(12)]
    import numpy as np
    from PIL import Image

    from torchdiag.pictures import PCA_SIZE

    with Image.open(doc["pca_image"]) as im:
        assert im.format == "PNG" and im.size == (PCA_SIZE[1], PCA_SIZE[0]) == (400, 400)
        text, top = dict(im.text), np.asarray(im.convert("L"))[:46]
    # the command, layer and model: in the PNG's text chunks and drawn in the title band above the plot
    assert text["Title"] == "embeddings · layer features · PCA"
    assert (text["Command"], text["Layer"], text["Model"]) == ("embeddings", "features", CNN) and CNN in text["Description"]
    pcs = doc["pca_explained_variance"]
    assert f"PC1 {pcs[0]:.1%}, PC2 {pcs[1]:.1%}" in text["Description"] and "12 samples × 32 dims" in text["Description"]
    assert (top < 100).sum() > 200


def test_json_keys_are_there_with_one_sample_and_without_labels(cli, tmp_path):
    """A sweep: a batch of one with a label left `nearest_neighbour_same_label` and `classes` out of the JSON (the
    docs list them, null where not measured): a reader's KeyError."""
    (tmp_path / "data.py").write_text(BATCH + "\ndef one():\n    x, y = batch()\n    return x[:1], y[:1]\n")
    doc = cli("embeddings", CNN, "--layer", "features", "--batch", f"{tmp_path}/data.py:one", "--tb", tmp_path / "tb",
              "--json").json
    assert doc["nearest_neighbour_same_label"] is None and doc["classes"] == 1, doc
    doc = cli("embeddings", CNN, "--layer", "features", "-i", "2x3x32x32", "--tb", tmp_path / "tb2", "--json").json
    assert doc["nearest_neighbour_same_label"] is None and doc["classes"] is None and doc["labels"] is False, doc


def test_nearest_neighbour_agreement_closed_form():
    import torch

    from torchdiag.diagnostics.embeddings import nn_agreement, pca_2d, vectors

    x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    assert nn_agreement(x, [0, 0, 1, 1]) == 1.0
    assert nn_agreement(x, [0, 1, 0, 1]) == 0.0
    assert nn_agreement(x, [0, 0, 1, 2]) == 0.5
    # reductions of a token output N×L×D
    t = torch.arange(24.0).view(2, 3, 4)
    assert torch.equal(vectors(t, "first")[0], t[:, 0])
    assert torch.equal(vectors(t, "mean")[0], t.mean(1))
    assert vectors(t, "flatten")[0].shape == (2, 12)
    # points on a line: PC1 explains everything
    line = torch.tensor([[0.0, 0.0], [1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
    coords, frac = pca_2d(line)
    assert frac[0] == pytest.approx(1.0) and frac[1] == pytest.approx(0.0, abs=1e-12)
    assert coords[:, 0].abs().tolist() == pytest.approx([1.5 * 5 ** 0.5, 0.5 * 5 ** 0.5, 0.5 * 5 ** 0.5, 1.5 * 5 ** 0.5])


def test_vit_cls_token(cli, tmp_path):
    r = cli("embeddings", sample("vit.py:build"), "--layer", "ln", "--reduce", "first", "--tb", tmp_path, "--json")
    assert r.code == 0, r.stderr
    assert r.json["dim"] == 64 and r.json["layer_output_shape"] == [2, 17, 64]


def test_usage_errors(cli, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # CPU-only machine for every case, even on a GPU box
    r = cli("embeddings", CNN, "--tb", tmp_path)
    assert r.code == 2 and "--layer" in r.stderr
    one_error_line(r)
    r = cli("embeddings", CNN, "--layer", "head.9", "--tb", tmp_path)
    assert r.code == 2 and "head.0" in r.stderr
    one_error_line(r)
    r = cli("embeddings", CNN, "--layer", "head.0", "--tb", tmp_path, "-i", "8x3x32:float99")
    assert r.code == 2
    one_error_line(r)
    r = cli("embeddings", CNN, "--layer", "head.0", "--tb", tmp_path, "--device", "cuda")
    assert r.code == 2 and "not available" in r.stderr
    one_error_line(r)


@pytest.mark.cuda
def test_cuda(cli, tmp_path):
    r = cli("embeddings", CNN, "--layer", "head.0", "--tb", tmp_path, "--device", "cuda")
    assert r.code == 0


def test_output_folders_checked_before_loading(cli, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for spec in (CNN, sample("broken_factory.py:raises")):     # the factory raises: exit 3 if loaded
        r = cli("embeddings", spec, "--layer", "head.0", "--tb", tmp_path / "runs", "--images", afile)
        assert r.code == 2, r.stderr
        one_error_line(r)
        assert r.stderr.startswith(f"error: --images {afile}: is a file"), r.stderr
        r = cli("embeddings", spec, "--layer", "head.0", "--tb", afile)
        assert r.code == 2, r.stderr
        one_error_line(r)
        assert r.stderr.startswith(f"error: --tb {afile}: is a file"), r.stderr
    assert afile.read_text() == "mine" and not (tmp_path / "runs").exists()


def test_meta_device_needs_real_values(cli, tmp_path):
    r = cli("embeddings", CNN, "--layer", "head.0", "--tb", tmp_path, "--device", "meta")
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert "needs real values" in r.stderr and "--device cpu" in r.stderr
    assert not (tmp_path / "embeddings").exists()


def test_readme_picture_is_what_the_code_draws(cli, tmp_path, monkeypatch):
    """docs/images/embeddings_pca.png is the README command's output (docs/images/regenerate.sh), run as the
    script runs it: from the repository root, with the model spec the title shows."""
    from support import ROOT, assert_readme_picture

    monkeypatch.chdir(ROOT)
    r = cli("embeddings", "sample_models/cnn.py:build", "--layer", "head.0", "--batch", "sample_models/gradcam_region.py:batch",
            "--tb", tmp_path / "runs", "--images", tmp_path / "emb")
    assert r.code == 0, r.stderr
    assert_readme_picture("embeddings_pca.png", tmp_path / "emb" / "embeddings_head.0_pca.png")


def test_bad_options_exit_2_before_loading_and_named_per_caller(cli, tmp_path):
    import torch
    from torch import nn

    from torchdiag.errors import OptionError

    r = cli("embeddings", sample("broken_factory.py:raises"), "--layer", "x", "--reduce", "max", "--tb", tmp_path)
    assert r.code == 2 and r.stderr.startswith("error: --reduce: 'max' is not one of auto, mean, first, flatten"), r.stderr
    one_error_line(r)                                         # the factory raises: exit 3 if it were loaded
    model, x = nn.Sequential(nn.Linear(3, 2)), torch.randn(4, 3)
    with pytest.raises(OptionError, match=r"^reduce: 'max' is not one of"):
        run("embeddings", model, x, layer="0", reduce="max")
    with pytest.raises(OptionError, match=r"^layer: embeddings needs the module"):
        run("embeddings", model, x, layer="")
    import torchdiag

    # torchdiag.embeddings(logdir=) still writes the projector data, through the renderer
    e = torchdiag.embeddings(model, x, layer="0", logdir=tmp_path)
    assert (tmp_path / "embeddings").is_dir() and e.data["projector_dir"] == str(tmp_path / "embeddings")
    with pytest.raises(OptionError, match=r"^reduce: first applies to N×L×D token outputs"):
        run("embeddings", nn.Sequential(nn.Conv2d(3, 2, 1)), torch.randn(2, 3, 4, 4), layer="0", reduce="first")


def test_labels_from_python_and_the_batch_target(tmp_path):
    import torch

    model, inputs = load("cnn.py:build")
    res = run("embeddings", model, inputs, layer="head.0", labels=torch.arange(8) % 2)
    assert res.data["labels"] is True and res.data["classes"] == 2 and res.artefacts["labels"] == [0, 1] * 4
    write_projector(res, tmp_path)
    assert (tmp_path / "embeddings" / "00000" / "head.0" / "metadata.tsv").read_text().split() == ["0", "1"] * 4
    write_projector(res, tmp_path)                             # a second run adds a step
    assert (tmp_path / "embeddings" / "00001" / "head.0" / "tensors.tsv").is_file()
    res = run("embeddings", model, inputs, layer="head.0", target=torch.arange(8) % 4)
    assert res.data["classes"] == 4


def test_one_vector_is_said_to_show_nothing():
    import torch

    from torchdiag.core.inputs import ModelInputs

    model, _ = load("cnn.py:build")
    res = run("embeddings", model, ModelInputs((torch.randn(1, 3, 32, 32),), {}), layer="head.0")
    assert res.data["samples"] == 1 and any(n.startswith("1 vector: the projector needs several") for n in res.notes)
    many = run("embeddings", model, ModelInputs((torch.randn(4, 3, 32, 32),), {}), layer="head.0")
    assert not any("vector:" in n for n in many.notes)


def test_a_layer_followed_by_an_in_place_op_is_written_as_it_output():
    """A sweep: a BatchNorm followed by ReLU(inplace=True) was written after the ReLU (min 0): the hook kept a view of
    the output on the CPU, not a copy, and the ReLU wrote into it."""
    import torch

    model, inputs = load("resnet.py:resnet18", inputs=["2x3x32x32"])
    res = run("embeddings", model, inputs, layer="bn1", reduce="flatten")
    kept = {}

    def keep(module, args, out):
        kept["x"] = out.detach().clone()

    handle = model.bn1.register_forward_hook(keep)
    with torch.no_grad():
        model.eval()
        model(inputs.args[0])
    handle.remove()
    assert float(kept["x"].min()) < 0   # the premise: the BatchNorm's output has negative values the ReLU zeroes
    assert torch.equal(res.artefacts["vectors"], kept["x"].flatten(1))


def test_a_sequence_first_layer_gives_one_vector_per_sample(tmp_path):
    """A sweep: nn.MultiheadAttention(batch_first=False) outputs L×N×D; its 6 per-position means over the batch of 10
    were written as 6 samples. Read as N×L×D: each sample's mean over its own tokens."""
    import torch
    import torch.nn as nn

    from torchdiag.core.inputs import ModelInputs

    class SeqFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.att = nn.Linear(8, 32), nn.MultiheadAttention(32, 4)

        def forward(self, x):
            h = self.proj(x).transpose(0, 1)
            return self.att(h, h, h)[0].transpose(0, 1).mean(1)

    torch.manual_seed(0)
    model, x = SeqFirst(), torch.randn(10, 6, 8)
    res = run("embeddings", model, ModelInputs((x,), {}), layer="att")
    with torch.no_grad():
        h = model.proj(x).transpose(0, 1)
        expect = model.att(h, h, h)[0].mean(0)   # L×N×D: per sample, the mean over its L tokens
    assert res.data["samples"] == 10 and "sequence-first" in res.data["reduction"]
    assert torch.allclose(res.artefacts["vectors"], expect, atol=1e-6)



def _channels_last_model():
    """A stage whose output is N×H×W×C, as timm's Swin stages are (a sweep: Swin's 7×7×768 gave 7-wide vectors,
    pooled over W and the channels)."""
    import torch

    class ChannelsLast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 48, 4, stride=4)
            self.stage = torch.nn.Identity()
            self.head = torch.nn.Linear(48, 5)

        def forward(self, x):
            h = self.stage(self.conv(x).permute(0, 2, 3, 1))   # N×14×14×48 from a 56×56 image
            return self.head(h.mean((1, 2)))

    torch.manual_seed(0)
    return ChannelsLast()


def test_a_channels_last_layer_is_pooled_over_its_height_and_width():
    import torch

    model, x = _channels_last_model(), torch.randn(6, 3, 56, 56)
    res = run("embeddings", model, (x,), layer="stage")
    assert res.data["dim"] == 48 and "channels last" in res.data["reduction"], res.data
    with torch.no_grad():
        want = model.conv(x).permute(0, 2, 3, 1).mean((1, 2))
    assert res.data["mean_norm"] == pytest.approx(float(want.double().norm(dim=1).mean()), rel=1e-5)
    conv = run("embeddings", model, (x,), layer="conv")
    assert conv.data["dim"] == 48 and "channels last" not in conv.data["reduction"]   # N×C×H×W stays as it was


def _side_by_side():
    """Two views of a 64-channel map joined along W: an N×C×H×W output of 56×112 whose C and H sizes have the image's
    aspect, which the aspect alone read as channels last (a review: 112-wide vectors)."""
    import torch

    class SideBySide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 64, 7, 4, 3)
            self.cat = torch.nn.Identity()
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):
            f = self.stem(x).relu()
            return self.head(self.cat(torch.cat([f, f.flip(-1)], -1)).mean((2, 3)))

    torch.manual_seed(0)
    return SideBySide()


def test_an_n_c_h_w_output_is_not_read_as_channels_last_by_its_aspect_alone():
    import torch

    res = run("embeddings", _side_by_side(), (torch.randn(4, 3, 224, 224),), layer="cat")
    assert res.data["dim"] == 64 and "channels last" not in res.data["reduction"], res.data

    class MaskFirst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.feat, self.fc = torch.nn.Conv2d(3, 32, 3, 2, 1), torch.nn.Identity(), torch.nn.Linear(32, 5)

        def forward(self, mask, img):
            return self.fc(self.feat(self.conv(img).relu()).mean((2, 3))) + 0 * mask.sum()

    torch.manual_seed(0)
    res = run("embeddings", MaskFirst(), (torch.ones(6, 1, 10, 10), torch.randn(6, 3, 64, 128)), layer="feat")
    assert res.data["layer_output_shape"] == [6, 32, 32, 64] and res.data["dim"] == 32, res.data


def _concatenating(width: int = 32):
    """An inception-like block: three branches of 128, 96 and 32 channels concatenated into a 256×H×W output. The block
    holds no parameter of size 256 and one of size 32, its height at 256×256 (a review: GoogLeNet's inception3a,
    GhostNet's ghost modules, read as channels last when the parameters decided before the aspect)."""
    import torch
    from torch import nn

    class Inception(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(64, 128, 1), nn.Conv2d(64, 96, 3, padding=1), nn.Conv2d(64, 32, 1)

        def forward(self, x):
            return torch.cat([self.a(x), self.b(x), self.c(x)], 1)

    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 64, 8, 8), nn.ReLU(), Inception(), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(256, 10))


def test_a_block_that_concatenates_branches_is_read_by_its_aspect_first():
    import torch

    model, x = _concatenating(), torch.randn(4, 3, 256, 256)
    res = run("embeddings", model, (x,), layer="2")
    assert res.data["layer_output_shape"] == [4, 256, 32, 32] and res.data["dim"] == 256, res.data
    assert "channels last" not in res.data["reduction"]
    with torch.no_grad():
        want = model[2](model[1](model[0](x))).mean((2, 3))
    assert res.data["mean_norm"] == pytest.approx(float(want.double().norm(dim=1).mean()), rel=1e-5)
    wide = run("embeddings", model, (torch.randn(4, 3, 192, 320),), layer="2")   # 24×40: its 40 not among them
    assert wide.data["dim"] == 256 and "channels last" not in wide.data["reduction"], wide.data


def test_a_channels_last_layer_wider_than_its_channels_is_read_by_its_parameters():
    """A review: Swin's first stage at 448×448 is 112×112×96 (and 56×112×96 at 224×448): its last size is not the
    largest, and the aspect alone read it as N×C×H×W, 56-wide vectors. Its LayerNorm holds 96 and not 112: channels
    last."""
    import torch

    class Stage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.norm = torch.nn.Conv2d(3, 24, 4, stride=4), torch.nn.LayerNorm(24)
            self.head = torch.nn.Linear(24, 5)

        def forward(self, x):
            return self.head(self.norm(self.embed(x).permute(0, 2, 3, 1)).mean((1, 2)))

    torch.manual_seed(0)
    model = Stage()
    for size in ((128, 128), (64, 128)):   # 32×32×24 and 16×32×24: 24 below the height or width
        x = torch.randn(3, 3, *size)
        res = run("embeddings", model, (x,), layer="norm")
        assert res.data["dim"] == 24 and "channels last" in res.data["reduction"], (size, res.data)
        with torch.no_grad():
            want = model.norm(model.embed(x).permute(0, 2, 3, 1)).mean((1, 2))
        assert res.data["mean_norm"] == pytest.approx(float(want.double().norm(dim=1).mean()), rel=1e-5)


def test_a_layer_without_parameters_is_read_by_the_module_that_made_its_input():
    """A sweep: a ReLU after a stride-(2, 1) convolution (8×16×64 from a 32×64 image: the map no longer has the image's
    aspect) in a model whose parameters hold both 8 and 64 was read as channels last: 64-wide vectors of an 8-channel
    output. The convolution that made the ReLU's input holds 8 and not 64."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.act = torch.nn.Conv2d(3, 8, 3, stride=(2, 1), padding=1), torch.nn.ReLU()
            self.conv2, self.fc = torch.nn.Conv2d(8, 64, 3, padding=1), torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(torch.relu(self.conv2(self.act(self.conv1(x)))).mean((2, 3)))

    torch.manual_seed(0)
    res = run("embeddings", Net(), (torch.randn(4, 3, 32, 64),), layer="act")
    assert res.data["layer_output_shape"] == [4, 8, 16, 64] and res.data["dim"] == 8, res.data
    assert "channels last" not in res.data["reduction"]


def test_the_module_before_a_layer_without_parameters_only_vetoes_channels_last():
    """A review: a Linear mixing along the width (MLP-Mixer style) makes the input of a GELU, 8×16×32 on a 16×32
    image: both aspect tests pass, and the Linear holds 32 (the width) and not 8, which read as channels last when
    the module before the layer decided. It only vetoes a channels-last reading: the model's parameters decide."""
    import torch

    class Mix(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.wmix = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(32, 32)
            self.act, self.head = torch.nn.GELU(), torch.nn.Linear(8, 5)

        def forward(self, x):
            return self.head(self.act(self.wmix(self.conv(x))).mean((2, 3)))

    torch.manual_seed(0)
    res = run("embeddings", Mix(), (torch.randn(4, 3, 16, 32),), layer="act")
    assert res.data["layer_output_shape"] == [4, 8, 16, 32] and res.data["dim"] == 8, res.data


def test_a_linear_along_the_width_and_a_channels_last_tie_are_read_right():
    """A review: a Linear mixing along the width of an N×C×H×W map (its own parameters hold the width, not the
    channels) was read as channels last: the convolution that made its input vetoes now, as for a layer without
    parameters. And an N×H×W×C output whose channels equal its height (edgenext's 24×16×24 at a 96×64 image) is read
    by the image's aspect, which only that layout has."""
    import torch

    class Mix(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.wmix, self.head = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(32, 32), torch.nn.Linear(8, 5)

        def forward(self, x):
            return self.head(self.wmix(self.conv(x)).mean((2, 3)))

    class Tie(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.proj, self.head = torch.nn.Conv2d(3, 96, 4, 4), torch.nn.Linear(96, 24), torch.nn.Linear(24, 5)

        def forward(self, x):
            return self.head(self.proj(self.embed(x).permute(0, 2, 3, 1)).mean((1, 2)))

    torch.manual_seed(0)
    res = run("embeddings", Mix(), (torch.randn(4, 3, 16, 32),), layer="wmix")
    assert res.data["layer_output_shape"] == [4, 8, 16, 32] and res.data["dim"] == 8, res.data
    res = run("embeddings", Tie(), (torch.randn(4, 3, 96, 64),), layer="proj")
    assert res.data["layer_output_shape"] == [4, 24, 16, 24] and "channels last" in res.data["reduction"], res.data


def test_a_layer_that_makes_new_channels_is_not_vetoed_by_its_input():
    """A review: Swin-style N×H×W×C stage whose LayerNorm holds 16 channels, the map 16×16 too: fc1 (16 -> 64) made
    64-wide channels-last features, and the LayerNorm that made its input vetoed them as N×C×H×W (16-wide vectors).
    The module before a layer with parameters only vetoes where the layer keeps its input's last size."""
    import torch

    class Stage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.norm = torch.nn.Conv2d(3, 16, 4, 4), torch.nn.LayerNorm(16)
            self.fc1, self.head = torch.nn.Linear(16, 64), torch.nn.Linear(64, 5)

        def forward(self, x):
            return self.head(self.fc1(self.norm(self.embed(x).permute(0, 2, 3, 1))).mean((1, 2)))

    torch.manual_seed(0)
    res = run("embeddings", Stage(), (torch.randn(4, 3, 64, 64),), layer="fc1")
    assert res.data["layer_output_shape"] == [4, 16, 16, 64] and res.data["dim"] == 64, res.data
    assert "channels last" in res.data["reduction"]


def test_a_source_models_default_inputs_give_the_projector_several_samples(cli, tmp_path):
    """A new user's hour: `embeddings hf:... --layer ... --tb` at defaults wrote one vector (the default batch of 1 of
    a command that does not train), and the projector had nothing to show. A source's defaults take 16 samples here;
    the header says why."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=32)
    cfg.architectures = ["BertModel"]
    cfg.save_pretrained(tmp_path / "bert")
    r = cli("embeddings", f"hf:{tmp_path / 'bert'}", "--layer", "pooler", "--tb", tmp_path / "tb", "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    assert doc["samples"] == 16 and doc["inputs"][0].startswith("input[0]: 16x"), doc["inputs"]
    assert "batch 16: the command compares samples" in doc["input_source"]
