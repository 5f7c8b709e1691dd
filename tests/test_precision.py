"""Precision (issue 17, part A): --dtype/--amp applied, checked for support, and nancheck's precision
localisation, each against numbers known in closed form (sample_models/precision.py)."""
from __future__ import annotations

import pytest
import torch

from support import load, one_error_line, sample

F16_MAX = 65504.0                 # float16's largest finite value: (2 - 2**-10) * 2**15
OVERFLOW = 5 * 2.0**14            # precision.py:overflow, big's output on ones: 81,920
HEADROOM_OUT = 5 * 2.0**11        # precision.py:headroom: 10,240


def nan(name, **kw):
    import torchdiag

    model, inputs = load(f"precision.py:{name}")
    return model, torchdiag.api.run("nancheck", model, inputs, **kw)


def codes(result):
    return {(f.code, f.where, f.severity) for f in result.findings}


# --- dtype facts ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16", "float64"])
def test_dtype_facts_match_torch_finfo(name):
    from torchdiag.core.precision import facts

    f, fi = facts(name), torch.finfo(getattr(torch, name))
    assert (f.max, f.smallest_normal, f.eps) == (fi.max, fi.smallest_normal, fi.eps)
    # the smallest subnormal is one ulp below the smallest normal: smallest_normal * eps
    assert f.smallest_subnormal == fi.smallest_normal * fi.eps
    assert f.smallest_subnormal > 0 and torch.tensor(f.smallest_subnormal / 2, dtype=torch.float64).to(getattr(torch, name)) == 0


def test_ulp_is_the_gap_to_the_next_representable_value():
    from torchdiag.core.precision import facts

    f16 = facts("float16")
    assert f16.ulp(1.0) == 2.0**-10 and f16.ulp(F16_MAX) == 32.0 and f16.ulp(1e-6) == 2.0**-24
    for x in (1.0, 3.0, 1000.0, 0.1):   # x + ulp is the next float16 after x
        t = torch.tensor(x, dtype=torch.float16)
        assert torch.nextafter(t, torch.tensor(float("inf"), dtype=torch.float16)) - t == f16.ulp(float(t))


# --- unsupported combinations: one line, exit 2, before the model loads ---------------------------

def test_amp_on_meta_is_one_usage_line(cli):
    r = cli("summary", sample("mlp.py:build"), "-i", "2x784", "--device", "meta", "--amp", "bf16")
    assert r.code == 2 and "--amp: torch has no autocast for the meta device" in r.stderr
    one_error_line(r)
    r = cli("flops", sample("mlp.py:build"), "-i", "2x784", "--device", "meta", "--amp", "fp16", "--json")
    assert r.code == 2 and r.json["exit_code"] == 2 and "--dtype" in r.json["error"]["hint"]


def test_amp_with_a_reduced_dtype_is_refused(cli):
    r = cli("nancheck", sample("mlp.py:build"), "--dtype", "float16", "--amp", "fp16")
    assert r.code == 2 and "--amp" in r.stderr
    one_error_line(r)


def test_dtype_on_meta_works_for_summary_and_flops(cli):
    r = cli("flops", sample("mlp.py:build"), "-i", "2x784", "--device", "meta", "--dtype", "float16", "--json")
    assert r.code == 0, r.stderr
    assert r.json["forward_flops"] == 2 * 2 * (784 * 256 + 256 * 128 + 128 * 10)


# --- summary / flops under --dtype and --amp ------------------------------------------------------

def test_summary_bytes_of_a_bf16_model_are_half(cli):
    params = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
    r32 = cli("summary", sample("mlp.py:build"), "-i", "2x784", "--json")
    r16 = cli("summary", sample("mlp.py:build"), "-i", "2x784", "--dtype", "bfloat16", "--json")
    assert r32.code == r16.code == 0
    assert r32.json["param_bytes"] == 4 * params and r16.json["param_bytes"] == 2 * params
    assert [row["dtype"] for row in r16.json["bytes_by_dtype"]] == ["bfloat16"]
    assert r16.json["precision"].startswith("bfloat16") and "precision" not in r32.json


@pytest.mark.parametrize("extra", [[], ["--dtype", "bfloat16"], ["--dtype", "float16"], ["--amp", "bf16"], ["--amp", "fp16"]])
def test_flops_unchanged_by_precision(cli, extra):
    r = cli("flops", sample("mlp.py:build"), "-i", "2x784", "--backward", "--json", *extra)
    assert r.code == 0, r.stderr
    fwd = 2 * 2 * (784 * 256 + 256 * 128 + 128 * 10)
    # backward: weight gradients (= forward) + input gradients of every layer but the first (its input needs none)
    assert r.json["forward_flops"] == fwd and r.json["backward_flops"] == fwd + fwd - 2 * 2 * 784 * 256


def test_amp_runs_the_forward_under_autocast(cli):
    r = cli("activations", sample("mlp.py:build"), "-i", "2x784", "--amp", "bf16", "--json")
    assert r.code == 0, r.stderr
    linear = [row for row in r.json["modules"] if row["type"] == "Linear"]
    assert linear and {row["dtype"] for row in linear} == {"bfloat16"}


# --- the Python API: dtype= runs on a cast copy ---------------------------------------------------

def test_api_dtype_never_casts_the_callers_model(untouched):
    import torchdiag

    model, inputs = load("precision.py:fine")
    with untouched(model):
        r = torchdiag.api.run("nancheck", model, inputs, dtype="float16")
        s = torchdiag.summary(model, inputs, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert r.exit_code == 0 and s.data["param_bytes"] == 2 * sum(p.numel() for p in model.parameters())


def test_api_amp_true_is_the_devices_own():
    import torchdiag

    model, inputs = load("precision.py:fine")
    r = torchdiag.api.run("nancheck", model, inputs, amp=True)
    assert r.data["reduced_precision"]["amp"] == "bfloat16"   # CPU: bf16


# --- nancheck: fp16 overflow at its module, said in precision terms -------------------------------

@pytest.mark.parametrize("how", [{"dtype": "float16"}, {"amp": "fp16"}])
def test_fp16_overflow_named_with_its_reason(how, untouched):
    import torchdiag

    model, inputs = load("precision.py:overflow")
    with untouched(model):
        r = torchdiag.api.run("nancheck", model, inputs, **how)
    assert r.exit_code == 1
    assert r.data["forward"]["module"] == "big" and r.data["forward"]["inf"] == 6   # 2 rows x 3 outputs
    cause = r.data["reduced_precision"]["cause"]
    assert cause == {"phase": "forward", "module": "big", "largest_finite": F16_MAX, "dtype": "float16",
                     "float32_max_abs": OVERFLOW, "kind": "overflow"}
    assert r.data["reduced_precision"]["reference"]["finite"] is True
    msg = next(f.message for f in r.findings if f.code == "non-finite-output")
    assert "output max |x| 81,920 (float32 reference) exceeds float16's largest finite 65,504" in msg


@pytest.mark.parametrize("how", [{"dtype": "float16"}, {"amp": "fp16"}])
def test_an_intermediate_overflow_inside_a_module_is_named_with_the_op_and_value(how):
    _, r = nan("attention", **how)
    assert r.exit_code == 1 and r.data["forward"]["module"] == "attn"
    cause = r.data["reduced_precision"]["cause"]
    # scores q_i . q_j = 8 * (8 * 30)**2 = 460,800 in float32; the module's output is exactly 1
    assert cause["kind"] == "inner-overflow" and cause["float32_inner_op"] == "mm"
    assert cause["float32_inner_max_abs"] == 8 * (8 * 30) ** 2 and cause["float32_max_abs"] == 1.0
    f = next(f for f in r.findings if f.code == "non-finite-output")
    assert "mm reaches max |x| 460,800" in f.message and "rounding or underflow" not in f.message
    assert f.hint.startswith("keep this op in float32")       # the precision remedy, not "look at log/sqrt"


def test_attention_model_is_fine_in_bfloat16():
    _, r = nan("attention", dtype="bfloat16")
    assert r.exit_code == 0 and not [f for f in r.findings if f.severity == "error"]


def test_overflow_model_is_fine_in_float32_and_bfloat16():
    _, r32 = nan("overflow")
    _, r16 = nan("overflow", dtype="bfloat16")
    assert r32.exit_code == 0 and r32.data["reduced_precision"] is None
    assert r16.exit_code == 0 and not r16.findings          # 81,920 is far inside bfloat16's range
    assert r16.data["reduced_precision"]["reference"] is None


def test_a_nan_that_is_there_in_float32_too_is_said_to_be_so():
    import torchdiag

    model, inputs = load("broken_nan_forward.py:build")
    r = torchdiag.api.run("nancheck", model, inputs, dtype="bfloat16")
    assert r.exit_code == 1 and r.data["forward"]["module"] == "log_features"
    assert r.data["reduced_precision"]["cause"]["kind"] == "also-float32"
    assert "not a precision problem" in next(f.message for f in r.findings if f.code == "non-finite-output")


# --- headroom and underflow -----------------------------------------------------------------------

def test_headroom_warning_with_the_exact_margin():
    _, r = nan("headroom", dtype="float16")
    assert r.exit_code == 0 and ("precision-headroom", "big", "warning") in codes(r)
    rows = [row for row in r.table("precision_headroom").rows if row["kind"] == "output"]
    assert [(row["module"], row["max_abs"]) for row in rows] == [("big", HEADROOM_OUT)]
    assert rows[0]["margin"] == pytest.approx(F16_MAX / HEADROOM_OUT)   # 6.397 < 8
    assert r.data["reduced_precision"]["reference"] is None           # nothing to explain, no zero gradients


def test_fp16_gradient_underflow_per_module():
    _, r = nan("underflow", dtype="float16")
    assert r.exit_code == 0 and ("grad-underflow", "fc", "warning") in codes(r)
    rows = r.table("precision_underflow").rows
    # fc: 4x3 weight + 3 bias = 15 values, all nonzero in float32 and at most 5e-9 (below half of float16's
    # smallest subnormal: they round to 0), all exactly 0 in float16
    assert rows == [{"module": "fc", "parameters": "weight, bias", "nonzero_float32": 15, "underflow": 15,
                     "subnormal": 0, "zero_reduced": 15, "fraction": 1.0}]
    assert r.data["reduced_precision"]["reference"]["why"].startswith("the reduced run's parameter gradients hold exact zeros")


def test_underflow_absent_in_bfloat16_and_informational_under_the_grad_scaler():
    _, rb = nan("underflow", dtype="bfloat16")
    assert rb.exit_code == 0 and not rb.findings and rb.table("precision_underflow").rows == []
    _, ra = nan("underflow", amp="fp16")
    assert ("grad-underflow", "fc", "info") in codes(ra)


@pytest.mark.parametrize("how", [{}, {"dtype": "bfloat16"}, {"dtype": "float16"}, {"amp": "bf16"}, {"amp": "fp16"}])
def test_fine_model_passes_in_every_precision(how):
    _, r = nan("fine", **how)
    assert r.exit_code == 0 and not r.findings, [f.message for f in r.findings]
    if how:
        assert r.data["reduced_precision"]["reference"] is None


def test_reduced_precision_pass_costs_no_extra_sync():
    """The Watch's magnitudes ride on the pass's one read-back. float16's cast reads one thing more, once, before any
    pass: do the weights fit its range (core.precision.cast_overflow, one read for all)? bfloat16 keeps float32's."""
    import torchdiag
    from torchdiag.core.syncs import SyncCounter

    model, inputs = load("precision.py:fine")
    counts = []
    for how in ({}, {"dtype": "float16"}, {"dtype": "bfloat16"}):
        with SyncCounter() as s:
            torchdiag.api.run("nancheck", model, inputs, **how)
        counts.append(s.total)
    assert counts[1] == counts[0] + 1 and counts[2] == counts[0], counts


# --- --steps with --amp fp16: the GradScaler ------------------------------------------------------

def test_every_step_skipped_is_an_error_naming_the_module(cli):
    r = cli("nancheck", sample("precision.py:overflow"), "--amp", "fp16", "--steps", "3", "--json")
    assert r.code == 1
    gs = r.json["steps"]["grad_scaler"]
    # skipped every step: the scale halves each time (GradScaler's backoff 0.5 from 65,536)
    assert gs["skipped_steps"] == [1, 2, 3] and gs["scale_per_step"] == [65536.0, 32768.0, 16384.0]
    assert gs["final_scale"] == 8192.0
    f = next(f for f in r.json["findings"] if f["code"] == "every-step-skipped")
    assert f["where"] == "big" and f["severity"] == "error"


def test_grad_scaler_on_a_healthy_model_skips_nothing(cli):
    r = cli("nancheck", sample("precision.py:fine"), "--amp", "fp16", "--steps", "3", "--json")
    assert r.code == 0, r.stderr
    gs = r.json["steps"]["grad_scaler"]
    assert gs["skipped"] == 0 and gs["scale_per_step"] == [65536.0] * 3 and gs["final_scale"] == 65536.0
    assert len(r.json["grad_scale_per_step"]) == 3


# --- check's config keys --------------------------------------------------------------------------

def test_check_config_dtype_reaches_nancheck(cli, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(f"""
[tool.torchdiag]
model = "{sample('precision.py:overflow')}"
device = "cpu"
dtype = "float16"
[tool.torchdiag.check]
nancheck = true
""")
    monkeypatch.chdir(tmp_path)
    r = cli("check", "--json")
    assert r.code == 1, r.stderr
    assert {c["check"]: c["status"] for c in r.json["checks"]} == {"nancheck": "FAIL"}
    (tmp_path / "pyproject.toml").write_text((tmp_path / "pyproject.toml").read_text().replace('"float16"', '"bfloat16"'))
    r = cli("check", "--json")
    assert r.code == 0, r.stderr


# --- CUDA -------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("how", [["--dtype", "float16"], ["--amp", "fp16"]])
def test_fp16_overflow_on_cuda(cli, how):
    r = cli("nancheck", sample("precision.py:overflow"), "--device", "cuda", "--json", *how)
    assert r.code == 1 and r.json["forward"]["module"] == "big"
    assert r.json["reduced_precision"]["cause"]["kind"] == "overflow"
    assert r.json["reduced_precision"]["cause"]["float32_max_abs"] == OVERFLOW


def test_an_op_without_a_reduced_kernel_is_exit_3_with_a_precision_hint(cli, tmp_path):
    (tmp_path / "inv.py").write_text(
        "import torch\nfrom torch import nn\n\n\nclass M(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fc = nn.Linear(3, 3)\n\n    def forward(self, x):\n"
        "        return torch.linalg.inv(self.fc(x).reshape(-1, 3, 3)).reshape(x.shape[0], -1)\n\n\n"
        "def build():\n    return M()\n")
    r = cli("nancheck", f"{tmp_path / 'inv.py'}:build", "-i", "3x3", "--dtype", "float16")
    assert r.code == 3 and "hint: the model ran in float16 (--dtype float16)" in r.stderr and "--amp" in r.stderr
    one_error_line(r)
    assert cli("nancheck", f"{tmp_path / 'inv.py'}:build", "-i", "3x3").code == 0   # float32: fine


@pytest.mark.parametrize("how", [{"dtype": "float16"}, {"amp": "fp16"}])
def test_fp16_gradient_overflow_named_in_backward_with_its_reason(how):
    _, r = nan("grad_overflow", loss="sum", **how)
    assert r.exit_code == 1 and r.data["forward"] is None          # the forward is finite
    assert r.data["backward"]["name"] == "amplify" and r.data["backward"]["inf"] == 6   # its input gradient, 2x3
    cause = r.data["reduced_precision"]["cause"]
    # sum loss: gradient 1 at every output; amplify multiplies it by 1e6 (exact in float32) > 65,504
    assert cause["kind"] == "overflow" and cause["phase"] == "backward"
    assert cause["float32_max_grad"] == 1e6 and cause["float32_max_grad_at"] == "shrink"
    assert "max |g| 1e6" in next(f.message for f in r.findings if f.code == "non-finite-grad")
    _, r32 = nan("grad_overflow", loss="sum")
    assert r32.exit_code == 0


def test_bfloat16_on_a_gpu_without_it_is_refused(monkeypatch):
    """Simulated (runs alike with or without a GPU): the check asks torch, before any model is built."""
    from torchdiag.core.precision import check_supported
    from torchdiag.core.run import RunSpec
    from torchdiag.errors import OptionError

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Old GPU")
    for kw, name in (({"amp": "bf16"}, "--amp"), ({"dtype": "bfloat16"}, "--dtype")):
        with pytest.raises(OptionError) as e:
            check_supported(RunSpec("nancheck", **kw), torch.device("cuda"))
        assert e.value.name_for("cli").message == f"{name}: this GPU (Old GPU) has no bfloat16 support"
    check_supported(RunSpec("nancheck", amp="fp16"), torch.device("cuda"))    # fp16 is fine there
    check_supported(RunSpec("memory", amp="bf16"), torch.device("meta"))      # memory models autocast on meta


def test_memory_on_meta_with_amp_is_not_refused(cli):
    r = cli("memory", sample("mlp.py:build"), "-i", "8x784", "--device", "meta", "--amp", "bf16", "--json")
    assert r.code in (0, 1), r.stderr


def test_grad_scaler_backs_off_until_the_scaled_gradient_fits(cli):
    """grad_overflow, sum loss: the gradient leaving amplify is 1e6 × scale. It fits float16 (≤ 65,504) once
    the scale is 2**-4 (62,500), after 20 halvings from 2**16: steps 1-20 skipped, then the scale stays."""
    r = cli("nancheck", sample("precision.py:grad_overflow"), "--amp", "fp16", "--loss", "sum", "--steps", "24", "--json")
    gs = r.json["steps"]["grad_scaler"]
    assert gs["skipped_steps"] == list(range(1, 21))
    assert gs["scale_per_step"] == [2.0 ** (16 - k) for k in range(20)] + [2.0**-4] * 4
    assert gs["final_scale"] == 2.0**-4
    assert "every-step-skipped" not in {f["code"] for f in r.json["findings"]}
    r = cli("nancheck", sample("precision.py:grad_overflow"), "--amp", "fp16", "--loss", "sum", "--steps", "3", "--json")
    f = next(f for f in r.json["findings"] if f["code"] == "every-step-skipped")
    assert f["where"] == "loss" and "scale × d loss / d output" in f["message"]   # 65,536 × 1 is Inf in float16


# --- casting keeps what is not floating -----------------------------------------------------------

class _ComplexModel(torch.nn.Module):
    """A complex weight (what --dtype cannot express) next to a real Linear."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([[1 + 2j, 3 - 4j]], dtype=torch.complex64))
        self.fc = torch.nn.Linear(2, 2)
        self.register_buffer("steps", torch.tensor(7))

    def forward(self, x):
        return self.fc((x.to(self.w.dtype) * self.w).abs().to(x.dtype))


def test_dtype_casts_floating_tensors_only_and_keeps_complex_parameters(untouched):
    import warnings

    import torchdiag
    from torchdiag.core.precision import cast_copy

    model = _ComplexModel()
    with untouched(model), warnings.catch_warnings():
        warnings.simplefilter("error")        # Module.to(float16) warns: "discards the imaginary part"
        work = cast_copy(model, "float16")
        r = torchdiag.api.run("nancheck", model, (torch.ones(3, 2),), dtype="float16")
    assert work.w.dtype == torch.complex64 and torch.equal(work.w, model.w)   # |1+2j| = sqrt(5), not 1
    assert work.fc.weight.dtype == torch.float16 and work.steps.dtype == torch.int64
    assert r.exit_code == 0, [f.message for f in r.findings]



class _GateFlips(torch.nn.Module):
    """On x = [1, 1]: h0 = x0 + 2**-10, pre = h0 - x1 = 2**-10 > 0 in float32, but in bfloat16 (ulp 2**-7
    at 1) h0 rounds to 1, so pre = 0 and ReLU's gradient is 0: a.weight's 2 gradient values (nonzero in
    float32) and head.weight's 3 (ReLU output 0) are exactly 0 in bfloat16, by rounding, not by range."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(2, 1, bias=False)
        self.head = torch.nn.Linear(1, 3)
        with torch.no_grad():
            self.a.weight.copy_(torch.tensor([[1.0, -1.0]]))

    def forward(self, x):
        h = torch.cat([x[:, :1] + 2.0 ** -10, x[:, 1:]], dim=1)
        return self.head(torch.relu(self.a(h)))


def test_bfloat16_zeros_are_rounding_not_underflow():
    """bfloat16 has float32's range: its zeros here are a gate flipped by rounding, in the table, no finding."""
    import torchdiag

    x = torch.ones(2, 2)
    assert torch.tensor(1 + 2.0 ** -10).bfloat16() == 1
    r = torchdiag.api.run("nancheck", _GateFlips(), (x,), dtype="bfloat16")
    rows = {row["module"]: row for row in r.table("precision_underflow").rows}
    assert (rows["a"]["nonzero_float32"], rows["a"]["zero_reduced"], rows["a"]["underflow"]) == (2, 2, 0)
    assert (rows["head"]["nonzero_float32"], rows["head"]["zero_reduced"]) == (6, 3)   # the bias keeps its 3
    assert rows["head"]["underflow"] == 0 and rows["head"]["fraction"] == 0.0
    assert not [f for f in r.findings if f.code == "grad-underflow"] and r.exit_code == 0


class _Gate(torch.nn.Module):
    """relu(g * (x + 2**-12) - 1) on x = 1, g = 1: 2**-12 > 0 in float32, so g's gradient is 1 + 2**-12; in
    float16 (ulp 2**-10 at 1) x + 2**-12 rounds to 1, the ReLU sees 0 and g's gradient is 0: rounding."""

    def __init__(self):
        super().__init__()
        self.g = torch.nn.Parameter(torch.ones(1))

    def forward(self, x):
        return torch.relu(self.g * (x + 2.0 ** -12) - 1)


class _KnownGrads(torch.nn.Module):
    """With a sum loss, w's gradient is c * s: exactly [2**-30, 2**-23, 2**-10] (≈ 9.3e-10, 1.2e-7, 9.8e-4)
    in float32; every factor is exact in float16. float16's smallest subnormal is 2**-24: 2**-30 rounds to
    0 (underflow), 2**-23 is held as a subnormal (below the smallest normal 2**-14), 2**-10 is normal."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))
        self.register_buffer("c", torch.tensor([2.0 ** -15, 2.0 ** -8, 2.0 ** 5]))
        self.register_buffer("s", torch.tensor(2.0 ** -15))
        self.gate = _Gate()

    def forward(self, x):
        return (self.w * self.c * self.s).sum() + self.gate(x).sum()


def test_fp16_underflow_counts_only_values_below_the_range_exactly():
    import torchdiag

    model = _KnownGrads()
    ref = model(torch.ones(1))
    ref.backward()
    assert model.w.grad.tolist() == [2.0 ** -30, 2.0 ** -23, 2.0 ** -10] and model.gate.g.grad.item() == 1 + 2.0 ** -12
    model.zero_grad(set_to_none=True)
    r = torchdiag.api.run("nancheck", model, (torch.ones(1),), dtype="float16", loss="sum")
    rows = {row["module"]: row for row in r.table("precision_underflow").rows}
    assert rows["(root)"] == {"module": "(root)", "parameters": "w", "nonzero_float32": 3, "underflow": 1,
                              "subnormal": 1, "zero_reduced": 1, "fraction": 1 / 3}
    # the gate's zero is rounding (its float32 gradient, ≈ 1, is well inside float16): no underflow
    assert rows["gate"] == {"module": "gate", "parameters": "g", "nonzero_float32": 1, "underflow": 0,
                            "subnormal": 0, "zero_reduced": 1, "fraction": 0.0}
    [f] = [f for f in r.findings if f.code == "grad-underflow"]
    assert (f.where, f.severity) == ("(root)", "warning") and "1 of 3" in f.message and r.exit_code == 0


class _CancellingNorm(torch.nn.Module):
    """A LayerNorm written as E[x²] − E[x]²: around 100 the two terms cancel, and in float16 the difference goes
    below 0 (its ulp at 1e4 is 8), so the sqrt of it is NaN; in float32 it is finite."""

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mu * mu
        return (x - mu) / torch.sqrt(var + 1e-5)


def test_a_cancellation_inside_a_module_names_the_op_that_made_the_nan():
    """A sweep: the variance's cancellation was said to be "float16 rounding or underflow earlier in the forward",
    though the module's inputs were finite: the first op inside it that made a non-finite value from finite inputs
    is named, with what its input held."""
    import torchdiag

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), _CancellingNorm(), torch.nn.Linear(64, 4))
    with torch.no_grad():
        model[0].bias.fill_(100.0)
        model[0].weight.mul_(0.5)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    r = torchdiag.api.run("nancheck", model, (x,), dtype="float16")
    f = next(f for f in r.findings if f.code == "non-finite-output")
    assert f.where == "1" and "inside its forward, sqrt gave the first non-finite value" in f.message, f.message
    assert "below 0" in f.message and "earlier in the forward" not in f.message
    with torch.no_grad():   # the premise: in float16 the variance goes negative, in float32 it does not
        h = model[0].half()(x.half())
        assert float(((h * h).mean(-1) - h.mean(-1) ** 2).min()) < 0
        h32 = model[0].float()(x)
        assert float(((h32 * h32).mean(-1) - h32.mean(-1) ** 2).min()) > 0


class _NaiveSoftmax(torch.nn.Module):
    def forward(self, x):   # exp without subtracting the max: exp(24) is past float16's 65,504, its sum more so
        e = torch.exp(x)
        return e / e.sum(-1, keepdim=True)


def test_the_first_op_past_the_range_is_named_not_the_largest():
    """A sweep: a softmax written as exp / sum blamed `sum` (the largest value, 4e10) where `exp` overflowed first."""
    import torchdiag

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), _NaiveSoftmax(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        model[0].weight.fill_(0.0)
        model[0].bias.copy_(torch.linspace(-20, 24, 16))
    r = torchdiag.api.run("nancheck", model, (torch.randn(4, 8),), dtype="float16")
    cause = r.data["reduced_precision"]["cause"]
    assert cause["kind"] == "inner-overflow" and cause["float32_inner_op"] == "exp", cause


def test_a_float32_reference_without_room_is_a_note_not_the_end_of_the_run(monkeypatch):
    """The float32 reference copies the model in float32 and runs backward: its weights, gradients and the bfloat16
    pass's activations at float32 are asked for. Where they do not fit, the run keeps its own findings and says why
    the reference is missing (it raised NoRoom, exit 3, and nothing of the pass was reported); the activations are
    what tips it here (its weights and gradients alone fit)."""
    from torch import nn

    from torchdiag.api import run
    from torchdiag.core import resources, train

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
    with torch.no_grad():
        model[0].bias[:10] = -100.0   # 10 dead units: exact zero gradients, the reference's cue
    f32 = sum(n for _, n in train._copy_bytes(model))
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 3 * f32)   # weights + grads: 2x
    res = run("nancheck", model, torch.randn(512, 16), dtype="bfloat16")
    assert res.exit_code == 0
    (note,) = [n for n in res.notes if n.startswith("the float32 reference did not run")]
    assert "the activations its backward keeps" in note, note
    assert dict(res.summary)["Precision"].endswith("float32 reference: not run: no room for its copy (notes)")


def test_overfit_batch_counts_what_rounds_away_at_the_early_steps_too():
    """A sweep: zero-initialised residual BatchNorms (timm's resnet10t, levit, mobilevitv2 under --dtype bfloat16):
    the BatchNorm before the zero one gets a gradient from step 2 on, and its bf16 Adam updates (~1e-3 on 1.0) round
    away; a run done in 14 steps was counted at its first step only, and said `unchanged-params` with no cause."""
    from torch import nn

    from torchdiag.api import run

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.bn1, self.b, self.bn2 = nn.Linear(8, 64), nn.BatchNorm1d(64), nn.Linear(64, 8), nn.BatchNorm1d(8)
            nn.init.zeros_(self.bn2.weight)   # zero-init residual: bn1 gets a gradient from step 2
            nn.init.constant_(self.bn1.weight, 64.0)   # a bf16 half-ulp of 0.125 there: lr 0.05 rounds away, and the
            self.head = nn.Linear(8, 4)                # head memorises the batch in ~11 steps

        def forward(self, x):
            return self.head(x + self.bn2(self.b(self.bn1(self.a(x)).relu())))

    torch.manual_seed(0)
    res = run("overfit-batch", Block(), (torch.randn(4, 8),), dtype="bfloat16", lr=0.05)
    assert res.data["steps"] < 64, res.data["steps"]   # done before the counts from step 64 (the old schedule)
    codes = {f.code: f for f in res.findings if f.severity != "info"}
    assert "update-rounds-away" in codes and "bn1.weight" in codes["update-rounds-away"].message, res.findings
    assert "unchanged-params" not in codes or "bn1.weight" not in codes["unchanged-params"].message, res.findings


def test_doctor_asks_a_bfloat16_model_whether_one_sample_erases_its_input_in_float32():
    """A sweep: doctor --dtype bfloat16 said `batchnorm-batch-1` (the output does not depend on the input) of
    mobilenet_v3_small, efficientnet_b0 and efficientvit_b0: bfloat16's 8-ulp limit (6%) read their 1-2% as 0. The
    erasure is the architecture's, so the probe runs on a float32 copy; float32 and bfloat16 now agree."""
    from torch import nn

    from torchdiag.api import run

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 1),
                             nn.BatchNorm2d(16), nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))

    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    said = {dt: {f.code for f in run("doctor", build().to(dt), (x.to(dt),)).findings if f.severity != "info"}
            for dt in (torch.float32, torch.bfloat16)}
    assert "batchnorm-batch-1" not in said[torch.float32] | said[torch.bfloat16], said


@pytest.mark.parametrize("kind", ["batchnorm1d", "casts its input"])
def test_doctor_float32_probe_falls_back_where_the_copy_cannot_run(kind):
    """A review: the float32 copy's probe raised out of doctor (exit 4) on a bf16 MLP with BatchNorm1d (its batch of
    one raises) and on a forward that casts its own input to bf16 (a dtype mismatch in the float32 copy)."""
    from torch import nn

    from torchdiag.api import run

    class Casts(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(self.bn(self.conv(x.to(torch.bfloat16))).relu().mean((2, 3)))

    torch.manual_seed(0)
    if kind == "batchnorm1d":
        model, x = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(4, 8)
    else:
        model, x = Casts(), torch.randn(4, 3, 8, 8)
    res = run("doctor", model.to(torch.bfloat16), (x.to(torch.bfloat16),))
    assert int(res.exit_code) in (0, 1), res.exit_code   # ran to its verdict (an internal error raises here)


@pytest.mark.parametrize("how", ["cli", "api"])
def test_a_weight_beyond_float16s_range_is_the_casts_doing(how, tmp_path, cli):
    """A sweep: a finite float32 checkpoint holding 1e6 under --dtype float16. The cast made it Inf, and nancheck
    blamed the checkpoint ("check the initialisation or the checkpoint") and said the float32 reference had it too:
    "not a precision problem". Plain torch: the float32 model is finite; .half() turns 1e6 into Inf."""
    import torchdiag

    (tmp_path / "net.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def build():\n    torch.manual_seed(0)\n    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\n"
        "    with torch.no_grad():\n        m[2].weight[0, 0] = 1e6\n    return m\n"
        "def example_inputs():\n    return (torch.rand(4, 8),)\n")
    assert torch.isinf(torch.tensor(1e6).half()) and torch.tensor(1e6).half().dtype == torch.float16
    if how == "cli":
        r = cli("nancheck", f"{tmp_path}/net.py:build", "--dtype", "float16", "--json")
        assert r.code == 1, r.stderr
        header, found = r.json["precision"], {(f["code"], f["where"]): f for f in r.json["findings"]}
    else:
        import importlib.util

        spec = importlib.util.spec_from_file_location("net_overflow", tmp_path / "net.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        model = mod.build()
        res = torchdiag.api.run("nancheck", model, mod.example_inputs(), dtype="float16")
        assert model[2].weight.dtype == torch.float32 and model[2].weight[0, 0] == 1e6   # the caller's, untouched
        header = res.header["precision"]
        found = {(f.code, f.where): {"message": f.message, "hint": f.hint} for f in res.findings}
    assert "1 finite value(s) of 2.weight (up to |1e+06|) lie beyond float16's largest, 65504" in header, header
    param = found[("non-finite-param", "2.weight")]
    assert "made ±Inf by the --dtype cast" in param["message"] and "65504" in param["hint"]
    assert "checkpoint" not in param["hint"]
    out = next(f for (code, _), f in found.items() if code == "non-finite-output")
    assert "not a precision problem" not in out["message"] and "a precision problem" in out["message"], out


def test_a_cast_overflow_elsewhere_does_not_make_a_forwards_own_nan_the_casts():
    """A review: an unused buffer's 1e6 (made Inf by the float16 cast) relabelled a log(0) of the forward's, there
    in float32 too, as "a precision problem"; only the module that holds an overflowed weight is the cast's."""
    from torch import nn

    import torchdiag

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.aux = nn.Module()
            self.aux.register_buffer("scale", torch.tensor([1e6]))   # a module's the forward never calls

        def forward(self, x):
            return torch.log(self.fc(x) * 0)   # log(0) = -inf, then NaN in the loss's softmax: a bug in float32 too

    torch.manual_seed(0)
    r = torchdiag.api.run("nancheck", Net(), (torch.randn(2, 4),), dtype="float16")
    assert "aux.scale" in r.header["precision"]
    out = next(f for f in r.findings if f.code == "non-finite-output")
    assert "not a precision problem" in out.message, out.message
