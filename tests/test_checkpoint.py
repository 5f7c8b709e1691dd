"""--checkpoint FILE (core.checkpoint): safe formats only, keys that do not fit, meta reads headers only."""
from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import struct
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from support import one_error_line, sample

MODEL = """
import torch
from torch import nn

def build(width=8):
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))

def example_inputs():
    return (torch.randn(3, 4),)
"""


def net(width=8):
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))


@pytest.fixture
def spec(tmp_path):
    (tmp_path / "net.py").write_text(MODEL)
    return f"{tmp_path}/net.py:build"


def trained():
    """Weights unlike the factory's (seeded 1): a loaded checkpoint is visible in the numbers."""
    torch.manual_seed(123)
    m = net()
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(0.5)
    return m.state_dict()


def findings(doc):
    return [(f["code"], f["where"]) for f in doc["findings"]]


def loaded_model(spec, path, **kw):
    from torchdiag.core.context import prepare
    from torchdiag.core.run import RunSpec

    model, _, ctx = prepare(RunSpec("summary", spec, checkpoint=str(path), **{"device": "cpu", **kw}))   # compared with CPU tensors
    return model, ctx


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".bin"])
def test_torch_file_loads_its_values(spec, tmp_path, suffix):
    path = tmp_path / f"w{suffix}"
    torch.save(trained(), path)
    model, ctx = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())
    assert ctx.header["checkpoint"] == [f"{path}: 4 tensors loaded"]


def test_safetensors_loads_its_values(spec, tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file(trained(), str(path))
    model, _ = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())


def test_lightning_ckpt_state_dict_with_prefix_stripped(spec, tmp_path, cli):
    path = tmp_path / "last.ckpt"
    torch.save({"epoch": 3, "global_step": 10, "state_dict": {"model." + k: v for k, v in trained().items()}}, path)
    model, ctx = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())
    r = cli("summary", spec, "--checkpoint", path, "--json")
    assert r.code == 0, r.stderr
    assert r.json["checkpoint"] == [f"{path}: 4 tensors loaded, prefix 'model.' stripped"]
    # the table's header says the list's items, not Python's repr of it (a review: "checkpoint: ['last.ckpt: ...']")
    text = cli("summary", spec, "--checkpoint", path)
    assert "checkpoint: " in text.stdout and "checkpoint: [" not in text.stdout and "4 tensors loaded" in text.stdout, \
        text.stdout


@pytest.mark.parametrize("layout, stripped", [
    (lambda sd: {"module._orig_mod." + k: v for k, v in sd.items()}, "module._orig_mod."),   # DDP around compile
    (lambda sd: {"_orig_mod.module." + k: v for k, v in sd.items()}, "_orig_mod.module."),
    (lambda sd: {"module": sd}, ""),                                                         # DeepSpeed's layout
    (lambda sd: {"checkpoint": {"model": sd}, "step": 3}, ""),                               # one level deeper
    (lambda sd: {"weights": {"net.": 1, **{"module." + k: v for k, v in sd.items()}}, "epoch": 1}, "module."),
])
def test_trainer_layouts_a_review_found_load(spec, tmp_path, layout, stripped):
    path = tmp_path / "w.pt"
    torch.save(layout(trained()), path)
    model, ctx = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())
    assert ctx.header["checkpoint"] == [f"{path}: 4 tensors loaded" + (f", prefix '{stripped}' stripped" if stripped else "")]


def test_two_candidate_state_dicts_are_not_guessed(spec, tmp_path, cli):
    path = tmp_path / "w.pt"
    torch.save({"ema": trained(), "student": trained()}, path)
    r = cli("summary", spec, "--checkpoint", path)
    assert r.code == 2 and "holds no state dict (found: ema, student)" in r.stderr, r.stderr


def test_index_shards_outside_their_folder_or_not_matching_are_refused(spec, tmp_path, cli):
    from safetensors.torch import save_file

    sd = trained()
    save_file({k: v for k, v in sd.items() if k.startswith("0.")}, str(tmp_path / "a.safetensors"))
    save_file({k: v for k, v in sd.items() if k.startswith("2.")}, str(tmp_path / "b.safetensors"))
    os.mkfifo(tmp_path / "f.safetensors")
    cases = {"abs": ({k: "/etc/hostname" for k in sd}, "outside the index's folder"),
             "up": ({k: "../a.safetensors" for k in sd}, "outside the index's folder"),
             "swapped": ({k: "b.safetensors" if k.startswith("0.") else "a.safetensors" for k in sd},
                         "maps 2 key(s) to a.safetensors that it does not hold"),
             "fifo": ({k: "f.safetensors" for k in sd}, "f.safetensors is a FIFO (named pipe)"),
             "good": ({k: "a.safetensors" if k.startswith("0.") else "b.safetensors" for k in sd}, None)}
    for name, (weight_map, words) in cases.items():
        index = tmp_path / f"{name}.safetensors.index.json"
        index.write_text(json.dumps({"weight_map": weight_map}))
        r = cli("summary", spec, "--checkpoint", index)
        assert r.code == (0 if words is None else 2), (name, r.stderr)
        if words:
            one_error_line(r)
            assert words in r.stderr, (name, r.stderr)


def test_a_method_named_as_a_global_is_hostile_and_a_path_is_not(tmp_path):
    """A review: `pathlib.Path.touch` (protocol 4 names a method) got the 'if you trust the file' hint; the scan read
    it as `Path.touch.PosixPath`. A Lightning hparam's PosixPath is a value, not a call."""
    from torchdiag.core.checkpoint import _hostile, unsafe_globals

    assert _hostile("pathlib.Path.touch") == "pathlib.Path.touch"
    assert _hostile("pathlib.PosixPath") is None and _hostile("argparse.Namespace") is None
    assert _hostile("Models.net.Cfg") is None    # a user package with a capital letter (a review)
    # a project's own module named like a stdlib one that runs nothing by its name
    assert _hostile("profile.Config") is None and _hostile("trace.Settings") is None
    assert _hostile("pydoc.pipepager") == "pydoc.pipepager" and _hostile("timeit.timeit") == "timeit.timeit"
    import timeit

    class Evil:
        def __reduce__(self):
            return timeit.timeit, ("pass",)

    path = tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"h": Evil()}, protocol=4))
    assert "timeit.timeit" in unsafe_globals(str(path))   # the name said twice is one memoised string


def test_a_loop_of_links_is_said_as_such(spec, tmp_path, cli):
    os.symlink(tmp_path / "b.pt", tmp_path / "a.pt")
    os.symlink(tmp_path / "a.pt", tmp_path / "b.pt")
    r = cli("summary", spec, "--checkpoint", tmp_path / "a.pt")
    assert r.code == 2 and "Too many levels of symbolic links" in r.stderr and "not found" not in r.stderr


def temp_module(tmp_path, name, source):
    """Import `source` as module `name` from tmp_path; the caller deletes it (file and sys.modules) before
    loading, so a loader that tried to import it would fail."""
    import importlib.util

    (tmp_path / f"{name}.py").write_text(source)
    mod_spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = mod
    mod_spec.loader.exec_module(mod)
    return mod


def forget_module(tmp_path, name):
    sys.modules.pop(name, None)
    (tmp_path / f"{name}.py").unlink()


USER_HPARAMS = """
import dataclasses

class AttributeDict(dict):          # Lightning's hparams container is a dict subclass like this
    def __getattr__(self, key):
        return self[key]

@dataclasses.dataclass
class Config:
    lr: float = 0.1
    widths: tuple = (4, 8)

def __getattr__(name):              # a module-level hook: would fire if anything were looked up here
    raise AssertionError(f"looked up {name}")
"""


def lightning_checkpoint(path, hparams_module, state, legacy=False):
    """The layout Lightning's trainer writes: the module's weights under `model.`, hyper_parameters, optimizer
    states, callbacks and loops state, lr schedulers, versions. `legacy`: torch's pre-zip format (torch < 1.6)."""
    m = net()
    m.load_state_dict(state)
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    m.load_state_dict(state)            # the weights saved are `state`; the optimizer has its moments
    torch.save({
        "epoch": 3, "global_step": 30, "pytorch-lightning_version": "2.4.0",
        "state_dict": {"model." + k: v for k, v in state.items()},
        "hyper_parameters": {"args": argparse.Namespace(lr=0.1, batch_size=32, data=Path("/data")),
                             "config": hparams_module.Config(), "extra": hparams_module.AttributeDict(depth=2)},
        "hparams_type": hparams_module.AttributeDict,
        "optimizer_states": [opt.state_dict()], "lr_schedulers": [],
        "callbacks": {"ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {
            "best_model_score": torch.tensor(0.25), "best_model_path": "/ckpt/epoch=2.ckpt", "dirpath": "/ckpt"}},
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 3, "completed": 3}}}},
    }, path, _use_new_zipfile_serialization=not legacy)


def random_state():
    torch.manual_seed(7)
    return {k: torch.randn_like(v) for k, v in net().state_dict().items()}


@pytest.mark.parametrize("name", ["last.ckpt", "trainer.pt", "legacy.ckpt"])
def test_lightning_checkpoint_with_hyper_parameters_loads_exactly(spec, tmp_path, cli, name):
    """Namespace, a dict subclass and a dataclass of a module that no longer exists, optimizer states, callbacks:
    weights_only refuses the file, torchdiag reads it through inert stand-ins and takes the state dict, exactly.
    The pre-zip format too, whose globals torch's scan does not read (a sweep: refused while the zip loaded)."""
    hp = temp_module(tmp_path, "hparams_gone_1", USER_HPARAMS)
    path, state = tmp_path / name, random_state()
    lightning_checkpoint(path, hp, state, legacy=name.startswith("legacy"))
    forget_module(tmp_path, "hparams_gone_1")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)              # what plain weights_only says of this file
    before = set(torch.serialization.get_safe_globals())
    model, ctx = loaded_model(spec, path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert ctx.header["checkpoint"] == [f"{path}: 4 tensors loaded, prefix 'model.' stripped"]
    assert "hparams_gone_1" not in sys.modules           # nothing was imported from the file's world
    assert set(torch.serialization.get_safe_globals()) == before   # the stand-ins were for that load only
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)              # and the user's own torch.load is as strict as before
    r = cli("summary", spec, "--checkpoint", path, "--json")
    assert r.code == 0, r.stderr
    assert r.json["checkpoint"] == [f"{path}: 4 tensors loaded, prefix 'model.' stripped"]


def evil_module(tmp_path, name, call, marker):
    """A class whose pickle calls `call` with arguments that would create `marker`."""
    args = {"os.system": f"('touch {marker}',)", "builtins.exec": f"(\"open({str(marker)!r}, 'w').close()\",)",
            "subprocess.Popen": f"(['touch', {str(marker)!r}],)", "pydoc.pipepager": f"('x', 'touch {marker}')",
            "timeit.timeit": f"(\"open({str(marker)!r}, 'w').close()\",)"}[call]
    module = call.split(".")[0]
    return temp_module(tmp_path, name, f"import {module}\nclass Evil:\n"
                                       f"    def __reduce__(self):\n        return ({call}, {args})\n")


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("call", ["os.system", "builtins.exec", "subprocess.Popen", "pydoc.pipepager", "timeit.timeit"])
def test_pickle_that_would_run_code_is_refused_and_never_executed(spec, tmp_path, cli, call):
    from torch import _weights_only_unpickler as wo

    from torchdiag.core import checkpoint

    marker = tmp_path / "PWNED"
    evil = evil_module(tmp_path, f"evil_{call.replace('.', '_')}", call, marker)
    for name in ("evil.ckpt", "evil.pt"):
        path = tmp_path / name
        torch.save({"state_dict": trained(), "hyper_parameters": {"h": evil.Evil()}}, path)
        assert not marker.exists()   # saving does not run __reduce__'s result
        r = cli("summary", spec, "--checkpoint", path)
        assert r.code == 2
        one_error_line(r)
        assert "could run code" in r.stderr and f".{call.split('.')[1]}" in r.stderr     # why, and what it would call
        assert call == "os.system" or f"it would call {call}" in r.stderr    # by its Python 3 name (posix.system)
        assert f"hint: no checkpoint needs to call {call.replace('os.', 'posix.')}: do not open this file" in r.stderr
        r = cli("summary", spec, "--checkpoint", path, "--json")
        assert r.code == 2 and "could run code" in r.json["error"]["message"]
        # torch's own allow-list does not let the call through ...
        names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        assert len(names) == 1 and names[0] not in wo._get_allowed_globals()
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path, weights_only=True)
        # ... and the stand-ins, even without the refusal, call nothing (torch blocks os/posix outright)
        try:
            obj = checkpoint._StandIns(names).load(str(path), {"map_location": "cpu"})
            assert all(torch.equal(obj["state_dict"][k], v) for k, v in trained().items())
        except pickle.UnpicklingError:
            assert call == "os.system"
        assert not marker.exists()
    # the pre-zip torch.save format (read by our own scan) and a plain pickle: refused the same way
    torch.save({"state_dict": trained(), "h": evil.Evil()}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    (tmp_path / "plain.pt").write_bytes(pickle.dumps({"state_dict": {}, "h": evil.Evil()}, protocol=4))
    for name in ("legacy.pt", "plain.pt"):
        r = cli("summary", spec, "--checkpoint", tmp_path / name)
        assert r.code == 2 and "could run code" in r.stderr and "do not open this file" in r.stderr, r.stderr
        one_error_line(r)
        assert "Warning" not in r.stderr      # torch's note on pickle protocol 4 is not shown
        assert not marker.exists()


def test_tensors_that_need_their_code_are_refused(spec, tmp_path, cli):
    """A tensor subclass, a tensor in a user's box: the stand-ins cannot give tensors, so the file is refused."""
    mod = temp_module(tmp_path, "tensors_gone", "import torch\nclass Marked(torch.Tensor):\n    pass\n"
                                                "class Box:\n    def __init__(self, t):\n        self.t = t\n")
    state = trained()
    subclass, boxed = dict(state), dict(state)
    subclass["0.weight"] = state["0.weight"].as_subclass(mod.Marked)
    boxed["0.weight"] = mod.Box(state["0.weight"])
    torch.save(subclass, tmp_path / "subclass.pt")
    torch.save({"state_dict": boxed}, tmp_path / "boxed.ckpt")
    forget_module(tmp_path, "tensors_gone")
    before = set(torch.serialization.get_safe_globals())
    for name, words in (("subclass.pt", "tensors_gone.Marked"), ("boxed.ckpt", "its tensor 0.weight is a tensors_gone.Box")):
        r = cli("summary", spec, "--checkpoint", tmp_path / name)
        assert r.code == 2, r.stderr
        one_error_line(r)
        assert "needs arbitrary unpickling" in r.stderr and words in r.stderr and "could run code" in r.stderr
        assert "weights_only=False" in r.stderr and "--checkpoint weights.pt" in r.stderr   # how to convert, if trusted
        r = cli("summary", spec, "--checkpoint", tmp_path / name, "--json")
        assert r.code == 2 and words in r.json["error"]["message"]
    assert set(torch.serialization.get_safe_globals()) == before     # removed again after a failed load too


def test_whole_pickled_model_is_named_not_loaded(spec, tmp_path, cli):
    mod = temp_module(tmp_path, "model_gone", MODEL)
    torch.save(mod.build(), tmp_path / "model.pt")
    torch.save({"epoch": 1, "model": mod.build()}, tmp_path / "wrapped.pt")
    forget_module(tmp_path, "model_gone")
    # the file's own top level is said (a sweep: a config dict under `model` had its keys listed as the file's)
    for name, found in (("model.pt", "a pickled torch.nn.modules.container.Sequential"),
                        ("wrapped.pt", "epoch, model (a pickled torch.nn.modules.container.Sequential)")):
        r = cli("summary", spec, "--checkpoint", tmp_path / name, "--json")
        assert r.code == 2
        assert f"holds no state dict (found: {found})" in r.json["error"]["message"], r.json["error"]
        assert "model.state_dict()" in r.json["error"]["hint"]


def test_strict_mismatch_is_one_line_naming_every_kind_of_key(spec, tmp_path, cli):
    state = net(16).state_dict()
    del state["2.bias"]
    state["head.weight"] = torch.zeros(1)
    path = tmp_path / "w16.pt"
    torch.save(state, path)
    r = cli("summary", spec, "--checkpoint", path)
    assert r.code == 2
    one_error_line(r)
    err = r.stderr
    assert "1 missing (2.bias)" in err and "1 unexpected (head.weight)" in err
    assert "0.weight: checkpoint 16x4, model 8x4" in err and "2.weight: checkpoint 2x16, model 2x8" in err
    assert "--no-strict-checkpoint" in err
    assert "give its factory the file's (--arg" in err   # a sweep: the fix is the sizes, not loading less
    r = cli("summary", spec, "--checkpoint", path, "--json")
    assert r.code == 2 and "does not fit the model" in r.json["error"]["message"]


def test_no_strict_loads_what_fits_and_reports_each_key(spec, tmp_path, cli):
    state = trained()
    state["0.weight"] = torch.zeros(16, 4)
    del state["2.bias"]
    state["extra.bias"] = torch.zeros(3)
    path = tmp_path / "w.pt"
    torch.save(state, path)
    r = cli("summary", spec, "--checkpoint", path, "--no-strict-checkpoint", "--json")
    assert r.code == 1, r.stderr
    assert sorted(findings(r.json)) == [("checkpoint-missing-key", "2.bias"), ("checkpoint-shape-mismatch", "0.weight"),
                                        ("checkpoint-unexpected-key", "extra.bias")]
    model, _ = loaded_model(spec, path, strict_checkpoint=False)
    assert torch.equal(model[2].weight, torch.full((2, 8), 0.5))      # what fits was loaded
    assert not torch.equal(model[0].weight, torch.zeros(8, 4))           # the mismatched key was not


def test_a_pass_with_keys_that_did_not_fit_ends_in_fail_not_pass(spec, tmp_path, cli):
    # a sweep: nine checkpoint errors, exit 1, and the last line "PASS: loss … in 41 step(s)"
    state = trained()
    del state["2.bias"]
    torch.save(state, tmp_path / "w.pt")
    r = cli("nancheck", spec, "--checkpoint", tmp_path / "w.pt", "--no-strict-checkpoint")
    said = " ".join(r.stdout.split())
    tail = said[said.rindex("FAIL: 1 checkpoint key(s) did not fit"):]
    assert r.code == 1 and "the command itself: PASS" in tail and "\nPASS" not in r.stdout, r.stdout
    # a command with no verdict line of its own gets this one (a review: exit 1 and no FAIL line)
    r = cli("summary", spec, "--checkpoint", tmp_path / "w.pt", "--no-strict-checkpoint")
    said = " ".join(r.stdout.split())
    assert r.code == 1 and "FAIL: 1 checkpoint key(s) did not fit (run on with --no-strict-checkpoint)" in said


def test_tied_parameter_saved_once_is_not_missing(tmp_path):
    from torchdiag.core.checkpoint import load

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.emb.weight

    state = {"emb.weight": torch.ones(10, 4)}   # save_pretrained writes a tied tensor once
    torch.save(state, tmp_path / "t.pt")
    m = Tied()
    report = load(m, str(tmp_path / "t.pt"), torch.device("cpu"), strict=True)
    assert report.fits and torch.equal(m.out.weight, torch.ones(10, 4))


def test_nancheck_names_the_non_finite_key(spec, tmp_path, cli):
    state = trained()
    state["2.weight"][1, 3] = float("nan")
    path = tmp_path / "nan.safetensors"
    from safetensors.torch import save_file

    save_file(state, str(path))
    r = cli("nancheck", spec, "--checkpoint", path, "--json")
    assert r.code == 1
    assert ("non-finite-param", "2.weight") in findings(r.json)
    assert not any(where == "0.weight" for code, where in findings(r.json) if code == "non-finite-param")


def write_safetensors_header(path, tensors: dict, data_bytes: bytes):
    head = json.dumps({k: {"dtype": d, "shape": s, "data_offsets": o} for k, (d, s, o) in tensors.items()}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data_bytes)


def test_meta_reads_only_the_header(tmp_path, cli):
    """The data section is cut off (a real read fails); on meta the header alone gives shapes and dtypes."""
    (tmp_path / "big.py").write_text("from torch import nn\n\ndef build():\n    return nn.Linear(4096, 4096)\n")
    n = 4096 * 4096 * 2
    path = tmp_path / "big.safetensors"
    write_safetensors_header(path, {"weight": ("BF16", [4096, 4096], [0, n]), "bias": ("BF16", [4096], [n, n + 8192])},
                             b"\x00" * 16)   # 16 bytes of a 33 MB data section
    spec = f"{tmp_path}/big.py:build"
    r = cli("summary", spec, "--checkpoint", path, "--device", "meta", "-i", "1x4096", "--json")
    assert r.code == 0, r.stderr
    assert "header only" in r.json["checkpoint"][0]
    assert [row["dtype"] for row in r.json["bytes_by_dtype"]] == ["bfloat16"]   # the checkpoint's dtype counts
    r = cli("summary", spec, "--checkpoint", path, "--device", "cpu", "-i", "1x4096")
    assert r.code == 2    # the same file on a real device needs its data, and it is not there
    one_error_line(r)


def test_meta_header_read_counts_bytes(tmp_path, monkeypatch):
    """Reading a header touches 8 + header-length bytes, however large the data section is."""
    import builtins

    from torchdiag.core import checkpoint

    path = tmp_path / "w.safetensors"
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(256, 256)}, str(path))
    read = []
    real_open = builtins.open

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: Counting(real_open(p, *a, **k)) if str(p) == str(path) else real_open(p, *a, **k))
    state, header_only = checkpoint.read_state(str(path), torch.device("meta"))
    monkeypatch.setattr(builtins, "open", real_open)
    assert header_only and state["w"].shape == (256, 256) and state["w"].device.type == "meta"
    assert sum(read) < 200 < path.stat().st_size - 256 * 256 * 4 + 200


class CountingFile(io.FileIO):
    """A file that counts the bytes read through it (torch reads a path through Python's open)."""
    read_bytes = 0

    def read(self, n=-1):
        data = super().read(n)
        CountingFile.read_bytes += len(data)
        return data

    def readinto(self, b):
        n = super().readinto(b)
        CountingFile.read_bytes += n or 0
        return n


@pytest.mark.parametrize("older_torch", [False, True])
def test_torch_file_on_meta_reads_no_tensor_data(tmp_path, monkeypatch, older_torch):
    """A 4 MiB .pt on meta: the pickle and the zip directory are read, the data records are not. `older_torch`
    takes away torch's own meta shortcut (older torch read every record for map_location='meta')."""
    import builtins

    from torchdiag.core import checkpoint

    path = tmp_path / "w.pt"
    torch.save({"state_dict": {"w": torch.ones(1024, 1024), "b": torch.ones(1024, dtype=torch.float16)}}, path)
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: CountingFile(p, "rb") if str(p) == str(path) else real_open(p, *a, **k))
    if older_torch:
        monkeypatch.setattr(torch.serialization, "_is_meta_location", lambda _: False, raising=False)
    CountingFile.read_bytes = 0
    state, header_only = checkpoint.read_state(str(path), torch.device("meta"))
    meta_read = CountingFile.read_bytes
    CountingFile.read_bytes = 0
    real, _ = checkpoint.read_state(str(path), torch.device("cpu"))
    monkeypatch.undo()
    assert CountingFile.read_bytes > 4 * 2**20            # the counter sees the data when it is read ...
    assert meta_read < 64 * 2**10                          # ... and on meta it was not
    assert header_only and state["w"].device.type == "meta"
    assert state["w"].shape == (1024, 1024) and state["b"].dtype == torch.float16
    assert torch.equal(real["w"], torch.ones(1024, 1024))


def test_torch_file_on_meta_says_no_data_read_unless_legacy(spec, tmp_path, cli):
    """The pre-zip torch.save format has no directory to map: it is read whole, and the header does not claim otherwise."""
    torch.save(trained(), tmp_path / "w.pt")
    torch.save(trained(), tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    for name, said in (("w.pt", ", header only (meta: shapes and dtypes, no data read)"), ("old.pt", "")):
        r = cli("summary", spec, "--checkpoint", tmp_path / name, "--device", "meta", "--json")
        assert r.code == 0, r.stderr
        assert r.json["checkpoint"] == [f"{tmp_path / name}: 4 tensors loaded{said}"]


def test_sharded_index_on_meta(tmp_path, cli):
    (tmp_path / "net.py").write_text(MODEL)
    write_safetensors_header(tmp_path / "model-00001-of-00002.safetensors", {"0.weight": ("F32", [8, 4], [0, 128]),
                                                                             "0.bias": ("F32", [8], [128, 160])}, b"")
    write_safetensors_header(tmp_path / "model-00002-of-00002.safetensors", {"2.weight": ("F16", [2, 8], [0, 32]),
                                                                             "2.bias": ("F16", [2], [32, 36])}, b"")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"0.weight": "model-00001-of-00002.safetensors", "0.bias": "model-00001-of-00002.safetensors",
                                                "2.weight": "model-00002-of-00002.safetensors", "2.bias": "model-00002-of-00002.safetensors"}}))
    r = cli("summary", f"{tmp_path}/net.py:build", "--checkpoint", index, "--device", "meta", "--json")
    assert r.code == 0, r.stderr
    assert r.json["checkpoint"][0].startswith(f"{index}: 4 tensors loaded")
    assert sorted(row["dtype"] for row in r.json["bytes_by_dtype"]) == ["float16", "float32"]
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    r = cli("summary", f"{tmp_path}/net.py:build", "--checkpoint", index, "--device", "meta")
    assert r.code == 2 and "never downloads" in r.stderr
    one_error_line(r)


@pytest.mark.parametrize("name, content, words", [
    ("missing.pt", None, "checkpoint not found"),
    # a sweep: torch's own words pointed at weights_only=False, which reads neither
    ("junk.pt", b"not a torch file", "cannot read {}: it begins with neither a zip nor a pickle protocol 2+ header"),
    ("renamed.pt", "safetensors", "cannot read {}: it is a safetensors file, not one written by torch.save"),
    ("w.npz", b"x", "unknown kind of file"),
    ("junk.safetensors", b"\x01", "not a safetensors file"),
    ("list.pt", "list", "holds no state dict"),
])
def test_bad_files_are_one_line_exit_2(spec, tmp_path, cli, name, content, words):
    path = tmp_path / name
    if content == "list":
        torch.save([1, 2], path)
    elif content == "safetensors":
        from safetensors.torch import save_file
        save_file({"w": torch.zeros(2)}, str(path))
    elif content is not None:
        path.write_bytes(content)
    r = cli("summary", spec, "--checkpoint", path)
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert words.format(path) in r.stderr, r.stderr
    assert "In PyTorch 2.6, we changed" not in r.stderr   # torch's own advice: weights_only=False


def test_every_model_command_has_the_options():
    from typer.main import get_command

    from torchdiag.cli.app import app

    group = get_command(app)
    for name in ("summary", "flops", "nancheck", "gradflow", "overfit-batch", "profile", "memory", "doctor",
                 "activations", "gradcam", "attention", "embeddings", "gradcheck"):
        opts = {o for p in group.commands[name].params for o in p.opts + p.secondary_opts}
        assert {"--checkpoint", "--strict-checkpoint", "--no-strict-checkpoint"} <= opts, name


def test_strict_checkpoint_must_be_a_bool():
    from torchdiag.core.run import RunSpec
    from torchdiag.errors import OptionError

    with pytest.raises(OptionError, match="strict_checkpoint"):
        RunSpec("summary", "x.py:build", strict_checkpoint="yes", caller="python")


def test_instance_attributes_of_an_unpickled_dict_are_not_its_methods(spec, tmp_path):
    """weights_only lets a file set attributes on an OrderedDict (for `_metadata`): an `items` or `get` there is
    data, never called in place of dict's own methods."""
    from collections import OrderedDict

    class Crafted:   # pickles as an OrderedDict whose BUILD state sets the attributes
        def __reduce__(self):
            return OrderedDict, (), {"items": set, "values": set, "get": set}, None, iter(random_state().items())

    torch.save({"state_dict": Crafted()}, tmp_path / "w.pt")    # builtins.set: on weights_only's allow-list
    assert torch.load(tmp_path / "w.pt", weights_only=True)["state_dict"].items is set
    model, ctx = loaded_model(spec, tmp_path / "w.pt")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in random_state().items())
    assert ctx.header["checkpoint"] == [f"{tmp_path / 'w.pt'}: 4 tensors loaded"]


TIED = """
import torch
from torch import nn

class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids):
        return self.out(self.embed(ids))

def build():
    return Tied()

def example_inputs():
    return (torch.randint(0, 10, (2, 3)),)
"""


def test_tied_weights_that_differ_in_the_file_are_said_and_casts_counted(tmp_path, cli):
    """A sweep: a checkpoint of an untied model loaded into a tied one kept one of the two values and dropped the
    other without a word; a bfloat16 file loaded into float32 said only "20 tensors loaded"."""
    from safetensors.torch import save_file

    (tmp_path / "tied.py").write_text(TIED)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(10, 4, generator=g), torch.randn(10, 4, generator=g)
    save_file({"embed.weight": a, "out.weight": b}, str(tmp_path / "untied.safetensors"))
    r = cli("summary", f"{tmp_path}/tied.py:build", "--checkpoint", str(tmp_path / "untied.safetensors"), "--json")
    assert r.code == 0, r.stderr
    (f,) = [f for f in r.json["findings"] if f["code"] == "checkpoint-tied-differ"]
    assert f["severity"] == "warning" and "one tensor in the model (tied)" in f["message"]
    kept = "embed.weight" if f["where"] == "out.weight" else "out.weight"
    assert f"holds {kept}'s values" in f["message"]
    a[0, 0] = float("nan")   # the same values, NaN included (a review: NaN compared unequal to itself)
    save_file({"embed.weight": a, "out.weight": a.clone()}, str(tmp_path / "same.safetensors"))
    r = cli("summary", f"{tmp_path}/tied.py:build", "--checkpoint", str(tmp_path / "same.safetensors"), "--json")
    assert not [f for f in r.json["findings"] if f["code"] == "checkpoint-tied-differ"]
    save_file({"embed.weight": a.bfloat16()}, str(tmp_path / "half.safetensors"))
    r = cli("summary", f"{tmp_path}/tied.py:build", "--checkpoint", str(tmp_path / "half.safetensors"), "--json")
    assert r.code == 0 and "1 cast bfloat16 → float32" in r.json["checkpoint"][0], r.json["checkpoint"]


def test_a_base_models_weights_load_into_the_model_that_holds_it_under_a_prefix(tmp_path):
    """A sweep: a BertModel checkpoint (`embeddings.…`) into BertForMaskedLM (`bert.embeddings.…`) gave 44 missing and
    39 unexpected keys and no word of the prefix; transformers' from_pretrained adds it. So does the loader, when
    that makes more keys fit; the head's keys stay missing (strict: refused, saying the prefix)."""
    from torchdiag.core.checkpoint import load
    from torchdiag.errors import UsageError

    class WithHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
            self.head = nn.Linear(8, 2)

    body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
    torch.save(body.state_dict(), tmp_path / "body.pt")
    with pytest.raises(UsageError, match=r"with the prefix 'body\.' added to its keys, 2 missing \(head\.weight"):
        load(WithHead(), str(tmp_path / "body.pt"), torch.device("cpu"), strict=True)
    model = WithHead()
    report = load(model, str(tmp_path / "body.pt"), torch.device("cpu"), strict=False)
    assert report.added == "body." and report.loaded == 4 and sorted(report.missing) == ["head.bias", "head.weight"]
    assert not report.unexpected and torch.equal(model.body[2].weight, body[2].weight)
    whole = WithHead()   # the model's own checkpoint: nothing added
    torch.save(whole.state_dict(), tmp_path / "whole.pt")
    assert load(WithHead(), str(tmp_path / "whole.pt"), torch.device("cpu")).added == ""


def test_a_checkpoint_without_batch_counts_loads_as_torch_loads_it(tmp_path):
    """A review: a state dict without BatchNorm's num_batches_tracked (saved before the count existed), which torch's
    strict load_state_dict takes (it fills the count with 0), was refused as missing a key (exit 2)."""
    import torch
    from torch import nn

    from torchdiag.core.checkpoint import load

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))

    src = build()
    src[1].running_mean.fill_(0.5)
    state = {k: v for k, v in src.state_dict().items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "legacy.pt"
    torch.save(state, path)
    build().load_state_dict(torch.load(path, weights_only=True), strict=True)   # torch takes it
    model = build()
    report = load(model, str(path), torch.device("cpu"), strict=True)
    assert report.fits and not report.missing
    assert torch.equal(model[1].running_mean, torch.full((8,), 0.5))


def test_a_checkpoint_far_off_names_a_few_keys_in_the_header_and_every_one_as_a_finding(tmp_path, cli):
    """A review: with --no-strict-checkpoint the header listed every missing, unexpected and mismatched key (hundreds
    for a wrong checkpoint); each is a finding of its own already."""
    path = tmp_path / "other.pt"
    torch.save({f"w{i}": torch.zeros(2) for i in range(8)}, path)
    r = cli("summary", sample("mlp.py:build"), "--checkpoint", path, "--no-strict-checkpoint", "--json")
    head = r.json["checkpoint"][0]
    assert "6 missing (0.weight, 0.bias, 2.weight and 3 more)" in head, head
    assert "8 unexpected (w0, w1, w2 and 5 more)" in head and "w7" not in head, head
    keys = {f["where"] for f in r.json["findings"] if f["code"].startswith("checkpoint-")}
    assert len(keys) == 14 and "w7" in keys and "4.bias" in keys, keys


def test_a_transformers_moe_folder_saved_per_expert_loads_into_its_fused_experts(tmp_path, cli):
    """A sweep: transformers >= 5 fuses a MoE's experts into one tensor in memory and save_pretrained writes them one
    per expert, as the Hub's checkpoints hold them: every such folder (Mixtral, glm4_moe_lite) was refused with the
    per-expert keys unexpected. transformers' own loader reads it (safetensors: no code runs); the model torchdiag
    diagnoses holds the saved model's values."""
    transformers = pytest.importorskip("transformers")
    from torchdiag.core.checkpoint import load
    from torchdiag.errors import UsageError

    cfg = transformers.AutoConfig.for_model(
        "mixtral", vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    saved = transformers.AutoModelForCausalLM.from_config(cfg)
    saved.save_pretrained(tmp_path)
    from safetensors import safe_open
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:   # the premise: per-expert keys on disk
        on_disk = set(f.keys())
    assert not on_disk >= set(saved.state_dict()) and any(".experts.3." in k for k in on_disk)
    torch.manual_seed(1)
    fresh = transformers.AutoModelForCausalLM.from_config(cfg)
    report = load(fresh, str(tmp_path / "model.safetensors"), torch.device("cpu"), strict=True)
    assert report.fits and report.converted and "converted by transformers' own loader" in report.describe()
    for k, v in saved.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    r = cli("summary", f"hf:{tmp_path}", "--device", "cpu", "--json")
    assert r.code == 0, r.stderr
    assert r.json["checkpoint"][0].endswith("converted by transformers' own loader to the layout the model "
                                                      "keeps in memory")
    # a review: another file in the folder (a step's weights) was replaced by the folder's model.safetensors and
    # called converted; only the folder's own weights are read that way, the rest said as they are
    from safetensors.torch import save_file
    save_file({k: v.clone() for k, v in saved.state_dict().items()} | {"extra.weight": torch.zeros(2)},
              str(tmp_path / "step100.safetensors"))
    with pytest.raises(UsageError, match="step100.safetensors does not fit the model: 1 unexpected"):
        load(transformers.AutoModelForCausalLM.from_config(cfg), str(tmp_path / "step100.safetensors"),
             torch.device("cpu"), strict=True)
    # a review: a sharded folder (model.safetensors.index.json) was refused
    shards = tmp_path / "sharded"
    saved.save_pretrained(shards, max_shard_size="50KB")
    assert (shards / "model.safetensors.index.json").is_file() and len(list(shards.glob("*.safetensors"))) > 1
    fresh = transformers.AutoModelForCausalLM.from_config(cfg)
    report = load(fresh, str(shards / "model.safetensors.index.json"), torch.device("cpu"), strict=True)
    assert report.converted and all(torch.equal(fresh.state_dict()[k], v) for k, v in saved.state_dict().items())
    # a review: a stale model.safetensors beside the index (save_pretrained twice into one folder) is what
    # from_pretrained reads: the index asked for is not replaced by it
    torch.manual_seed(2)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "stale")
    saved.save_pretrained(tmp_path / "stale", max_shard_size="50KB")
    assert (tmp_path / "stale" / "model.safetensors").is_file()
    with pytest.raises(UsageError, match="does not fit the model"):
        load(transformers.AutoModelForCausalLM.from_config(cfg), str(tmp_path / "stale" / "model.safetensors.index.json"),
             torch.device("cpu"), strict=True)


def test_an_empty_or_foreign_file_is_said_in_words(spec, tmp_path, cli):
    # a hostile review: "cannot read text.pt: KeyError: 101" and "cannot read empty.pt: EOFError"
    (tmp_path / "text.pt").write_text("hello")
    (tmp_path / "empty.pt").write_bytes(b"")
    good = tmp_path / "good.pt"
    torch.save(trained(), good)
    # a copy cut short: a review found it called no zip
    (tmp_path / "cut.pt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    # a NumPy .npz and another zip (a sweep: torch's "[enforce fail at inline_container.cc:180] file in archive is not
    # in a subdirectory")
    import numpy as np

    np.savez(tmp_path / "w.npz", weight=np.zeros(3))
    with zipfile.ZipFile(tmp_path / "other.pt", "w") as z:
        z.writestr("notes.txt", "hello")
    for name, said in (("text.pt", "not a file torch.save wrote (neither its zip archive nor a pickle; 5 bytes)"),
                       ("empty.pt", "the file is empty"), ("cut.pt", "a zip archive without its end"),
                       ("w.npz", "a zip archive that torch.save did not write (a NumPy .npz: it holds weight.npy)"),
                       ("other.pt", "a zip archive that torch.save did not write (it holds notes.txt)")):
        r = cli("summary", spec, "--checkpoint", tmp_path / name)
        assert r.code == 2 and f"cannot read {tmp_path / name}: {said}" in r.stderr, r.stderr
        one_error_line(r)
    assert "torch.from_numpy(v)" in cli("summary", spec, "--checkpoint", tmp_path / "w.npz").stderr


def test_a_plain_pickle_is_refused_in_words(spec, tmp_path, cli):
    # a review: torch's weights-only refusal, cut mid-sentence at 120 characters, with its bold codes (\x1b[1m)
    import pickle

    (tmp_path / "p.pt").write_bytes(pickle.dumps({"w": [1, 2, 3]}))
    (tmp_path / "cut.pt").write_bytes(pickle.dumps(list(range(100)))[:30])
    for name in ("p.pt", "cut.pt"):
        r = cli("summary", spec, "--checkpoint", tmp_path / name, "--json")
        assert r.code == 2 and "\x1b[" not in r.stderr + r.stdout, r.stderr
        assert "does not read as torch.save's: written by pickle.dump, or cut short" in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["model_best.pth.tar", "weights", "W.PT", "w.SAFETENSORS", "shards.bin.tar"])
def test_a_checkpoint_named_otherwise_is_read_by_its_first_bytes(spec, tmp_path, name):
    """A sweep: timm's train.py and pytorch/examples' ImageNet write `model_best.pth.tar`; that, an upper-case
    ending and a file without one were "unknown kind of file", though torch.load reads them."""
    from safetensors.torch import save_file

    path = tmp_path / name
    if "safetensors" in name.lower():
        save_file(trained(), str(path))
    else:
        torch.save({"epoch": 3, "state_dict": trained()}, path)
    model, ctx = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())
    assert ctx.header["checkpoint"] == [f"{path}: 4 tensors loaded"]


@pytest.mark.parametrize("beside", [{"best_acc1": torch.tensor(12.5)}, {"epoch": torch.tensor(3)}])
def test_a_trainers_tensor_scalar_beside_its_state_dict_is_not_the_state_dict(spec, tmp_path, beside):
    """pytorch/examples' ImageNet checkpoint keeps `best_acc1` as a tensor beside `state_dict`: the top level was read
    as the state dict ("0 tensors loaded, 8 missing, 1 unexpected (best_acc1)"), and --no-strict-checkpoint ran on
    the factory's random weights."""
    path = tmp_path / "checkpoint.pth"
    torch.save({"epoch": 1, "arch": "net", "state_dict": {"module." + k: v for k, v in trained().items()}, **beside},
               path)
    model, ctx = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())
    assert ctx.header["checkpoint"] == [f"{path}: 4 tensors loaded, prefix 'module.' stripped"]


def test_a_model_entry_holding_a_config_is_passed_over_for_the_weights(spec, tmp_path, cli):
    path = tmp_path / "cfg.pt"
    torch.save({"model": {"arch": "net", "depth": 2}, "weights": trained(), "epoch": 3}, path)
    model, _ = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())
    torch.save({"model": {"arch": "net"}, "epoch": 3}, path)   # no weights at all: the file's own keys are said
    r = cli("summary", spec, "--checkpoint", path)
    assert r.code == 2 and "holds no state dict (found: model, epoch)" in r.stderr, r.stderr


def test_two_parts_that_fit_alike_are_not_guessed_between(spec, tmp_path, cli):
    """A GAN's checkpoint: `generator.` and `discriminator.`, both the factory's class. The alphabetically first
    prefix was stripped and the discriminator loaded, silently under --no-strict-checkpoint. A wrapper's own name
    (Lightning's `model.` beside `ema_model.`) is still taken."""
    path = tmp_path / "gan.ckpt"
    zeros = {k: torch.zeros_like(v) for k, v in trained().items()}
    torch.save({"state_dict": {**{"generator." + k: v for k, v in trained().items()},
                               **{"discriminator." + k: v for k, v in zeros.items()}}}, path)
    for extra in ((), ("--no-strict-checkpoint",)):
        r = cli("summary", spec, "--checkpoint", path, *extra)
        assert r.code == 2, r.stderr
        one_error_line(r)
        assert "'discriminator.'" in r.stderr and "'generator.'" in r.stderr and "not known" in r.stderr, r.stderr
    torch.save({"state_dict": {**{"model." + k: v for k, v in trained().items()},
                               **{"ema_model." + k: v for k, v in zeros.items()}}}, path)
    model, ctx = loaded_model(spec, path, strict_checkpoint=False)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())
    # strict too (a sweep: the EMA's keys failed it as unexpected), the copy left out said in the header
    model, ctx = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())
    assert ctx.header["checkpoint"] == [f"{path}: 4 tensors loaded, the file's other copy under 'ema_model.' left out "
                                        "(4 tensors), prefix 'model.' stripped"], ctx.header


def test_a_model_holding_an_ema_model_of_its_own_is_not_guessed_for(tmp_path, cli):
    """A review: where the model itself has an `ema_model` submodule, the file's `ema_model.body.weight` (the EMA copy)
    silently overwrote the stripped `model.ema_model.body.weight`, and strict loading passed with the wrong values."""
    (tmp_path / "twice.py").write_text(
        "from torch import nn\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.body = nn.Linear(4, 2)\n        self.ema_model = nn.Module()\n"
        "        self.ema_model.body = nn.Linear(4, 2)\n    def forward(self, x):\n"
        "        return self.body(x) + self.ema_model.body(x)\ndef build():\n    return M()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import twice
        state = twice.build().state_dict()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("twice", None)
    path = tmp_path / "both.ckpt"
    torch.save({"state_dict": {**{"model." + k: v for k, v in state.items()},
                               **{"ema_model." + k: v + 1 for k, v in state.items()}}}, path)
    r = cli("summary", f"{tmp_path / 'twice.py'}:build", "-i", "2x4", "--checkpoint", path)
    assert r.code == 2 and "which part is meant is not known" in r.stderr, r.stderr


@pytest.mark.parametrize("dtype", [torch.uint32, torch.complex64])
def test_meta_reads_every_safetensors_dtype_torch_has(spec, tmp_path, cli, dtype):
    """A sweep: --device meta called U16/U32/U64/C64/F8_E8M0 entries "not understood", the file "may be damaged";
    safe_open reads them, and so does a CPU run."""
    from safetensors.torch import save_file

    state = trained()
    state["0.bias"] = state["0.bias"].to(dtype)
    path = tmp_path / "w.safetensors"
    save_file(state, str(path))
    r = cli("summary", spec, "--checkpoint", path, "--device", "meta", "--json")
    assert r.code == 0, r.stderr
    assert r.json["checkpoint"][0].startswith(f"{path}: 4 tensors loaded")


def test_a_safetensors_file_under_a_path_that_is_not_utf8_loads(spec, tmp_path):
    """A sweep: safetensors' load_file takes UTF-8 paths only; a Latin-1 folder name (bytes Python keeps as
    surrogates) was "cannot read ...: the file may be damaged"."""
    from safetensors.torch import save_file

    folder = os.fsdecode(os.fsencode(str(tmp_path)) + b"/w\xff")
    os.mkdir(folder)
    path = os.path.join(folder, "w.safetensors")
    save_file(trained(), path)
    model, ctx = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())


@pytest.mark.parametrize("other", ["ema", "model_ema", "state_dict_ema"])
def test_an_ema_copy_beside_the_model_is_said_not_read(spec, tmp_path, other):
    """A sweep: {'model': sd, 'ema': sd'} loaded 'model' and said nothing of the EMA weights people ship."""
    path = tmp_path / "ema.pt"
    ema = {k: v + 1 for k, v in trained().items()}
    torch.save({"model": trained(), other: ema, "epoch": 3}, path)
    model, ctx = loaded_model(spec, path)
    assert all(torch.equal(p, torch.full_like(p, 0.5)) for p in model.parameters())
    assert ctx.header["checkpoint"] == [f"{path}: 4 tensors loaded, entry 'model' read ('{other}' holding weights "
                                        "too: not read)"]


@pytest.mark.parametrize("dtype, said", [(torch.int8, "int8 → float32"), (torch.bool, "bool → float32"),
                                         (torch.complex64, "complex64 → float32")])
def test_a_weight_saved_as_another_kind_of_number_is_counted_as_cast(spec, tmp_path, dtype, said):
    """A sweep: int8 codes saved without their scale, a mask in place of a weight, complex values (their imaginary
    part dropped) loaded into float parameters with the header saying only "4 tensors loaded"."""
    state = trained()
    state["0.weight"] = (state["0.weight"] * 2).to(dtype)
    path = tmp_path / "w.pt"
    torch.save(state, path)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's own on complex -> real
        _, ctx = loaded_model(spec, path)
    assert ctx.header["checkpoint"] == [f"{path}: 4 tensors loaded, 1 cast {said}"]


def test_one_shard_alone_says_its_index_names_the_rest(spec, tmp_path, cli):
    """A sweep: shards without their index were "does not fit the model: N missing", blaming the model."""
    from safetensors.torch import save_file

    state = trained()
    keys = sorted(state)
    save_file({k: state[k] for k in keys[:2]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: state[k] for k in keys[2:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    shard = tmp_path / "model-00001-of-00002.safetensors"
    r = cli("summary", spec, "--checkpoint", shard)
    assert r.code == 2 and "one shard of 2" in r.stderr and "is not beside it" in r.stderr, r.stderr
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: ("model-00001-of-00002.safetensors" if k in keys[:2] else "model-00002-of-00002.safetensors")
                        for k in keys}}))
    r = cli("summary", spec, "--checkpoint", shard)
    assert r.code == 2 and f"give --checkpoint its index, {tmp_path / 'model.safetensors.index.json'}" in r.stderr
    r = cli("summary", spec, "--checkpoint", tmp_path / "model.safetensors.index.json")
    assert r.code == 0, r.stderr


BUFFERED = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.register_buffer("position_ids", torch.arange(4), persistent=False)   # made, not saved (BERT's)
    def forward(self, x):
        return self.fc(x + self.position_ids)

def build():
    return Net()

def example_inputs():
    return (torch.randn(3, 4),)
"""


def test_a_legacy_files_value_of_a_buffer_the_model_does_not_save_is_left_out_and_said(tmp_path, cli):
    """A sweep: an old BERT pytorch_model.bin holds `embeddings.position_ids`, a buffer transformers now registers
    non-persistent; the tool's own suggested --checkpoint line was refused (1 unexpected key), where
    from_pretrained loads the file."""
    (tmp_path / "buf.py").write_text(BUFFERED)
    state = {"fc.weight": torch.full((2, 4), 0.5), "fc.bias": torch.zeros(2), "position_ids": torch.arange(4)}
    torch.save(state, tmp_path / "old.bin")
    r = cli("summary", f"{tmp_path}/buf.py:build", "--checkpoint", tmp_path / "old.bin", "--json")
    assert r.code == 0, r.stderr
    assert r.json["checkpoint"] == [f"{tmp_path / 'old.bin'}: 2 tensors loaded, 1 value(s) of buffers the model makes "
                                    "itself and does not save left out (position_ids)"]
