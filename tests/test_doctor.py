"""doctor: each broken sample model is caught by its own check, naming the exact culprit."""
import math

import pytest
import torch
from torch import nn

from support import load, sample

DOCTOR = "doctor"


def doc(cli, name, *extra):
    r = cli(DOCTOR, sample(name), "--json", *extra)
    assert r.stdout.strip(), r.stderr
    return r, r.json


def found(d, code):
    return [f for f in d["findings"] if f["code"] == code]


def row(d, check_id):
    return next(r for r in d["checks"] if r["id"] == check_id)


def run_diag(model, inputs, **kw):
    from torchdiag.api import run

    return run(DOCTOR, model, inputs, **kw)


# ---------------------------------------------------------------- healthy model: all checks pass
def test_healthy_mlp_passes_with_true_input_stats(cli):
    r, d = doc(cli, "mlp.py:build")
    assert r.code == 0 and d["exit_code"] == 0
    assert not [f for f in d["findings"] if f["severity"] in ("error", "warning")]
    assert {x["id"] for x in d["checks"]} == {"device", "inplace", "modes", "batchnorm", "determinism", "update",
                                              "frozen", "dtype", "inputs", "target"}
    assert all(x["status"] == "ok" for x in d["checks"]), d["checks"]
    for key in ("checks", "input_stats", "findings", "notes", "schema_version"):
        assert key in d
    # independent truth: example_inputs() is torch.randn(16, 784) under seed 0
    torch.manual_seed(0)
    x = torch.randn(16, 784).double()
    (s,) = d["input_stats"]
    assert s["input"] == "input[0]" and s["shape"] == "16x784" and s["non_finite"] == 0
    assert s["min"] == pytest.approx(float(x.min()), abs=1e-6)
    assert s["max"] == pytest.approx(float(x.max()), abs=1e-6)
    assert s["mean"] == pytest.approx(float(x.mean()), abs=1e-9)
    assert s["std"] == pytest.approx(float(x.std()), abs=1e-9)
    assert "6/6 params change" in row(d, "update")["verdict"]  # 3 Linear layers: 3 weights + 3 biases


# ---------------------------------------------------------------- device
def test_tensor_created_without_device_is_caught_on_cpu_only_machine(cli):
    model, inputs = load("broken_doctor_device.py:build")
    inputs.call(model)  # on the CPU the bug is silent: forward works
    r, d = doc(cli, "broken_doctor_device.py:build")
    assert r.code == 1
    (f,) = found(d, "device-mismatch")
    assert f["severity"] == "error" and f["where"] == "pos" and "LearnedPositions" in f["message"]
    assert "device=x.device" in f["hint"]
    assert row(d, "device")["where"] == "pos"


@pytest.mark.parametrize("spec, code", [("cnn.py:build", 0), ("broken_doctor_device.py:build", 1)])
def test_the_meta_rebuild_runs_at_the_dtype_asked(cli, spec, code):
    """A sweep: under --dtype bfloat16 the factory's float32 rebuild met the cast inputs ("Input type (BFloat16) and
    bias type (float) should be the same"), and the device check was skipped on every model with a conv bias."""
    r, d = doc(cli, spec, "--dtype", "bfloat16")
    assert r.code == code and row(d, "device")["status"] == ("ok" if code == 0 else "error"), row(d, "device")
    assert bool(found(d, "device-mismatch")) == (code == 1)


def test_a_model_that_treats_meta_specially_is_confirmed_on_fake_cuda(cli, tmp_path):
    # LongT5's pattern: positions on the weight's device, except on meta (device=None): the meta run mixes
    # devices, a run with the weights as fake CUDA tensors does not, so there is no device finding
    (tmp_path / "meta_aware.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class MetaAware(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.w = nn.Linear(8, 8)\n\n"
        "    def forward(self, x):\n"
        "        dev = self.w.weight.device if self.w.weight.device.type != 'meta' else None\n"
        "        return self.w(x) + torch.arange(8, device=dev).float()\n\n"
        "def build():\n    return MetaAware()\n\n"
        "def example_inputs():\n    return (torch.randn(4, 8),)\n")
    r = cli("doctor", f"{tmp_path / 'meta_aware.py'}:build", "--json", "--device", "cpu")
    assert r.code == 0 and not found(r.json, "device-mismatch"), r.json["findings"]
    assert row(r.json, "device")["status"] == "ok" and "fake CUDA" in row(r.json, "device")["verdict"]


class _MatmulCpu(nn.Module):
    def forward(self, x):
        return x @ torch.ones(x.shape[-1], 3)   # meta alone lets meta @ cpu through; CUDA would not


def test_device_guard_catches_op_meta_itself_allows():
    model = nn.Sequential(nn.Linear(4, 4), _MatmulCpu())
    from torchdiag.core.inputs import ModelInputs

    res = run_diag(model, ModelInputs((torch.randn(2, 4),)))
    (f,) = [f for f in res.findings if f.code == "device-mismatch"]
    assert f.where == "1" and "aten.mm" in f.message


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 8, batch_first=True)

    def forward(self, x):
        h0 = torch.zeros(1, x.shape[0], 8)       # made here, used (and rejected) inside self.rnn
        return self.rnn(x, h0)[0]


class _PlainAttribute(nn.Module):
    def __init__(self):
        super().__init__()
        self.mask = torch.ones(4)                # not a buffer: model.to(device) leaves it behind

    def forward(self, x):
        return x * self.mask


def test_device_mismatch_names_the_creator_not_the_consumer():
    from torchdiag.core.inputs import ModelInputs

    res = run_diag(nn.Sequential(nn.Linear(4, 4), _Encoder()), ModelInputs((torch.randn(2, 3, 4),)))
    (f,) = [f for f in res.findings if f.code == "device-mismatch"]
    assert f.where == "1" and "_Encoder" in f.message and "1x2x8" in f.message and "used in 1.rnn (GRU)" in f.message


class _PaddingMask(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2)

    def forward(self, x):
        mask = torch.zeros(x.shape[1], x.shape[0], dtype=torch.bool)   # the bug: no device=
        mask[:, 3:] = True
        return self.attn(x, x, x, key_padding_mask=mask, need_weights=False)[0]


def test_device_mismatch_names_the_user_tensor_not_the_one_torch_derives_from_it():
    """A helper: the device-mismatch named MultiheadAttention for a 4x4x1x12 float mask that torch's attention builds
    from the user's key_padding_mask, made without device= in the model's own forward: the line to fix is the mask's."""
    from torchdiag.core.inputs import ModelInputs

    res = run_diag(_PaddingMask(), ModelInputs((torch.randn(5, 2, 8),)))
    (f,) = [f for f in res.findings if f.code == "device-mismatch"]
    assert f.where == "(root)" and "(_PaddingMask) creates a 2x5 tensor" in f.message, (f.where, f.message)
    assert "used in attn (MultiheadAttention)" in f.message, f.message


class _Masked(nn.Module):
    """Boolean-mask indexing (nonzero: no meta kernel), then a tensor made without device= (the bug, or not)."""

    def __init__(self, bug):
        super().__init__()
        self.lin, self.bug = nn.Linear(8, 4), bug

    def forward(self, x):
        kept = self.lin(x[x[:, 0] > 0])
        if self.bug == "sized":   # the bug with a size only the data tells: torch's fake run calls it u0
            return kept + torch.arange(kept.shape[0])[:, None]
        return kept.sum(0) + (torch.ones(4) if self.bug else torch.ones(4, device=x.device))


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="fake CUDA tensors need a CUDA build of torch (no GPU)")
@pytest.mark.parametrize("bug", [True, False, "sized"])
def test_a_masked_forward_that_meta_cannot_run_is_checked_on_fake_cuda(bug):
    """A sweep: every torch_geometric GCNConv/GATConv model skipped the device check (a boolean mask's nonzero has no
    meta kernel) and the run said PASS over a tensor made without device=. The fake-CUDA run now gives such ops a
    symbolic size (a shape environment): the bug is caught, the healthy model is ok."""
    from torchdiag.core.inputs import ModelInputs

    res = run_diag(_Masked(bug), ModelInputs((torch.randn(16, 8, generator=torch.Generator().manual_seed(0)),)))
    found = [f for f in res.findings if f.code == "device-mismatch"]
    assert bool(found) == bool(bug), [f.to_dict() for f in res.findings]
    assert row(res.to_dict(), "device")["status"] == ("error" if bug else "ok"), row(res.to_dict(), "device")
    assert not any("u0" in f.message for f in found), [f.message for f in found]   # a review: "a u0x1 tensor"


def test_plain_tensor_attribute_left_behind_by_to():
    from torchdiag.core.inputs import ModelInputs

    res = run_diag(nn.Sequential(nn.Linear(4, 4), _PlainAttribute()), ModelInputs((torch.randn(2, 4),)))
    (f,) = [f for f in res.findings if f.code == "device-mismatch"]
    assert f.where == "1" and "plain tensor attribute" in f.message and "register_buffer" in f.hint


def test_parameters_spread_over_devices():
    from torchdiag.core.inputs import ModelInputs

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[1].to("meta")
    res = run_diag(model, ModelInputs((torch.randn(2, 4),)))
    spread = [f for f in res.findings if f.code == "device-mismatch"]
    assert [f.where for f in spread] == ["1"]
    assert "weight, bias on meta" in spread[0].message and "cpu: 2" in spread[0].message
    assert res.exit_code == 1


# ---------------------------------------------------------------- in-place
def test_inplace_edit_names_the_editing_module(cli):
    r, d = doc(cli, "broken_doctor_inplace.py:build")
    assert r.code == 1
    (f,) = found(d, "inplace-autograd")
    assert f["where"] == "shift" and "InplaceShift" in f["message"]
    assert "saved for backward by act" in f["message"]   # Sigmoid saved its output
    assert row(d, "update")["status"] == "skipped"


def test_inplace_relu_after_sigmoid_is_named():
    from torchdiag.core.inputs import ModelInputs

    model = nn.Sequential(nn.Linear(5, 6), nn.Sigmoid(), nn.ReLU(inplace=True), nn.Linear(6, 2))
    res = run_diag(model, ModelInputs((torch.randn(3, 5),)))
    (f,) = [f for f in res.findings if f.code == "inplace-autograd"]
    assert f.where == "2" and "ReLU" in f.message and "saved for backward by 1" in f.message


class _OutOfMemoryInBackward(torch.autograd.Function):
    failed = False

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        _OutOfMemoryInBackward.failed = True
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")


class _RunsOutOfMemory(nn.Module):
    """A backward out of memory, and every forward after it (as efficientnet_b7 at 600² under a 16 GiB cap)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 2)

    def forward(self, x):
        if _OutOfMemoryInBackward.failed and torch.is_grad_enabled():
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")
        return _OutOfMemoryInBackward.apply(self.fc(x))


def test_a_backward_out_of_memory_is_said_as_such_not_as_an_in_place_search():
    # a zoo row: efficientnet_b7's doctor exited 3 on "forward in train mode (locating the in-place edit) failed"
    from torchdiag.core.inputs import ModelInputs
    from torchdiag.errors import ModelError

    _OutOfMemoryInBackward.failed = False
    with pytest.raises(ModelError) as exc:
        run_diag(_RunsOutOfMemory(), ModelInputs((torch.randn(3, 5),)))
    assert "can't allocate memory" in exc.value.message and "locating the in-place edit" not in exc.value.message


# ---------------------------------------------------------------- modes
def test_batchnorm_batch_one_fails_in_train_mode(cli):
    r, d = doc(cli, "broken_doctor_batchnorm.py:build")
    assert r.code == 1
    (f,) = found(d, "batchnorm-batch-1")
    assert f["severity"] == "error" and f["where"] == "bn" and "batch size 1" in f["message"]
    # the other training checks still ran, on a batch of 2; the device check kept its eval-mode run
    assert row(d, "update")["status"] == "ok" and "batch of 2" in d["notes"][0]
    assert row(d, "device")["status"] == "ok"


def test_batchnorm_batch_one_probe_notes_when_batch_is_larger(cli):
    """A batch of 1 that would raise is info: whether the loader makes one is not doctor's to see, and the failure is
    loud (issue 32: a port's 750 samples in batches of 16 never make one, and doctor warned); `data --model` says."""
    r, d = doc(cli, "broken_doctor_batchnorm.py:build", "-i", "4x20")
    assert r.code == 0
    (f,) = found(d, "batchnorm-batch-1")
    assert f["severity"] == "info" and f["where"] == "bn" and "data --model" in f["message"]
    (m,) = found(d, "mode-dependent")
    assert m["severity"] == "info" and m["where"] == "bn" and "BatchNorm1d" in m["message"]


@pytest.mark.parametrize("seen", [0, 50])
def test_the_mode_difference_says_when_batchnorm_statistics_had_seen_no_batch(seen):
    """A sweep: timm's mobileone_s0 as built had "max |train − eval| output difference 1.197e+15 ... as designed", read
    as a broken model: its eval output normalised with running statistics that had seen no batch. Said where they had
    not (counts read, not names); a model whose statistics saw batches is said as before. The model is untouched."""
    from torchdiag.api import run

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    with torch.no_grad():
        for _ in range(seen):
            model(torch.randn(8, 8) * 50 + 20)
    (f,) = [f for f in run("doctor", model, torch.randn(8, 8) * 50 + 20).findings if f.code == "mode-dependent"]
    assert ("had seen no batch" in f.message) == (seen == 0), f.message
    assert int(model[1].num_batches_tracked) == seen


def test_trained_statistics_loaded_without_their_count_are_not_said_fresh():
    """A review: a trained model's checkpoint saved without num_batches_tracked loads its trained statistics beside a
    count of 0, and doctor said they "had seen no batch". The values are asked too."""
    from torchdiag.api import run

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    with torch.no_grad():
        for _ in range(50):
            model(torch.randn(8, 8) * 50 + 20)
    model[1].num_batches_tracked.zero_()   # as a state dict without the key leaves it
    (f,) = [f for f in run("doctor", model, torch.randn(8, 8) * 50 + 20).findings if f.code == "mode-dependent"]
    assert "had seen no batch" not in f.message, f.message


class _NormThenMean(nn.Module):
    """StarNet's end: BatchNorm2d over the last feature map, then the mean of its positions, then the head. `act`
    between them (a ReLU, as in most CNNs) keeps what the sample was."""

    def __init__(self, act: bool, dropout: float = 0.0):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.act = nn.ReLU() if act else nn.Identity()
        self.drop, self.head = nn.Dropout(dropout), nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.drop(self.act(self.bn(self.conv(x))).mean((2, 3))))


@pytest.mark.parametrize("act, dropout", [(False, 0.0), (False, 0.5), (True, 0.0)])
def test_a_batch_of_one_that_erases_the_input_is_a_warning(act, dropout):
    """A sweep: timm's starnet_s050 in train mode at batch 1 gives the head norm.bias whatever the image (BatchNorm
    over one sample's positions, then their mean); doctor said "train mode works even with batch size 1". With dropout
    the pair runs under one seed; with a ReLU between them the sample is kept, and nothing is said."""
    torch.manual_seed(0)
    model, x = _NormThenMean(act, dropout), torch.randn(4, 3, 8, 8)
    with torch.no_grad():   # the premise, in plain torch: one sample at a time, the same output (dropout off)
        model.train()
        model.drop.eval()
        same = torch.allclose(model(x[:1]), model(x[1:2]), atol=1e-6)
        model.train()
    assert same != act
    r = _doctor_findings(model, x)
    f = [f for f in r.findings if f.code == "batchnorm-batch-1"]
    if act:
        assert not f
        return
    assert f[0].severity == "warning" and "the output does not depend on the input" in f[0].message, f[0].message


def test_your_own_batch_of_one_that_erases_the_input_is_an_error():
    """A sweep: mobilevitv2 at -i 1x3x256x256 had "train-mode forward works with batch size 1", then param-not-updated
    errors blaming a gate or dtype: at that batch the output does not depend on the input. The sample and a perturbed
    copy are compared; with a ReLU between norm and mean the row stays ok."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    f = [f for f in _doctor_findings(_NormThenMean(act=False), x).findings if f.code == "batchnorm-batch-1"]
    assert f and f[0].severity == "error" and "at your batch size of 1" in f[0].message, [g.to_dict() for g in f]
    assert not [f for f in _doctor_findings(_NormThenMean(act=True), x).findings if f.code == "batchnorm-batch-1"]


class _TextNormThenMean(nn.Module):
    """Ids through an embedding, a Conv1d, BatchNorm1d, then the mean over time (a text CNN's end)."""

    def __init__(self):
        super().__init__()
        self.emb, self.conv = nn.Embedding(100, 8), nn.Conv1d(8, 8, 3, padding=1)
        self.bn, self.head = nn.BatchNorm1d(8), nn.Linear(8, 2)

    def forward(self, ids):
        return self.head(self.bn(self.conv(self.emb(ids).transpose(1, 2))).mean(2))


@pytest.mark.parametrize("case", ["ids", "no-running-stats", "bfloat16"])
def test_the_erasure_is_found_for_ids_without_running_stats_and_in_bfloat16(case):
    """A review: integer inputs were skipped (only float samples compared), a BatchNorm without running statistics
    erases in eval mode too (the reference then), and bfloat16's rounding sat above a float32 threshold."""
    torch.manual_seed(0)
    if case == "ids":
        model, x = _TextNormThenMean(), torch.randint(0, 100, (4, 20))
    else:
        model, x = _NormThenMean(act=False), torch.randn(4, 3, 8, 8)
        if case == "no-running-stats":
            model.bn = nn.BatchNorm2d(8, track_running_stats=False)
        else:
            model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    f = [f for f in _doctor_findings(model, x).findings if f.code == "batchnorm-batch-1"]
    assert f and "the output does not depend on the input" in f[0].message, [g.to_dict() for g in f]


def test_nondeterministic_eval_names_the_module(cli):
    r, d = doc(cli, "broken_doctor_nondeterministic.py:build")
    assert r.code == 1
    (f,) = found(d, "nondeterministic-eval")
    assert f["where"] == "noise" and "AlwaysDropout" in f["message"]
    (m,) = found(d, "mode-dependent")
    assert m["where"] == "drop" and "Dropout" in m["message"]


# ---------------------------------------------------------------- parameters
def test_params_with_gradient_that_never_update(cli):
    r, d = doc(cli, "broken_doctor_not_updated.py:build")
    assert r.code == 1
    fs = found(d, "param-not-updated")
    assert {f["where"] for f in fs} == {"gate.scale", "head.bias"}
    by = {f["where"]: f["message"] for f in fs}
    assert "writes the old value back" in by["gate.scale"] and "all zeros" in by["head.bias"]


def test_frozen_backbone_listed_by_module(cli):
    r, d = doc(cli, "broken_doctor_frozen.py:build")
    assert r.code == 0
    (f,) = found(d, "frozen")
    assert f["severity"] == "info" and f["where"] == "backbone"
    assert f"({16 * 32 + 32 + 32 * 32 + 32:,} params)" in f["message"]
    assert d["frozen_params"] == [{"module": "backbone", "params": 1600, "frozen": "all parameters"}]


# ---------------------------------------------------------------- dtypes
def test_float64_parameter_promotes_output(cli):
    r, d = doc(cli, "broken_doctor_dtype.py:build")
    assert r.code == 1
    (f,) = found(d, "dtype-mismatch")
    assert f["where"] == "norm.gain" and f["severity"] == "error" and "promotes the output to float64" in f["message"]
    assert "float32: 136, float64: 8" in f["message"]    # 16*8+8 float32, 8 float64


def test_input_dtype_differs_from_parameters(cli):
    r, d = doc(cli, "mlp.py:build", "-i", "16x784:float64")
    assert r.code == 1
    (f,) = found(d, "dtype-mismatch")
    assert f["where"] == "input[0]" and "float64" in f["message"] and "float32" in f["message"]
    (ff,) = found(d, "forward-fails")
    assert ff["where"] == "0"


# ---------------------------------------------------------------- inputs and targets
def test_unnormalised_image_input(cli):
    r, d = doc(cli, "broken_doctor_unnormalised.py:build")
    assert r.code == 0
    (f,) = found(d, "unnormalised-input")
    assert f["severity"] == "warning" and f["where"] == "input[0]"
    torch.manual_seed(0)
    x = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8).double()
    s = d["input_stats"][0]
    assert (s["min"], s["max"]) == (float(x.min()), float(x.max()))
    assert s["mean"] == pytest.approx(float(x.mean()))


class _Scaled(nn.Module):
    """Raw pixels in, scaled by the model itself before its first convolution (a Keras Lambda(x / 255 - 0.5))."""

    def __init__(self, scale=True):
        super().__init__()
        self.scale, self.conv = scale, nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x / 255 - 0.5 if self.scale else x).mean((2, 3))


def _doctor_findings(model, *inputs):
    from torchdiag.api import run

    return run("doctor", model, inputs if len(inputs) > 1 else inputs[0])


def test_raw_pixels_the_model_scales_itself_are_info_naming_what_its_first_weighted_layer_sees():
    torch.manual_seed(0)
    x = torch.randint(0, 256, (4, 3, 16, 16)).float()
    r = _doctor_findings(_Scaled(), x)
    (f,) = [f for f in r.findings if f.code == "unnormalised-input"]
    most = float((x / 255 - 0.5).abs().max())    # truth: what conv receives, an affine image of the input
    assert f.severity == "info" and f"conv, sees |x| ≤ {most:.4g} (correlation 1 with" in f.message, f.message
    flat = nn.Sequential(nn.Flatten(), _Div255(), nn.Linear(3 * 16 * 16, 2))   # flattened first: same values
    assert [f.severity for f in _doctor_findings(flat, x).findings if f.code == "unnormalised-input"] == ["info"]


class _Div255(nn.Module):
    def forward(self, x):
        return x / 255


class _TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, image, side):
        return self.fc(side) + image.mean()


def test_raw_pixels_that_reach_the_first_weighted_layer_or_cannot_be_traced_stay_a_warning():
    torch.manual_seed(0)
    x = torch.randint(0, 256, (4, 3, 16, 16)).float()
    raw = [f for f in _doctor_findings(_Scaled(scale=False), x).findings if f.code == "unnormalised-input"]
    assert [f.severity for f in raw] == ["warning"] and f"conv, sees |x| ≤ {float(x.max()):.4g}" in raw[0].message
    # the first weighted layer reads another tensor (not the image's values): nothing says the image is scaled
    other = _doctor_findings(_TwoInputs(), x, torch.rand(4, 4))
    assert [f.severity for f in other.findings if f.code == "unnormalised-input"] == ["warning"]



class _Squashed(nn.Module):
    """Review cases: the first weighted layer sees small values that are not the image scaled."""

    def __init__(self, how):
        super().__init__()
        self.how, self.a, self.b = how, nn.Conv2d(3, 4, 3), nn.Conv2d(3, 4, 3)

    def forward(self, x):
        if self.how == "branch":      # one branch scaled, the other reads raw pixels
            return (self.a(x / 255) + self.b(x)).mean((2, 3))
        if self.how == "constant":    # a layer first called on a constant of the image's size
            return (self.a(torch.zeros_like(x)) + self.b(x)).mean((2, 3))
        squash = {"tanh": torch.tanh, "clamp": lambda t: t.clamp(0, 1), "sigmoid": torch.sigmoid}[self.how]
        return self.a(squash(x)).mean((2, 3))   # squashed, not scaled: the pixels' information is gone


@pytest.mark.parametrize("how", ["branch", "constant", "tanh", "clamp", "sigmoid"])
def test_raw_pixels_squashed_or_read_raw_by_another_layer_stay_a_warning(how):
    torch.manual_seed(0)
    x = torch.randint(0, 256, (4, 3, 16, 16)).float()
    found = [f for f in _doctor_findings(_Squashed(how), x).findings if f.code == "unnormalised-input"]
    assert [f.severity for f in found] == ["warning"], found[0].message



def test_target_out_of_range_from_batch_function(cli):
    spec = sample("broken_doctor_target.py:batch")
    r, d = doc(cli, "broken_doctor_target.py:build", "--batch", spec)
    assert r.code == 1
    (f,) = found(d, "target-out-of-range")
    # labels arange(16) % 10 + 1: values 1..10, only i = 9 gives 10
    assert f["where"] == "output" and "[1, 10]" in f["message"] and "10 classes" in f["message"]
    assert "1 of 16 targets" in f["message"] and "subtract 1" in f["hint"]
    assert row(d, "update")["status"] == "ok"   # training checks still ran, on random targets


def test_non_finite_input():
    from torchdiag.core.inputs import ModelInputs

    x = torch.randn(4, 6)
    x[0, 1] = float("nan")
    x[2, 3] = float("inf")
    res = run_diag(nn.Linear(6, 3), ModelInputs((x,)))
    (f,) = [f for f in res.findings if f.code == "non-finite-input"]
    assert f.where == "input[0]" and "2 of 24" in f.message


# ---------------------------------------------------------------- contract
@pytest.mark.parametrize("name", ["broken_doctor_not_updated.py:build", "broken_doctor_batchnorm.py:build",
                                  "broken_doctor_nondeterministic.py:build", "cnn.py:build",
                                  "broken_doctor_inplace.py:build"])
def test_model_untouched(untouched, name):
    from torchdiag.core.context import prepare
    from torchdiag.core.run import RunSpec
    from torchdiag.diagnostics import doctor
    from torchdiag.runner.local import invoke

    # as the CLI runs it: the context carries the factory, so the device check rebuilds it on meta
    model, inputs, ctx = prepare(RunSpec(DOCTOR, model=sample(name), device="cpu", caller="python"))
    assert ctx.factory is not None
    model.train()
    with untouched(model):
        invoke(doctor, model, inputs, doctor.Options(), ctx)


def test_bad_input_is_exit_2_one_line(cli):
    r = cli(DOCTOR, sample("mlp.py:build"), "-i", "16xabc")
    assert r.code == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout


def test_cuda_on_cpu_only_machine_is_exit_2(cli, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a CPU-only machine, even on a GPU box
    r = cli(DOCTOR, sample("mlp.py:build"), "--device", "cuda")
    assert r.code == 2 and "error: device 'cuda' is not available" in r.stderr and "Traceback" not in r.stderr


def test_model_raising_is_exit_3_naming_module(cli):
    r = cli(DOCTOR, sample("broken_shape.py:build"))
    assert r.code == 3 and "2.0 (Linear)" in r.stderr


def test_table_and_tensorboard(cli, tmp_path):
    r = cli(DOCTOR, sample("broken_doctor_inplace.py:build"), "--tb", tmp_path)
    assert r.code == 1
    assert "Checklist" in r.stdout and "inplace-autograd" in r.stdout and "shift" in r.stdout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "doctor"))
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert any("doctor/checks" in t for t in tags) and any("doctor/findings" in t for t in tags)


@pytest.mark.cuda
def test_device_mismatch_on_real_gpu(cli):
    r, d = doc(cli, "broken_doctor_device.py:build", "--device", "cuda")
    assert r.code == 1
    assert [f["where"] for f in found(d, "device-mismatch")] == ["pos"]


# ---------------------------------------------------------------- every forward is behind the error boundary
FLAKY = '''
import torch
from torch import nn


class Flaky(nn.Module):
    """Raises on its `raise_on`-th call; with inplace=True it also edits a tensor saved for backward."""

    def __init__(self, raise_on, inplace):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.raise_on, self.inplace, self.calls = raise_on, inplace, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.raise_on:
            raise RuntimeError(f"flaky on call {self.calls}")
        y = torch.sigmoid(self.lin(x))
        if self.inplace:
            y.add_(1.0)          # sigmoid saved its output: backward fails
        return y


def build(raise_on=0, inplace=False):
    return nn.Sequential(nn.Linear(4, 4), Flaky(raise_on, inplace))


def empty():
    return nn.Sequential()


def frozen():
    return nn.Sequential(nn.Linear(4, 3)).requires_grad_(False)


def example_inputs():
    return (torch.randn(8, 4),)
'''


def _one_error_line(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    return lines[0]


@pytest.fixture
def flaky(tmp_path):
    path = tmp_path / "flaky.py"
    path.write_text(FLAKY)
    return str(path)


# doctor's forwards on the working copy, in order: eval (1), determinism (2, 3), train (4), then the
# forward after the optimizer step (5) — or, when backward fails in place, the locating forward (5)
@pytest.mark.parametrize("raise_on,inplace", [(2, False), (3, False), (4, False), (5, False), (5, True)])
def test_model_raising_on_a_later_forward_is_exit_3_naming_the_module(cli, flaky, raise_on, inplace):
    args = ["--arg", f"raise_on={raise_on}"] + (["--arg", "inplace=True"] if inplace else [])
    r = cli(DOCTOR, f"{flaky}:build", *args)
    assert r.code == 3, r.stderr
    line = _one_error_line(r)
    assert "failed in 1 (Flaky)" in line and f"flaky on call {raise_on}" in line, line
    r = cli(DOCTOR, f"{flaky}:build", *args, "--json")
    assert r.code == 3 and r.json["exit_code"] == 3 and "1 (Flaky)" in r.json["error"]["message"]


def test_inplace_sample_still_located_through_the_boundary(cli, flaky):
    r, d = doc(cli, "broken_doctor_inplace.py:build")
    assert r.code == 1 and found(d, "inplace-autograd")
    r = cli(DOCTOR, f"{flaky}:build", "--arg", "inplace=True", "--json")
    assert r.code == 1
    (f,) = found(r.json, "inplace-autograd")
    assert f["where"] == "1"


@pytest.mark.parametrize("factory", ["empty", "frozen"])
def test_no_trainable_parameters_skips_backward_checks(cli, flaky, factory):
    r = cli(DOCTOR, f"{flaky}:{factory}", "--json")
    assert r.code == 0, r.stderr
    d = r.json
    for check in ("inplace", "update"):
        assert row(d, check)["status"] == "skipped" and row(d, check)["verdict"] == "no trainable parameters"
    assert not [f for f in d["findings"] if f["severity"] == "error"]
    assert row(d, "determinism")["status"] == "ok"
    if factory == "frozen":
        assert found(d, "frozen")[0]["severity"] == "warning"      # the other findings still decide
    r = cli(DOCTOR, f"{flaky}:{factory}")
    assert r.code == 0 and "no trainable parameters" in r.stdout and "error:" not in r.stderr


class _NoisyEval(nn.Module):
    """No Dropout/BatchNorm, no self.training: adds fresh noise on every call, in both modes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x + torch.randn(x.shape))


def test_random_forward_is_not_blamed_on_self_training():
    from torchdiag.core.inputs import ModelInputs

    res = run_diag(nn.Sequential(_NoisyEval()), ModelInputs((torch.randn(5, 4),)))
    (f,) = [f for f in res.findings if f.code == "nondeterministic-eval"]
    assert f.where == "0"
    assert not [f for f in res.findings if f.code == "mode-dependent"]   # the code never reads self.training
    modes = next(r for r in res.tables[0].rows if r["id"] == "modes")
    assert modes["status"] == "skipped" and "random" in modes["verdict"]


def test_dropout_at_p_zero_is_not_called_no_dropout():
    """A sweep: a Hugging Face model with every dropout at 0.0 read "no Dropout/BatchNorm; train = eval output" beside
    its Dropout modules; they are there, and idle."""
    from torchdiag.core.inputs import ModelInputs

    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0), nn.Linear(4, 2), nn.Dropout(p=0))
    modes = next(r for r in run_diag(model, ModelInputs((torch.randn(5, 4),))).tables[0].rows if r["id"] == "modes")
    assert modes["status"] == "ok" and modes["verdict"].startswith("no active Dropout/BatchNorm (2 Dropout with p=0)")
    plain = nn.Sequential(nn.Linear(4, 2))
    modes = next(r for r in run_diag(plain, ModelInputs((torch.randn(5, 4),))).tables[0].rows if r["id"] == "modes")
    assert modes["verdict"] == "no Dropout/BatchNorm; train = eval output"


class _MetaOdd(nn.Module):
    """On meta or fake CUDA tensors its forward adds a tensor of another shape, as transformers' mask builder does on
    meta (a sweep: nystromformer)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y + torch.zeros(3, 5, device=y.device) if y.device.type != "cpu" else y


def test_a_failed_fake_cuda_run_logs_nothing_of_torchs_own(capfd, caplog):
    """A sweep: doctor on nystromformer printed 74 lines of torch's fake-tensor error log ("failed while attempting
    to run meta for aten.add.Tensor", a traceback) while its row said the meta run was skipped."""
    from torchdiag.api import run

    r = run("doctor", _MetaOdd(), torch.randn(2, 4))
    row = next(row for row in r.tables[0].rows if row["id"] == "device")
    assert row["status"] == "skipped" and "meta" in row["verdict"], row
    err = capfd.readouterr().err
    assert "failed while attempting" not in err and "Traceback" not in err, err
    logged = [rec.getMessage() for rec in caplog.records if rec.name.startswith("torch._subclasses")]
    assert not logged, logged[:1]


# ---------------------------------------------------------------- run contract: options, Python API
def test_bad_run_option_is_exit_2_before_the_model_loads(cli, tmp_path):
    raising = tmp_path / "raising.py"
    raising.write_text("def build():\n    raise RuntimeError('the factory ran')\n")
    for spec in (f"{raising}:build", str(tmp_path / "missing.py") + ":build"):
        r = cli(DOCTOR, spec, "--seed", "-1")
        assert r.code == 2, r.stderr
        assert _one_error_line(r).startswith("error: --seed:") and "factory ran" not in r.stderr
        assert "not found" not in r.stderr


def test_python_keywords_named_in_python_terms():
    import torchdiag
    from torchdiag.errors import OptionError, UsageError

    model, x = nn.Linear(4, 2), torch.randn(3, 4)
    with pytest.raises(OptionError) as e:
        torchdiag.doctor(model, x, lr=-1.0)
    assert e.value.message.startswith("lr:")
    with pytest.raises(OptionError) as e:
        torchdiag.doctor(model, x, seed=-1)
    assert e.value.message.startswith("seed:")
    with pytest.raises(UsageError) as e:
        torchdiag.doctor(model, x, steps=3)
    assert "steps" in e.value.message


def test_python_api_target_and_optimizer_come_from_the_run(untouched):
    import torchdiag

    model = nn.Sequential(nn.Linear(6, 5))
    x = torch.randn(8, 6)
    with untouched(model):
        r = torchdiag.doctor(model, x, target=torch.arange(8) % 5 + 1, optimizer="sgd", lr=0.1)
    (f,) = [f for f in r.findings if f.code == "target-out-of-range"]
    assert "[1, 5]" in f.message and "5 classes" in f.message
    update = next(row for row in r.tables[0].rows if row["id"] == "update")
    assert update["verdict"] == "2/2 params change after 1 SGD step"
    assert r.exit_code == 1


def test_an_ignore_label_in_segmentation_targets_is_named_as_one():
    """A sweep: 255 pixels (VOC's unlabelled) gave `target-out-of-range` with the hint "give the last layer 256
    outputs"; the fix is the loss's ignore_index."""
    import torchdiag

    model = nn.Conv2d(3, 5, 1)
    y = torch.randint(0, 5, (2, 4, 4), generator=torch.Generator().manual_seed(0))
    y[:, 0] = 255
    r = torchdiag.doctor(model, torch.randn(2, 3, 4, 4), target=y)
    (f,) = [f for f in r.findings if f.code == "target-out-of-range"]
    assert "ignore_index=255" in f.hint and "256 outputs" not in f.hint, f.hint


def test_an_additive_mask_given_as_an_input_is_not_bad_data():
    """A sweep: a causal LM given torch's 0/-inf square-subsequent mask as a forward input failed doctor with
    non-finite-input ("clean the data"); ±Inf with no NaN is a mask, info, and the pass's own rows judge the rest."""
    import torchdiag

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(50, 16), nn.Linear(16, 50)
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 1)

        def forward(self, ids, mask):
            return self.head(self.enc(self.emb(ids), mask=mask))

    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    r = torchdiag.doctor(LM(), (ids, nn.Transformer.generate_square_subsequent_mask(16)))
    assert r.exit_code == 0 and "inf-input" in {f.code for f in r.findings}, [(f.code, f.message) for f in r.findings]


def test_default_optimizer_is_adam_lr_1e3():
    from torchdiag.core.run import OptimizerSpec
    from torchdiag.diagnostics import doctor

    assert doctor.OPTIMIZER == OptimizerSpec("adam", lr=1e-3) and doctor.NEEDS_VALUES is False


def test_meta_device_runs_the_static_checks_and_skips_the_rest(cli):
    r, d = doc(cli, "broken_doctor_device.py:build", "--device", "meta")
    assert r.code == 1
    assert [f["where"] for f in found(d, "device-mismatch")] == ["pos"]
    for check in ("inplace", "modes", "batchnorm", "determinism", "update", "target"):
        assert row(d, check)["status"] == "skipped" and "meta" in row(d, check)["verdict"]


# ---------------------------------------------------------------- classifications come from facts
class _EditsItsWeight(nn.Module):
    """Edits its own parameter in forward: fine under no_grad (eval), refused by autograd in train."""

    def __init__(self, how):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))
        self.how = how

    def forward(self, x):
        if torch.is_grad_enabled():
            if self.how == "iadd":
                self.w += 0.0
            elif self.how == "setitem":
                self.w[0] = 1.0
            else:
                torch.nn.functional.relu(self.w, inplace=True)
        return x * self.w


@pytest.mark.parametrize("how", ["iadd", "setitem", "functional"])
def test_inplace_on_a_leaf_in_train_forward_is_named(how):
    res = run_diag(nn.Sequential(nn.Linear(4, 4), _EditsItsWeight(how)), torch.randn(3, 4))
    (f,) = [f for f in res.findings if f.code == "inplace-autograd"]
    assert f.where == "1" and "_EditsItsWeight" in f.message
    assert next(r for r in res.tables[0].rows if r["id"] == "update")["status"] == "skipped"


class _SaysBatchNorm(nn.Module):
    """Not a BatchNorm, but raises BatchNorm's words in train mode: its own bug, not batchnorm-batch-1."""

    def forward(self, x):
        if self.training:
            raise ValueError("Expected more than 1 value per channel when training, got input size [1, 4]")
        return x


def test_error_text_alone_does_not_make_a_batchnorm_finding():
    from torchdiag.errors import ModelError

    with pytest.raises(ModelError) as e:
        run_diag(nn.Sequential(nn.Linear(4, 4), _SaysBatchNorm()), torch.randn(1, 4))
    assert "forward in train mode failed in 1 (_SaysBatchNorm)" in e.value.message


class _BackwardRaises(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("one of the variables needed for gradient computation has been modified by an "
                           "inplace operation (not really)")


class _CustomBackward(nn.Module):
    def forward(self, x):
        return _BackwardRaises.apply(x)


def test_backward_failure_without_an_inplace_edit_is_the_models_error():
    from torchdiag.errors import ModelError

    with pytest.raises(ModelError) as e:
        run_diag(nn.Sequential(nn.Linear(4, 4), _CustomBackward()), torch.randn(3, 4))
    assert e.value.message.startswith("backward failed:")
    checks = {r["id"]: r for r in e.value.partial.tables[0].rows}
    assert checks["inplace"]["verdict"] == "not run"


class _ToDouble(nn.Module):
    def forward(self, x):
        return x.double()


class _RaisesAboutDevices(nn.Module):
    def forward(self, x):
        raise RuntimeError("Expected all tensors to be on the same device, but found cpu and meta (dtype float64)")


def test_forward_failure_elsewhere_is_not_blamed_on_the_dtype_finding():
    from torchdiag.errors import ModelError

    # float64 parameters, a float32 input: a dtype-mismatch error. The input is cast before it meets
    # them, and the forward then fails for its own reason (whatever its message says)
    model = nn.Sequential(_ToDouble(), _RaisesAboutDevices(), nn.Linear(4, 2).double())
    with pytest.raises(ModelError) as e:
        run_diag(model, torch.randn(3, 4))
    assert "forward (eval mode) failed in 1 (_RaisesAboutDevices)" in e.value.message
    (f,) = [f for f in e.value.partial.findings if f.code == "dtype-mismatch"]
    assert f.severity == "error" and f.where == "input[0]"


# ------------------------------------- by design at initialisation: looks broken at init, is not (info only)
def _by_design(factory: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("by_design", sample("by_design.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, factory)()


@pytest.mark.parametrize("factory, shape, sources", [
    ("zero_head", (2, 8), {"head"}),
    # each block's own zero-initialised norm, said once over the stack (a sweep: 16 lines on resnet50)
    ("zero_residual", (2, 3, 8, 8), {"blocks"}),
])
def test_zero_initialised_parameter_is_not_param_not_updated(factory, shape, sources, untouched):
    import torchdiag.api

    model, x = _by_design(factory), torch.randn(*shape)
    with untouched(model):
        res = torchdiag.api.run("doctor", model, (x,))
    assert res.exit_code == 0 and not [f for f in res.findings if f.severity == "error"]
    zi = [f for f in res.findings if f.code == "zero-init"]
    assert {f.where for f in zi} == sources and all(f.severity == "info" for f in zi)
    assert all(("each block's own zero-initialised module, in 2 of the 2 modules of blocks (0–1), at 4" if f.where == "blocks"
                else "initialised to exactly zero") in f.message for f in zi), [f.message for f in zi]
    if sources == {"blocks"}:   # every parameter it covers, of both blocks
        assert {m.split(".")[1] for m in zi[0].members} == {"0", "1"}
    row = next(r for r in res.table("checks").rows if r["id"] == "update")
    assert row["status"] == "info" and row["code"] == "zero-init"


def test_stochastic_depth_off_for_the_training_checks():
    import torchdiag.api

    res = torchdiag.api.run("doctor", _by_design("drop_path"), (torch.randn(2, 8),))
    assert res.exit_code == 0 and "stochastic depth off for the training checks (6 module(s))" in res.notes
    assert not [f for f in res.findings if f.code == "param-not-updated"]


def test_nested_fast_path_output_does_not_crash(cli):
    # nn.TransformerEncoder in eval with a padding mask: nested tensors inside (and out of) the model
    for spec in ("nested_fastpath.py:nested_output", "nested_fastpath.py:build"):
        r = cli("doctor", sample(spec), "--json")
        assert r.code == 0, (spec, r.stdout[-500:], r.stderr[-500:])
    from torchdiag.diagnostics.doctor.determinism import _fingerprint
    from torchdiag.diagnostics.doctor.shared import max_diff, scale

    nested = torch.nested.nested_tensor([torch.ones(3, 2), -2 * torch.ones(1, 2)])
    # sum and sum of |x| over its values, the order-sensitive sum (a flip: the test below), no non-finite value
    fp = [float(v) for v in _fingerprint(nested)]
    assert fp[:2] == [6.0 - 4.0, 6.0 + 4.0] and fp[3] == 0 and len(fp) == 4
    assert max_diff(nested, nested) == 0.0 and scale({"h": nested}) == 2.0


def test_fingerprint_in_pieces_matches_the_whole_tensor():
    # the CPU fingerprints a tensor piece by piece (heap fragmentation: timm convmixer_768_32 reached 14 GB);
    # the sums, the ±1 pattern's sum and the non-finite count must be those of the whole tensor, computed here
    # independently in numpy with the pattern repeated from the tensor's first element
    import numpy as np

    from torchdiag.diagnostics.doctor import determinism as det

    n = int(det.CPU_PIECE * 2.5) + 7
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    x[5], x[det.CPU_PIECE + 3], x[-1] = float("inf"), float("nan"), -float("inf")
    det._fingerprint(torch.zeros(1))   # builds the pattern
    w = det._PATTERNS[(torch.device("cpu"), torch.float64)].numpy()
    v = np.where(np.isfinite(x.double().numpy()), x.double().numpy(), 0.0)
    truth = [v.sum(), np.abs(v).sum(), (v * np.resize(w, n)).sum(), 3.0]
    fp = [float(f) for f in det._fingerprint(x)]
    assert np.allclose(fp, truth, rtol=1e-12, atol=1e-6), (fp, truth)
    # a swap of two unequal values in different pieces, at positions whose pattern signs differ, is seen
    i = next(i for i in range(det.CPU_PIECE, 2 * det.CPU_PIECE) if w[i % det.WEIGHTS] != w[10] and x[i] != x[10])
    y = x.clone()
    y[10], y[i] = x[i], x[10]
    assert not det._same_fp(fp, [float(f) for f in det._fingerprint(y)])
    # sums that overflow across pieces (float64 near its range): inf as a tensor sum gives, no exception
    import math

    big = torch.full((2 * det.CPU_PIECE,), 1e302, dtype=torch.float64)   # each piece's sum finite, both: not
    fp = det._fingerprint(big)
    assert fp[0] == math.inf and fp[1] == math.inf and fp[3] == 0, fp


def test_a_gate_at_initialisation_is_not_param_not_updated(untouched):
    # issue 26 (timm cait_xxs24_224): patch blocks read only through class-attention blocks, each branch
    # under a 1e-6 layer scale: two gates multiply, the gradients of norm1.weight are ~1e-13 and Adam's
    # first step (≈ lr·g/eps) rounds away in float32. A short training run grows the gates and they move.
    import torchdiag.api

    from conftest import load_module

    model, x = load_module("by_design_gates.py").cait_like(1e-6), torch.randn(2, 3, 16, 16)
    with untouched(model):
        res = torchdiag.api.run("doctor", model, (x,))
    assert res.exit_code == 0 and not [f for f in res.findings if f.severity in ("error", "warning")], \
        [f.message for f in res.findings if f.severity != "info"]
    gated = [f for f in res.findings if f.code == "by-design-init"]
    assert any(f.where == "blocks.0.gamma_1" and "blocks.0.norm1.weight" in f.message for f in gated), gated
    assert all("do not change after 1 Adam step at initialisation" in f.message and "after 3 steps" in f.message
               for f in gated)
    row = next(r for r in res.table("checks").rows if r["id"] == "update")
    assert row["status"] == "info" and row["code"] == "by-design-init"
    assert any("optimizer steps on the same batch" in n for n in res.notes)



def test_a_cpu_kernel_stays_caught_when_confirmed_on_fake_cuda(cli, tmp_path):
    # a kernel made in forward without device= and passed to conv2d: torch's fake conv does not check devices,
    # so the confirming fake-CUDA run must (its own guard), or this bug would pass
    (tmp_path / "blur.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Blur(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.conv = nn.Conv2d(3, 3, 3, padding=1)\n\n"
        "    def forward(self, x):\n"
        "        kernel = torch.ones(3, 1, 3, 3) / 9\n"
        "        return torch.nn.functional.conv2d(self.conv(x), kernel, padding=1, groups=3)\n\n"
        "def build():\n    return Blur()\n\n"
        "def example_inputs():\n    return (torch.randn(2, 3, 8, 8),)\n")
    r = cli("doctor", f"{tmp_path / 'blur.py'}:build", "--json", "--device", "cpu")
    assert r.code == 1
    (f,) = found(r.json, "device-mismatch")
    assert "3x1x3x3 tensor" in f["message"]


class NoiseFed(nn.Module):
    """A GAN vocoder in miniature: the forward draws its noise itself (UnivNet), then only deterministic layers."""

    def __init__(self):
        super().__init__()
        self.pre, self.post = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.post(torch.tanh(self.pre(x + torch.randn_like(x))))


class ShuffledEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x)[:, torch.randperm(x.shape[1])]     # ViLT's visual_embed draws its patches' order


class Shuffled(nn.Module):
    """ViLT in miniature: `embed` draws the order of the tokens; sums over them do not see it."""

    def __init__(self):
        super().__init__()
        self.embed, self.mix, self.head = ShuffledEmbedding(), nn.Linear(4, 4), nn.Linear(6 * 4, 2)

    def forward(self, x):
        return self.head(self.mix(self.embed(x)).flatten(1))


@pytest.mark.parametrize("model, where", [(NoiseFed, "(root)"), (Shuffled, "embed")])
def test_nondeterministic_eval_names_where_the_runs_part(model, where):
    # the forward that draws the noise, not the first layer it feeds; a permutation, which every sum misses
    from torchdiag.api import run

    torch.manual_seed(0)
    res = run("doctor", model(), torch.randn(2, 6, 4))
    (f,) = [f for f in res.findings if f.code == "nondeterministic-eval"]
    assert f.where == where, f.message
    # samples drawn in eval (randn_like, randperm) may be the model's design: a warning naming the ops, not a failure
    # (a sweep: a VAE's reparameterisation failed doctor)
    assert f.severity == "warning" and "draws samples in eval (rand" in f.message and res.exit_code == 0


def test_dropout_on_in_eval_or_a_state_that_moves_stays_an_error():
    from torchdiag.api import run

    class HandDropout(nn.Module):     # F.dropout's own defaults: training=True
        def forward(self, x):
            return torch.nn.functional.dropout(x, 0.3)

    class DropPath(nn.Module):   # transformers' ConvNextDropPath, left on: keep_prob + torch.rand, floored
        def forward(self, x):
            mask = (0.8 + torch.rand(x.shape[0], 1)).floor_()
            return x.div(0.8) * mask

    class RandMask(nn.Module):   # a hand-made mask (a review), and a coin flip per unit
        def forward(self, x):
            return x * (torch.rand_like(x) > 0.3) * torch.bernoulli(torch.full_like(x, 0.9))

    torch.manual_seed(0)
    for model in (nn.Sequential(nn.Linear(4, 4), HandDropout()), nn.Sequential(Flip(), nn.Linear(4, 2)),
                  nn.Sequential(nn.Linear(4, 4), DropPath()), nn.Sequential(nn.Linear(4, 4), RandMask())):
        res = run("doctor", model, torch.randn(2, 4))
        (f,) = [f for f in res.findings if f.code == "nondeterministic-eval"]
        assert f.severity == "error" and "draws samples" not in f.message and res.exit_code == 1


class Flip(nn.Module):
    """A random flip left on in eval, at an image size where a position ramp's sum barely moves."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x.flip(-1) if self.calls % 2 == 0 else x


class Recursive(nn.Module):
    """Calls itself once on every other call: the two runs' call structures differ inside it."""

    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(4, 4), 0

    def forward(self, x, depth=0):
        self.calls += depth == 0
        return self(self.lin(x), 1) if depth == 0 and self.calls % 2 == 0 else self.lin(x)


def test_nondeterministic_eval_sees_a_flip_and_a_call_structure_that_differs():
    from torchdiag.api import run

    torch.manual_seed(0)
    flip = nn.Sequential(Flip(), nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 2))
    (f,) = [f for f in run("doctor", flip, torch.randn(1, 3, 224, 224)).findings if f.code == "nondeterministic-eval"]
    assert f.where == "0", f.message
    outer = nn.Sequential(nn.Linear(4, 4), Recursive())
    (g,) = [f for f in run("doctor", outer, torch.randn(2, 4)).findings if f.code == "nondeterministic-eval"]
    assert g.where == "1" and "(Recursive)" in g.message, g.message


class SparseOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x).relu().to_sparse()


class ComplexNaN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        h = self.lin(x)
        return h, torch.complex(h, h * float("nan"))


class InfSource(nn.Module):
    """Noise in eval next to an inf: the sums of the output are inf in both runs."""

    def forward(self, x):
        out = x + 1e-2 * torch.randn_like(x)
        out[:, 0] = float("inf")
        return out


class InfHolder(nn.Module):
    def __init__(self):
        super().__init__()
        self.src, self.lin = InfSource(), nn.Linear(8, 2)

    def forward(self, x):
        h = self.src(x)
        return self.lin(h[:, 1:].repeat(1, 2)[:, :8])


@pytest.mark.parametrize("model, where", [(ComplexNaN, None), (InfHolder, "src")])
def test_nondeterministic_eval_on_complex_and_non_finite_outputs(model, where):
    # a complex NaN equals itself (no false alarm), and an inf does not hide the noise beside it (the culprit is
    # the module that draws it)
    from torchdiag.api import run

    torch.manual_seed(0)
    res = run("doctor", model(), torch.randn(2, 8))
    found = [f.where for f in res.findings if f.code == "nondeterministic-eval"]
    assert found == ([] if where is None else [where]), [f.message for f in res.findings]


def test_a_sparse_output_is_compared_as_its_values():
    from torchdiag.diagnostics.doctor.determinism import _fingerprint, _same_fp
    from torchdiag.diagnostics.doctor.shared import max_diff

    torch.manual_seed(0)
    out = SparseOut().eval()(torch.randn(2, 8))
    assert max_diff(out, out) == 0.0 and max_diff(out, out * 2) > 0
    dense = [float(v) for v in _fingerprint(out.to_dense())]
    assert [float(v) for v in _fingerprint(out)] == dense and _same_fp(dense, dense)
    assert max_diff(out.to_sparse_csr(), out.to_sparse_csr()) == 0.0


# ---------------------------------------------------------------- a forward that writes into its input
class _Doubles(nn.Module):
    """Writes into the caller's tensor before its layer: every forward sees twice the last one's input."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x.mul_(2)
        return self.fc(x)


def test_a_forward_that_writes_into_its_input_is_a_warning_not_a_random_eval():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    first = x.clone()
    d = run_diag(_Doubles(), x).to_dict()
    # the two eval forwards each got the first values: bit-identical, no nondeterministic-eval
    assert not found(d, "nondeterministic-eval") and row(d, "determinism")["status"] == "ok"
    (f,) = found(d, "edits-input")
    assert f["severity"] == "warning" and f["where"] == "(root)" and "input[0]" in f["message"]
    assert d["exit_code"] == 0
    # the statistics are of the values the user gave, not of a doubled tensor
    (s,) = d["input_stats"]
    assert s["max"] == pytest.approx(float(first.max()), abs=1e-6)


def test_edits_input_names_the_module_that_writes():
    model = nn.Sequential(nn.ReLU(inplace=True), nn.Linear(8, 4))
    d = run_diag(model, torch.randn(4, 8)).to_dict()
    (f,) = found(d, "edits-input")
    assert f["where"] == "0" and "written in 0" in f["message"]


def test_a_forward_that_reads_its_input_only_has_no_edits_input():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 4))   # in place on its own values
    d = run_diag(model, torch.randn(4, 8)).to_dict()
    assert not found(d, "edits-input") and row(d, "inputs")["status"] == "ok"


class _Branchy(nn.Module):
    def __init__(self):
        from support import load_module

        super().__init__()
        drop_path = load_module("by_design.py").DropPath   # timm's, as the samples write it
        self.a, self.drop, self.b = nn.Linear(8, 8), drop_path(0.5), nn.Linear(8, 2)

    def forward(self, x):
        return self.b(x + self.drop(self.a(x)))


def test_stochastic_depth_is_a_mode_dependent_module_not_ok():
    """A sweep: swin_t's 12 StochasticDepth (turned off for the training checks) read "no Dropout/BatchNorm;
    train = eval output", though its train and eval outputs differ (0.29, measured by hand)."""
    torch.manual_seed(0)
    model, x = _Branchy(), torch.randn(16, 8)
    outs = [model.train()(x), model.eval()(x)]
    assert (outs[0] - outs[1]).abs().max() > 0   # the truth: train and eval differ
    r = run_diag(model, x)
    (f,) = [f for f in r.findings if f.code == "mode-dependent"]
    assert "1 DropPath make train and eval outputs differ" in f.message and "stochastic depth off" in f.message
    # a sweep: the difference measured with them off (0) was printed as if it were theirs (swin_tiny)
    assert "(not measured: the outputs were compared with stochastic depth off)" in f.message, f.message


@pytest.mark.parametrize("end, loss, found", [(nn.Softmax(dim=1), "auto", True), (nn.Identity(), "auto", False),
                                             (nn.LogSoftmax(dim=1), "auto", False),
                                             (nn.Softmax(dim=1), "mse", False)])
def test_a_softmax_before_cross_entropy_is_said(end, loss, found):
    """A sweep: doctor passed a model ending in a softmax (only overfit-batch warned); log_softmax is harmless (it is
    its own log_softmax), and a loss that is not cross-entropy reads probabilities on purpose."""
    from torchdiag.api import run

    torch.manual_seed(0)
    res = run("doctor", nn.Sequential(nn.Linear(8, 6), end), torch.randn(4, 8), loss=loss)
    got = [f for f in res.findings if f.code == "softmax-before-cross-entropy"]
    assert bool(got) == found, [f.to_dict() for f in res.findings]
    if found:   # soft targets (distillation): auto trains the probabilities by mse, which reads them as they are
        soft = run("doctor", nn.Sequential(nn.Linear(8, 6), end), torch.randn(4, 8),
                   target=torch.softmax(torch.randn(4, 6), 1))
        assert "softmax-before-cross-entropy" not in {f.code for f in soft.findings}
    if found:
        assert got[0].severity == "warning" and f"cannot fall below {math.log(1 + 5 / math.e):.4g}" in got[0].message


class LoRA(nn.Module):
    """peft's recipe: a frozen base, a random A and a zero B in the same module."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.base = nn.Linear(d_in, d_out).requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(2, d_in) * 0.1)
        self.lora_B = nn.Parameter(torch.zeros(d_out, 2))

    def forward(self, x):
        return self.base(x) + x @ self.lora_A.t() @ self.lora_B.t()


class ReZero(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ff, self.alpha = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d)), nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return x + self.alpha * self.ff(x)


class LoRANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.head = LoRA(8, 16), LoRA(16, 4)

    def forward(self, x):
        return self.head(torch.nn.functional.gelu(self.fc1(x)))


def test_zero_init_names_the_gate_beside_or_above_the_parameters():
    """A sweep: LoRA's lora_A was said to sit upstream of the next layer ("fc2, initialised to exactly zero"), and
    ReZero's attention of block 0 upstream of block 1."""
    from torchdiag.api import run

    torch.manual_seed(0)
    lora = LoRANet()
    zi = {f.where: f for f in run("doctor", lora, torch.randn(4, 8)).findings if f.code == "zero-init"}
    assert set(zi) == {"fc1", "head"}, [f.message for f in zi.values()]
    assert "(fc1.lora_A)" in zi["fc1"].message
    assert "upstream of fc1, whose lora_B is initialised to exactly zero" in zi["fc1"].message
    rezero = nn.Sequential(*[ReZero(8) for _ in range(3)], nn.Linear(8, 2))
    (f,) = [f for f in run("doctor", rezero, torch.randn(4, 8)).findings if f.code == "zero-init"]
    assert f.where == "(root)" and sorted(f.members) == sorted(n for n, _ in rezero.named_parameters() if ".ff." in n)
    assert "each block's own alpha, at exactly zero: blocks 0–2 of the model" in f.message, f.message


class ZeroHeadAndBias(nn.Module):
    """A zero head, and a zero output bias held by the root itself (a review: the root, an ancestor of every module,
    was named the gate)."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 2)
        nn.init.zeros_(self.head.weight)
        self.out_bias = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return self.head(self.body(x)) + self.out_bias


def test_the_roots_own_zero_parameter_is_not_every_modules_gate():
    from torchdiag.api import run

    torch.manual_seed(0)
    (f,) = [f for f in run("doctor", ZeroHeadAndBias(), torch.randn(4, 8)).findings if f.code == "zero-init"]
    assert f.where == "head" and "upstream of head, whose weight" in f.message, f.message


class LayerDrop(nn.Module):
    """HF's LayerDrop in miniature: in train mode each layer is skipped at random (Wav2Vec2's layerdrop 0.1)."""

    def __init__(self, p=0.15):
        super().__init__()
        self.p, self.layers, self.head = p, nn.ModuleList(nn.Linear(8, 8) for _ in range(4)), nn.Linear(8, 2)

    def forward(self, x):
        for layer in self.layers:
            if self.training and torch.rand([]) < self.p:
                continue
            x = x + torch.tanh(layer(x))
        return self.head(x)


def test_a_layer_skipped_at_random_is_info_not_a_no_grad_error():
    """A sweep: doctor (and so `check`) failed a healthy Wav2Vec2ForCTC whose LayerDrop skipped layer 1 in its pass;
    gradflow already drew again."""
    from torchdiag.api import run

    skipped = []
    for seed in range(8):
        torch.manual_seed(seed)   # the judged pass draws from the run's seed; the other draws from their own
        res = run("doctor", LayerDrop(), torch.randn(4, 8), seed=seed)
        assert "no-grad" not in {f.code for f in res.findings}, [f.to_dict() for f in res.findings]
        skipped += [f for f in res.findings if f.code == "skipped-at-random"]
    assert skipped and all(f.severity == "info" and "LayerDrop-like" in f.message for f in skipped)


class OwnLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 3)

    def forward(self, x):
        logits = self.lin(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, (x[:, 0] > 0).long()), "logits": logits}


def test_the_class_targets_row_says_the_model_computes_its_own_loss():
    """A sweep: with labels in the batch and the model's own loss, the row said "random valid ones used"."""
    from torchdiag.api import run

    torch.manual_seed(0)
    row = next(r for r in run("doctor", OwnLoss(), torch.randn(4, 8)).table("checks").rows if r["id"] == "target")
    assert row["status"] == "ok" and "the model computes its own loss" in row["verdict"], row


class RandomCut(nn.Module):
    """A bug: half the time the encoder's output is detached (a review: called LayerDrop-like, doctor passed)."""

    def __init__(self):
        super().__init__()
        self.enc, self.head = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        h = self.enc(x)
        if torch.rand(()) < 0.5:
            h = h.detach()
        return self.head(h)


def test_a_random_detach_is_a_cut_not_a_skip():
    from torchdiag.api import run

    for seed in range(4):
        res = run("doctor", RandomCut(), torch.randn(4, 8), seed=seed)
        codes = {f.code for f in res.findings}
        assert "skipped-at-random" not in codes, [f.message for f in res.findings]
        if "no-grad" in codes:
            return
    pytest.fail("no seed of 4 cut the encoder")


class SparseRecommender(nn.Module):
    """A two-tower scorer on sparse embeddings (a sweep: exit 4 in doctor, overfit-batch and nancheck)."""

    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(50, 8, sparse=True)
        self.items = nn.EmbeddingBag(80, 8, mode="mean", sparse=True)

    def forward(self, u, hist):
        return (self.user(u) * self.items(hist)).sum(-1)


@pytest.mark.parametrize("command", ["doctor", "nancheck", "overfit-batch", "lr-find"])
def test_sparse_embeddings_are_diagnosed_with_dense_gradients_and_left_sparse(command):
    from torchdiag.api import run
    from torchdiag.core.inputs import ModelInputs

    torch.manual_seed(0)
    model = SparseRecommender()
    inputs = ModelInputs((torch.randint(0, 50, (16,)), torch.randint(0, 80, (16, 4))), {})
    extra = {"steps": 30} if command in ("overfit-batch", "lr-find") else {}
    res = run(command, model, inputs, loss="mse", target=torch.randn(16), **extra)
    assert int(res.exit_code) in (0, 1), [f.to_dict() for f in res.findings]
    assert res.header["sparse_gradients"].startswith("2 embedding(s) with sparse=True made dense gradients")
    assert model.user.sparse and model.items.sparse        # the caller's model as it was


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(3, 16, num_layers=2, dropout=0.1, batch_first=True), nn.Linear(16, 4)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def test_an_lstms_own_dropout_is_named_as_the_mode_dependence():
    """A sweep: an LSTM(dropout=0.1) forecaster was told its "forward code reads self.training"."""
    from torchdiag.api import run

    torch.manual_seed(0)
    (f,) = [f for f in run("doctor", Forecaster(), torch.randn(8, 12, 3)).findings if f.code == "mode-dependent"]
    assert f.where == "rnn" and "1 LSTM make train and eval outputs differ" in f.message, f.message


def test_copies_after_the_training_pass_are_asked_room_for_its_activations(monkeypatch):
    """doctor's training pass measures what its backward keeps (core.saved); the short run's copy and the copy that
    looks for where the zero gradients stop run backward on the same batch and keep as much again. Room for their
    weights, gradients and Adam's state alone let them through (the kernel's OOM killer on a large batch)."""
    from torchdiag.core import resources, train

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(16, 4)
            self.body = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))

        def forward(self, x):
            return self.head(x) + 0 * self.body(x)

    model = Gated()
    weights = sum(n for _, n in train._copy_bytes(model))
    free = 9 * weights   # weights, gradients and two Adam moments fit (4x) twice over; 256 x 64 tanh outputs not
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: free)
    res = run_diag(model, torch.randn(256, 16))
    assert [f.code for f in res.findings if f.severity == "error"] == ["param-not-updated"]
    for what in ("not re-checked with a short training run", "where the zero gradients stop was not looked for"):
        note = next(n for n in res.notes if what in n)
        assert "the activations its backward keeps" in note and "NoRoom" not in note, note


def test_modes_that_change_nothing_yet_are_not_said_to_make_outputs_differ():
    """A sweep: swinv2_cr's dropout sits in MLPs whose branch starts closed, and doctor said "12 Dropout make train and
    eval outputs differ (max |train − eval| output difference 0)". Where the outputs agree, it says so."""
    from torchdiag.api import run

    class Closed(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.side = nn.Linear(8, 4), nn.Sequential(nn.Linear(8, 4), nn.Dropout(0.5))
            self.gate = nn.Parameter(torch.zeros(()))   # the side branch starts closed

        def forward(self, x):
            return self.body(x) + self.gate * self.side(x)

    torch.manual_seed(0)
    res = run("doctor", Closed(), torch.randn(6, 8))
    (f,) = [f for f in res.findings if f.code == "mode-dependent"]
    assert "here they agree" in f.message and "Dropout make train" not in f.message, f.message
    open_ = Closed()
    with torch.no_grad():
        open_.gate.fill_(1.0)
    (f,) = [f for f in run("doctor", open_, torch.randn(6, 8)).findings if f.code == "mode-dependent"]
    assert "1 Dropout make train and eval outputs differ" in f.message, f.message


class _TokenMix(nn.Module):
    """A token-mixing Linear (its bias one constant per token, on every channel) before a LayerNorm over the channels,
    behind a zero-initialised head (gmixer's and ResMLP-style token MLPs): the bias is cancelled by the LayerNorm."""

    def __init__(self):
        super().__init__()
        self.mix, self.norm, self.head = nn.Linear(6, 6), nn.LayerNorm(8), nn.Linear(8, 3)
        nn.init.zeros_(self.head.weight)

    def forward(self, x):
        return self.head(self.norm(self.mix(x.transpose(1, 2)).transpose(1, 2)).mean(1))


def test_a_bias_cancelled_behind_a_zero_head_is_invariant_not_gated():
    """A sweep: doctor called gmixer's token-MLP biases `by-design-init` ("a gate training opens ... they move"), the
    move Adam normalising rounding-level gradients once the zero head opened; gradflow called them `invariant`. The
    re-check's trained copy is now asked whether the loss depends on them at all."""
    from torchdiag.api import run

    torch.manual_seed(0)
    model, x = _TokenMix(), torch.randn(8, 6, 8, generator=torch.Generator().manual_seed(0))
    twin = _TokenMix().double()   # the truth, by hand: any shift of the bias leaves the loss as it was
    nn.init.normal_(twin.head.weight)
    xd = x.double()
    before = twin(xd)
    with torch.no_grad():
        twin.mix.bias.add_(torch.randn(6, dtype=torch.float64) * 10)
    assert torch.allclose(twin(xd), before, atol=1e-12)
    res = run("doctor", model, x)
    codes = {(f.code, f.where) for f in res.findings}
    assert ("invariant", "mix.bias") in codes and not any(c == "by-design-init" for c, _ in codes), codes
    assert res.exit_code == 0


def test_a_gradient_too_small_to_move_a_parameter_is_not_blamed_on_the_optimizer():
    """A review: a sigmoid gate saturated shut at g = -22 gets a gradient of ~3e-12, which no Adam step at 1e-3 can add
    to -22 in float32; doctor's hint said to check that the optimizer holds the parameter, which it does."""
    from torchdiag.api import run

    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = nn.Parameter(torch.tensor(-22.0))
            self.branch = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))

        def forward(self, x):
            return x + torch.sigmoid(self.g) * self.branch(x)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), Gate(), nn.Linear(16, 4))
    res = run("doctor", model, torch.randn(8, 16))
    (f,) = [f for f in res.findings if f.code == "param-not-updated"]
    assert f.where == "1.g" and "a gradient that vanishes" in f.hint and "check that the optimizer" not in f.hint, f


def test_the_target_row_names_a_language_models_next_tokens():
    """A new user: the checklist said "no targets given (random valid ones used)" where the header's loss is the next
    tokens of the input ids."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    r = _doctor_findings(model, torch.randint(0, 50, (4, 16)))
    (row,) = [row for row in r.table("checks").rows if row["id"] == "target"]
    assert row["verdict"] == "no targets given: the next tokens of input[0] (a language model) are the targets", row
    assert "next-token cross_entropy" in r.header["loss"]


class _Classifier(nn.Module):
    """Token ids in, one row of class logits per sequence out (a sequence-classification head): no next tokens."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(50, 8), nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def test_the_target_row_names_no_next_tokens_for_a_head_that_does_not_predict_them():
    """A sweep: BertForSequenceClassification's checklist said "the next tokens of input[0] (a language model) are
    the targets" beside a header's cross_entropy against random class targets: token ids feeding an embedding are not
    enough, the output must be their next-token logits."""
    torch.manual_seed(0)
    r = _doctor_findings(_Classifier(), torch.randint(0, 50, (4, 16)))
    (row,) = [row for row in r.table("checks").rows if row["id"] == "target"]
    assert row["verdict"] == "no targets given (random valid ones used)", row
    assert r.header["loss"].startswith("cross_entropy") and "next-token" not in r.header["loss"]


def _bn_net(momentum):
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, momentum=momentum), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


@pytest.mark.parametrize("momentum", [0.99, 0.1, 0.0, "0-trained"])
def test_batchnorm_running_statistics_that_keep_the_last_batch_or_never_move_are_said(momentum):
    # TensorFlow's momentum (the old statistics' weight) copied into torch (the new batch's weight): torchvision's
    # MaxViT had 0.99 until 0.18; transformers' EfficientNet has 0.99 and MobileNetV2 0.997
    torch.manual_seed(0)
    model = _bn_net(0.0 if momentum == "0-trained" else momentum)
    if momentum == "0-trained":   # statistics trained at 0.1, then frozen at momentum 0 on purpose: not said
        with torch.no_grad():
            model[1].running_mean.fill_(0.3)
            model[1].running_var.fill_(2.0)
    if momentum == 0.99:   # the premise, in plain torch: two batches in train mode, the statistics are ~the last's
        probe, a, b = _bn_net(0.99), torch.randn(8, 3, 10, 10), torch.randn(8, 3, 10, 10) + 5
        with torch.no_grad():
            probe.train()
            probe(a)
            probe(b)
            last = probe[0](b).mean((0, 2, 3))
        assert torch.allclose(probe[1].running_mean, 0.99 * last + 0.01 * 0.99 * probe[0](a).mean((0, 2, 3)),
                              atol=1e-5)
    r = run_diag(model, torch.randn(4, 3, 16, 16))
    f = [f for f in r.findings if f.code == "batchnorm-momentum"]
    if momentum in (0.1, "0-trained"):
        assert not f, [x.message for x in f]
        return
    (f,) = f
    assert f.severity == "warning" and f.where == "1", f
    said = "weigh the last training batch 0.99 and all before it 0.01" if momentum == 0.99 else "still at mean 0, variance 1"
    assert said in f.message and f.message.startswith("BatchNorm 1 has momentum"), f.message


class _KeepsBatchNormInEval(nn.Module):
    """A model whose train() keeps its BatchNorm in eval (a frozen, pretrained normalisation)."""

    def __init__(self, momentum):
        super().__init__()
        self.body = _bn_net(momentum)

    def train(self, mode=True):
        super().train(mode)
        self.body[1].eval()
        return self

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("momentum", [0.99, 0.0])
def test_batchnorm_momentum_is_not_judged_where_the_models_train_keeps_it_in_eval(momentum):
    torch.manual_seed(0)
    model = _KeepsBatchNormInEval(momentum)
    model.train()
    assert not model.body[1].training   # the premise: train mode never updates its statistics
    r = run_diag(model, torch.randn(4, 3, 16, 16))
    assert not [f.message for f in r.findings if f.code == "batchnorm-momentum"]


def test_a_batchnorm_of_momentum_none_runs_on_meta_in_both_modes():
    # momentum None (a cumulative average) reads float(num_batches_tracked) in train mode, which meta refuses;
    # the devices row said "train mode raised there: Tensor.item() cannot be called on meta tensors"
    torch.manual_seed(0)
    r = run_diag(_bn_net(None), torch.randn(4, 3, 16, 16))
    (row,) = [row for row in r.table("checks").rows if row["id"] == "device"]
    assert row["status"] == "ok" and "raised" not in row["verdict"], row


@pytest.mark.parametrize("p", [0.9, 0.5])
def test_a_dropout_that_drops_most_of_its_input_is_said(p):
    # TensorFlow 1's keep_prob = 0.9 ported as torch's p: 90% dropped, the rest scaled 10x (a sweep: eval accuracy 0.36
    # against 0.59 at 0.1, and watch passed it)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(p), nn.Linear(64, 4))
    model.train()
    with torch.no_grad():   # the premise, in plain torch: the share of a layer's values it zeroes
        zeroed = float((model[2](torch.ones(10000)) == 0).float().mean())
    assert abs(zeroed - p) < 0.02
    r = run_diag(model, torch.randn(4, 8))
    found = [f for f in r.findings if f.code == "dropout-rate"]
    if p == 0.5:
        assert not found
        return
    (f,) = found
    assert f.severity == "warning" and f.where == "2" and "zeroes 90% of the values and scales the rest by 10" in f.message


class _DropsItsLogits(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return nn.functional.dropout(self.body(x), 0.3, self.training)


@pytest.mark.parametrize("where", ["after-head", "functional", "before-head", "batchnorm-after"])
def test_a_dropout_on_the_output_is_said(where):
    """A sweep: Dropout(0.5) after the head passed (cross-entropy 0.742 in train mode against 0.503 in eval). The
    train-mode output is the eval one with a share zeroed and the rest scaled by one constant: said; a dropout before
    the head, or BatchNorm moving the output too, is not that."""
    torch.manual_seed(0)
    layers = {"after-head": [nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4), nn.Dropout(0.5)],
              "before-head": [nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 4)],
              "batchnorm-after": [nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4), nn.Dropout(0.5)]}
    model = _DropsItsLogits() if where == "functional" else nn.Sequential(*layers[where])
    x = torch.randn(16, 8)
    with torch.no_grad():   # the premise, in plain torch: eval output vs a train one
        e, t = model.eval()(x), model.train()(x)
        kept = t != 0
        constant = bool(torch.allclose(t[kept] / e[kept], (t[kept] / e[kept])[0].expand(int(kept.sum()))))
    assert constant == (where in ("after-head", "functional"))
    r = run_diag(model, x)
    found = [f for f in r.findings if f.code == "dropout-into-loss"]
    if where in ("after-head", "functional"):
        (f,) = found
        scale = "2" if where == "after-head" else "1.43"
        assert f.severity == "warning" and f"the rest scaled by {scale}" in f.message, f.message
    else:
        assert not found


def test_a_dropout_on_the_output_is_said_in_bfloat16():
    """A review: Dropout(0.1) after the head in bfloat16 was silent: the kept values' train/eval ratio spreads by
    bfloat16's rounding (6.7e-3), past a float32 tolerance of 1e-3."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10), nn.Dropout(0.1)).bfloat16()
    r = run_diag(model, torch.randn(32, 16).bfloat16())
    (f,) = [f for f in r.findings if f.code == "dropout-into-loss"]
    assert "the rest scaled by 1.11" in f.message, f.message


def test_the_dropout_rate_message_near_one_says_what_torch_does():
    # a review: p = 0.999 was said "zeroes 100%", p = 1 "scales the rest by 1e+09"; torch zeroes everything at 1
    from torchdiag.core.dropout_rate import said

    with torch.no_grad():
        assert float(nn.Dropout(1.0).train()(torch.ones(100)).abs().sum()) == 0.0   # the premise
    assert "zeroes 99.9% of the values and scales the rest by 1000" in said([("fc", 0.999)])[0]
    assert "zeroes every value (nothing passes)" in said([("fc", 1.0)])[0]


class _Settles(nn.Module):
    """Its first two forwards add an offset that later ones do not (a cache filled by its early calls): doctor's
    eval forward and its first determinism forward get it, the second does not."""

    def __init__(self):
        super().__init__()
        self.fc, self.calls = nn.Linear(8, 3), 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x) + (1.0 if self.calls <= 2 else 0.0)


def test_determinism_fingerprints_calls_only_when_two_eval_forwards_differ(monkeypatch):
    """A perf review: every module call of both eval forwards was fingerprinted in float64 (xcit: 14 s a forward
    against 0.6 s plain) to name a culprit most models never have. A healthy model's forwards are plain; a random
    one is fingerprinted on more pairs, and still named; one whose output settles after its first calls is said as not
    caught."""
    from torchdiag.diagnostics.doctor import determinism as det

    made = []

    class Counted(det.CallRecorder):
        def __init__(self, model):
            made.append(1)
            super().__init__(model)

    monkeypatch.setattr(det, "CallRecorder", Counted)
    torch.manual_seed(0)
    d = run_diag(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)), torch.randn(4, 8)).to_dict()
    assert row(d, "determinism")["status"] == "ok" and not made
    noisy = nn.Sequential(nn.Linear(8, 8), _Noise(), nn.Linear(8, 3))
    (f,) = found(run_diag(noisy, torch.randn(4, 8)).to_dict(), "nondeterministic-eval")
    assert f["where"] == "1" and len(made) == 2, (f, made)
    (g,) = found(run_diag(_Settles(), torch.randn(4, 8)).to_dict(), "nondeterministic-eval")
    assert "the 6 forwards after them agreed pair by pair" in g["message"] and g["where"] == "(root)", g
    assert g["hint"].startswith("no random op ran: a state the forward keeps"), g   # not the randomness hint
    # a second review: off on every 4th call never settles; one off on every 3rd (calls 3, 6: the plain pair, then
    # the second recorded one) is named from the pair that differs
    (h,) = found(run_diag(nn.Sequential(nn.Linear(8, 8), _EveryThird(), nn.Linear(8, 3)), torch.randn(4, 8)).to_dict(),
                 "nondeterministic-eval")
    assert h["where"] == "1", h


class _RaisesFrom(nn.Module):
    """Adds noise in eval (nondeterministic), and raises from its `start`-th call on (or on that call alone)."""

    def __init__(self, start: int, once: bool):
        super().__init__()
        self.fc, self.calls, self.start, self.once = nn.Linear(8, 3), 0, start, once

    def forward(self, x):
        self.calls += 1
        if self.calls == self.start or (self.calls > self.start and not self.once):
            raise RuntimeError(f"boom on call {self.calls}")
        return self.fc(x) + torch.randn(1)


@pytest.mark.parametrize("once", [False, True])
def test_a_model_raising_in_the_extra_forwards_keeps_its_determinism_finding(once):
    """A third and fourth review: a model raising from its 5th call on (a full cache) lost the nondeterministic-eval
    it had shown (exit 3, the row "skipped"), and one raising on its 5th call alone was said to have agreed pair by
    pair. Doctor's forwards: eval (1), determinism (2, 3): they differ; the 4th and 5th are the first recorded pair."""
    from torchdiag.errors import ModelError

    if once:
        d = run_diag(_RaisesFrom(5, once), torch.randn(4, 8)).to_dict()
    else:   # its next forward fails doctor (exit 3), the checks before it kept as the partial result
        with pytest.raises(ModelError, match="boom on call 7") as exc:
            run_diag(_RaisesFrom(5, once), torch.randn(4, 8))
        d = exc.value.partial.to_dict()
    (f,) = found(d, "nondeterministic-eval")
    assert "a further eval forward raised" in f["message"] and "boom on call 5" in f["message"], f


class _EveryThird(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x + (1.0 if self.calls % 3 == 0 else 0.0)


class _Noise(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)


NESTED = """
import torch, torch.nn as nn
class Backbone(nn.Module):
    # a 2-stage conv backbone returning {'feature_maps': (f1, f2)}, as transformers' BackboneOutput
    def __init__(self):
        super().__init__()
        self.s1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.s2 = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
    def forward(self, x):
        f1 = self.s1(x)
        return {"feature_maps": (f1, self.s2(f1))}
def build():
    torch.manual_seed(0)
    return Backbone()
"""


def test_an_output_one_level_down_is_judged_whatever_grad_mode_reads_it(tmp_path, cli):
    """A zoo re-run: doctor exited 2 on InstructBLIP-Video and EfficientLoFTR ("cannot pick a tensor to compute a
    loss"): its eval output, made under no_grad, was read with grad on, and the pick one level down asked for a
    tensor carrying a gradient. gradflow passed on the same models."""
    (tmp_path / "nested.py").write_text(NESTED)
    for command in ("doctor", "gradflow"):
        r = cli(command, f"{tmp_path}/nested.py:build", "-i", "2x3x16x16", "--json")
        assert r.code == 0, (command, r.stderr)


class _CachedCodebook(nn.Module):
    """A bias before a BatchNorm (cancelled: invariant) and a codebook cached as a plain float32 attribute by the first
    forward, as transformers' mimi keeps `_embed`: `.double()` leaves it float32."""

    def __init__(self):
        super().__init__()
        self.lin, self.bn, self.codebook = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Embedding(4, 16)
        self._embed = None

    def forward(self, x):
        if self._embed is None:
            self._embed = self.codebook.weight.detach().t().clone()
        return torch.relu(self.bn(self.lin(x))) @ self._embed


class _ScatteredTable(nn.Module):
    """A bias before a BatchNorm and a float32 table kept as a plain attribute, scattered into a float32 tensor the
    forward makes: it works in float64 only if the table stays float32."""

    def __init__(self):
        super().__init__()
        self.lin, self.bn, self.out = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4)
        self.table = torch.randn(1, 4)

    def forward(self, x):
        buf = torch.zeros(x.shape[0], 16)
        buf.scatter_(1, torch.arange(4).repeat(x.shape[0], 1), self.table.expand(x.shape[0], 4))
        return self.out(torch.relu(self.bn(self.lin(x))) + buf)


@pytest.mark.parametrize("model", [_CachedCodebook, _ScatteredTable])
def test_the_float64_invariance_copy_widens_cached_attributes(model):
    """A zoo re-run: mimi's float64 copy failed ("Input type (torch.FloatTensor) and weight type
    (torch.DoubleTensor)") and doctor dropped the invariance re-check with a note; here lin.bias, cancelled by the
    BatchNorm and left unmoved by SGD's rounding-level step, was then a `param-not-updated` error. Where the plain
    float64 copy fails, its floating attributes are cast too: `invariant` (info). Asked second: a review's table
    scattered into a float32 tensor made in forward works only as it is. The user's model is left as it was."""
    from torchdiag.api import run

    torch.manual_seed(0)
    model, x = model(), torch.randn(8, 8)
    r = run("doctor", model, x, optimizer="sgd")
    assert not any("not re-checked for invariance" in n for n in r.notes), r.notes
    assert "param-not-updated" not in {f.code for f in r.findings}, [f.to_dict() for f in r.findings]
    (f,) = [f for f in r.findings if f.code == "invariant"]
    assert "lin.bias" in f.message, f.message
    assert getattr(model, "_embed", None) is None   # the user's model as given: doctor ran copies
