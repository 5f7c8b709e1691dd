"""Issue 17, part B: reduced precision in the training step. bf16 updates that round away (doctor,
overfit-batch), fp16 loss scaling (the GradScaler's scale per step, skipped steps, the module of the
first non-finite gradient), gradflow's underflow column, the dtype each matmul/conv ran in (profile,
memory). Expectations are closed forms or plain-torch re-computations, never the tool's own output."""
import math

import pytest

from support import load, load_module, sample

torch = pytest.importorskip("torch")

from torchdiag.api import run  # noqa: E402

M = load_module("precision_steps.py")
BF16 = torch.bfloat16


def codes(result):
    return [f.code for f in result.findings]


def finding(result, code):
    return next(f for f in result.findings if f.code == code)


def ones(dtype=torch.float32, device="cpu"):
    return torch.ones(M.BATCH, M.IN, dtype=dtype, device=device)


# --- bf16 weights whose update rounds away ------------------------------------------------------

def test_premise_one_step_rounds_away_at_one_but_not_at_two_to_minus_ten():
    """What the sample relies on, from bf16 itself: an update of 1e-3 (Adam's first step) or 8e-5
    (SGD lr 1e-5 on a gradient of 8) is lost at 1.0 and kept at 2**-10."""
    one, small = torch.tensor(1.0, dtype=BF16), torch.tensor(2.0 ** -10, dtype=BF16)
    for update in (1e-3, 8e-5):
        assert (one - update).to(BF16) == one
        assert (small - torch.tensor(update, dtype=BF16)) != small


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_doctor_names_the_bf16_parameter_whose_update_rounds_away(untouched, device):
    model = M.rounds_away().to(device=device, dtype=BF16)
    with untouched(model):
        r = run("doctor", model, ones(BF16, device), loss="sum")
    f = finding(r, "update-rounds-away")
    assert f.severity == "warning" and f.where == "big.weight" and "big.weight 75%" in f.message
    assert "amp bf16" in f.hint and "Kahan" in f.hint and "learning rate (lr)" in f.hint
    # the weights came in bf16 from the caller, not from a dtype option (a review: "instead of --dtype bfloat16")
    assert "build the model in float32" in f.hint and "dtype" not in f.hint, f.hint
    # 3 of big.weight's 4 rows are 1.0 (8 elements each); every element has gradient 8 (sum loss, ones)
    assert r.data["rounded_away"] == [{"name": "big.weight", "dtype": "bfloat16", "unchanged": 24, "moving": 32,
                                       "fraction": 0.75}]
    assert "param-not-updated" not in codes(r) and r.exit_code == 0


def test_dtype_bfloat16_through_the_api_casts_a_copy_and_finds_it(untouched):
    model = M.rounds_away()
    with untouched(model):
        r = run("doctor", model, ones(), loss="sum", dtype="bfloat16")
    assert r.data["rounded_away"][0]["fraction"] == 0.75
    assert "instead of dtype bfloat16" in finding(r, "update-rounds-away").hint


def test_doctors_command_line_hint_names_no_option_it_does_not_have(cli, tmp_path):
    """A review: doctor's hint said "raise the learning rate (--lr)" (doctor has no --lr) and "instead of --dtype
    bfloat16" for a model its factory built in bf16."""
    from support import sample

    res = cli("doctor", sample("precision_steps.py:rounds_away"), "--arg", "dtype=bfloat16", "--loss", "sum", "--json",
              "-i", f"{M.BATCH}x{M.IN}:bfloat16")
    f = next(f for f in res.json["findings"] if f["code"] == "update-rounds-away")
    assert "--lr" not in f["hint"] and "--dtype" not in f["hint"] and "--amp bf16" in f["hint"], f["hint"]


def test_a_parameter_that_rounds_away_entirely_is_not_also_param_not_updated():
    model = M.rounds_away()
    with torch.no_grad():
        model.big.weight.fill_(1.0)
    r = run("doctor", model.to(BF16), ones(BF16), loss="sum")
    assert r.data["rounded_away"][0] == {"name": "big.weight", "dtype": "bfloat16", "unchanged": 32, "moving": 32,
                                         "fraction": 1.0}
    assert "param-not-updated" not in codes(r)


def test_bf16_keeps_doctors_true_param_not_updated_findings():
    """A forward that writes the parameter back and a gradient hook multiplying by 0 stay errors in bf16
    (lr 0.1: Adam's first step of ~0.1 is kept by bf16 at 1.0, where gate.scale sits; at lr 1e-3 it rounds
    away, and that is what doctor then says instead)."""
    model, x = load("broken_doctor_not_updated.py:build")
    r = run("doctor", model.to(BF16), x.tensors()[0][1].to(BF16), lr=0.1)
    assert sorted(f.where for f in r.findings if f.code == "param-not-updated") == ["gate.scale", "head.bias"]


def test_float32_and_a_healthy_bf16_model_get_no_rounding_finding():
    r = run("doctor", M.rounds_away(), ones(), loss="sum")
    assert "update-rounds-away" not in codes(r) and "rounded_away" not in r.data
    model, x = load("mlp.py:build")     # Kaiming-uniform weights |w| < 0.05: Adam's 1e-3 step is kept
    r = run("doctor", model.to(BF16), x.tensors()[0][1].to(BF16))
    assert "update-rounds-away" not in codes(r) and r.verdict == "PASS"


def test_overfit_batch_measures_the_first_sgd_step():
    r = run("overfit-batch", M.rounds_away().to(BF16), ones(BF16), loss="sum", steps=3, optimizer="sgd",
            lr=1e-5, momentum=0)
    assert r.data["rounded_away"] == [{"name": "big.weight", "dtype": "bfloat16", "unchanged": 24, "moving": 32,
                                       "fraction": 0.75}]
    assert finding(r, "update-rounds-away").where == "big.weight"
    r32 = run("overfit-batch", M.rounds_away(), ones(), loss="sum", steps=3, optimizer="sgd", lr=1e-5, momentum=0)
    assert "update-rounds-away" not in codes(r32)


# --- fp16 loss scaling ----------------------------------------------------------------------------

def follows_torch_rule(scales, skipped):
    """torch.amp.GradScaler's documented defaults: start 2**16, x0.5 after a skipped step, x2 after 2000
    clean steps in a row (never reached here)."""
    assert scales[0] == 2.0 ** 16
    for k in range(len(scales) - 1):
        assert scales[k + 1] == scales[k] * (0.5 if skipped[k] else 1.0), k


def leading_skips(model, x, target, limit=64):
    """Plain torch: how many first steps a GradScaler skips when the parameters do not move while it
    skips (a skipped step changes nothing): halve the scale until the scaled gradients are finite."""
    scale = 2.0 ** 16
    for k in range(limit):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), target)
        (loss * scale).backward()
        if all(torch.isfinite(p.grad).all() for p in model.parameters()):
            return k
        scale *= 0.5
    return limit


def test_every_step_skipped_is_an_error_naming_the_module(untouched):
    model, x = M.skips_every_step(), torch.randn(8, M.IN)
    with untouched(model):
        r = run("overfit-batch", model, x, amp="fp16", steps=10)
    assert r.series["loss_scale"] == [2.0 ** 16 * 0.5 ** k for k in range(10)]
    assert r.data["skipped_steps"] == 10 and r.data["skipped_at"] == list(range(10))
    f = finding(r, "every-step-skipped")
    assert f.severity == "error" and f.where == "scale" and "towards its input" in f.message
    assert r.exit_code == 1


def test_scale_follows_the_rule_and_skips_match_a_plain_torch_replay():
    torch.manual_seed(1)
    x = torch.randn(8, M.IN)
    r = run("overfit-batch", M.skips_then_recovers(), x, amp="fp16", steps=25)
    scales, skipped = r.series["loss_scale"], [k in r.data["skipped_at"] for k in range(25)]
    follows_torch_rule(scales, skipped)
    target = torch.randint(0, M.OUT, (8,), generator=torch.Generator().manual_seed(0))   # core/loss.py's draw
    expected = leading_skips(M.skips_then_recovers(), x, target)
    # the first `expected` steps are skipped, the next one is not (later ones may skip again, by the rule)
    assert 0 < expected < 25 and r.data["skipped_at"][:expected] == list(range(expected))
    assert expected not in r.data["skipped_at"]
    assert "every-step-skipped" not in codes(r)
    assert ("Loss scale", f"first 65536, last {scales[-1]:g}, min {min(scales):g}; {sum(skipped)} of 25 update(s) "
            "skipped") in r.summary


@pytest.mark.slow
def test_healthy_fp16_run_keeps_its_scale():
    model, x = load("mlp.py:build")
    r = run("overfit-batch", model, x, amp="fp16", steps=20, target_ratio=1e-9)
    assert r.series["loss_scale"] == [2.0 ** 16] * 20 and r.data["skipped_steps"] == 0


def test_no_scale_without_fp16():
    model, x = load("mlp.py:build")
    r = run("overfit-batch", model, x, amp="bf16", steps=3)
    assert "loss_scale" not in r.series and "skipped_steps" not in r.data


def test_culprit_rule_on_hand_built_events():
    from torchdiag.core.scaling import culprit

    ev = [("head", "output", None), ("head", "param", None), ("head", "input", None), ("body", "output", None)]
    assert culprit(ev, [True, True, False, False])[0] == "head"          # head's backward made it
    assert "parameter" in culprit(ev, [True, False, True, True])[1]
    assert culprit(ev, [False, False, False, False])[0] == "head"        # already bad at its output: the loss
    assert "reaching its output" in culprit(ev, [False, False, False, False])[1]
    assert culprit(ev, [True] * 4) is None


def test_doctor_under_fp16_backs_off_like_training_then_judges_the_step():
    """A fresh GradScaler's 2**16 overflows many healthy models: doctor halves the scale as skipped steps
    do until the gradients fit (skips_then_recovers needs a few halvings), and judges that step."""
    r = run("doctor", M.skips_then_recovers(), torch.randn(8, M.IN), amp="fp16")
    update = next(row for row in r.tables[0].rows if row["id"] == "update")
    assert update["status"] == "ok" and "skipped-step" not in codes(r)
    # a gradient that overflows at every scale down to 2**-8 (x 1e7 at the input of `scale`)
    r = run("doctor", M.skips_every_step(), torch.randn(8, M.IN), amp="fp16")
    f = finding(r, "skipped-step")
    assert f.severity == "warning" and f"down to {2.0 ** -8:g}" in f.message and "param-not-updated" not in codes(r)


def test_cli_shows_the_scale_and_fails(cli):
    from support import sample

    spec = sample("precision_steps.py:skips_every_step")
    r = cli("overfit-batch", spec, "-i", "8x8", "--amp", "fp16", "--steps", "4")
    assert r.code == 1 and "Loss scale" in r.stdout and "first 65536, last 8192, min 8192; 4 of 4" in r.stdout
    j = cli("overfit-batch", spec, "-i", "8x8", "--amp", "fp16", "--steps", "4", "--json").json
    assert j["loss_scale"] == [65536.0, 32768.0, 16384.0, 8192.0] and j["skipped_steps"] == 4
    assert [f["code"] for f in j["findings"] if f["severity"] == "error"] == ["every-step-skipped", "cannot-overfit"]


@pytest.mark.cuda
def test_every_step_skipped_on_cuda():
    r = run("overfit-batch", M.skips_every_step().cuda(), torch.randn(8, M.IN, device="cuda"), amp="fp16", steps=6)
    assert r.series["loss_scale"] == [2.0 ** 16 * 0.5 ** k for k in range(6)]
    assert finding(r, "every-step-skipped").where == "scale"


# --- gradflow: underflowed gradient values ----------------------------------------------------------

def underflow_case(dtype=torch.float32):
    """Linear(8→4, no bias), sum loss: dL/dW[i, j] = Σ_n x[n, j]. Columns 0-2 of x are 1e-6 (sum 8e-6,
    below float16's smallest normal 6.1e-5), the rest 1 (sum 8): exactly 3/8 of the values underflow."""
    model = torch.nn.Sequential(torch.nn.Linear(M.IN, M.OUT, bias=False)).to(dtype)
    x = torch.ones(M.BATCH, M.IN)
    x[:, :3] = 1e-6
    return model, x.to(dtype)


@pytest.mark.parametrize("how", [dict(amp="fp16"), dict(dtype="float16")])
def test_gradflow_underflow_fraction_in_fp16(how):
    model, x = underflow_case()
    r = run("gradflow", model, x, loss="sum", **how)
    layer = r.table("layers").rows[0]
    assert layer["underflow"] == 3 / 8 and r.table("params").rows[0]["underflow"] == 3 / 8
    assert "smallest normal" in r.table("layers").note


def test_gradflow_underflow_is_bf16s_own_range_and_absent_in_float32():
    model, x = underflow_case()
    assert run("gradflow", model, x, loss="sum", amp="bf16").table("layers").rows[0]["underflow"] == 0.0
    r = run("gradflow", model, x, loss="sum")
    assert all("underflow" not in row for t in r.tables for row in t.rows)


def test_gradflow_underflow_costs_no_extra_host_sync():
    from torchdiag.core.syncs import SyncCounter

    model, x = load("mlp.py:build")
    totals = []
    for amp in (None, "bf16"):
        with SyncCounter() as s:
            run("gradflow", model, x, amp=amp)
        totals.append(s.total)
    assert totals[0] == totals[1]


# --- profile and memory: the dtype each compute op ran in ---------------------------------------

@pytest.mark.parametrize("command,options", [("profile", dict(mode="train", wait=0, warmup=1, active=1)),
                                             ("memory", {})])
def test_autocast_fallback_is_named(command, options):
    r = run(command, M.falls_back(), torch.randn(8, M.IN), amp="bf16", **options)
    rows = {(row["op"], row["input_dtypes"]): row for row in r.table("op_dtypes").rows}
    assert rows[("aten::addmm", "bfloat16, bfloat16, bfloat16")]["modules"] == ["fc"]   # bias, input, weight
    assert "router" in rows[("aten::mm", "float32, float32")]["modules"]
    f = finding(r, "autocast-fallback")
    assert f.severity == "info" and f.where == "router" and r.exit_code == 0


def test_no_dtype_table_in_float32():
    r = run("profile", M.falls_back(), torch.randn(8, M.IN), wait=0, warmup=1, active=1)
    assert r.table("op_dtypes") is None and "autocast-fallback" not in codes(r)
    assert math.isfinite(r.data["step_time_ms"]["mean"])


# --- a healthy model stays healthy in every precision ----------------------------------------------

@pytest.mark.parametrize("precision", [dict(amp="bf16"), dict(amp="fp16"), dict(dtype="bfloat16")])
@pytest.mark.parametrize("command,options", [("doctor", {}), ("gradflow", {}),
                                             ("profile", dict(mode="train", wait=0, warmup=1, active=1))])
def test_healthy_mlp_gets_no_error_in_any_precision(command, options, precision, untouched):
    model, x = load("mlp.py:build")
    with untouched(model):
        r = run(command, model, x, **options, **precision)
    assert not [f for f in r.findings if f.severity == "error"] and r.exit_code == 0
    if command == "profile":   # the dtype the Linear layers' addmm ran in (the precision asked for)
        want = {"bf16": "bfloat16", "fp16": "float16"}.get(precision.get("amp"), precision.get("dtype"))
        rows = [row for row in r.table("op_dtypes").rows if row["op"] == "aten::addmm"]
        assert [row["input_dtypes"] for row in rows] == [", ".join([want] * 3)]


# --- float16 weights: Adam's eps and second moment flush to 0 -------------------------------------

def adam_nan_step(dtype):
    model = M.adam_nan_fp16().to(dtype)
    return run("doctor", model, M.adam_nan_input().to(dtype), loss="sum")


def test_premise_adam_in_float16_makes_the_zero_gradient_weight_nan():
    """What the sample relies on: gradient [8, 0]; eps 1e-8 is 0 in float16 (half the smallest
    subnormal is 2**-25 > 1e-8), so the second weight's update is 0 / 0."""
    assert torch.tensor(1e-8, dtype=torch.float16) == 0 and 1e-8 < 2.0 ** -25
    model = M.adam_nan_fp16().half()
    model(M.adam_nan_input().half()).sum().backward()
    assert model.fc.weight.grad.tolist() == [[8.0, 0.0]]
    torch.optim.Adam(model.parameters(), lr=1e-3).step()
    w = model.fc.weight.detach().float()[0]
    assert w[0].item() == float(torch.tensor(1 - 1e-3).half()) and math.isnan(w[1].item())


def test_doctor_says_adam_underflows_in_float16_not_that_the_forward_overwrites():
    r = adam_nan_step(torch.float16)
    f = finding(r, "non-finite-update")
    assert f.severity == "error" and f.where == "fc.weight" and "fc.weight (1 of 2)" in f.message
    # sqrt(2**-25 / (1 - 0.999)) = 0.0055: below it (1 - beta2) g^2 is 0 in float16
    assert "eps 1e-08 is 0 in float16" in f.message and "|g| ≤ 0.0055" in f.message
    assert "amp fp16" in f.hint and "optimizer sgd" in f.hint      # named as the Python caller writes them
    assert "param-not-updated" not in codes(r)


def test_doctor_on_the_command_line_names_no_optimizer_option_it_lacks(cli):
    """A sweep: doctor's float16 hint said "or --optimizer sgd", an option doctor's command line refuses."""
    r = cli("doctor", sample("mlp.py:build"), "--dtype", "float16", "--json")
    (f,) = [f for f in r.json["findings"] if f["code"] == "non-finite-update"]
    assert "--amp fp16" in f["hint"] and "--optimizer" not in f["hint"] and "plain SGD" in f["hint"], f["hint"]


def test_the_same_step_is_fine_in_float32_and_rounds_away_in_bfloat16():
    assert not [f for f in adam_nan_step(torch.float32).findings if f.severity != "info"]
    r = adam_nan_step(torch.bfloat16)     # 1 - 1e-3 rounds back to 1 in bfloat16; eps fits bf16's range
    assert "non-finite-update" not in codes(r) and r.data["rounded_away"][0]["fraction"] == 1.0


def test_healthy_mlp_in_float16_is_told_why_adam_fails_there():
    model, x = load("mlp.py:build")
    r = run("doctor", model, x, dtype="float16")
    assert {f.code for f in r.findings if f.severity == "error"} == {"non-finite-update"}
    r = run("doctor", model, x, dtype="float16", optimizer="sgd")
    assert not [f for f in r.findings if f.severity == "error"]


def test_overfit_batch_nan_loss_after_a_float16_adam_step_names_the_parameters_and_why():
    r = run("overfit-batch", M.adam_nan_fp16(), M.adam_nan_input(), loss="sum", steps=3, dtype="float16")
    f = finding(r, "non-finite-loss")
    assert "at step 1" in f.message and "made 1 of 1 trainable parameter tensor(s) Inf/NaN (fc.weight)" in f.message
    assert "eps 1e-08 is 0 in float16" in f.message and "nancheck" not in f.hint and "amp fp16" in f.hint
