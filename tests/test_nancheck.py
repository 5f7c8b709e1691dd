"""nancheck: the exact culprit for each way numbers go bad, checked against hand-computed truth."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from support import load, sample

BAD = ("non-finite-input", "non-finite-param", "non-finite-output", "non-finite-loss", "non-finite-grad",
       "non-finite-param-grad")


def codes(doc):
    return [(f["code"], f["where"]) for f in doc["findings"]]


def write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def run_diag(name, **kw):
    import torchdiag.api

    model, inputs = load(name)
    return model, inputs, torchdiag.api.run("nancheck", model, inputs, loss=kw.pop("loss", "auto"), **kw)


# --- healthy models -----------------------------------------------------------------------------

def test_healthy_mlp_passes_with_json_contract(cli):
    r = cli("nancheck", sample("mlp.py:build"), "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    assert doc["command"] == "nancheck" and doc["schema_version"] == 1 and doc["exit_code"] == 0
    assert doc["findings"] == []
    assert doc["loss"].startswith("cross_entropy on output")  # the choice made is in JSON
    assert doc["forward"] is None and doc["backward"] is None
    # 6 module calls: the Sequential root + 5 children (3 Linear, 2 ReLU)
    assert doc["modules_checked"] == 6
    assert doc["param_grads_checked"] == 6
    # the loss is cross-entropy of this model's output against seeded random classes: recompute it
    model, inputs, res = run_diag("mlp.py:build")
    with torch.no_grad():
        out = model(*inputs.args)
    target = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(0))
    assert res.data["loss_value"] == pytest.approx(float(torch.nn.functional.cross_entropy(out, target)), rel=1e-6)


def test_healthy_resnet_with_inplace_relu_and_batchnorm_passes(untouched):
    import torchdiag.api

    model, inputs = load("resnet.py:build")
    with untouched(model):   # BatchNorm running stats are restored bit for bit
        res = torchdiag.api.run("nancheck", model, inputs, loss="auto")
    assert res.findings == [] and res.exit_code == 0


# --- forward ------------------------------------------------------------------------------------

def test_nan_forward_names_log_features_with_exact_counts_and_range(cli):
    r = cli("nancheck", sample("broken_nan_forward.py:build"), "--json")
    assert r.code == 1
    doc = r.json
    # truth: log() of the tanh outputs gives NaN exactly where they are negative
    model, inputs = load("broken_nan_forward.py:build")
    with torch.no_grad():
        h = model.encoder(inputs.args[0])
    fwd = doc["forward"]
    assert (fwd["module"], fwd["type"], fwd["output"]) == ("log_features", "LogFeatures", "output")
    assert fwd["nan"] == int((h < 0).sum()) and fwd["nan"] > 0
    assert fwd["inf"] == int((h == 0).sum()) == 0
    assert fwd["input_min"] == pytest.approx(float(h.min())) and fwd["input_max"] == pytest.approx(float(h.max()))
    assert fwd["later_modules_affected"] == 2      # head and the root carry it on
    assert codes(doc)[0] == ("non-finite-output", "log_features")
    assert ("non-finite-loss", "loss") in codes(doc)
    # every parameter gradient is NaN: reported once, naming the first parameter
    assert ("non-finite-param-grad", "encoder.0.weight") in codes(doc)
    assert {r["parameter"] for r in doc["param_grads_non_finite"]} == {
        "encoder.0.weight", "encoder.0.bias", "head.weight", "head.bias"}
    # the backward is not blamed for a NaN that came from the forward
    assert "non-finite-grad" not in [c for c, _ in codes(doc)]
    rows = doc["forward_non_finite"]
    assert [x["module"] for x in rows] == ["log_features", "head", "(root)"]
    assert [x["origin"] for x in rows] == [True, False, False]


def test_inf_division_names_pool_with_inf_not_nan(cli):
    r = cli("nancheck", sample("broken_inf_division.py:build"), "--json")
    assert r.code == 1
    fwd = r.json["forward"]
    model, inputs = load("broken_inf_division.py:build")
    x, mask = inputs.args
    with torch.no_grad():
        num = model.embed(x).sum(dim=1)
    expected_inf = int((num[2] != 0).sum())          # row 2 has an empty mask: nonzero / 0 = ±Inf
    assert (fwd["module"], fwd["type"]) == ("pool", "MaskedMeanPool")
    assert (fwd["nan"], fwd["inf"]) == (int((num[2] == 0).sum()), expected_inf) == (0, 8)
    assert codes(r.json)[0] == ("non-finite-output", "pool")


def test_non_finite_parameter_and_input_are_reported_first(cli, tmp_path):
    spec = write(tmp_path, "badparam.py", """
        import torch
        from torch import nn

        def build():
            torch.manual_seed(0)
            m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
            with torch.no_grad():
                m[2].weight[1, 3] = float("nan")
            return m

        def example_inputs():
            return (torch.randn(3, 4),)

        def batch():
            x = torch.randn(3, 4)
            x[0, 0] = float("inf")
            return x, torch.tensor([0, 1, 0])
        """)
    r = cli("nancheck", spec + ":build", "--json")
    assert r.code == 1
    doc = r.json
    assert codes(doc)[:2] == [("non-finite-param", "2.weight"), ("non-finite-output", "2")]
    # a sweep: the output's hint blamed the module's forward operations; the weight itself carries the NaN
    (out,) = [f for f in doc["findings"] if f["code"] == "non-finite-output"]
    assert "its own parameter 2.weight is non-finite already" in out["hint"] and "log/sqrt" not in out["hint"]
    assert doc["non_finite_tensors"] == [{"tensor": "2.weight", "kind": "parameter", "shape": "2x4", "nan": 1, "inf": 0}]
    # the NaN weight feeds output column 1 only: 3 rows × 1 column
    assert (doc["forward"]["nan"], doc["forward"]["inf"]) == (3, 0)

    r = cli("nancheck", spec + ":build", "--batch", spec + ":batch", "--json")
    assert r.code == 1
    assert codes(r.json)[0] == ("non-finite-input", "input[0]")
    assert r.json["non_finite_tensors"][0] == {"tensor": "input[0]", "kind": "input", "shape": "3x4", "nan": 0, "inf": 1}


# --- loss ---------------------------------------------------------------------------------------

def test_custom_loss_that_makes_nan_from_finite_output(cli, tmp_path):
    spec = write(tmp_path, "lossy.py", """
        import torch
        from torch import nn

        def build():
            torch.manual_seed(0)
            return nn.Linear(3, 2)

        def example_inputs():
            return (torch.randn(4, 3),)

        def logloss(output, target):
            return torch.log(output).mean()     # negative outputs -> NaN
        """)
    r = cli("nancheck", spec + ":build", "--loss", spec + ":logloss", "--json")
    assert r.code == 1
    doc = r.json
    assert doc["loss"].startswith("logloss() on output")
    assert doc["forward"] is None
    assert codes(doc)[0] == ("non-finite-loss", "loss")
    assert "loss function itself" in doc["findings"][0]["message"]


# --- backward -----------------------------------------------------------------------------------

def test_nan_only_in_backward_names_norm(cli):
    r = cli("nancheck", sample("broken_nan_backward.py:build"), "--json")
    assert r.code == 1
    doc = r.json
    assert doc["forward"] is None                     # the forward is finite
    assert doc["backward"] == {"name": "norm", "type": "L2Norm", "via": "inputs", "nan": 8, "inf": 0}
    assert codes(doc) == [("non-finite-grad", "norm"), ("non-finite-param-grad", "proj.weight")]
    # truth: sqrt'(0) = inf, times d(x²)/dx = 0 → NaN in the zero row (row 0, 8 features) only;
    # proj.weight.grad = g^T x with a NaN row in g → every entry NaN; head gets finite gradients
    assert doc["param_grads_non_finite"] == [{"parameter": "proj.weight", "shape": "8x8", "nan": 64, "inf": 0}]
    assert doc["param_grads_checked"] == 3


def test_backward_nan_in_a_first_layer_is_found_through_its_parameters(cli, tmp_path):
    spec = write(tmp_path, "gate.py", """
        import torch
        from torch import nn

        class SqrtGate(nn.Module):
            def __init__(self):
                super().__init__()
                self.gain = nn.Parameter(torch.zeros(4))      # sqrt'(0) = inf
            def forward(self, x):
                return x * torch.sqrt(self.gain) + x

        def build():
            torch.manual_seed(0)
            return nn.Sequential(SqrtGate(), nn.Linear(4, 3))

        def example_inputs():
            return (torch.randn(5, 4),)
        """)
    r = cli("nancheck", spec + ":build", "--json")
    assert r.code == 1
    doc = r.json
    assert doc["backward"]["name"] == "0" and doc["backward"]["via"] == "parameters"
    assert codes(doc) == [("non-finite-grad", "0"), ("non-finite-param-grad", "0.gain")]
    # d/dgain of sum(g_out * x * sqrt(gain)) = sum(g_out*x)/(2 sqrt(0)): ±inf per element
    row = doc["param_grads_non_finite"][0]
    assert row["nan"] + row["inf"] == 4


def test_anomaly_shows_forward_trace_and_restores_mode(cli):
    assert not torch.is_anomaly_enabled()
    r = cli("nancheck", sample("broken_nan_backward.py:build"), "--anomaly", "--json")
    assert r.code == 1
    a = r.json["anomaly"]
    assert a["raised"] and a["op"] == "PowBackward0"
    assert "returned nan values" in a["message"]
    last = a["user_frames"][-1]
    assert last["file"].endswith("broken_nan_backward.py") and "torch.sqrt" in last["code"]
    assert not torch.is_anomaly_enabled()
    r = cli("nancheck", sample("broken_nan_backward.py:build"), "--anomaly")
    assert "Anomaly mode: forward call that created PowBackward0" in r.stdout


# --- --steps --------------------------------------------------------------------------------------

def _first_bad_step_by_hand(lr: float, steps: int, weights: bool = False):
    """SGD on y = xW^T + b with mse, gradients in closed form: the first step whose loss is not finite
    (with weights=True also the initial and the current W, b at that step)."""
    import importlib.util

    from support import SAMPLES

    spec = importlib.util.spec_from_file_location("nan_steps_truth", SAMPLES / "broken_nan_after_steps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lin = mod.build()[0]
    (x,), y = mod.batch()
    w, b = lin.weight.detach().clone(), lin.bias.detach().clone()
    w0, b0 = w.clone(), b.clone()
    n = x.shape[0]
    for step in range(1, steps + 1):
        r = x @ w.T + b - y
        loss = (r ** 2).mean()
        if not torch.isfinite(loss):
            return (step, (w0, b0), (w, b)) if weights else step
        gw, gb = 2.0 / n * r.T @ x, 2.0 / n * r.sum(0)
        w, b = w - lr * gw, b - lr * gb
        if not (torch.isfinite(w).all() and torch.isfinite(b).all()):
            return step
    return None


def test_steps_finds_the_step_where_training_goes_non_finite(cli, untouched):
    expected = _first_bad_step_by_hand(0.01, 30)
    assert expected is not None and expected > 3
    spec = sample("broken_nan_after_steps.py:build")
    batch = sample("broken_nan_after_steps.py:batch")
    r = cli("nancheck", spec, "--steps", 30, "--lr", 0.01, "--batch", batch, "--json")
    assert r.code == 1
    doc = r.json
    assert doc["steps"]["first_non_finite_step"] == expected
    assert doc["steps"]["first"]["phase"] == "loss"
    assert codes(doc) == [("non-finite-loss", "loss")]
    assert len(doc["loss_per_step"]) == expected
    # every parameter is still finite when the loss overflows: the one whose norm grew most is named,
    # with its norms before training and at the failing step (closed-form SGD above)
    _, (w0, b0), (w, b) = _first_bad_step_by_hand(0.01, 30, weights=True)
    assert float(w.norm() / w0.norm()) > float(b.norm() / b0.norm())
    grew = doc["steps"]["first"]["grew_most"]
    assert grew["parameter"] == "0.weight"
    assert grew["norm_start"] == pytest.approx(float(w0.norm()), rel=1e-5)
    assert grew["norm_now"] == pytest.approx(float(w.norm()), rel=1e-3)
    assert "grew most in 0.weight" in doc["findings"][0]["message"]
    # a smaller learning rate converges: no finding, exit 0
    assert _first_bad_step_by_hand(0.0005, 30) is None
    r = cli("nancheck", spec, "--steps", 30, "--lr", 0.0005, "--batch", batch, "--json")
    assert r.code == 0 and r.json["steps"]["first_non_finite_step"] is None and r.json["steps"]["ran"] == 30


def test_steps_reports_the_parameter_that_goes_non_finite_in_the_update(tmp_path, untouched):
    import torchdiag.api
    from torchdiag.core.inputs import ModelInputs

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
            self.huge = torch.nn.Parameter(torch.tensor([3e38]))

        def forward(self, x):
            return (x * self.w).sum() - self.huge.sum()

    model = Scale()
    inputs = ModelInputs((torch.tensor([1.0, 1.0]),), {}, "test")
    # loss = output (a scalar): d/dhuge = -1, so SGD at lr 1e38 makes huge 3e38 + 1e38 > float32 max = Inf,
    # while w becomes 1 - 1e38 (finite); the forward before the update is finite (2 - 3e38)
    with untouched(model):
        res = torchdiag.api.run("nancheck", model, inputs, steps=3, lr=1e38)   # loss auto: the scalar output
    f = [(x.code, x.where) for x in res.findings]
    assert f == [("non-finite-param", "huge")]
    assert res.data["steps"]["first"]["phase"] == "update" and res.data["steps"]["first_non_finite_step"] == 1


class _Clipped(torch.nn.Module):
    """Gemma 4's audio layers: clip bounds in buffers, ±Inf until calibrated (no clipping)."""

    def __init__(self, leak: bool = False):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("input_min", torch.tensor(-float("inf")))
        self.register_buffer("input_max", torch.tensor(float("inf")))
        self.leak = leak

    def forward(self, x):
        y = self.lin(torch.clamp(x, self.input_min, self.input_max))
        return y + self.input_max if self.leak else y     # leak: the Inf becomes a value


def test_an_inf_bound_in_a_buffer_is_info_when_the_pass_stays_finite():
    import torchdiag.api
    from torchdiag.core.inputs import ModelInputs

    inputs = ModelInputs((torch.randn(2, 4),), {}, "test")
    res = torchdiag.api.run("nancheck", _Clipped(), inputs)
    assert res.exit_code == 0 and [(f.code, f.severity) for f in res.findings] == [("inf-buffer", "info")]
    assert "2 buffer(s) hold ±Inf (input_min, input_max)" in res.findings[0].message
    leaked = torchdiag.api.run("nancheck", _Clipped(leak=True), inputs)
    assert leaked.exit_code == 1
    assert [(f.code, f.where) for f in leaked.findings][:2] == [("non-finite-param", "input_min"),
                                                                 ("non-finite-param", "input_max")]


# --- no trace, errors, devices ----------------------------------------------------------------

def test_model_untouched_by_checks_steps_and_anomaly(untouched, tmp_path):
    import torchdiag.api

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5),
                                torch.nn.ReLU(inplace=True), torch.nn.Linear(8, 3))
    model.eval()
    model[0].weight.requires_grad_(False)
    model[4].weight.grad = torch.full_like(model[4].weight, 7.0)   # a stale grad the user had
    from torchdiag.core.inputs import ModelInputs

    inputs = ModelInputs((torch.randn(5, 6),), {}, "test")
    with untouched(model):
        res = torchdiag.api.run("nancheck", model, inputs, loss="auto", steps=3, lr=0.1, anomaly=True)
    assert res.exit_code == 0
    assert len(res.series["loss_per_step"]) == 3
    model2, inputs2 = load("broken_nan_forward.py:build")
    with untouched(model2):
        torchdiag.api.run("nancheck", model2, inputs2, loss="auto", anomaly=True)


def test_bad_input_is_exit_2_one_error_line(cli):
    r = cli("nancheck", sample("mlp.py:build"), "-i", "16xfoo")
    assert r.code == 2
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: bad input shape") and len([x for x in lines if x.startswith("error:")]) == 1
    assert "Traceback" not in r.stderr and r.stdout == ""
    r = cli("nancheck", sample("mlp.py:build"), "--steps", 2, "--optimizer", "lbfgs")
    assert r.code == 2 and r.stderr.startswith("error: --optimizer: 'lbfgs' is not one of adam, adamw, sgd")
    assert "Traceback" not in r.stderr
    r = cli("nancheck", sample("mlp.py:build"), "--device", "meta")
    assert r.code == 2 and r.stderr.startswith("error: nancheck needs real values")


def test_model_that_raises_is_exit_3_naming_the_module(cli):
    r = cli("nancheck", sample("broken_shape.py:build"))
    assert r.code == 3
    assert r.stderr.startswith("error: forward failed in 2.0 (Linear)") and "Traceback" not in r.stderr


def test_cuda_on_cpu_only_machine_is_a_clear_exit_2(cli, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a CPU-only machine, even on a GPU box
    r = cli("nancheck", sample("mlp.py:build"), "--device", "cuda")
    assert r.code == 2
    assert r.stderr.startswith("error: device 'cuda' is not available") and "Traceback" not in r.stderr


@pytest.mark.cuda
def test_nan_forward_on_cuda(cli):
    r = cli("nancheck", sample("broken_nan_forward.py:build"), "--device", "cuda", "--json")
    assert r.code == 1 and r.json["forward"]["module"] == "log_features"
    r = cli("nancheck", sample("broken_nan_backward.py:build"), "--device", "cuda", "--json")
    assert r.code == 1 and r.json["backward"]["name"] == "norm"


def test_json_keys_are_stable_on_a_clean_run(cli):
    """Every table key is present (empty list) and optional parts are null when not requested."""
    r = cli("nancheck", sample("mlp.py:build"), "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    for key in ("forward_non_finite", "backward_non_finite", "param_grads_non_finite", "non_finite_tensors"):
        assert doc[key] == [], key
    for key in ("steps", "loss_per_step", "anomaly"):
        assert key in doc and doc[key] is None, key
    # the console still shows no empty table
    r = cli("nancheck", sample("mlp.py:build"))
    assert r.code == 0 and "Non-finite" not in r.stdout and "Backward: modules" not in r.stdout
    # requested: present with values
    r = cli("nancheck", sample("mlp.py:build"), "--steps", "2", "--anomaly", "--json")
    doc = r.json
    assert r.code == 0 and doc["steps"]["ran"] == 2 and len(doc["loss_per_step"]) == 2
    assert doc["anomaly"]["raised"] is False
    # same keys on a failing run, where the tables have rows
    r = cli("nancheck", sample("broken_nan_forward.py:build"), "--steps", "3", "--json")
    doc = r.json
    assert r.code == 1 and doc["forward_non_finite"] and doc["param_grads_non_finite"]
    assert doc["non_finite_tensors"] == [] and doc["anomaly"] is None
    assert doc["steps"]["ran"] == 0 and doc["loss_per_step"] == []


# --- a NaN made in a module's own code, between its submodule calls --------------------------------

FUNCTIONAL = """
    import torch
    from torch import nn

    class Between(nn.Module):            # log() in forward, between two submodule calls
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 3)

        def forward(self, x):
            return self.b(torch.log(self.a(x)))

    class After(nn.Module):              # log() after the last submodule call
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return torch.log(self.a(x))

    class Outer(nn.Module):              # the culprit is a nested container, not the root
        def __init__(self):
            super().__init__()
            self.pre = nn.Linear(4, 4)
            self.block = Between()
            self.post = nn.Linear(3, 2)

        def forward(self, x):
            return self.post(self.block(self.pre(x)))

    def between():
        torch.manual_seed(0)
        return Between()

    def after():
        torch.manual_seed(0)
        return After()

    def outer():
        torch.manual_seed(0)
        return Outer()

    def example_inputs():
        return (torch.randn(5, 4),)
    """


def test_nan_in_a_modules_own_code_names_the_calls_around_it(cli, tmp_path):
    spec = write(tmp_path, "functional.py", FUNCTIONAL)
    r = cli("nancheck", spec + ":between", "--json")
    assert r.code == 1
    fwd = r.json["forward"]
    # truth: log of a(x) is NaN where a(x) < 0; b mixes each row, so a row with one NaN is all NaN
    import importlib.util

    mspec = importlib.util.spec_from_file_location("functional_truth", spec)
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    torch.manual_seed(0)                          # the CLI's --seed 0 before example_inputs()
    (x,) = mod.example_inputs()
    with torch.no_grad():
        h = mod.between().a(x)
    assert (fwd["module"], fwd["type"]) == ("(root)", "Between")
    assert fwd["nan"] == int((h < 0).any(dim=1).sum()) * 3 and fwd["nan"] > 0
    assert fwd["own_code"] == {"after": "a", "after_type": "Linear", "first_consumer": "b", "first_consumer_type": "Linear"}
    msg = r.json["findings"][0]["message"]
    assert "between a (Linear) returning finite values and b (Linear) receiving it" in msg
    assert "1 other module call(s) downstream" in msg           # b, which finished before the root
    assert r.json["forward_non_finite"][0]["module"] == "b"     # innermost first; the origin is marked
    assert [x["origin"] for x in r.json["forward_non_finite"]] == [False, True]

    fwd = cli("nancheck", spec + ":after", "--json").json["forward"]
    assert fwd["module"] == "(root)" and fwd["own_code"]["after"] == "a" and fwd["own_code"]["first_consumer"] is None

    doc = cli("nancheck", spec + ":outer", "--json").json
    fwd = doc["forward"]
    assert (fwd["module"], fwd["type"]) == ("block", "Between")
    assert fwd["own_code"]["after"] == "block.a" and fwd["own_code"]["first_consumer"] == "block.b"
    r = cli("nancheck", spec + ":outer")
    # the summary names the origin too (words, not line breaks: the console wraps at its width, and a longer
    # tmp path, e.g. under pytest-xdist, moves the break)
    assert "first non-finite at block (Between)" in " ".join(r.stdout.split())


def test_anomaly_note_and_frames_outside_user_code():
    from torchdiag.diagnostics import nancheck

    trace = [
        '  File "/home/u/.venv/bin/torchdiag", line 8, in <module>',
        "    sys.exit(main())",
        '  File "/home/u/.venv/lib/python3.11/site-packages/torchdiag/cli/app.py", line 59, in main',
        "    code = app(standalone_mode=False)",
        '  File "/home/u/proj/model.py", line 12, in forward',
        "    return torch.log(x)",
        '  File "C:\\venv\\Scripts\\torchdiag.exe", line 3, in <module>',
        "    main()",
    ]
    frames = nancheck.parse_frames(trace)
    assert [f["user"] for f in frames] == [False, False, True, False]
    assert frames[2]["code"] == "return torch.log(x)" and frames[2]["line"] == 12
    # whoever called torchdiag (a test, a script using the API) is above its first frame: not user code
    caller = ['  File "/home/u/proj/train.py", line 3, in <module>', "    torchdiag.nancheck(model)",
              '  File "/home/u/src/torchdiag/api.py", line 85, in nancheck', "    return _with_loss()"]
    assert [f["user"] for f in nancheck.parse_frames(caller + trace[4:6])] == [False, False, True]


def test_anomaly_on_a_forward_nan_says_it_only_sees_backward(cli):
    r = cli("nancheck", sample("broken_nan_forward.py:build"), "--anomaly", "--json")
    assert r.code == 1
    assert r.json["anomaly"]["raised"] and r.json["anomaly"]["user_frames"] == []   # the NaN reached backward in the loss
    r = cli("nancheck", sample("broken_nan_forward.py:build"), "--anomaly")
    out = " ".join(r.stdout.split())
    assert "where the forward NaN/Inf from log_features entered the backward" in out
    assert "created by torchdiag's loss" in out


def test_all_finite_one_sync_is_never_wrong():
    """The batched check must agree with an element-wise isfinite on every tricky case."""
    import torch

    from torchdiag.diagnostics.nancheck import all_finite

    big = torch.full((4,), 3e38)                      # finite, but its float32 sum overflows to inf
    cases = {
        "healthy": ([torch.ones(3), torch.zeros(2, 2)], True),
        "nan in one": ([torch.ones(3), torch.tensor([1.0, float("nan")])], False),
        "+inf and -inf in two tensors": ([torch.tensor([float("inf")]), torch.tensor([-float("inf")])], False),
        "huge but finite": ([big, big.double() * 1e10], True),
        "float16": ([torch.full((3,), 60000.0, dtype=torch.float16)], True),
        "complex nan": ([torch.tensor([1 + 1j, complex(float("nan"), 0)])], False),
        "empty": ([torch.empty(0), torch.empty(0, 3)], True),
        "nothing": ([], True),
    }
    for label, (tensors, want) in cases.items():
        truth = all(bool(torch.isfinite(t).all()) for t in tensors)
        assert truth == want, label
        assert all_finite(tensors) is want, label


# --- options: validated once, before the model loads; named in the caller's terms -----------------

def test_bad_option_values_are_exit_2_before_the_model_loads(cli, tmp_path):
    spec = write(tmp_path, "raises.py", """
        def build():
            raise RuntimeError("the factory must not be called")
        """)
    for args, flag in ((["--optimizer", "lbfgs"], "--optimizer"), (["--lr", "-1", "--steps", "2"], "--lr"),
                       (["--lr", "nan"], "--lr")):
        r = cli("nancheck", spec + ":build", *args)
        assert r.code == 2, (args, r.stderr)
        assert r.stderr.startswith(f"error: {flag}: ") and "factory" not in r.stderr and "Traceback" not in r.stderr
        r = cli("nancheck", str(tmp_path / "missing.py") + ":build", *args, "--json")
        assert r.code == 2 and r.json["error"]["message"].startswith(f"{flag}: ")
    r = cli("nancheck", spec + ":build", "--steps", "-1")
    assert r.code == 2 and "--steps" in r.stderr and "factory" not in r.stderr


def test_bad_option_values_name_the_python_keyword():
    import torchdiag
    from torchdiag.errors import OptionError

    model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    for kw, name in (({"steps": -1}, "steps"), ({"steps": 1.5}, "steps"), ({"optimizer": "lbfgs"}, "optimizer"),
                     ({"lr": 0}, "lr"), ({"anomaly": "yes"}, "anomaly")):
        with pytest.raises(OptionError) as e:
            torchdiag.nancheck(model, x, **kw)
        assert e.value.message.startswith(f"{name}: "), (kw, e.value.message)


def test_optimizer_default_is_plain_sgd_lr_001():
    """Today's --steps optimizer, kept by the contract: SGD without momentum, lr 0.01."""
    from torchdiag.core.train import make_optimizer
    from torchdiag.diagnostics import nancheck

    opt = make_optimizer([torch.nn.Parameter(torch.ones(2))], nancheck.OPTIMIZER)
    assert type(opt) is torch.optim.SGD
    assert opt.defaults["lr"] == 0.01 and opt.defaults["momentum"] == 0.0


# --- the healthy path defers every check; the exact pass runs only on suspicion -------------------

def test_healthy_model_never_runs_the_exact_pass(monkeypatch):
    import torchdiag.api
    from torchdiag.diagnostics.nancheck import flags

    def refuse(*a, **k):
        raise AssertionError("the exact pass ran on a healthy model")

    monkeypatch.setattr(flags, "checked_pass", refuse)
    model, inputs = load("cnn.py:build")
    res = torchdiag.api.run("nancheck", model, inputs, steps=2)
    assert res.exit_code == 0 and res.data["modules_checked"] == 11 and res.data["steps"]["ran"] == 2
    # a broken model does reach it (that is where the culprit is named)
    model, inputs = load("broken_nan_forward.py:build")
    with pytest.raises(AssertionError, match="exact pass ran"):
        torchdiag.api.run("nancheck", model, inputs)


def test_huge_but_finite_values_are_a_suspicion_not_a_finding(monkeypatch):
    """Outputs near float32 max overflow their sum (the device-side flag): the exact pass then
    decides, and finds everything finite."""
    import torchdiag.api
    from torchdiag.diagnostics.nancheck import flags

    exact = []
    real = flags.checked_pass
    monkeypatch.setattr(flags, "checked_pass", lambda *a, **k: exact.append(1) or real(*a, **k))

    class Huge(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.w * 3e38          # each element finite, their sum is not

    x = torch.ones(2, 4)
    assert torch.isfinite(Huge()(x)).all() and not torch.isfinite(Huge()(x).sum())
    res = torchdiag.api.run("nancheck", Huge(), x, loss=lambda out, target: (out / 3e38).mean())
    assert res.findings == [] and res.exit_code == 0
    assert exact == [1]        # the suspicion was decided by the exact pass (forward only: no grad hooks)


def test_anomaly_never_shows_torchdiags_frames_as_the_users():
    """An op created by torchdiag's own loss: the frames table shows torch's frames at most, never
    torchdiag's, and says the op came from torchdiag's loss."""
    import os

    import torchdiag
    from torchdiag.diagnostics.nancheck.anomaly import report_anomaly
    from torchdiag.results import Result

    ours = os.path.join(os.path.dirname(torchdiag.__file__), "core", "loss.py")
    trace = ['  File "/venv/lib/python3.11/site-packages/typer/main.py", line 1445, in wrapper', "    return callback()",
             f'  File "{os.path.join(os.path.dirname(torchdiag.__file__), "api.py")}", line 99, in run', "    return x",
             f'  File "{ours}", line 180, in _primary', "    return F.cross_entropy(y, t)",
             '  File "/usr/lib/python3/site-packages/torch/nn/functional.py", line 3100, in cross_entropy',
             "    return torch._C._nn.cross_entropy_loss(input, target)"]
    r = Result("nancheck")
    report_anomaly(r, {"raised": True, "op": "LogSoftmaxBackward0", "message": "nan", "forward_trace": trace})
    rows = r.table("anomaly_frames").rows
    assert rows and all("torchdiag" not in row["frame"] for row in rows)
    assert [row["frame"] for row in rows] == ["/usr/lib/python3/site-packages/torch/nn/functional.py:3100 in "
                                              "cross_entropy"]   # not the CLI's caller (typer) either
    assert "by torchdiag's loss (--loss)" in r.table("anomaly_frames").note


def test_steps_with_the_auto_loss_train_the_run_they_say(cli):
    """Without --batch the target is made up, and the run must still be plain SGD on plain mse: a reverted change
    that divided the loss by its starting error slowed SGD down by that factor, and this run stopped diverging.
    Truth by hand: gradient descent on mse over inputs X diverges whatever the target once lr exceeds
    2 / λmax(2/n XᵀX) for the weight together with the bias (the augmented [X, 1])."""
    import importlib.util

    from support import SAMPLES

    spec_ = importlib.util.spec_from_file_location("nan_steps_auto", SAMPLES / "broken_nan_after_steps.py")
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    (x,) = mod.example_inputs()
    aug = torch.cat([x, torch.ones(x.shape[0], 1)], 1).double()
    limit = 2.0 / float(torch.linalg.eigvalsh(2.0 / x.shape[0] * aug.T @ aug).max())
    assert 0.01 > 10 * limit
    r = cli("nancheck", sample("broken_nan_after_steps.py:build"), "--steps", 30, "--lr", 0.01, "--json")
    assert r.code == 1 and ("non-finite-loss", "loss") in codes(r.json), r.stdout[-500:]
    assert "against a random target" in r.json["loss"] and "scaled" not in r.json["loss"]


class OwnLossLabels(torch.nn.Module):
    """A model that takes its labels and computes its own cross-entropy, as HF models do."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, labels):
        logits = self.lin(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class OwnLossTuple(OwnLossLabels):
    def forward(self, x, labels):   # transformers' return_dict=False: (loss, logits)
        out = super().forward(x, labels)
        return out["loss"], out["logits"]


def test_labels_all_ignore_index_are_named_as_the_nan_loss_cause():
    """A sweep: GPT-2 given labels all -100 got 'look at log/sqrt/division in its forward'."""
    from torchdiag.api import run
    from torchdiag.core.inputs import ModelInputs

    x = torch.randn(5, 4)
    res = run("nancheck", OwnLossLabels(), ModelInputs((x,), {"labels": torch.full((5,), -100)}))
    hints = {f.code: f.hint for f in res.findings if f.severity == "error"}
    assert "non-finite-output" in hints, hints
    assert all(h.startswith("every value of labels is -100, cross-entropy's ignore_index") for h in hints.values())
    res = run("nancheck", OwnLossTuple(), ModelInputs((x,), {"labels": torch.full((5,), -100)}))
    hints = [f.hint for f in res.findings if f.severity == "error"]
    assert hints and all(h.startswith("every value of labels is -100") for h in hints), hints
    ok = run("nancheck", OwnLossLabels(), ModelInputs((x,), {"labels": torch.tensor([0, 1, 2, -100, -100])}))
    assert ok.exit_code == 0


class SqrtPlusOffset(torch.nn.Module):
    """A NaN of its own (sqrt of a negative) beside an int input that happens to be all -100 (a review: the -100
    hint replaced the real one)."""

    def forward(self, x, offset):
        return torch.sqrt(x - 100) + offset.float()


def test_an_int_input_of_minus_100_is_not_blamed_for_a_nan_it_did_not_make():
    from torchdiag.api import run
    from torchdiag.core.inputs import ModelInputs

    res = run("nancheck", SqrtPlusOffset(), ModelInputs((torch.randn(5, 3), torch.full((5, 3), -100)), {}))
    hints = [f.hint for f in res.findings if f.severity == "error"]
    assert hints and not any("ignore_index" in (h or "") for h in hints), hints


class _CausalLM(torch.nn.Module):
    """A causal encoder LM whose additive mask (0 / -inf, torch's generate_square_subsequent_mask) is a forward
    input, as in PyTorch's word_language_model example."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 16)
        self.enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 1)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, ids, mask):
        return self.head(self.enc(self.emb(ids), mask=mask))


def _attend(mask):
    """Attention by hand with an additive mask: a row the mask sets to -inf throughout softmaxes to NaN."""
    class Attend(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 3)

        def forward(self, x, m):
            q, k, v = self.qkv(x).chunk(3, -1)
            w = torch.softmax(q @ k.transpose(1, 2) / 8 ** 0.5 + m, -1)
            return self.out((w @ v).mean(1))

    torch.manual_seed(0)
    return Attend(), (torch.randn(2, 5, 8), mask)


def test_an_additive_mask_input_is_info_when_the_pass_stays_finite_and_traced_when_it_does_not():
    """A sweep: a causal LM given its 0/-inf mask as an input was a non-finite-input error (exit 1) on a healthy
    model; a row masked to -inf throughout (a sample of only padding) was blamed on the mask as bad data, the NaN the
    softmax makes never traced to its module."""
    from torchdiag.api import run

    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    r = run("nancheck", _CausalLM(), (ids, torch.nn.Transformer.generate_square_subsequent_mask(16)))
    assert r.exit_code == 0 and [f.code for f in r.findings] == ["inf-input"], [f.to_dict() for f in r.findings]
    mask = torch.zeros(2, 5, 5)
    mask[1] = float("-inf")   # sample 1: every key masked
    model, args = _attend(mask)
    r = run("nancheck", model, args)
    f = next(f for f in r.findings if f.code == "non-finite-output")
    assert f.where == "(root)" and "from inputs holding ±Inf but no NaN" in f.message and "-inf" in f.hint, f.to_dict()


def test_a_nan_in_the_target_is_the_datas_not_the_losss():
    """A sweep: a NaN in the --batch target was "the loss function itself produced it"."""
    from torchdiag.api import run

    y = torch.randn(4, 3)
    y[2, 2] = float("nan")
    r = run("nancheck", torch.nn.Linear(5, 3), (torch.randn(4, 5),), target=y, loss="mse")
    codes = [f.code for f in r.findings]
    assert codes[0] == "non-finite-target" and "the target is non-finite" in r.findings[1].message, codes


def test_an_inf_made_inside_the_model_or_in_the_data_is_not_a_mask():
    """A review of the mask rules: an exp's +Inf between two layers was blamed on the next Linear as if a mask's -inf
    (it arose in the parent's own code), a -inf feature a ReLU clamps passed as a mask, and NaN labels a loss masks
    failed a finite pass."""
    from torchdiag.api import run

    class Overflow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)
            with torch.no_grad():
                self.a.weight.mul_(200.0)

        def forward(self, x):
            return self.b(torch.exp(self.a(x)))

    r = run("nancheck", Overflow(), (torch.randn(4, 4, generator=torch.Generator().manual_seed(0)),))
    f = next(f for f in r.findings if f.code == "non-finite-output")
    assert f.where == "(root)" and "own forward code" in f.message and "mask" not in f.hint, f.to_dict()
    x = torch.randn(4, 4)
    x[1, 2] = float("-inf")   # log(0) in a feature: bad data, even though the ReLU below makes it 0
    clamped = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 3))
    assert "non-finite-input" in {f.code for f in run("nancheck", clamped, (x,)).findings}
    y = torch.randn(4, 3)
    y[0, 1] = float("nan")   # a missing label the loss masks

    def masked(out, target):
        keep = ~torch.isnan(target)
        return ((out - torch.nan_to_num(target)) ** 2)[keep].mean()

    r = run("nancheck", torch.nn.Linear(5, 3), (torch.randn(4, 5),), target=y, loss=masked)
    assert r.exit_code == 0 and [f.severity for f in r.findings if f.code == "non-finite-target"] == ["info"]


def test_the_mask_rules_leave_other_causes_to_their_own_findings():
    """A fifth review: a loss masking NaN labels after subtracting (torch.where over (out - y)**2) made NaN gradients,
    which the target's error hid; a masked max-pool's -inf turned into NaN by the next Linear was the container's with
    a softmax hint; an ALiBi-style mask (-inf beside negative biases) was a non-finite-input error."""
    from torchdiag.api import run

    y = torch.randn(4, 3)
    y[0, 1] = float("nan")

    def where_loss(out, target):   # NaN gradients: d/dout of (out - nan)**2 is NaN, where() only hides the value
        return torch.where(torch.isnan(target), torch.zeros(()), (out - target) ** 2).mean()

    r = run("nancheck", torch.nn.Linear(5, 3), (torch.randn(4, 5),), target=y, loss=where_loss)
    codes = {f.code: f.severity for f in r.findings}
    assert codes.get("non-finite-target") == "info" and "non-finite-grad" in codes, codes

    class Pool(torch.nn.Module):
        def forward(self, x, mask):
            return (x + mask[..., None]).amax(1)

    class PoolNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pool, self.head = Pool(), torch.nn.Linear(4, 2)

        def forward(self, x, mask):
            return self.head(self.pool(x, mask))

    x, mask = torch.randn(2, 3, 4), torch.zeros(2, 3)
    mask[1] = float("-inf")   # a sample of only padding: its max is -inf, the Linear makes NaN of it
    r = run("nancheck", PoolNet(), (x, mask))   # the NaN is made of the mask's -inf: the mask is no bad data
    assert "non-finite-input" not in {f.code for f in r.findings} and "max over a row" in next(
        f.hint for f in r.findings if f.code == "non-finite-output"), [f.to_dict() for f in r.findings]

    class Prep(torch.nn.Module):   # a sixth review: a submodule passing the mask on is not where the NaN arises
        def forward(self, m):
            return m[:, None, :]

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.prep, self.qkv = Prep(), torch.nn.Linear(4, 12)

        def forward(self, x, m):
            q, k, v = self.qkv(x).chunk(3, -1)
            return (torch.softmax(q @ k.transpose(1, 2) + self.prep(m), -1) @ v).mean(1)

    r = run("nancheck", Attn(), (x, mask))
    f = next(f for f in r.findings if f.code == "non-finite-output")
    assert f.where == "(root)" and r.exit_code == 1, [g.to_dict() for g in r.findings]
    alibi = torch.triu(torch.full((5, 5), float("-inf")), 1) - 0.5 * torch.arange(5.0).view(1, 5).abs()
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    class Att(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha, self.out = mha, torch.nn.Linear(8, 2)

        def forward(self, h, m):
            return self.out(self.mha(h, h, h, attn_mask=m)[0].mean(1))

    r = run("nancheck", Att(), (torch.randn(2, 5, 8), alibi.tril(0) + torch.triu(torch.full((5, 5), float("-inf")), 1)))
    assert r.exit_code == 0 and "inf-input" in {f.code for f in r.findings}, [f.to_dict() for f in r.findings]


def test_a_masked_missing_label_is_neither_the_headline_nor_an_input_error():
    """A sixth review: a model's own NaN beside a masked missing label was headlined as the target's; HF-style labels
    given both as an input and as the target, their NaN masked by the model's own loss, failed as non-finite-input."""
    from torchdiag.api import run

    y = torch.randn(4, 3)
    y[0, 1] = float("nan")

    def masked(out, target):
        keep = ~torch.isnan(target)
        return ((out - torch.nan_to_num(target)) ** 2)[keep].mean()

    class LogOut(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(5, 3)

        def forward(self, x):
            return torch.log(self.l(x))   # negative values: NaN, the model's own

    r = run("nancheck", LogOut(), (torch.randn(4, 5),), target=y, loss=masked)
    assert r.findings[0].code == "non-finite-output" and {f.code: f.severity for f in r.findings}[
        "non-finite-target"] == "info", [f.to_dict() for f in r.findings]

    class Labelled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(5, 3)

        def forward(self, x, labels):
            out = self.l(x)
            keep = ~torch.isnan(labels)
            return ((out - torch.nan_to_num(labels)) ** 2)[keep].mean()

    r = run("nancheck", Labelled(), (torch.randn(4, 5), y), target=y)
    assert r.exit_code == 0 and "non-finite-input" not in {f.code for f in r.findings}, [f.to_dict() for f in r.findings]


def test_a_float8_buffer_is_read_not_an_internal_error():
    """A review (/tmp/rev36): a float8 buffer holding inf ended nancheck with 'Promotion for Float8 Types is not
    supported' (its sum and norm in float32); it is read as float32 now, and reported as any buffer."""
    from torchdiag.api import run as api_run

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(8, 10)
            self.register_buffer("amax_history", torch.tensor([float("inf"), 0.0]).to(torch.float8_e5m2))

        def forward(self, x):
            return self.head(x)

    res = api_run("nancheck", Scaled(), (torch.randn(4, 8),))
    assert [(f.severity, f.code, f.where) for f in res.findings] == [("info", "inf-buffer", "amax_history")]


@pytest.mark.parametrize("used", [False, True])
def test_a_float8_weight_copy_beside_a_masked_fill_leaves_the_fill_a_fill(used):
    """Reviews (/tmp/rev47, /tmp/rev48): an fp8 copy of a weight kept as a buffer stopped the fill trace (isfinite is
    not implemented for float8), kept or cast to float32 in the forward, and a healthy -inf ban of classes 0, 2, 5 was
    non-finite-output and loss errors."""
    from torchdiag.api import run as api_run

    class Banned(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(10, 8)
            self.register_buffer("ban", torch.tensor([True, False, True, False, False, True, False, False]))
            self.register_buffer("w8", self.fc.weight.detach().to(torch.float8_e4m3fn))

        def forward(self, x):
            y = x @ self.w8.to(torch.float32).t() + self.fc.bias if used else self.fc(x)
            return y.masked_fill(self.ban, float("-inf"))

    torch.manual_seed(0)
    res = api_run("nancheck", Banned(), (torch.randn(4, 10),))
    assert not [f for f in res.findings if f.severity == "error"], \
        [(f.code, f.message) for f in res.findings]
    assert [f.code for f in res.findings if f.code == "inf-fill"] == ["inf-fill"]


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_buffer_is_read_by_its_stored_values(layout):
    """A graph's sparse adjacency buffer ended nancheck with "Could not run 'aten::linalg_vector_norm' with arguments
    from the 'SparseCPU' backend" (an internal error); its stored values are read, and a NaN among them is found."""
    from torchdiag.api import run as api_run

    class Graph(torch.nn.Module):
        def __init__(self, adj):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)
            self.register_buffer("adj", adj.to_sparse() if layout == "coo" else adj.to_sparse_csr())

        def forward(self, x):
            return (self.adj.to_dense() @ self.fc(x).t()).t()

    res = api_run("nancheck", Graph(torch.eye(4)), (torch.randn(4, 8),))
    assert res.exit_code == 0 and not [f for f in res.findings if f.severity != "info"]
    bad = torch.eye(4)
    bad[1, 2] = float("nan")
    res = api_run("nancheck", Graph(bad), (torch.randn(4, 8),))
    assert [f.where for f in res.findings if f.code == "non-finite-param"] == ["adj"]


_RELU_OUT = textwrap.dedent('''
    import torch, torch.nn as nn
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            self.act = nn.ReLU() if ACT == "relu" else nn.Softplus()   # the fault: a ReLU on the class outputs
            with torch.no_grad():
                self.body[2].bias.fill_(-5.0)
        def forward(self, x):
            return self.act(self.body(x))
    def build():
        return Net()
    def loss(out, target):   # Keras' categorical cross-entropy on outputs: normalised by each row's sum
        p = out / out.sum(1, keepdim=True)
        return -(torch.nn.functional.one_hot(target, 4) * torch.log(p)).sum(1).mean() * SCALE
    def batch():
        torch.manual_seed(0)
        return torch.randn(16, 8), torch.randint(0, 4, (16,))
''')


@pytest.mark.parametrize("act", ["relu", "softplus"])
def test_a_loss_non_finite_from_a_finite_output_says_what_the_output_held(cli, tmp_path, act):
    """bench/bugs so_47352366 ported a ReLU on the class outputs under a loss that normalises by each row's sum: the
    loss was nan "from a finite model output" and no rule named the activation. The rows all exactly 0, and the
    module that made the output, are said. A Softplus output (positive) under a loss scaled to inf says nothing of
    the output: it held no zero or negative value."""
    f = tmp_path / "m.py"
    scale = "1.0" if act == "relu" else "float('inf')"
    f.write_text(f"ACT = {act!r}\nSCALE = {scale}\n" + _RELU_OUT)
    r = cli("nancheck", f"{f}:build", "--batch", f"{f}:batch", "--loss", f"{f}:loss", "--device", "cpu", "--json")
    (found,) = [x for x in json.loads(r.stdout)["findings"] if x["code"] == "non-finite-loss"]
    if act == "relu":   # the truth: every output is ReLU(-5 + small) = 0
        assert "16 of 16 rows all exactly 0" in found["message"] and "made by act (ReLU)" in found["message"], found
    else:
        assert "the output holds" not in found["message"], found


def test_output_facts_count_zero_rows_and_values_at_or_below_zero():
    from torchdiag.core.output_facts import output_facts

    out = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, -2.0], [3.0, 4.0, 5.0], [0.0, 0.0, 0.0]])
    said = output_facts(out, "head (ReLU)")
    assert "2 of 4 rows all exactly 0" in said and "8 of 12 values <= 0" in said and "min -2" in said, said
    assert "made by head (ReLU)" in said
    assert output_facts(torch.ones(3, 2)) == ""
    assert output_facts(torch.zeros(3, 2).to_sparse()) == ""   # a sparse output tells nothing: no error


_MASKED_LOG = textwrap.dedent('''
    import torch, torch.nn as nn
    def build():
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    def loss(out, target):   # probabilities of class 0 masked to exactly 0, then a log: the loss's own zero
        p = torch.softmax(out, 1) * torch.tensor([0.0, 1.0, 1.0, 1.0])
        return -torch.log(p.gather(1, target[:, None])).mean()
    def batch():
        torch.manual_seed(0)
        return torch.randn(16, 8), torch.arange(16) % 4
''')


def test_a_log_of_a_probability_the_loss_zeroed_is_not_blamed_on_signed_logits(cli, tmp_path):
    """A sweep: softmax, a mask, then log made the loss inf at a finite output, and the hint blamed the Linear's
    negative logits ("a log of 0 or below"), whose log_softmax is finite. Said now: a probability the loss made 0."""
    f = tmp_path / "m.py"
    f.write_text(_MASKED_LOG)
    r = cli("nancheck", f"{f}:build", "--batch", f"{f}:batch", "--loss", f"{f}:loss", "--device", "cpu", "--json")
    (found,) = [x for x in json.loads(r.stdout)["findings"] if x["code"] == "non-finite-loss"]
    assert "its log_softmax over dim 1 is finite" in found["message"], found
    assert "a log of a probability the loss made exactly 0" in found["message"], found
    assert "a log of 0 or below" not in found["message"], found
    # a log of the signed output itself is NaN, not inf: its negative values are the cause (a review)
    f.write_text(_MASKED_LOG.replace("p = torch.softmax(out, 1) * torch.tensor([0.0, 1.0, 1.0, 1.0])", "p = out"))
    r = cli("nancheck", f"{f}:build", "--batch", f"{f}:batch", "--loss", f"{f}:loss", "--device", "cpu", "--json")
    (found,) = [x for x in json.loads(r.stdout)["findings"] if x["code"] == "non-finite-loss"]
    assert "a log taken of the output itself is NaN at its values below 0" in found["message"], found
    assert "made exactly 0" not in found["message"], found
    # a mean over an empty selection: 0/0, NaN, with no log (a third review)
    f.write_text(_MASKED_LOG.replace("return -torch.log(p.gather(1, target[:, None])).mean()",
                                     "keep = target > 9\n    return (out[keep] ** 2).sum() / keep.sum()"))
    r = cli("nancheck", f"{f}:build", "--batch", f"{f}:batch", "--loss", f"{f}:loss", "--device", "cpu", "--json")
    (found,) = [x for x in json.loads(r.stdout)["findings"] if x["code"] == "non-finite-loss"]
    assert "0/0 is NaN (a mean over an empty selection" in found["message"], found


def test_output_facts_name_an_output_too_large_to_square_not_a_log():
    """A sweep: an MSE regression blown up at lr 0.5 (output -1.6e37, finite) had its Inf loss explained by "a log of 0
    or below, or a division by a row's sum of 0": mse has neither; the square of the output overflows float32."""
    from torchdiag.core.output_facts import output_facts

    out = torch.tensor([[-1.633e37], [-1.086e33]])
    y = torch.zeros(2, 1)
    assert torch.isinf(torch.nn.functional.mse_loss(out, y)) and torch.isfinite(out).all()   # the truth
    said = output_facts(out, "2 (Linear)")
    assert "reaches 1.633e+37 in magnitude" in said and "a square overflows float32" in said, said
    assert "a log of 0" not in said, said   # 2 of 2 values <= 0 is no cause at this size
    both = output_facts(torch.tensor([[0.0, 0.0], [3e38, 1.0]]))   # a review: an all-zero row stays said beside it
    assert "1 of 2 rows all exactly 0" in both and "a log of 0" in both and "3e+38 in magnitude" in both, both
    assert "values <= 0" in output_facts(torch.tensor([[-1e18], [-2.0]]))   # its square is finite: the log clause


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_an_adam_update_in_float16_is_explained_by_its_eps(cli, optimizer):
    """A sweep: `--dtype float16 --steps 2 --optimizer adam` made every weight Inf at step 1 and the hint said to
    lower the learning rate (at lr 1e-5). Adam's eps 1e-8 is 0 in float16, and so is (1 - beta2)·g² for a small
    gradient: m / (√v + eps) divides by 0. Doctor and overfit-batch said so; nancheck now does. SGD stays finite."""
    r = cli("nancheck", sample("mlp.py:build"), "--dtype", "float16", "--steps", "2", "--optimizer", optimizer,
            "--json", "--device", "cpu")   # (measured on the CPU; a GPU's fused kernels are another question)
    bad = [f for f in r.json["findings"] if f["code"] == "non-finite-param"]
    if optimizer == "sgd":
        assert r.code == 0 and not bad, r.json["findings"]
        return
    assert r.code == 1 and "Adam's eps 1e-08 is 0 in float16" in bad[0]["message"], bad
    assert "--amp fp16" in bad[0]["hint"] and "learning rate" not in bad[0]["hint"], bad[0]["hint"]


def test_a_float16_adam_step_too_large_is_not_blamed_on_eps(tmp_path, cli):
    """A review: every gradient large (inputs × 100), lr 1e6: the weights overflow where Adam's second moment is not
    0, and eps was still blamed. It is blamed only where the moment is 0 at the non-finite values."""
    (tmp_path / "big.py").write_text(
        "import torch\nfrom torch import nn\n\nclass Big(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.l = nn.Linear(16, 4)\n\n    def forward(self, x):\n"
        "        return self.l(x * 100)\n\ndef build():\n    torch.manual_seed(0)\n    return Big()\n")
    r = cli("nancheck", f"{tmp_path / 'big.py'}:build", "-i", "8x16", "--steps", "3", "--dtype", "float16",
            "--optimizer", "adam", "--lr", "1e6", "--json", "--device", "cpu")
    (bad,) = [f for f in r.json["findings"] if f["code"] == "non-finite-param"]
    assert r.code == 1 and "eps" not in bad["message"] and "--lr 1e+06 is beyond float16's largest value" in \
        bad["message"] and bad["hint"].startswith("lower --lr"), bad


def test_eps_is_not_named_alone_where_the_learning_rate_broke_the_rest(tmp_path, cli):
    """A second review: rows of an embedding no batch uses have Adam's second moment 0 (eps's NaN there), and at lr 1e5
    the rows used overflow too, where the moment is not 0. Eps was named as the cause, and its hint (--optimizer
    sgd) cannot help. Eps is named only where the moment is 0 at every non-finite value."""
    (tmp_path / "emb.py").write_text(
        "import torch\nfrom torch import nn\n\ndef build():\n    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Embedding(100, 16), nn.Flatten(), nn.Linear(64, 4))\n\n"
        "def example_inputs():\n    return (torch.randint(0, 10, (8, 4)),)\n")
    spec = f"{tmp_path / 'emb.py'}:build"
    found = {}
    for lr in ("1e5", "1e-3"):
        r = cli("nancheck", spec, "--steps", "3", "--dtype", "float16", "--optimizer", "adam", "--lr", lr, "--json",
                "--device", "cpu")
        found[lr] = [f for f in r.json["findings"] if f["code"] == "non-finite-param"][0]
    assert "eps" not in found["1e5"]["message"] and "beyond float16's largest value" in found["1e5"]["message"]
    assert "Adam's eps 1e-08 is 0 in float16" in found["1e-3"]["message"], found   # every bad value: moment 0


def test_a_learning_rate_beyond_float16_is_named_as_the_cause(cli):
    """A review: SGD at lr 1e6 on float16 weights failed in the step ("value cannot be converted to type c10::Half
    without overflow") and the hint said an op had no float16 kernel. 1e6 is beyond float16's 65504."""
    r = cli("nancheck", sample("mlp.py:build"), "--dtype", "float16", "--steps", "2", "--optimizer", "sgd",
            "--lr", "1e6", "--device", "cpu")
    assert r.code == 3 and "--lr 1e+06 is beyond float16's largest value (65504)" in r.stderr, r.stderr
    assert "no float16 kernel" not in r.stderr


def test_a_reduced_gradients_error_says_the_summary_is_this_ranks_own_pass():
    """A sweep: under --wrap ddp, rank 0's summary said "all gradients finite" beside `non-finite-after-reduction`:
    its rows are this rank's own pass, and now say so where the reduction brought the NaN."""
    from torchdiag.diagnostics.nancheck.wrapped import report_reduced
    from torchdiag.results import Result

    r = Result("nancheck")
    r.summary = [("Loss", "1.0"), ("Backward", "all gradients finite"), ("Parameter gradients", "4 checked; all finite")]
    report_reduced(r, reduced_finite=False)
    assert [f.code for f in r.findings] == ["non-finite-after-reduction"]
    assert r.summary == [("Loss", "1.0"), ("Backward", "all gradients finite (this rank's own pass, before the reduction)"),
                         ("Parameter gradients", "4 checked; all finite (this rank's own pass, before the reduction)")]
