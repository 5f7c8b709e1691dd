"""gradcheck: pass on correct autograd code, fail (exit 1) naming input and element on wrong code."""
import pytest

from support import one_error_line, sample

CA = "custom_autograd.py"


def _inputs(*shapes, seed=0):
    """The inputs the CLI makes for -i SHAPE... (float64, same generator)."""
    import torch

    from torchdiag.core.inputs import make_tensor, parse_input_spec

    g = torch.Generator().manual_seed(seed)
    out = []
    for s in shapes:
        spec = parse_input_spec(s)
        spec.dtype = "float64"
        out.append(make_tensor(spec, torch.device("cpu"), g)[0])
    return out


def test_correct_function_passes(cli):
    r = cli("gradcheck", sample(f"{CA}:MulSquare"), "-i", "3", "-i", "3", "--second-order", "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    assert doc["passed"] is True and doc["kind"] == "autograd.Function" and doc["precision"] == "float64"
    assert doc["torch_gradcheck"]["passed"] and doc["torch_gradgradcheck"]["passed"]
    rows = doc["per_input"]
    assert [(x["order"], x["input"]) for x in rows] == [(1, "input[0]"), (1, "input[1]"), (2, "input[0]"), (2, "input[1]")]
    assert all(x["max_abs_error"] < 1e-6 and x["passed"] for x in rows)
    assert doc["findings"] == [] and doc["exit_code"] == 0


def test_wrong_function_fails_naming_input_and_element(cli):
    r = cli("gradcheck", sample(f"{CA}:WrongMulSquare"), "-i", "5", "-i", "5", "--json")
    assert r.code == 1
    doc = r.json
    assert doc["passed"] is False and doc["torch_gradcheck"]["passed"] is False
    ok, bad = doc["per_input"]
    assert ok["input"] == "input[0]" and ok["passed"]
    # no entry off by more than atol: no relative error to give (a "0" beside an abs error of 1e-10 was misread), and
    # a function target has no train/eval mode (a null "mode" was)
    assert ok["max_rel_error"] is None and ok["max_abs_error"] < 1e-5 and "mode" not in doc
    assert bad["input"] == "input[1]" and not bad["passed"]
    # closed form: d(x·y²)/dy = 2xy, the wrong backward gives xy → error |xy|, worst where |xy| is largest
    x, y = _inputs("5", "5")
    j = int((x * y).abs().argmax())
    assert bad["element"] == [j] and bad["output_element"] == [j]
    assert bad["numerical"] == pytest.approx(float(2 * x[j] * y[j]), rel=1e-6)
    assert bad["analytical"] == pytest.approx(float(x[j] * y[j]), rel=1e-12)
    assert bad["max_abs_error"] == pytest.approx(float((x * y).abs().max()), rel=1e-6)
    assert bad["max_rel_error"] == pytest.approx(0.5, rel=1e-5)
    assert bad["failing_entries"] == 5            # only the diagonal of the 5×5 Jacobian
    f = doc["findings"][0]
    assert f["code"] == "wrong-gradient" and f["where"] == "input[1]" and f"({j})" in f["message"]
    # the table view names the same input and element
    r2 = cli("gradcheck", sample(f"{CA}:WrongMulSquare"), "-i", "5", "-i", "5")
    assert r2.code == 1 and "input[1]" in r2.stdout and f"element ({j})" in r2.stdout.replace("\n", " ")


def test_element_index_in_a_2d_input(untouched):
    import torch

    from torchdiag.diagnostics import gradcheck as diag

    class OffByOneAt12(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, g):
            wrong = g * 3
            wrong[1, 2] += g[1, 2]   # d out[1,2] / d x[1,2] comes out 4 instead of 3
            return wrong

    x = torch.randn(2, 4, dtype=torch.float64)
    checked = diag.build("autograd.Function", OffByOneAt12.apply, [x], ["input[0]"], diag.Options(), "OffByOneAt12")
    res = diag.run(checked)
    row = res.table("per_input").rows[0]
    assert row["element"] == [1, 2] and row["output_element"] == [1, 2] and row["failing_entries"] == 1
    assert row["max_abs_error"] == pytest.approx(1.0, abs=1e-6) and res.exit_code == 1


def test_second_order_only_failure(cli):
    r = cli("gradcheck", sample(f"{CA}:DetachedCube"), "-i", "4", "--json")
    assert r.code == 0 and r.json["passed"]
    r = cli("gradcheck", sample(f"{CA}:DetachedCube"), "-i", "4", "--second-order", "--json")
    assert r.code == 1
    doc = r.json
    first, second = doc["per_input"]
    assert first["passed"] and not second["passed"] and second["order"] == 2
    assert second["analytical"] == 0.0          # the detached x loses d(3x²)/dx entirely
    assert doc["findings"][0]["code"] == "wrong-second-order-gradient"
    assert doc["torch_gradgradcheck"]["passed"] is False


def test_module_target_checks_parameters_and_is_untouched(untouched):
    import importlib.util

    import torch

    from torchdiag.diagnostics import gradcheck as diag

    spec = importlib.util.spec_from_file_location("ca", sample(CA))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.ScaledTanh(3)
    x = torch.randn(2, 3, dtype=torch.float64)
    with untouched(model):
        kind, target = diag.resolve_target(model, {}, "ScaledTanh")
        res = diag.run(diag.build(kind, target, [x], ["input[0]"], diag.Options(), "ScaledTanh"))
    names = [r["input"] for r in res.table("per_input").rows]
    assert names == ["input[0]", "a", "lin.weight", "lin.bias"] and res.data["passed"]
    assert next(p for p in model.parameters()).dtype == torch.float32   # the check ran on a float64 copy


def test_cli_module_class_with_args_and_function(cli):
    r = cli("gradcheck", sample(f"{CA}:ScaledTanh"), "--arg", "features=2", "-i", "3x2", "--json")
    assert r.code == 0 and r.json["kind"] == "nn.Module" and r.json["parameters"] == 3
    r = cli("gradcheck", sample(f"{CA}:softclip"), "-i", "4")
    assert r.code == 0 and "PASS" in r.stdout
    r = cli("gradcheck", sample(f"{CA}:MulSquare"), "--json")     # example_inputs() of the module
    assert r.code == 0 and r.json["input_source"] == "example_inputs()"


def test_usage_errors_exit_2(cli, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # CPU-only machine for every case, even on a GPU box
    r = cli("gradcheck", sample(f"{CA}:MulSquar"), "-i", "3", "-i", "3")
    assert r.code == 2 and "MulSquare" in r.stderr          # did-you-mean hint
    one_error_line(r)
    r = cli("gradcheck", sample(f"{CA}:MulSquare"), "-i", "3xz")
    assert r.code == 2
    one_error_line(r)
    r = cli("gradcheck", sample(f"{CA}:MulSquare"), "-i", "3", "-i", "3", "--device", "cuda")
    assert r.code == 2 and "not available" in r.stderr
    one_error_line(r)
    r = cli("gradcheck", sample(f"{CA}:MulSquare"), "-i", "3", "-i", "3", "--json", "--device", "cuda")
    assert r.code == 2 and r.json["exit_code"] == 2


def test_target_raising_is_exit_3(cli):
    r = cli("gradcheck", sample(f"{CA}:MulSquare"), "-i", "3", "-i", "4")     # shapes do not broadcast
    assert r.code == 3 and "raised" in r.stderr
    one_error_line(r)


@pytest.mark.cuda
def test_cuda(cli):
    r = cli("gradcheck", sample(f"{CA}:MulSquare"), "-i", "3", "-i", "3", "--device", "cuda")
    assert r.code == 0


ARITY = '''
import torch
from torch import nn


class NewStyle(torch.autograd.Function):
    """forward without ctx (setup_context saves what backward needs): takes 2 inputs."""

    @staticmethod
    def forward(x, y):
        return x * y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y, grad * x


def scale(x, factor=None):
    return x * 2 if factor is None else x * factor


def anything(x, *more):
    return x + sum(more)


class Pair(nn.Module):
    def forward(self, x, y):
        return x * y
'''


@pytest.mark.parametrize("name,args,message", [
    (f"{CA}:WrongMulSquare", ["-i", "3"], "WrongMulSquare takes 2 inputs, got 1"),
    (f"{CA}:MulSquare", ["-i", "3"] * 3, "MulSquare takes 2 inputs, got 3"),
    (f"{CA}:ScaledTanh", ["-i", "3", "-i", "3"], "ScaledTanh takes 1 input, got 2"),
    (f"{CA}:softclip", ["-i", "3", "-i", "3"], "softclip takes 1 input, got 2"),
    (f"{CA}:DetachedCube", [], "DetachedCube takes 1 input, got 2 from example_inputs()"),
])
def test_wrong_number_of_inputs_is_exit_2_before_running(cli, name, args, message):
    r = cli("gradcheck", sample(name), *args)
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert r.stderr.startswith(f"error: {message}\n"), r.stderr
    r = cli("gradcheck", sample(name), *args, "--json")
    assert r.code == 2 and r.json["error"]["message"] == message


def test_arity_from_signature_kinds(cli, tmp_path):
    path = tmp_path / "arity.py"
    path.write_text(ARITY)
    r = cli("gradcheck", f"{path}:NewStyle", "-i", "3")     # no ctx in forward: 2 inputs, not 1
    assert r.code == 2 and "NewStyle takes 2 inputs, got 1" in r.stderr
    one_error_line(r)
    assert cli("gradcheck", f"{path}:NewStyle", "-i", "3", "-i", "3").code == 0
    assert cli("gradcheck", f"{path}:scale", "-i", "3").code == 0
    r = cli("gradcheck", f"{path}:scale", "-i", "3", "-i", "3", "-i", "3")
    assert r.code == 2 and "scale takes 1 to 2 inputs, got 3" in r.stderr
    assert cli("gradcheck", f"{path}:anything", "-i", "3", "-i", "3", "-i", "3").code == 0
    r = cli("gradcheck", f"{path}:Pair", "-i", "3")                # Module.forward(self, x, y)
    assert r.code == 2 and "Pair takes 2 inputs, got 1" in r.stderr
    assert cli("gradcheck", f"{path}:Pair", "-i", "3", "-i", "3").code == 0


RANDOM = '''
import torch
from torch import nn


class Drop(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))


def noisy(x):
    return x * 2 + torch.rand_like(x)


def sign(x):
    return (x > 0).long()
'''


def test_random_targets_and_integer_outputs(cli, tmp_path):
    """Dropout in training mode made finite differences random: a FAIL blaming backward (exit 1).
    Now an nn.Module is checked in eval mode with a note; a random function is exit 2; so is a
    target with no floating-point output (was a vacuous PASS)."""
    (tmp_path / "rnd.py").write_text(RANDOM)
    r = cli("gradcheck", f"{tmp_path}/rnd.py:Drop", "-i", "2x3", "--json")
    assert r.code == 0, r.stderr
    assert r.json["passed"] and r.json["mode"] == "eval" and any("eval mode" in n for n in r.json["notes"])
    r = cli("gradcheck", f"{tmp_path}/rnd.py:noisy", "-i", "3")
    assert r.code == 2 and "different outputs for the same input" in r.stderr
    one_error_line(r)
    r = cli("gradcheck", f"{tmp_path}/rnd.py:sign", "-i", "3")
    assert r.code == 2 and "no floating-point output (int64)" in r.stderr
    one_error_line(r)
    r = cli("gradcheck", sample(f"{CA}:ScaledTanh"), "-i", "2x3", "--json")     # deterministic: stays in train mode
    assert r.code == 0 and r.json["mode"] == "train" and r.json["notes"] == []


def test_nan_gradient_fails_and_bad_tolerances_are_usage_errors(cli, tmp_path):
    """A backward that returns NaN must not read as 'pass' (NaN compares false with every bound),
    and --eps ≤ 0 (numerical gradient 0/0 or sign-flipped) or a negative/NaN tolerance is exit 2."""
    path = tmp_path / "nan_fn.py"
    path.write_text(
        "import torch\n\n"
        "class NanGrad(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        return x * 2\n\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        return g * float('nan')\n")
    r = cli("gradcheck", f"{path}:NanGrad", "-i", "3", "--json")
    assert r.code == 1, r.stderr
    (row,) = r.json["per_input"]
    assert row["passed"] is False and row["failing_entries"] == 9
    for option, value in (("--eps", "0"), ("--eps", "-1"), ("--atol", "-1"), ("--rtol", "nan")):
        r = cli("gradcheck", sample(f"{CA}:MulSquare"), "-i", "3", "-i", "3", option, value)
        assert r.code == 2 and r.stderr.startswith(f"error: {option}") and "Traceback" not in r.stderr


@pytest.mark.parametrize("option,value", [("--eps", "0"), ("--atol", "-1"), ("--rtol", "nan")])
def test_bad_option_is_exit_2_before_the_target_is_imported(cli, tmp_path, option, value):
    boom = tmp_path / "boom.py"
    boom.write_text("raise RuntimeError('imported')\n")           # importing it would be exit 3
    r = cli("gradcheck", f"{boom}:f", "-i", "3", option, value, "--json")
    assert r.code == 2 and r.stderr.startswith(f"error: {option}: ")
    assert r.json["exit_code"] == 2 and "Traceback" not in r.stderr


@pytest.mark.parametrize("kw,name", [(dict(eps=0), "eps"), (dict(atol=-1), "atol"), (dict(rtol=float("nan")), "rtol"),
                                     (dict(max_elements=0), "max_elements")])
def test_bad_option_from_python_names_the_keyword(kw, name):
    import torch

    import torchdiag
    from torchdiag.errors import OptionError

    with pytest.raises(OptionError) as e:
        torchdiag.gradcheck(lambda a: (a ** 3).sum(), torch.randn(4), **kw)
    assert e.value.message.startswith(f"{name}: ") and e.value.code == 2


def test_cli_inputs_are_cores_doubled(cli):
    """-i inputs come from core's input preparation (same generator as every command), in float64."""
    import torch

    from torchdiag.core.inputs import ModelInputs

    r = cli("gradcheck", sample(f"{CA}:MulSquare"), "-i", "3", "-i", "2x3", "--json")
    assert r.code == 0 and r.json["input_source"] == "--input"
    assert r.json["inputs"] == ModelInputs(tuple(_inputs("3", "2x3")), {}, "").describe()
    assert all(t.dtype == torch.float64 for t in _inputs("3", "2x3"))


def _scaled_tanh_state(a: float):
    """ScaledTanh(features=2) weights with its scale `a`: a NaN one makes every gradient NaN (exit 1)."""
    import torch

    return {"a": torch.tensor(a), "lin.weight": torch.tensor([[0.3, -0.2], [0.1, 0.4]]), "lin.bias": torch.tensor([0.05, -0.1])}


def test_checkpoint_loads_into_a_module_target(cli, tmp_path):
    """The weights of --checkpoint are the ones checked: a NaN scale in the file fails a target that passes
    with its own weights; a Lightning-style .ckpt (prefix, hyper_parameters) loads as on every command."""
    import argparse

    import torch

    target = sample(f"{CA}:ScaledTanh")
    assert cli("gradcheck", target, "--arg", "features=2", "-i", "3x2").code == 0
    torch.save(_scaled_tanh_state(float("nan")), tmp_path / "nan.pt")
    r = cli("gradcheck", target, "--arg", "features=2", "-i", "3x2", "--checkpoint", tmp_path / "nan.pt", "--json")
    assert r.code == 1, r.stderr
    assert r.json["checkpoint"] == [f"{tmp_path / 'nan.pt'}: 3 tensors loaded"]
    assert not r.json["passed"] and {row["input"] for row in r.json["per_input"] if not row["passed"]} >= {"a", "lin.weight"}
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"model." + k: v for k, v in _scaled_tanh_state(2.0).items()},
                "hyper_parameters": {"args": argparse.Namespace(features=2)}, "epoch": 1}, ckpt)
    r = cli("gradcheck", target, "--arg", "features=2", "-i", "3x2", "--checkpoint", ckpt, "--json")
    assert r.code == 0, r.stderr
    assert r.json["passed"] and r.json["checkpoint"] == [f"{ckpt}: 3 tensors loaded, prefix 'model.' stripped"]


def test_checkpoint_keys_that_do_not_fit(cli, tmp_path):
    import torch

    state = _scaled_tanh_state(1.0)
    state["extra"] = torch.zeros(1)
    torch.save(state, tmp_path / "w.pt")
    args = ("gradcheck", sample(f"{CA}:ScaledTanh"), "--arg", "features=2", "-i", "3x2", "--checkpoint", tmp_path / "w.pt")
    r = cli(*args)
    assert r.code == 2 and "1 unexpected (extra)" in r.stderr and "--no-strict-checkpoint" in r.stderr
    one_error_line(r)
    r = cli(*args, "--no-strict-checkpoint", "--json")
    assert r.code == 1, r.stderr
    assert [(f["code"], f["where"]) for f in r.json["findings"]] == [("checkpoint-unexpected-key", "extra")]
    assert r.json["passed"] is True          # the gradients themselves are right: only the checkpoint failed


@pytest.mark.parametrize("name", ["MulSquare", "softclip"])
def test_checkpoint_on_a_target_without_weights_is_exit_2(cli, tmp_path, name):
    import torch

    torch.save(_scaled_tanh_state(1.0), tmp_path / "w.pt")
    kind = {"MulSquare": "an autograd.Function", "softclip": "a function"}[name]
    inputs = {"MulSquare": ("-i", "3", "-i", "3"), "softclip": ("-i", "3")}[name]
    r = cli("gradcheck", sample(f"{CA}:{name}"), *inputs, "--checkpoint", tmp_path / "w.pt")
    assert r.code == 2
    one_error_line(r)
    assert f"error: --checkpoint: does not apply to {name}: it is {kind}, which has no weights to load" in r.stderr
    assert "hint:" in r.stderr
    r = cli("gradcheck", sample(f"{CA}:{name}"), *inputs, "--checkpoint", tmp_path / "w.pt", "--json")
    assert r.code == 2 and r.json["error"]["message"].startswith("--checkpoint: does not apply")



def test_complex_tensors_are_checked_with_their_imaginary_parts():
    """A sweep: complex parameters were cast to float64, losing their imaginary part (torch's 'discards the
    imaginary part' warning), and the check passed on another function. Now they are checked as real and
    imaginary parts: a complex backward missing its conjugate fails, a complex filter's parameter passes."""
    import torch
    from torch import nn

    import torchdiag

    class Square(torch.autograd.Function):   # z -> z², its backward right for real z only (no conjugate)
        @staticmethod
        def forward(ctx, z):
            ctx.save_for_backward(z)
            return z * z

        @staticmethod
        def backward(ctx, grad):
            (z,) = ctx.saved_tensors
            return grad * 2 * z

    class ComplexFilter(nn.Module):
        def __init__(self):
            super().__init__()
            self.filt = nn.Parameter(torch.randn(5, dtype=torch.cfloat))
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(torch.fft.irfft(torch.fft.rfft(x, dim=-1) * self.filt, n=8, dim=-1))

    z = torch.randn(3, dtype=torch.cdouble)
    r = torchdiag.gradcheck(Square, z)
    assert r.exit_code == 1 and "wrong-gradient" in {f.code for f in r.findings}, r.verdict
    assert torchdiag.gradcheck(lambda t: t * t, z).exit_code == 0   # autograd's own complex backward: right
    assert torchdiag.gradcheck(lambda t: t.conj(), z).exit_code == 0   # a review: a conjugate view raised
    assert torchdiag.gradcheck(lambda t: t * 2, z.conj()).exit_code == 0
    torch.manual_seed(0)
    r = torchdiag.gradcheck(ComplexFilter(), torch.randn(2, 8), params=True)
    rows = {row["input"]: row for row in r.table("per_input").rows}
    assert r.exit_code == 0 and rows["filt"]["shape"] == "5x2", rows


def test_too_many_elements_from_the_parameters_points_at_no_params(cli, tmp_path):
    """A new user: 16 ids beside 106,304 weights were told "106,304 input elements ... use smaller shapes with -i"."""
    (tmp_path / "wide.py").write_text("import torch\n"
                                      "def build():\n    return torch.nn.Linear(300, 300)\n")
    r = cli("gradcheck", f"{tmp_path}/wide.py:build", "-i", "2x300")
    assert r.code == 2, r.stderr
    assert "90,900 elements to check (90,300 of them the module's parameters)" in r.stderr, r.stderr
    assert "--no-params checks the inputs alone" in r.stderr, r.stderr
    assert cli("gradcheck", f"{tmp_path}/wide.py:build", "-i", "2x300", "--no-params").code == 0


def test_a_modules_weights_come_from_the_seed(cli):
    """A review: ScaledTanh's weights were drawn from wherever the RNG stood, so its errors changed from run to run.
    Built after torch.manual_seed(--seed), as every command builds its model: the same seed, the same numbers."""
    def errors(*seed):
        r = cli("gradcheck", sample(f"{CA}:ScaledTanh"), "-i", "2x3", *seed, "--json")
        assert r.code == 0, r.stderr
        return [row["max_abs_error"] for row in r.json["per_input"]]

    first = errors()
    assert errors() == first and errors("--seed", "0") == first and errors("--seed", "1") != first
