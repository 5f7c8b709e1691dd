"""Hostile cases, round two (issue 31): model sources, checkpoints, precision, `check` configurations and
torchrun. Each case gives the documented exit code (2 bad input file/config, 3 the user's own code
raised), one `error:` line and one JSON document under --json; the two `check` cases give the right
verdict. Beside each named case, its neighbours: other layouts, value types, file kinds, dtypes."""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from support import HANG_GUARD, ROOT, one_error_line, torchrun_many

MODEL = """
import os, torch
from torch import nn

class Net(nn.Module):
    def __init__(self, extra_dtype=None):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        if extra_dtype is not None:
            dtype = getattr(torch, extra_dtype)
            value = torch.randn(3, dtype=dtype) if dtype.is_complex else torch.ones(3, dtype=dtype)
            self.extra = nn.Parameter(value, requires_grad=dtype.is_complex)

    def forward(self, x):
        y = self.fc(x)
        if hasattr(self, "extra") and self.extra.is_complex():
            y = y * self.extra.abs()
        return y

def build(extra_dtype=None):
    return Net(extra_dtype)

def seq():
    return nn.Sequential(nn.Linear(4, 3))

class WithExtra(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.tag = None
    def get_extra_state(self):
        return {"v": 7, "names": ["a", "b"], "scale": 0.5}
    def set_extra_state(self, state):
        if state.get("bad"):
            raise ValueError("this extra state is not mine")
        self.tag = state
    def forward(self, x):
        return self.lin(x)

def extra():
    return nn.Sequential(WithExtra())

class OwnLoader(nn.Linear):
    def _load_from_state_dict(self, *args, **kwargs):
        raise RuntimeError("my own loader is broken")

def own_loader():
    return nn.Sequential(OwnLoader(4, 3))

def example_inputs():
    return torch.randn(2, 4)
"""


@pytest.fixture
def spec(tmp_path):
    (tmp_path / "hostile2.py").write_text(MODEL)
    return lambda factory="build": f"{tmp_path}/hostile2.py:{factory}"


def failing(cli, code: int, *args):
    """The case with and without --json: `code`, one error line, one JSON document naming the error."""
    r = cli(*args)
    assert r.code == code, r.stdout + r.stderr
    one_error_line(r)
    j = cli(*args, "--json")
    assert j.code == code, j.stderr
    doc = json.loads(j.stdout)
    assert doc["exit_code"] == code and doc["error"]["message"]
    return next(line for line in r.stderr.splitlines() if line.startswith("error:"))


def seq_state():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3)).state_dict()


def write_safetensors(path: Path, entries: dict, data: bytes = b"") -> Path:
    head = json.dumps(entries).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


# ---- 1. check gives the right verdict ----------------------------------------------------------------

def _config(tmp_path, body: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.parametrize("check", ["max-params = 1000", "nancheck = true"])
def test_check_strict_checkpoint_false_mismatch_fails_the_checkpoint_not_a_diagnostic(tmp_path, spec, cli, check):
    state = seq_state()
    state["0.weight"] = torch.zeros(4, 4)
    torch.save(state, tmp_path / "wrong.pt")
    config = _config(tmp_path, f"""
        [tool.torchdiag]
        model = "{spec('seq')}"
        checkpoint = "{tmp_path / 'wrong.pt'}"
        strict-checkpoint = false
        check = {{{check}}}
    """)
    r = cli("check", "--config", config, "--json")
    assert r.code == 1, r.stderr
    doc = r.json
    rows = {row["check"]: row for row in doc["checks"]}
    assert rows["checkpoint"]["status"] == "FAIL" and "0.weight" in rows["checkpoint"]["message"]
    other = "max-params" if "max" in check else "nancheck"
    assert rows[other]["status"] == "PASS"       # the mismatch is not blamed on the other check
    failed = [f["where"] for f in doc["findings"] if f["severity"] == "error"]
    assert failed == [f"{spec('seq')}::checkpoint"]


def test_check_with_a_fitting_checkpoint_has_no_checkpoint_row(tmp_path, spec, cli):
    torch.save(seq_state(), tmp_path / "right.pt")
    config = _config(tmp_path, f"""
        [tool.torchdiag]
        model = "{spec('seq')}"
        checkpoint = "{tmp_path / 'right.pt'}"
        strict-checkpoint = false
        check = {{max-params = 1000}}
    """)
    r = cli("check", "--config", config, "--json")
    assert r.code == 0, r.stderr
    assert [row["check"] for row in r.json["checks"]] == ["max-params"]


@pytest.mark.slow
@pytest.mark.parametrize("beside", ["", "max-params = 1000, "])
def test_check_overfit_batch_empty_table_runs_with_defaults(tmp_path, spec, cli, beside):
    def rows(value):
        config = _config(tmp_path, f"""
            [tool.torchdiag]
            model = "{spec('seq')}"
            check = {{{beside}overfit-batch = {value}}}
        """)
        r = cli("check", "--config", config, "--json")
        assert r.code in (0, 1), r.stderr
        return {row["check"]: row for row in r.json["checks"]}

    empty, true = rows("{}"), rows("true")
    assert "overfit-batch" in empty             # run, not switched off
    for key in ("figure", "limit", "status"):   # exactly what `true` (the defaults) gives
        assert empty["overfit-batch"][key] == true["overfit-batch"][key]
    if beside:                                  # false (beside another check) is what switches it off
        assert "overfit-batch" not in rows("false")


CONFIG_SHAPES = {
    "tool = 5\n": "tool = 5",
    "[tool]\ntorchdiag = 5\n": "not a table",
    '[tool]\ntorchdiag = "sample"\n': "not a table",
    "[tool]\ntorchdiag = [1, 2]\n": "not a table",
    '[tool]\ntorchdiag = 2.5\n': "not a table",
    '[[tool.torchdiag]]\nmodel = "x.py:build"\n': "not a table",
    '[tool.torchdiag]\nmodel = "x.py:build"\nargs = {a = ' + "[" * 20000 + "]" * 20000 + "}\n": "levels deep",
    '[tool.torchdiag]\nmodel = "x.py:build"\ncheck = ' + "{a = " * 5000 + "1" + "}" * 5000 + "\n": "levels deep",
    'x = ' + "[" * 100000 + "\n": "levels deep",
}


@pytest.mark.parametrize("body", list(CONFIG_SHAPES), ids=range(len(CONFIG_SHAPES)))
def test_pyproject_shapes_are_usage_errors(tmp_path, cli, body):
    path = tmp_path / "pyproject.toml"
    path.write_text(body)
    line = failing(cli, 2, "check", "--config", path)
    assert CONFIG_SHAPES[body] in line
    assert "unknown key 's'" not in line


def test_deep_brackets_inside_toml_strings_are_not_nesting(tmp_path, spec, cli):
    config = _config(tmp_path, f"""
        [tool.torchdiag]
        model = "{spec('seq')}"   # [[[[[[ a comment is not nesting
        name = "{'[' * 200}"
        check = {{max-params = 1000}}
    """)
    r = cli("check", "--config", config)
    assert r.code == 0, r.stderr


@pytest.mark.parametrize("kind", ["fifo", "devnull", "folder"])
def test_config_that_is_not_a_regular_file(tmp_path, cli, kind):
    path = tmp_path / "conf.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devnull":
        path.symlink_to("/dev/null")
    else:
        path.mkdir()
    failing(cli, 2, "check", "--config", path)


# ---- 3. checkpoints that are not regular files -------------------------------------------------------

def _special(tmp_path: Path, kind: str, name: str) -> Path:
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        here = os.getcwd()
        os.chdir(tmp_path)   # AF_UNIX paths are short: bind by the relative name
        try:
            s = socket.socket(socket.AF_UNIX)
            s.bind(name)
        finally:
            os.chdir(here)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to(kind)   # a device, through a symlink
    return path


KINDS = ["fifo", "socket", "folder", "/dev/zero", "/dev/urandom", "/dev/null"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["weights.pt", "model.safetensors", "model.safetensors.index.json"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_checkpoint_that_is_not_a_regular_file_is_refused(tmp_path, spec, cli, kind, name, device):
    path = _special(tmp_path, kind, name)
    line = failing(cli, 2, "summary", spec("seq"), "--checkpoint", path, "--device", device)
    assert "folder" in line if kind == "folder" else "not a regular file" in line


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_hf_folder_whose_weights_are_not_regular_files(tmp_path, cli, kind):
    pytest.importorskip("transformers")
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2))
    _special(folder, kind, "model.safetensors")
    line = failing(cli, 2, "summary", f"hf:{folder}")
    assert "model.safetensors" in line and "not a regular file" in line


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_hf_folder_whose_config_is_not_a_regular_file(tmp_path, cli, kind):
    """A sweep: a FIFO config.json was said "the folder has no config.json"."""
    folder = tmp_path / "hf"
    folder.mkdir()
    _special(folder, kind, "config.json")
    line = failing(cli, 2, "summary", f"hf:{folder}")
    assert "config.json is a" in line and "not a regular file" in line and "has no config.json" not in line, line


def test_index_whose_shard_is_a_fifo(tmp_path, spec, cli):
    os.mkfifo(tmp_path / "shard-1.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"0.weight": "shard-1.safetensors", "0.bias": "shard-1.safetensors"}}))
    failing(cli, 2, "summary", spec("seq"), "--checkpoint", index)


# ---- 3/5. safetensors headers: bounded and validated before anything is allocated ----------------------

BAD_HEADERS = {
    "negative shape": {"0.weight": {"dtype": "F32", "shape": [-3, 4], "data_offsets": [0, 48]}},
    "2^62 shape": {"0.weight": {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 48]}},
    "2^70 by 0": {"0.weight": {"dtype": "F32", "shape": [2**70, 0], "data_offsets": [0, 0]}},
    "float shape": {"0.weight": {"dtype": "F32", "shape": [3.0, 4], "data_offsets": [0, 48]}},
    "string shape": {"0.weight": {"dtype": "F32", "shape": "3x4", "data_offsets": [0, 48]}},
    "bool in shape": {"0.weight": {"dtype": "F32", "shape": [True, 4], "data_offsets": [0, 48]}},
    "offsets past the file": {"0.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 2**40]}},
    "negative offsets": {"0.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [-48, 0]}},
    "offsets of another size": {"0.weight": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 40]}},
    "entry not an object": {"0.weight": [1, 2]},
    "no dtype": {"0.weight": {"shape": [3, 4], "data_offsets": [0, 48]}},
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_safetensors_header(tmp_path, spec, cli, case, device):
    path = write_safetensors(tmp_path / "bad.safetensors", BAD_HEADERS[case], b"\0" * 48)
    line = failing(cli, 2, "summary", spec("seq"), "--checkpoint", path, "--device", device)
    assert "0.weight" in line


@pytest.mark.parametrize("opener,closer", [(b"[", b"]"), (b'{"a":', b"}")])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_deep_safetensors_header_is_refused_before_parsing(tmp_path, spec, cli, opener, closer, device):
    head = opener * 200000 + (b"1" if opener != b"[" else b"") + closer * 200000
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(head)) + head)
    line = failing(cli, 2, "summary", spec("seq"), "--checkpoint", path, "--device", device)
    assert "levels deep" in line


def test_meta_still_reads_a_header_whose_data_is_not_there(tmp_path, spec, cli):
    """On meta the data is never read: a header alone (the data cut off) still gives shapes and dtypes."""
    path = write_safetensors(tmp_path / "head.safetensors",
                             {"0.weight": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 24]},
                              "0.bias": {"dtype": "BF16", "shape": [3], "data_offsets": [24, 30]}})
    r = cli("summary", spec("seq"), "--checkpoint", path, "--device", "meta", "--json")
    assert r.code == 0, r.stderr
    assert cli("summary", spec("seq"), "--checkpoint", path).code == 2   # off meta the data must be there


# ---- 4/5. torch.save checkpoints: tensors that cannot be loaded, extra state, the model's own loader --------

def _odd(kind: str):
    w = seq_state()["0.weight"]
    return {"sparse": w.to_sparse, "sparse_csr": w.to_sparse_csr, "sparse_csc": w.to_sparse_csc,
            "quantized": lambda: torch.quantize_per_tensor(w, 0.1, 0, torch.qint8),
            "nested": lambda: torch.nested.nested_tensor([w[0], w[1], w[2]]),
            "meta": lambda: torch.empty(3, 4, device="meta")}[kind]()


@pytest.mark.parametrize("kind", ["sparse", "sparse_csr", "sparse_csc", "quantized", "nested", "meta"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_checkpoint_tensor_of_another_layout(tmp_path, spec, cli, kind, device):
    state = seq_state()
    state["0.weight"] = _odd(kind)
    torch.save(state, tmp_path / "odd.pt")
    before = (tmp_path / "odd.pt").read_bytes()
    r = cli("summary", spec("seq"), "--checkpoint", tmp_path / "odd.pt", "--device", device, "--json")
    if kind == "meta" and device == "meta":
        assert r.code == 0, r.stderr   # a meta tensor on meta: shapes and dtypes is all there is to load
    else:
        assert r.code == 2, r.stderr
        message = r.json["error"]["message"]
        # on meta torch.load itself may fail on the layout (no meta kernel): said as the file, not read
        assert "0.weight" in message or (device == "meta" and message.startswith("cannot read"))
        one_error_line(cli("summary", spec("seq"), "--checkpoint", tmp_path / "odd.pt", "--device", device))
    assert (tmp_path / "odd.pt").read_bytes() == before


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_integer_tensor_for_a_float_weight(tmp_path, spec, cli, dtype, device):
    state = seq_state()
    state["0.weight"] = torch.ones(3, 4, dtype=dtype)
    torch.save(state, tmp_path / "int.pt")
    r = cli("summary", spec("seq"), "--checkpoint", tmp_path / "int.pt", "--device", device, "--json")
    assert r.code == 0, r.stderr


def test_integer_tensor_on_meta_takes_the_models_dtype(tmp_path):
    from torchdiag.core.checkpoint import load

    state = seq_state()
    state["0.weight"] = torch.ones(3, 4, dtype=torch.int64)
    torch.save(state, tmp_path / "int.pt")
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 3))
    load(model, str(tmp_path / "int.pt"), torch.device("meta"))
    assert model[0].weight.dtype == torch.float32 and model[0].weight.is_meta


def test_extra_state_is_loaded_through_set_extra_state(tmp_path, spec, cli):
    from torchdiag.core.checkpoint import load
    from torchdiag.core.loading import import_module

    module = import_module(str(tmp_path / "hostile2.py"))
    torch.save(module.extra().state_dict(), tmp_path / "extra.pt")
    model = module.extra()
    report = load(model, str(tmp_path / "extra.pt"), torch.device("cpu"))
    assert report.fits and report.loaded == 3
    assert model[0].tag == {"v": 7, "names": ["a", "b"], "scale": 0.5}   # what get_extra_state saved
    for device in ("cpu", "meta"):
        r = cli("summary", spec("extra"), "--checkpoint", tmp_path / "extra.pt", "--device", device, "--json")
        assert r.code == 0, r.stderr


def test_extra_state_missing_from_the_checkpoint_is_still_reported(tmp_path, spec, cli):
    state = {k: v for k, v in nn.Sequential(nn.Linear(4, 3)).state_dict().items()}
    torch.save({"0.lin." + k.split(".", 1)[1]: v for k, v in state.items()}, tmp_path / "no_extra.pt")
    line = failing(cli, 2, "summary", spec("extra"), "--checkpoint", tmp_path / "no_extra.pt")
    assert "1 missing (0._extra_state)" in line


def test_models_own_load_code_raising_is_exit_3(tmp_path, spec, cli):
    torch.save(seq_state(), tmp_path / "good.pt")
    line = failing(cli, 3, "summary", spec("own_loader"), "--checkpoint", tmp_path / "good.pt")
    assert "my own loader is broken" in line
    from torchdiag.core.loading import import_module

    module = import_module(str(tmp_path / "hostile2.py"))
    state = module.extra().state_dict()
    state["0._extra_state"] = {"bad": True}
    torch.save(state, tmp_path / "bad_extra.pt")
    line = failing(cli, 3, "summary", spec("extra"), "--checkpoint", tmp_path / "bad_extra.pt")
    assert "this extra state is not mine" in line


# ---- 5. parameters that are not float --------------------------------------------------------------------

RUNS = [["gradflow"], ["nancheck", "--steps", "2"], ["doctor"], ["overfit-batch", "--steps", "3"], ["memory"]]


@pytest.mark.parametrize("dtype", ["int64", "bool", "int8", "uint8", "int32"])
@pytest.mark.parametrize("run", RUNS, ids=[r[0] for r in RUNS])
def test_frozen_integer_parameter_is_skipped(spec, cli, dtype, run):
    r = cli(run[0], spec(), "--arg", f"extra_dtype={dtype!r}", *run[1:], "--device", "cpu", "--json")
    assert r.code in (0, 1), r.stderr
    doc = r.json
    assert "error" not in doc
    if run[0] == "gradflow":   # no gradient for it; its weight norm is the plain norm of its values (three ones)
        row = next(p for p in doc["params"] if p["name"] == "extra")
        assert row["status"] == "frozen" and row["grad_norm"] is None
        assert row["weight_norm"] == pytest.approx(3 ** 0.5)


def test_frozen_integer_parameter_in_check_and_the_python_api(tmp_path, spec, cli):
    import torchdiag
    from torchdiag.core.loading import import_module

    config = _config(tmp_path, f"""
        [tool.torchdiag]
        model = "{spec()}"
        args = {{extra_dtype = "int64"}}
        check = {{gradflow = true, nancheck = true}}
    """)
    r = cli("check", "--config", config, "--json")
    assert r.code == 0, r.stderr
    model = import_module(str(tmp_path / "hostile2.py")).build("int64")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = torchdiag.gradflow(model, torch.randn(2, 4))
    assert result.exit_code == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_complex_parameters_with_fp16_amp_are_a_usage_error(spec, cli):
    for run in (["overfit-batch", "--steps", "3"], ["nancheck", "--steps", "2"], ["doctor"]):
        line = failing(cli, 2, run[0], spec(), "--arg", "extra_dtype='complex64'", *run[1:], "--amp", "fp16",
                       "--device", "cpu")
        assert "complex" in line and "--amp" in line
    r = cli("overfit-batch", spec(), "--arg", "extra_dtype='complex64'", "--steps", "3", "--amp", "bf16", "--device", "cpu",
            "--json")
    assert r.code in (0, 1), r.stderr     # bf16 needs no loss scaling: it runs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nancheck_steps_with_complex_parameters_and_dtype(spec, cli, dtype):
    r = cli("nancheck", spec(), "--arg", "extra_dtype='complex64'", "--steps", "2", "--dtype", dtype, "--json")
    assert r.code == 0, r.stderr


def test_memory_dtype_keeps_complex_parameters_complex(spec, cli):
    r = cli("memory", spec(), "--arg", "extra_dtype='complex64'", "--dtype", "bfloat16", "--device", "cpu", "--json")
    assert r.code == 0, r.stderr
    # 15 float weights in bfloat16 (2 bytes) and 3 complex64 values (8 bytes), not cast to the real dtype
    assert r.json["param_bytes"] == 15 * 2 + 3 * 8


# ---- 5/6. Hugging Face configs -------------------------------------------------------------------------

GPT2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 50, "n_positions": 32,
        "bos_token_id": 0, "eos_token_id": 0, "architectures": ["GPT2LMHeadModel"]}
VIT = {"model_type": "vit", "image_size": 32, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
       "intermediate_size": 16, "patch_size": 4}


def _hf(tmp_path, config, name="hf") -> str:
    pytest.importorskip("transformers")
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return f"hf:{folder}"


@pytest.mark.parametrize("base,key,value", [
    (GPT2, "n_layer", "two"), (GPT2, "n_layer", [2]), (GPT2, "n_layer", None), (GPT2, "n_embd", 16.5),
    (GPT2, "n_positions", {"a": 1}), (VIT, "image_size", "abc"), (VIT, "image_size", [32, "x"]), (VIT, "image_size", 32.5),
])
def test_hf_config_with_a_badly_typed_value(tmp_path, cli, base, key, value):
    line = failing(cli, 2, "summary", _hf(tmp_path, {**base, key: value}))
    assert key in line


@pytest.mark.parametrize("arg", ["n_layer=two", "n_layer=[2]", "n_embd=1.5"])
def test_hf_arg_with_a_badly_typed_value(tmp_path, cli, arg):
    line = failing(cli, 2, "summary", _hf(tmp_path, GPT2), "--arg", arg)
    assert arg.split("=")[0] in line


@pytest.mark.parametrize("text", ['{"model_type": "gpt2", "x": ' + "[" * 100000 + "]" * 100000 + "}",
                                  '{"model_type": "gpt2", "x": ' + '{"a": ' * 100000 + "1" + "}" * 100000 + "}"])
def test_hf_config_nested_without_end(tmp_path, cli, text):
    line = failing(cli, 2, "summary", _hf(tmp_path, text))
    assert "levels deep" in line


def test_hf_task_without_a_head_for_the_model_is_a_usage_error(tmp_path, cli):
    folder = _hf(tmp_path, GPT2)
    line = failing(cli, 2, "summary", folder, "--arg", "task=image-classification")
    assert "image-classification" in line and "gpt2" in line
    # the hint lists the heads it has (a sweep: "e.g. base" was said of a ViT, which has image-classification)
    hint = cli("summary", folder, "--arg", "task=image-classification").stderr
    assert "has a head for: base, causal-lm, " in hint and "sequence-classification" in hint, hint


@pytest.mark.parametrize("arch", ["Trainer", "TrainingArguments", "AutoConfig"])
def test_hf_architectures_naming_a_class_that_is_not_a_model(tmp_path, cli, arch):
    line = failing(cli, 2, "summary", _hf(tmp_path, {**GPT2, "architectures": [arch]}))
    assert arch in line


def test_hf_good_config_still_builds(tmp_path, cli):
    r = cli("summary", _hf(tmp_path, GPT2), "--json")
    assert r.code == 0, r.stderr


# ---- 6. minor ------------------------------------------------------------------------------------------

def test_fsdp_refuses_mixed_parameter_dtypes_before_sharding(spec):
    from torchdiag.core.distributed import Ranks, _fully_shard
    from torchdiag.core.loading import import_module
    from torchdiag.errors import UsageError

    module = import_module(spec().rpartition(":")[0])
    for dtype in ("complex64", "int64", "float64"):
        with pytest.raises(UsageError, match="FSDP needs one dtype per parameter group"):
            _fully_shard(module.build(dtype), Ranks(0, 2, 0), torch.device("cpu"))


@pytest.mark.slow
@pytest.mark.subprocess
def test_input_prompt_is_not_glued_onto_the_error_line(tmp_path):
    (tmp_path / "asks.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Net(nn.Linear):
            def forward(self, x):
                input("continue? ")
                return super().forward(x)

        def build():
            return Net(4, 3)

        def example_inputs():
            return torch.randn(2, 4)
    """))
    for extra in ([], ["--json"]):
        r = subprocess.run([sys.executable, "-m", "torchdiag", "summary", f"{tmp_path}/asks.py:build", *extra],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=HANG_GUARD,
                           env={**os.environ, "COLUMNS": "120"})
        assert r.returncode == 3, r.stderr
        assert "continue?" not in r.stdout + r.stderr
        assert [line for line in r.stderr.splitlines() if "error:" in line][0].startswith("error: ")
        if extra:
            assert json.loads(r.stdout)["exit_code"] == 3


# ---- 2. torchrun: ranks that built different models (2 real launches) ----------------------------------

RANK_MODEL = """
import os, torch
from torch import nn

def build():
    width = 4 + int(os.environ.get("RANK", "0"))   # rank 1 builds a wider hidden layer
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))

def example_inputs():
    return torch.randn(4, 4)
"""


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """Both wraps in one launch (support.torchrun_many): every rank refuses before wrapping and ends normally."""
    folder = tmp_path_factory.mktemp("ranked")
    (folder / "ranked.py").write_text(RANK_MODEL)
    runs = {f"{c}-{w}": [c, f"{folder}/ranked.py:build", "--wrap", w] for c, w in [("memory", "fsdp"), ("doctor", "ddp")]}
    return torchrun_many(runs, env={"TORCHDIAG_DIST_TIMEOUT": "600"})


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("command,wrap", [("memory", "fsdp"), ("doctor", "ddp")])
def test_ranks_with_different_models_are_refused_by_name_before_wrapping(refused, command, wrap):
    code, doc, stderr = refused[f"{command}-{wrap}"]
    assert code != 0, stderr
    assert doc["exit_code"] == 3
    message = doc["error"]["message"]
    assert "[ranks 0,1]" in message      # every rank refused, each saying the same
    # said once, by rank 0, not once per rank (a sweep)
    assert stderr.count("error: [rank") == 1 and "error: [ranks 0,1]" in stderr, stderr
    assert "0.weight (rank 0: 4x4 float32, rank 1: 5x4 float32)" in message
    assert "collective mismatch" not in stderr and "Connection closed" not in stderr


@pytest.mark.parametrize("precision", [["--dtype", "bfloat16"], ["--dtype", "float16"], ["--amp", "bf16"], ["--amp", "fp16"]])
def test_gradcam_takes_dtype_and_amp(cli, precision):
    args = ["gradcam", f"{ROOT}/sample_models/gradcam_region.py:build", "--layer", "features.0",
            "--image", ROOT / "docs/images/sample_input.png", "--device", "cpu", "--json"]
    plain, reduced = cli(*args), cli(*args, *precision)
    assert plain.code == 0 and reduced.code == 0, reduced.stderr
    assert {"bfloat16": "bfloat16", "float16": "float16", "bf16": "bfloat16", "fp16": "float16"}[precision[1]] \
        in reduced.json["precision"]
    assert reduced.json["target_class"] == plain.json["target_class"]
    # the same region: the peak moves by at most a pixel or two with 8-11 mantissa bits
    assert all(abs(a - b) <= 2 for a, b in zip(reduced.json["heatmap_peak"], plain.json["heatmap_peak"]))


def test_a_copy_that_does_not_fit_is_one_line_not_the_oom_killer(monkeypatch):
    # timm regnety_2560 (5 GiB of float32 parameters) on a 24 GiB machine: the copies the training commands make
    # were ended by the kernel with no line at all. Here the machine is made small instead of the model large.
    from torchdiag.api import run
    from torchdiag.core import resources
    from torchdiag.errors import ModelError

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))   # 4,355 float32 values: 17,420 B
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 10_000)
    with pytest.raises(ModelError) as caught:
        run("overfit-batch", model, torch.randn(4, 64), steps=5)
    assert "not enough memory for a copy of the model" in caught.value.message
    assert caught.value.code == 3
    with pytest.raises(ModelError) as caught:   # doctor's fallback (the model itself) would keep as much again
        run("doctor", model, torch.randn(4, 64))
    assert "not enough memory" in caught.value.message and "17.01 KiB" in caught.value.message
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 10**9)
    assert run("overfit-batch", model, torch.randn(4, 64), steps=5).exit_code in (0, 1)


def test_what_a_copy_takes_is_what_deepcopy_makes_not_the_logical_size():
    # a review: an expanded buffer (4 bytes stored, 25.6 GB logical) and a sparse adjacency were refused
    from torchdiag.core.train import _copy_bytes

    class Held(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)                                        # 72 float32 parameters: 288 B
            self.register_buffer("ones", torch.ones(1, 1).expand(80000, 80000))   # one stored float: 4 B
            i = torch.tensor([[0, 1, 2], [1, 2, 0]])
            self.register_buffer("adj", torch.sparse_coo_tensor(i, torch.ones(3), (200000, 200000)))   # 2x3 int64 + 3 float32
            self.register_buffer("twice", self.fc.weight.detach().clone())
            self.register_buffer("view", self.twice[:2])                    # shares twice's storage: counted once

    total = sum(n for _, n in _copy_bytes(Held()))
    assert total == 288 + 4 + (6 * 8 + 3 * 4) + 64 * 4
    assert sum(n for _, n in _copy_bytes(Held(), torch.float64)) == 2 * 288 + 8 + (6 * 8 + 3 * 8) + 64 * 8


@pytest.mark.parametrize("case", ["image-device", "image-fifo", "tokens-folder", "model-device"])
def test_a_path_that_exists_but_is_no_file_is_said_as_what_it_is(tmp_path, cli, case):
    """A sweep: --image /dev/null, --tokens @folder and a model spec /dev/null:f said "not found" of a path that
    exists. Like --checkpoint, they now name what it is (exit 2), and a FIFO is never opened (no hang)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    cnn, lm = str(ROOT / "sample_models" / "cnn.py:build"), str(ROOT / "sample_models" / "transformer_lm.py:build")
    args, said = {
        "image-device": (["gradcam", cnn, "--image", "/dev/null", "--layer", "features"], "--image /dev/null is a device"),
        "image-fifo": (["gradcam", cnn, "--image", str(fifo), "--layer", "features"], "is a FIFO (named pipe)"),
        "tokens-folder": (["attention", lm, "--tokens", f"@{tmp_path}"], "is a folder, not a regular file"),
        "model-device": (["summary", "/dev/null:f"], "/dev/null is a device"),
    }[case]
    r = cli(*args, "--device", "cpu")
    assert r.code == 2 and said in r.stderr and "not found" not in r.stderr, r.stderr
    one_error_line(r)
