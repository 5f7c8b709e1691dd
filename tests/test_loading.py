"""MODEL_SPEC, --arg, inputs and devices: every path works or fails with one line and its exit code."""
import pytest
import torch

from torchdiag.core.inputs import parse_input_spec
from torchdiag.core.loading import parse_args, split_spec
from torchdiag.errors import ModelError, UsageError

from support import ROOT, SAMPLES, load, sample


def _error_line(res):
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    return lines[0]


@pytest.mark.parametrize("args, code, words", [
    (["summary", "sample_models/mlp.py"], 2, "no ':factory'"),
    (["summary", "sample_models/nothere.py:build"], 2, "not found"),
    (["summary", f"{ROOT}/README.md:build"], 2, "README.md' is not a Python file"),
    (["summary", f"{SAMPLES}:build"], 2, "sample_models' is a folder, not a Python file"),
    (["summary", f"{SAMPLES}/:build"], 2, "is a folder, not a Python file"),
    (["summary", "no_such_pkg.models:build"], 2, "module 'no_such_pkg.models' not found"),
    (["summary", sample("mlp.py:buidl")], 2, "no factory named 'buidl'"),
    (["summary", sample("broken_factory.py:not_a_module")], 2, "returned dict, not a torch.nn.Module"),
    (["summary", sample("broken_factory.py:raises")], 3, "ValueError: config key 'depth' missing"),
    (["summary", sample("bad_import.py:build")], 3, "importing"),
    (["summary", sample("mlp.py:build"), "-i", "16xabc"], 2, "bad input shape"),
    # a sweep: a diffusers UNet's encoder_hidden_states, "bad input shape 'x=2x4'"
    (["summary", sample("mlp.py:build"), "-i", "encoder_hidden_states=2x8x32"], 2, "-i gives positional inputs only"),
    (["summary", sample("mlp.py:build"), "-i", "16x0"], 2, "every dimension"),
    (["summary", sample("mlp.py:build"), "-i", "16x784:float99"], 2, "unknown dtype 'float99'"),
    (["summary", sample("mlp.py:build"), "-i", "16x784:int64[5,1)"], 2, "empty value range"),
    (["summary", sample("two_input.py:build")], 2, "no inputs for the model"),
    (["summary", sample("mlp.py:build"), "--device", "cuda"], 2, "device 'cuda' is not available"),
    (["summary", sample("mlp.py:build"), "--device", "cuda:3"], 2, "not available"),
    (["summary", sample("mlp.py:build"), "--device", "tpu"], 2, "unknown device 'tpu'"),
    (["summary", sample("mlp.py:build"), "--device", ""], 2, "empty device name"),   # not auto (a hostile review)
    (["summary", sample("mlp.py:build"), "--arg", "hidden"], 2, "malformed --arg 'hidden'"),
    (["summary", sample("mlp.py:build"), "--arg", "widht=3"], 2, "does not accept these --arg values"),
    (["summary", sample("broken_shape.py:build")], 3, "forward failed in 2.0 (Linear) with input shapes (4x32)"),
])
def test_errors_are_one_line_with_exit_code(cli, args, code, words, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a CPU-only machine, even on a GPU box
    res = cli(*args)
    assert res.code == code, (res.code, res.stderr)
    assert words in _error_line(res)


def test_missing_factory_suggests_close_names(cli):
    res = cli("summary", sample("mlp.py:buidl"))
    assert "hint: did you mean build?" in res.stderr


def test_no_inputs_names_the_three_ways(cli):
    res = cli("summary", sample("two_input.py:build"))
    assert "-i/--input" in res.stderr and "example_inputs()" in res.stderr and "example_input_array" in res.stderr


def test_json_error_is_one_document(cli):
    res = cli("summary", sample("mlp.py:nope"), "--json")
    assert res.code == 2 and res.json["error"]["message"].startswith("'") and res.json["exit_code"] == 2


def test_split_on_last_colon_and_args():
    assert split_spec("C:/models/net.py:build") == ("C:/models/net.py", "build")
    assert parse_args(["depth=50", "name=resnet", "dims=(1, 2)", "flag=True"]) == {
        "depth": 50, "name": "resnet", "dims": (1, 2), "flag": True}
    # a shell's or TOML's spelling of a bool (a sweep: batch_first=false reached the factory as "false", truthy)
    assert parse_args(["a=false", "b=TRUE", "c=none", "d=falsey"]) == {"a": False, "b": True, "c": "none", "d": "falsey"}
    with pytest.raises(UsageError):
        parse_args(["=3"])


def test_dotted_module_spec(cli, monkeypatch):
    monkeypatch.chdir(SAMPLES.parent)
    res = cli("summary", "sample_models.mlp:build", "--json")
    assert res.code == 0 and res.json["total_params"] == 235_146


def test_class_factory_with_args():
    model, inputs = load("cnn.py:SmallCNN", "classes=3", "width=4", inputs=["2x3x32x32"])
    assert type(model).__name__ == "SmallCNN" and model.head[1].out_features == 3
    assert model.features[0].out_channels == 4 and inputs.args[0].shape == (2, 3, 32, 32)


def test_input_specs():
    s = parse_input_spec("2x128:int64[0,30000)")
    assert s.shape == (2, 128) and s.dtype == "int64" and (s.low, s.high) == (0, 30000)
    assert parse_input_spec("4x5:int32[1,3]").high == 4  # inclusive bound for integers
    assert parse_input_spec("2x3:bool").dtype == "bool"
    assert parse_input_spec("1x3x8x8:bf16").dtype == "bfloat16"


def test_int_inputs_default_to_embedding_range_and_respect_ranges():
    _, inputs = load("rnn.py:build", inputs=["3x7:int64"])
    (t,) = inputs.args
    assert t.dtype == torch.int64 and t.shape == (3, 7) and 0 <= t.min() and t.max() < 500
    assert "the nn.Embedding that consumes it: embed" in inputs.notes[0]
    _, inputs = load("rnn.py:build", inputs=["64x64:int64[10,12)"])
    assert set(inputs.args[0].unique().tolist()) <= {10, 11}


def test_example_inputs_dict_become_keyword_inputs():
    _, inputs = load("transformer_lm.py:build")
    assert inputs.args == () and set(inputs.kwargs) == {"input_ids", "labels"}
    assert inputs.source == "example_inputs()"


def test_example_input_array_is_used():
    # cnn.py has no example_inputs(); its factory sets example_input_array
    _, inputs = load("cnn.py:build")
    assert inputs.source == "example_input_array" and inputs.args[0].shape == (8, 3, 32, 32)


def test_meta_device_builds_without_allocating():
    model, inputs = load("mlp.py:build", device="meta")
    assert all(p.is_meta for p in model.parameters()) and inputs.args[0].is_meta


def test_meta_fallback_for_constructors_that_need_values():
    from torchdiag.core.loading import load_model

    loaded = load_model(sample("broken_factory.py:needs_values"), [], torch.device("meta"))
    assert loaded.built_on == "parameters moved to meta as registered"
    assert all(p.is_meta for p in loaded.model.parameters())
    assert loaded.model.fc1.out_features == 24


@pytest.mark.parametrize("args, words", [
    (["-i", "2x4:int8[0,30000)"], "does not fit int8"),
    (["-i", "100000x100000x1000"], "would take"),
])
def test_inputs_that_cannot_be_made(cli, args, words):
    res = cli("summary", sample("mlp.py:build"), *args)
    assert res.code == 2 and words in _error_line(res)


def test_sys_exit_in_user_code_is_exit_3(cli, tmp_path):
    (tmp_path / "m.py").write_text("import sys\nfrom torch import nn\n\ndef build():\n    sys.exit(5)\n")
    res = cli("summary", f"{tmp_path}/m.py:build", "-i", "2x4")
    assert res.code == 3 and "called sys.exit(5)" in _error_line(res)


def test_tb_pointing_at_a_file_is_a_usage_error(cli, tmp_path):
    (tmp_path / "afile").write_text("")
    res = cli("summary", sample("mlp.py:build"), "--tb", tmp_path / "afile", "--json")
    assert res.code == 2 and "is a file, not a folder" in _error_line(res)
    assert res.json["exit_code"] == 2  # exactly one JSON document, the error


@pytest.mark.parametrize("body", ["if x.sum().item() > 0:\n            x = x + 1", "x = x[x.nonzero(as_tuple=True)].view(2, 4)"])
def test_meta_forward_that_reads_values_says_use_cpu(cli, tmp_path, body):
    (tmp_path / "m.py").write_text(
        "from torch import nn\n\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = nn.Linear(4, 4)\n\n    def forward(self, x):\n        " + body + "\n        return self.fc(x)\n\n"
        "def build():\n    return M()\n")
    res = cli("flops", f"{tmp_path}/m.py:build", "-i", "2x4", "--device", "meta")
    assert res.code == 3 and "forward failed in (root) (M)" in _error_line(res)
    assert "run it with --device cpu" in res.stderr
    assert cli("flops", f"{tmp_path}/m.py:build", "-i", "2x4", "--device", "cpu").code == 0


def test_a_builder_that_raises_typeerror_without_arg_values_is_the_models_error_not_the_users():
    """hf hunyuan_vl's config holds a None its model raises a TypeError on: with no --arg given, exit 3 naming the
    build, not 'does not accept these --arg values' (exit 2); with --arg values, the usage error stands."""
    import torch

    from torchdiag.core import sources

    def build(**kw):
        if kw:
            raise TypeError(f"unexpected keyword {next(iter(kw))!r}")
        return None ** 2.0   # the config's None, as the model's own code meets it

    with pytest.raises(ModelError, match=r"building fake raised TypeError"):
        sources.build(sources.Source(build, {}, "fake"), torch.device("cpu"), 0)
    with pytest.raises(UsageError, match="does not accept these --arg values"):
        sources.build(sources.Source(build, {"widht": 3}, "fake"), torch.device("cpu"), 0)


def test_factory_args_are_in_the_json_as_their_values(cli, tmp_path):
    """A sweep: `--arg weights_backbone=None` showed as the string 'None' in the header (the factory got None)."""
    f = tmp_path / "m.py"
    f.write_text("import torch.nn as nn\n\ndef build(width=8, norm=None):\n    assert norm is None\n"
                 "    return nn.Linear(4, width)\n")
    r = cli("summary", f"{f}:build", "--arg", "norm=None", "--arg", "width=6", "-i", "2x4", "--json")
    assert r.code == 0, r.stderr
    assert r.json["factory_args"] == {"norm": None, "width": 6}


def test_a_model_with_its_own_training_step_is_told_it_is_not_run(cli, tmp_path):
    """A sweep: a LightningModule's training_step (which detached its logits) passed gradflow, doctor and
    overfit-batch; nothing said those commands never run it."""
    (tmp_path / "lit.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "class Lit(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.net = nn.Linear(8, 3)\n"
        "    def forward(self, x):\n        return self.net(x)\n"
        "    def training_step(self, batch, i):\n        return self(batch[0]).detach().sum()\n"
        "    def configure_optimizers(self):\n        return torch.optim.AdamW(self.parameters())\n\n"
        "class Sched(nn.Linear):\n"
        "    def __init__(self):\n        super().__init__(8, 3)\n        self.training_step = lambda step: 1.0\n\n"
        "def sched():\n    return Sched()\n\n"
        "def build():\n    return Lit()\n\n"
        "def example_inputs():\n    return (torch.randn(4, 8),)\n")
    r = cli("gradflow", f"{tmp_path}/lit.py:build", "--device", "cpu", "--json")
    assert r.json["training_step"].startswith("not run: torchdiag trains forward()'s output")
    r = cli("summary", f"{tmp_path}/lit.py:build", "--device", "cpu", "--json")
    assert "training_step" not in r.json        # summary trains nothing
    r = cli("gradflow", f"{tmp_path}/lit.py:sched", "--device", "cpu", "--json")
    assert "training_step" not in r.json        # an attribute of that name is no Lightning contract (a review)


def test_a_model_holding_meta_tensors_is_one_line_exit_2(cli, tmp_path):
    """A factory that leaves a buffer on the meta device: every command ended in torch's "Cannot copy out of meta
    tensor" (exit 4); the Python API's model partly on meta as well. A model wholly on meta stays a meta run."""
    f = tmp_path / "m.py"
    f.write_text("import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                 "        self.fc = torch.nn.Linear(8, 4)\n        self.register_buffer('unused', torch.empty(3, "
                 "device='meta'))\n    def forward(self, x):\n        return self.fc(x)\n"
                 "def build():\n    return M()\n")
    for command in ("summary", "nancheck", "gradflow"):
        r = cli(command, f"{f}:build", "--input", "2x8", "--device", "cpu")
        assert r.code == 2 and "1 tensor(s) on the meta device" in r.stderr and "buffer unused" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert cli("summary", f"{f}:build", "--input", "2x8", "--device", "meta").code == 0
    import importlib.util

    from torchdiag.api import run as api_run
    spec = importlib.util.spec_from_file_location("m_meta", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(UsageError, match="buffer unused"):
        api_run("nancheck", mod.build(), (torch.randn(2, 8),))


# ---- a model too big for the memory here (core.resources.room_for_model) ---------------------------------------------
# A user pointing torchdiag at hf:FOLDER of a model of billions of parameters (zamba's default config: 7.2e9, 27 GiB of
# float32) on a 24 GiB machine got the process OOM-killed, or after 40 s "building ... raised RuntimeError: ... can't
# allocate memory" (exit 3). The machine is made small here instead of the model large: nothing big is ever allocated.

def _small_source(monkeypatch, built_on):
    """torchvision:tiny, a source form whose builder records the device each build ran under (meta: the sizing)."""
    from torch import nn

    from torchdiag.core import sources

    def build():
        built_on.append(torch.empty(0).device.type)
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))   # 4,355 float32 values: 17,420 B

    monkeypatch.setattr(sources, "resolve", lambda spec, kwargs, download=None: sources.Source(
        build, dict(kwargs), "torchvision tiny", inputs=("2x64",), header={"source": "torchvision:tiny"}))


def test_a_source_too_big_for_the_memory_is_refused_before_its_weights_are_built(cli, monkeypatch):
    from torchdiag.core import resources

    built_on: list = []
    _small_source(monkeypatch, built_on)
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 10_000)
    res = cli("summary", "torchvision:tiny", "--device", "cpu")
    assert res.code == 3, res.stderr
    line = _error_line(res)
    assert line == ("error: torchvision:tiny is too big for the memory here: 4,355 parameters need 17.01 KiB on cpu "
                    "(17.01 KiB of float32 weights), 9.77 KiB is available there"), line
    assert "--device meta" in res.stderr and "--arg" in res.stderr
    assert built_on == ["meta"]                     # sized on meta; the weights were never made
    assert cli("summary", "torchvision:tiny", "--device", "meta").code == 0   # meta needs no memory: never refused
    res = cli("summary", "torchvision:tiny", "--device", "cpu", "--json")
    assert res.code == 3 and res.json["error"]["message"].startswith("torchvision:tiny is too big"), res.stdout


def test_a_training_command_counts_its_gradients_copy_and_optimizer_state(cli, monkeypatch):
    from torchdiag.core import resources

    _small_source(monkeypatch, [])
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 55_000)   # the weights fit, the training not
    assert cli("summary", "torchvision:tiny", "--device", "cpu").code == 0
    assert cli("gradflow", "torchvision:tiny", "--device", "cpu").code in (0, 1)   # weights + gradients: 34,840 B
    res = cli("overfit-batch", "torchvision:tiny", "--device", "cpu")
    assert res.code == 3, res.stderr
    assert _error_line(res) == (
        "error: torchvision:tiny is too big for the memory here: 4,355 parameters need 85.06 KiB on cpu (the weights "
        "17.01 KiB, a copy to train 17.01 KiB, its gradients 17.01 KiB, adam state 34.02 KiB for overfit-batch), "
        "53.71 KiB is available there")
    res = cli("doctor", "torchvision:tiny", "--device", "cpu")   # it trains a copy with Adam too
    assert res.code == 3 and "(the weights 17.01 KiB, a copy to train 17.01 KiB, its gradients 17.01 KiB, adam state " \
        "34.02 KiB for doctor)" in res.stderr, res.stderr
    res = cli("overfit-batch", "torchvision:tiny", "--device", "cpu", "--optimizer", "sgd", "--momentum", "0")
    assert res.code in (0, 1), res.stderr          # no optimizer state: 3 x 17,420 B fits
    res = cli("overfit-batch", "torchvision:tiny", "--device", "cpu", "--dtype", "bfloat16")
    # counted at --dtype: 17,420 B built, then 4 x 8,710 B fits (only the sizing is asserted: under a pretended GPU
    # torch 2.14's Adam reaches for CUDA in a bfloat16 step)
    assert "too big" not in res.stderr, res.stderr
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 30_000)
    res = cli("overfit-batch", "torchvision:tiny", "--device", "cpu", "--dtype", "bfloat16")
    assert res.code == 3 and "need 42.53 KiB on cpu (the weights 8.51 KiB (bfloat16), a copy" in res.stderr, res.stderr


def test_a_model_too_big_for_the_gpu_or_for_the_host_that_builds_it():
    # on meta, 10^10 float32 weights (37 GiB) cost nothing; the memory of the host and of the GPU are patched, so the
    # test means the same on a machine with a GPU and without one
    from torch import nn

    from torchdiag.core import resources
    from torchdiag.core.run import RunSpec

    with torch.device("meta"):
        big = nn.Linear(100_000, 100_000, bias=False)
    cuda = torch.device("cuda", 0)
    free = {"cpu": 64 * 2**30, "cuda": 16 * 2**30}
    patch = pytest.MonkeyPatch()
    patch.setattr(resources, "device_available", lambda device, swap=False: free[device.type])
    try:
        with pytest.raises(ModelError) as caught:
            resources.room_for_model(big, "hf:big", cuda, RunSpec("summary", "hf:big"))
        assert caught.value.code == 3 and caught.value.message == (
            "hf:big is too big for the memory here: 10,000,000,000 parameters need 37.25 GiB on cuda:0 (37.25 GiB of "
            "float32 weights), 16.00 GiB is available there")
        free["cpu"], free["cuda"] = 16 * 2**30, 80 * 2**30   # the GPU holds it, the host that builds it does not
        with pytest.raises(ModelError) as caught:
            resources.room_for_model(big, "hf:big", cuda, RunSpec("summary", "hf:big"))
        assert "need 37.25 GiB on cpu" in caught.value.message
        free["cpu"] = 64 * 2**30
        resources.room_for_model(big, "hf:big", cuda, RunSpec("summary", "hf:big"))   # fits: nothing said
        free["cuda"] = 70 * 2**30
        with pytest.raises(ModelError) as caught:   # nancheck: + the gradients
            resources.room_for_model(big, "hf:big", cuda, RunSpec("nancheck", "hf:big"))
        assert "need 74.51 GiB on cuda:0 (the weights 37.25 GiB, gradients 37.25 GiB for nancheck)" \
            in caught.value.message
        patch.setattr(resources, "device_available", lambda device, swap=False: None)   # mps: not known, not refused
        resources.room_for_model(big, "hf:big", torch.device("mps"), RunSpec("nancheck", "hf:big"))
    finally:
        patch.undo()


def test_a_build_that_runs_out_of_memory_anyway_is_one_line_exit_3(cli, tmp_path):
    model = tmp_path / "hungry.py"
    model.write_text("def build():\n    raise MemoryError()\n\n\n"
                     "def allocator():\n    raise RuntimeError('[enforce fail at alloc_cpu.cpp:127] err == 0. "
                     "DefaultCPUAllocator: can\\'t allocate memory: you tried to allocate 220463104 bytes.')\n\n\n"
                     "class QuotaError(MemoryError):\n    pass\n\n\n"
                     "def quota():\n    raise QuotaError('licence seat quota exceeded')\n")
    for factory in ("build", "allocator"):
        res = cli("summary", f"{model}:{factory}", "--device", "cpu")
        assert res.code == 3, res.stderr
        assert _error_line(res).startswith(f"error: {model}:{factory} ran out of memory while it was built: ")
        assert "--device meta" in res.stderr
    res = cli("summary", f"{model}:quota", "--device", "cpu")   # a library's MemoryError subclass: its own words
    assert res.code == 3 and _error_line(res) == "error: quota() raised QuotaError: licence seat quota exceeded", \
        res.stderr


def test_the_memory_available_counts_swap_for_a_build_and_a_containers_limit(monkeypatch, tmp_path):
    # a review: MemAvailable alone refused a model a host with swap had run (slowly) before, and a container's
    # cgroup limit, where the OOM killer acts first, was not read
    from torchdiag.core import resources

    info = {"MemAvailable:": 8 * 2**30, "SwapFree:": 4 * 2**30}
    monkeypatch.setattr(resources, "_meminfo", lambda key: info.get(key))
    monkeypatch.setattr(resources, "_address_space_left", lambda: None)
    monkeypatch.setattr(resources, "_cgroup_left", lambda: None)
    assert resources.host_available() == 8 * 2**30 and resources.host_available(swap=True) == 12 * 2**30
    monkeypatch.setattr(resources, "_cgroup_left", lambda: 2**30)
    assert resources.host_available(swap=True) == 2**30
    limit, usage = tmp_path / "limit", tmp_path / "usage"
    real_open = open

    def fake_open(path, *a, **k):
        return real_open({"/sys/fs/cgroup/memory/memory.limit_in_bytes": limit,
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes": usage}.get(path, "/nonexistent/x"), *a, **k)

    monkeypatch.undo()
    monkeypatch.setattr("builtins.open", fake_open)
    limit.write_text("9223372036854771712\n")   # v1's "no limit"
    usage.write_text("1000\n")
    assert resources._cgroup_left() is None
    limit.write_text(f"{3 * 2**30}\n")
    assert resources._cgroup_left() == 3 * 2**30 - 1000


def test_a_copy_to_train_is_refused_when_its_gradients_and_optimizer_state_do_not_fit(cli, monkeypatch, tmp_path):
    # Linear(100, 10): 1,010 float32 weights, 4,040 B; its copy trained with Adam holds 4,040 B of gradients and
    # 8,080 B of moments beside the copy. Asked for the copy alone, 8,000 B free let it through to be OOM-killed
    # later (torchvision vit_h_14's gradflow re-check on 24 GiB); a file spec is not sized before it loads.
    from torchdiag.core import resources

    (tmp_path / "lin.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(100, 10)\n\n"
                                     "def example_inputs():\n    return (torch.randn(4, 100),)\n")
    spec = f"{tmp_path / 'lin.py'}:build"
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 8_000)
    res = cli("overfit-batch", spec, "--device", "cpu", "--steps", "5")
    assert res.code == 3, res.stderr
    assert _error_line(res) == (
        "error: not enough memory for a copy of the model to train it: on cpu it needs 15.78 KiB (its tensors "
        "3.95 KiB, its gradients 3.95 KiB, adam state 7.89 KiB), 7.81 KiB is free there")
    res = cli("overfit-batch", spec, "--device", "cpu", "--steps", "5", "--optimizer", "sgd", "--momentum", "0")
    assert res.code == 3 and "it needs 7.89 KiB (its tensors 3.95 KiB, its gradients 3.95 KiB), " in res.stderr
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 8_080)
    res = cli("overfit-batch", spec, "--device", "cpu", "--steps", "5", "--optimizer", "sgd", "--momentum", "0")
    assert res.code in (0, 1), res.stderr   # no state: the copy and its gradients fit exactly
    assert cli("overfit-batch", spec, "--device", "cpu", "--steps", "5").code == 3
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 16_160)   # exactly what it needs
    assert cli("overfit-batch", spec, "--device", "cpu", "--steps", "5").code in (0, 1)
    # memory measures a step on a copy: in train mode its gradients and Adam's state come with it, in inference not
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 8_000)
    res = cli("memory", spec, "--device", "cpu")
    assert res.code == 3 and "to measure a step on it: on cpu it needs 15.78 KiB" in res.stderr, res.stderr
    assert cli("memory", spec, "--device", "cpu", "--mode", "inference").code == 0


def test_a_model_with_buffers_is_said_to_need_its_weights_and_buffers(cli, monkeypatch):
    # Linear(64, 8) and BatchNorm1d(8): 520 + 16 parameters, and 8 + 8 float32 statistics and an int64 count beside
    # them: 2,144 + 72 = 2,216 B, every byte of it counted and called what it is
    from torch import nn

    from torchdiag.core import resources, sources

    monkeypatch.setattr(sources, "resolve", lambda spec, kwargs, download=None: sources.Source(
        lambda: nn.Sequential(nn.Linear(64, 8), nn.BatchNorm1d(8)), dict(kwargs), "torchvision tiny",
        inputs=("2x64",), header={"source": "torchvision:tiny"}))
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 2_000)
    res = cli("summary", "torchvision:tiny", "--device", "cpu")
    assert _error_line(res) == ("error: torchvision:tiny is too big for the memory here: 536 parameters need 2.16 KiB "
                                "on cpu (2.16 KiB of float32 weights and buffers), 1.95 KiB is available there")


def test_ranks_on_one_host_each_get_their_part_of_its_memory(monkeypatch):
    # under torchrun two ranks on this host each build the model and run their step at once: each may take half of
    # what is available (each compared the whole host's memory before: two 10 GiB builds passed on 16 GiB)
    from torchdiag.core import resources

    monkeypatch.setattr(resources, "_mem_available", lambda: 16 * 2**30)
    monkeypatch.setattr(resources, "_meminfo", lambda key: 2 * 2**30)   # SwapFree
    monkeypatch.setattr(resources, "_cgroup_left", lambda: None)
    monkeypatch.setattr(resources, "_address_space_left", lambda: None)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    cpu = torch.device("cpu")
    assert resources.device_available(cpu) == 16 * 2**30 and resources.device_available(cpu, swap=True) == 18 * 2**30
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")   # two hosts of two ranks
    assert resources.device_available(cpu) == 8 * 2**30 and resources.device_available(cpu, swap=True) == 9 * 2**30
    monkeypatch.setattr(resources, "_address_space_left", lambda: 5 * 2**30)   # each process's own cap: not shared
    assert resources.device_available(cpu) == 5 * 2**30
    monkeypatch.setattr(resources, "_address_space_left", lambda: None)
    monkeypatch.setattr(resources, "_cgroup_left", lambda: 6 * 2**30)   # the container's, shared by its ranks
    assert resources.device_available(cpu) == 3 * 2**30


def _copies(monkeypatch) -> list:
    """Every train_copy call of the run: (why, dtype, backward, the optimizer's name or None)."""
    from torchdiag.core import train

    calls, real = [], train.train_copy

    def copy(model, why="to train it", dtype=None, **uses):
        opt = uses.get("optimizer")
        calls.append((why, dtype, uses.get("backward", False), opt.name if opt is not None else None))
        return real(model, why, dtype, **uses)

    monkeypatch.setattr(train, "train_copy", copy)
    return calls


def test_each_copy_is_asked_room_for_what_its_caller_runs_on_it(monkeypatch):
    """A review: the gate tests' copies (forward and backward only) were asked room for Adam's state; overfit-batch's
    second opinion, trained with Adam, for the run's SGD; doctor's float64 and stop-finding copies, run backward, for
    their weights alone."""
    from torch import nn

    from torchdiag.api import run
    from torchdiag.core.run import OptimizerSpec

    calls = _copies(monkeypatch)
    torch.manual_seed(0)
    gated = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    nn.init.zeros_(gated[1].weight)   # a zero-init gate: zero gradients before it, re-checked by a short run
    run("gradflow", gated, (torch.randn(16, 8),))
    rechecks = [c for c in calls if c[0] == "to re-check a finding with a short training run"]
    assert ("to re-check a finding with a short training run", None, True, "adam") in rechecks   # the run: it steps
    assert ("to re-check a finding with a short training run", None, True, None) in rechecks     # a gate test
    calls.clear()
    lin = nn.Linear(100, 10)
    run("overfit-batch", lin, (torch.randn(4, 100),), optimizer="sgd", momentum=0.0, lr=1e-9)
    # the run's SGD (no state), the float64 copy that asks whether the loss depends on the weights that never moved
    # (forward and backward), then the second opinion's Adam
    assert [c[1:] for c in calls] == [(None, False, "sgd"), (torch.float64, True, None), (None, False, "adam")], calls
    assert OptimizerSpec("sgd", momentum=0.0).states == 0 and OptimizerSpec("adam").states == 2

    class Biased(nn.Module):   # lin.bias cancelled in forward: it does not move, and the loss does not depend on it
        def __init__(self):
            super().__init__()
            self.lin, self.head = nn.Linear(100, 20), nn.Linear(20, 5)

        def forward(self, x):
            return self.head(torch.relu(self.lin(x) - self.lin.bias + 0.1))

    calls.clear()
    run("doctor", Biased(), (torch.randn(4, 100),))
    floats = [c for c in calls if c[1] == torch.float64]
    assert floats and all(c[2] for c in floats), calls


def test_a_complex_parameter_is_counted_with_its_gradient_and_state(monkeypatch):
    from torch import nn

    from torchdiag.core import resources, train
    from torchdiag.core.run import OptimizerSpec

    class Complex(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(100, 10, dtype=torch.complex64))   # 8,000 B

    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 31_999)   # 31.25 KiB both: in bytes
    with pytest.raises(train.NoRoom, match=r"needs 32,000 B \(its tensors 7.81 KiB, its gradients 7.81 KiB, adam "
                                           r"state 15.62 KiB\), 31,999 B is free there"):
        train.room_for_copy(Complex(), "to train it", optimizer=OptimizerSpec("adam"))
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 32_000)
    train.room_for_copy(Complex(), "to train it", optimizer=OptimizerSpec("adam"))


def test_sizes_that_print_alike_are_told_in_bytes():
    from torchdiag.fmt import bytes_apart

    assert bytes_apart(4_216, 4_215) == ("4,216 B", "4,215 B")   # both 4.12 KiB
    assert bytes_apart(8_192, 4_096) == ("8.00 KiB", "4.00 KiB")


def test_check_sizes_the_model_for_its_heaviest_check(cli, monkeypatch, tmp_path):
    # a review: gradflow alone was refused (weights and gradients do not fit), and check ran the same gradflow on a
    # model sized for its weights alone
    from torchdiag.core import resources

    _small_source(monkeypatch, [])
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 20_000)   # 17,420 B of weights
    assert cli("gradflow", "torchvision:tiny", "--device", "cpu").code == 3
    cfg = tmp_path / "torchdiag.toml"
    for checks, code in (("gradflow = true", 3), ("max-params = 10000", 0)):   # weights and gradients: 34,840 B
        cfg.write_text(f'model = "torchvision:tiny"\ninputs = ["2x64"]\ndevice = "cpu"\n[check]\n{checks}\n')
        res = cli("check", "--config", str(cfg))
        assert res.code == code, (checks, res.stdout, res.stderr)
        assert ("gradients 17.01 KiB for check" in res.stdout + res.stderr) == (code == 3), res.stdout + res.stderr
    # overfit-batch's copy is asked room when made, with its own table's optimizer: an SGD one is not charged Adam's
    # state at load (a review); the copy, its gradients and the weights, 52,260 B, fit
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 60_000)
    cfg.write_text('model = "torchvision:tiny"\ninputs = ["2x64"]\ndevice = "cpu"\n[check]\n'
                   'overfit-batch = {optimizer = "sgd", momentum = 0.0, steps = 5}\n')
    res = cli("check", "--config", str(cfg))
    assert "too big" not in res.stdout + res.stderr and "not enough memory" not in res.stdout + res.stderr, res.stdout


def test_a_sparse_embeddings_gradient_is_not_counted_as_its_whole_table(monkeypatch):
    """nn.Embedding(sparse=True) gets a gradient of the rows a batch looks up: a copy run backward (profile's and
    memory's train mode, data's step timing keep the embedding sparse) was asked a dense gradient as large as the
    table and refused where it fits. A weight a dense head reads too (tied) gets a dense gradient and is counted; so
    is the table of a model sized for gradflow, which makes its embeddings dense before it runs (a review)."""
    from torch import nn

    from torchdiag.core import resources, train
    from torchdiag.core.run import RunSpec

    class Recommender(nn.Module):
        def __init__(self, tied=False):
            super().__init__()
            self.table = nn.Embedding(20_000, 16, sparse=True)   # 1.28 MB
            self.head = nn.Linear(16, 20_000 if tied else 1, bias=False)
            if tied:
                self.head.weight = self.table.weight

        def forward(self, ids):
            return self.head(self.table(ids))

    table = 20_000 * 16 * 4
    model = Recommender()
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: int(1.5 * table))
    train.room_for_copy(model, "to re-check it", backward=True)   # the table, its few rows' gradient, the head
    with pytest.raises(ModelError, match="gradients 1.22 MiB"):
        resources.room_for_model(model, "m", torch.device("cpu"), RunSpec("gradflow", "m"))
    ids = torch.randint(0, 20_000, (4, 8))
    model(ids).sum().backward()
    assert model.table.weight.grad.is_sparse   # what torch gives it: a batch's 32 rows
    with pytest.raises(train.NoRoom, match="its gradients 1.22 MiB"):
        train.room_for_copy(Recommender(tied=True), "to re-check it", backward=True)
    with pytest.raises(ModelError, match="gradients 1.22 MiB"):
        resources.room_for_model(Recommender(tied=True), "m", torch.device("cpu"), RunSpec("gradflow", "m"))


def test_a_copy_wrapped_in_ddp_is_asked_room_for_its_gradient_buckets(monkeypatch):
    """DistributedDataParallel keeps a flat copy of the gradients in its buckets (gradient_as_bucket_view=False, the
    default): a DDP-wrapped copy run backward holds its gradients twice (measured: a 120 MB model's process grew
    249 MB over DDP's construction and one backward)."""
    from torch import nn

    from torchdiag.core import resources, train

    model = nn.Linear(100, 20)   # 8,080 B
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 3 * 8_080 - 1)
    train.room_for_copy(model, "to train it", backward=True)   # weights and gradients: 2x
    with pytest.raises(train.NoRoom, match=r"needs 24,240 B \(its tensors 7.89 KiB, its gradients 7.89 KiB, DDP's "
                                           r"gradient buckets 7.89 KiB\), 24,239 B is free there"):
        train.room_for_copy(model, "to train it", backward=True, buckets=True)


def test_memory_freed_into_the_allocator_counts_as_free_under_an_address_space_cap(monkeypatch):
    """Under `ulimit -v` the room left is the cap less VmSize, and a freed tensor stays mapped in malloc's heap:
    efficientnet_b6's re-checks were refused after its pass freed 6 GB of activations (the zoo's 14 GiB cap), which
    the copies would have reused. What malloc holds free (mallinfo2) counts as room."""
    import ctypes
    import resource as rlimit

    from torchdiag.core import resources

    # what malloc holds free depends on its thresholds and arenas (a CI worker's heap was trimmed): read, not ranged
    assert resources._allocator_free() >= 0 and (resources._allocator_free() > 0) == hasattr(ctypes.CDLL(None),
                                                                                            "mallinfo2")
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    monkeypatch.setattr(rlimit, "getrlimit", lambda which: (size, size) if which == rlimit.RLIMIT_AS else (-1, -1))
    monkeypatch.setattr(resources, "_allocator_free", lambda: 7 * 2**30)
    assert resources._address_space_left() >= 7 * 2**30   # the cap is used up by VmSize; what malloc holds is room
