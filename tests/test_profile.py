"""`torchdiag profile`: structure and consistency of the profile (never timings).

Truth is computed by hand from the models: an MLP 784→256→128→10 runs 3 aten::addmm and 2 relu per
forward; in training, backward of the first Linear (input needs no grad) runs 1 aten::mm and the
other two 2 each; a frozen branch creates no backward nodes, so it gets no backward time."""
import json
import math

import pytest

from support import load, sample

FAST = dict(wait=0, warmup=1, active=3)


def _run(name, *args, inputs=None, **opts):
    from torchdiag.api import run

    model, x = load(name, *args, inputs=inputs)
    return run("profile", model, x, **{**FAST, **opts})


def _ops(result):
    out = {}
    for r in result.table("operators").rows:
        out[r["op"]] = out.get(r["op"], 0) + r["calls"]
    return out


def _modules(result):
    return {r["name"]: r for r in result.table("modules").rows}


# ----------------------------------------------------------------------------------------- helpers

def test_percentile_closed_forms():
    from torchdiag.diagnostics.profile import percentile, step_stats

    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(1, 11)), 90) == pytest.approx(9.1)   # rank 0.9*9 = 8.1 → 9 + 0.1
    assert percentile([7.0], 90) == 7.0
    s = step_stats([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert s["mean"] == 5.0 and s["median"] == 4.5 and s["min"] == 2.0 and s["max"] == 9.0
    assert s["std"] == pytest.approx(math.sqrt(32 / 7))


# ----------------------------------------------------------------------------------------- inference

def test_inference_mlp_counts_and_modules(untouched):
    from torchdiag.api import run

    model, x = load("mlp.py:build")
    with untouched(model):
        r = run("profile", model, x, **FAST, top=0)
    ops = _ops(r)
    assert ops["aten::addmm"] == 3 * 3        # 3 Linear per step × 3 active steps
    assert ops["aten::linear"] == 3 * 3
    assert ops["aten::relu"] == 2 * 3
    assert not any(k.startswith(("module::", "ProfilerStep", "torchdiag::")) for k in ops)
    for row in r.table("operators").rows:
        assert row["cpu_time_us"] >= row["self_cpu_time_us"] >= 0
        assert "self_cuda_time_us" not in row
    # the table is ordered by self CPU time (which op leads is the machine's timing: on a busy CI run aten::expand
    # once came before aten::addmm)
    selfs = [row["self_cpu_time_us"] for row in r.table("operators").rows]
    assert selfs == sorted(selfs, reverse=True)

    mods = _modules(r)
    assert list(mods) == ["", "0", "1", "2", "3", "4"]
    assert [mods[n]["type"] for n in ("0", "1", "4")] == ["Linear", "ReLU", "Linear"]
    assert all(m["calls"] == 3 for m in mods.values())
    children = sum(mods[n]["cpu_time_us"] for n in "01234")
    assert mods[""]["cpu_time_us"] >= children
    assert mods[""]["self_cpu_time_us"] == pytest.approx(mods[""]["cpu_time_us"] - children, abs=0.01)
    assert "backward_cpu_time_us" not in mods["0"]

    d = r.data
    assert set(d["step_time_ms"]) == {"mean", "median", "p90"}
    assert d["step_time_ms"]["p90"] >= d["step_time_ms"]["median"] > 0
    assert d["batch_size"] == 16
    assert d["samples_per_s"] == pytest.approx(16 / (d["step_time_ms"]["mean"] / 1e3), rel=1e-3)
    assert len(r.series["step_times_ms"]) == 0 + 1 + 3
    assert d["step_phases"] == ["warmup", "active", "active", "active"]
    assert d["step_time_stats_ms"]["steps"] == 3
    assert r.table("phases") is None    # phases are a train-mode table


def test_top_k_limits_operator_rows_and_trace_only(tmp_path):
    from torchdiag.render.profile import write_trace

    trace = tmp_path / "t.json"
    r = _run("mlp.py:build", top=2, trace=True)
    write_trace(r, trace)     # the trace is data; render/ writes it
    assert len(r.table("operators").rows) == 2
    assert r.data["operators_total"] > 2
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("name") == "module::2" and e.get("ph") == "X") == 3   # once per active step


def test_a_trace_the_profiler_cut_short_keeps_the_old_file(tmp_path):
    """A sweep: under a file-size limit kineto's own write of a small model's trace was cut at 1,024 bytes without a
    word, and the truncated bytes replaced the user's previous trace, exit 0. A trace that ends before its end is
    refused (exit 2) and the old file kept; a whole one is written."""
    from torchdiag.errors import UsageError
    from torchdiag.render.profile import write_trace

    trace = tmp_path / "t.json"
    trace.write_text("PRECIOUS")
    r = _run("mlp.py:build", top=2, trace=True)
    whole = r.artefacts["trace"]
    r.artefacts["trace"] = whole[:1024]
    with pytest.raises(UsageError, match="end before the trace does"):
        write_trace(r, trace)
    assert trace.read_text() == "PRECIOUS"
    r.artefacts["trace"] = whole
    write_trace(r, trace)
    assert json.loads(trace.read_text())["traceEvents"]


def test_record_shapes_splits_by_input_shape_and_memory_is_output_bytes():
    r = _run("mlp.py:build", top=0, record_shapes=True, memory=True)
    addmm = {tuple(tuple(s) for s in row["input_shapes"][1:3]): row
             for row in r.table("operators").rows if row["op"] == "aten::addmm"}
    # addmm(bias, input, weight.t()): one row per Linear layer
    assert set(addmm) == {((16, 784), (784, 256)), ((16, 256), (256, 128)), ((16, 128), (128, 10))}
    for (_inp, w), row in addmm.items():
        assert row["calls"] == 3
        # the output (16 × out) float32 is allocated once per call
        assert row["cpu_memory_bytes"] == 3 * 16 * w[1] * 4
    assert all("self_cpu_memory_bytes" in row for row in r.table("operators").rows)
    assert "cpu_memory_bytes" in _modules(r)["0"]
    # display: shapes of tensor arguments only, no trailing dots for scalar arguments
    shown = {row["_shapes"] for row in r.table("operators").rows if row["op"] == "aten::addmm"}
    assert shown == {"256, 16x784, 784x256", "128, 16x256, 256x128", "10, 16x128, 128x10"}


def test_cnn_conv_calls_and_depth():
    r = _run("cnn.py:build", top=0, depth=1)
    ops = _ops(r)
    assert ops["aten::conv2d"] == 2 * 3
    assert ops["aten::max_pool2d"] == 2 * 3
    assert ops["aten::addmm"] == 1 * 3
    assert set(_modules(r)) == {"", "features", "head"}   # depth 1


def test_container_never_called_gets_sum_row():
    r = _run("transformer_lm.py:build", depth=2)
    mods = _modules(r)
    assert mods["blocks"]["type"] == "ModuleList" and mods["blocks"]["calls"] == 0
    assert mods["blocks"]["cpu_time_us"] == pytest.approx(
        mods["blocks.0"]["cpu_time_us"] + mods["blocks.1"]["cpu_time_us"], abs=0.01)
    assert mods["blocks.0"]["calls"] == 3 and mods["blocks.0"]["type"] == "Block"
    assert _ops(r)["aten::_scaled_dot_product_flash_attention_for_cpu"] == 2 * 3   # one per Block


# ----------------------------------------------------------------------------------------- train

def test_train_mlp_forward_backward_counts(untouched):
    from torchdiag.api import run

    model, x = load("mlp.py:build")
    with untouched(model):
        r = run("profile", model, x, **FAST, top=0, mode="train", loss="auto")
    ops = _ops(r)
    assert ops["aten::addmm"] == 3 * 3
    assert ops["aten::mm"] == (1 + 2 + 2) * 3     # first layer: weight grad only
    assert ops["autograd::engine::evaluate_function: AddmmBackward0"] == 3 * 3
    assert ops["Optimizer.step#Adam.step"] == 3
    assert r.header["loss"].startswith("cross_entropy")
    mods = _modules(r)
    for name in ("0", "2", "4"):
        assert mods[name]["backward_cpu_time_us"] > 0
    assert mods[""]["backward_cpu_time_us"] >= sum(mods[n]["backward_cpu_time_us"] for n in "01234") - 0.01
    phases = {p["phase"] for p in r.table("phases").rows}
    assert phases == {"forward", "loss", "backward", "optimizer_step"}


def test_train_frozen_branch_gets_no_backward_time(untouched):
    from torchdiag.api import run

    model, x = load("two_input.py:build", inputs=["4x3x16x16", "4x12"])
    with untouched(model):
        r = run("profile", model, x, **FAST, mode="train", loss="auto", optimizer="sgd")
    mods = _modules(r)
    assert mods["table"]["backward_cpu_time_us"] == 0       # frozen: no backward nodes
    assert mods["table.0"]["backward_cpu_time_us"] == 0
    assert mods["image.0"]["backward_cpu_time_us"] > 0
    assert mods["head"]["backward_cpu_time_us"] > 0
    assert "aux_head" not in mods                            # never called in forward
    assert _ops(r)["Optimizer.step#SGD.step"] == 3


# ----------------------------------------------------------------------------------------- CLI

def test_cli_json_trace_and_tb(cli, tmp_path):
    trace = tmp_path / "run.json"
    res = cli("profile", sample("mlp.py:build"), "--wait", "0", "--warmup", "1", "--active", "2",
              "--json", "--trace", trace, "--tb", tmp_path / "tb", "--record-shapes", "--memory")
    assert res.code == 0, res.stderr
    doc = res.json
    for key in ("step_time_ms", "operators", "modules", "samples_per_s", "trace", "tb_trace", "exit_code"):
        assert key in doc
    op = doc["operators"][0]
    assert {"op", "calls", "self_cpu_time_us", "cpu_time_us", "input_shapes", "self_cpu_memory_bytes"} <= set(op)
    assert not any(k.startswith("_") for k in op)
    assert {"name", "cpu_time_us", "calls", "type"} <= set(doc["modules"][0])

    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::addmm" in names and "module::0" in names and "module::(root)" in names
    steps = {n for n in names if n and n.startswith("ProfilerStep#")}
    assert len(steps) == 2

    tb = tmp_path / "tb" / "profile"
    traces = list(tb.glob("*.pt.trace.json"))
    assert len(traces) == 1 and "traceEvents" in json.loads(traces[0].read_text())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert len(acc.Scalars("profile/step_times_ms")) == 0 + 1 + 2


def test_cli_table_output(cli):
    # pinned to the CPU: with --device auto a GPU machine profiles on CUDA and ranks operators by CUDA time
    res = cli("profile", sample("cnn.py:build"), "--wait", "0", "--warmup", "1", "--active", "2", "--mode", "train",
              "--device", "cpu")
    assert res.code == 0, res.stderr
    for text in ("operators by self CPU time", "Time per module", "Where a train step goes", "Step time",
                 "Throughput", "backward", "optimizer_step", "features"):
        assert text in res.stdout, text


def test_cli_untouched_train(cli, untouched):
    """Train mode through the public entry: the loaded model object is not modified."""
    from torchdiag.api import run

    model, x = load("cnn.py:build")
    model.train()
    with untouched(model):
        run("profile", model, x, **FAST, mode="train", loss="mse")
    assert model.training


def _one_error(res, code, *fragments):
    assert res.code == code, (res.code, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    for f in fragments:
        assert f in lines[0], lines[0]


def test_bad_input_exit_2(cli):
    _one_error(cli("profile", sample("mlp.py:build"), "-i", "16xabc"), 2, "bad input shape")


def test_bad_options_exit_2(cli, tmp_path):
    spec = sample("mlp.py:build")
    _one_error(cli("profile", spec, "--mode", "training"), 2, "--mode", "'training' is not one of inference, train")
    _one_error(cli("profile", spec, "--active", "0"), 2, "--active")
    _one_error(cli("profile", spec, "--trace", tmp_path / "missing" / "t.json"), 2, "does not exist")
    _one_error(cli("profile", spec, "--device", "meta"), 2, "meta")
    _one_error(cli("profile", spec, "--optimizer", "lbfgs"), 2, "--optimizer", "'lbfgs' is not one of adam, adamw, sgd")


def test_cuda_request_without_cuda_exit_2(cli, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # a CPU-only machine, even on a GPU box
    res = cli("profile", sample("mlp.py:build"), "--device", "cuda")
    _one_error(res, 2, "cuda", "not available")


def test_forward_error_names_module_exit_3(cli):
    res = cli("profile", sample("broken_shape.py:build"), "--wait", "0", "--warmup", "1", "--active", "1")
    _one_error(res, 3, "2.0", "Linear")


# ----------------------------------------------------------------------------------------- CUDA

@pytest.mark.cuda
def test_cuda_inference_has_cuda_columns_and_kernels(untouched):
    from torchdiag.api import run

    model, x = load("mlp.py:build", device="cuda")
    with untouched(model):
        r = run("profile", model, x, **FAST, top=0, memory=True)
    assert r.header["activities"] == "CPU, CUDA"
    rows = {row["op"]: row for row in r.table("operators").rows}
    assert rows["aten::addmm"]["calls"] == 3 * 3
    assert rows["aten::addmm"]["self_cuda_time_us"] > 0
    assert "self_cuda_memory_bytes" in rows["aten::addmm"]
    assert r.table("kernels").rows and all(k["cuda_time_us"] >= 0 for k in r.table("kernels").rows)
    assert _modules(r)["0"]["cuda_time_us"] > 0


@pytest.mark.cuda
def test_cuda_train_backward_cuda_time(untouched):
    from torchdiag.api import run

    model, x = load("mlp.py:build", device="cuda")
    with untouched(model):
        r = run("profile", model, x, **FAST, top=0, mode="train", loss="auto")
    mods = _modules(r)
    assert mods["0"]["backward_cuda_time_us"] > 0 and mods["0"]["backward_cpu_time_us"] > 0
    assert _ops(r)["aten::mm"] == 5 * 3


@pytest.mark.slow
@pytest.mark.subprocess
def test_trace_directory_is_exit_2_before_loading(cli, tmp_path):
    full, empty = tmp_path / "full", tmp_path / "empty"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    empty.mkdir()
    for d in (full, empty):     # an empty folder used to be deleted and replaced by the trace file
        for spec in (sample("mlp.py:build"), sample("broken_factory.py:raises")):
            _one_error(cli("profile", spec, "--active", "1", "--warmup", "1", "--wait", "0", "--trace", d),
                       2, "--trace", "is a directory")
        assert d.is_dir()
    assert (full / "keep.txt").read_text() == "x" and list(empty.iterdir()) == []


def test_trace_not_written_is_a_clear_error(cli, tmp_path, monkeypatch):
    """The profiler only logs a failed write: the exported file is checked before --trace is written."""
    from torch.profiler import profile

    monkeypatch.setattr(profile, "export_chrome_trace", lambda self, path: None)   # writes nothing
    out = tmp_path / "t.json"
    args = ("--active", "1", "--warmup", "1", "--wait", "0", "--trace", out)
    _one_error(cli("profile", sample("mlp.py:build"), *args), 2, "--trace", "could not be written")
    out.write_text("{}")       # an old file of the same name does not count as written
    _one_error(cli("profile", sample("mlp.py:build"), *args), 2, "--trace", "could not be written")
    r = cli("profile", sample("mlp.py:build"), *args, "--json")
    assert r.code == 2 and r.json["exit_code"] == 2 and "could not be written" in r.json["error"]["message"]
    monkeypatch.undo()
    r = cli("profile", sample("mlp.py:build"), *args, "--json")     # overwriting the named file is fine
    assert r.code == 0, r.stderr
    assert r.json["trace"] == str(out) and "traceEvents" in json.loads(out.read_text())


def test_bad_option_is_exit_2_before_loading_and_named_per_caller(cli):
    """Options are validated when built: the factory that raises (exit 3 if loaded) is never called."""
    from torchdiag.api import run
    from torchdiag.errors import OptionError

    for args, flag in ((["--active", "0"], "--active"), (["--wait", "-1"], "--wait"), (["--top", "-2"], "--top"),
                       (["--mode", "fit"], "--mode"), (["--optimizer", "lion"], "--optimizer")):
        res = cli("profile", sample("broken_factory.py:raises"), *args)
        _one_error(res, 2, flag)
        assert res.stderr.startswith(f"error: {flag}:"), res.stderr
    model, x = load("mlp.py:build")
    with pytest.raises(OptionError, match=r"^active: must be ≥ 1, got 0"):
        run("profile", model, x, active=0)
    with pytest.raises(OptionError, match=r"^trace: takes True or False, not 'run.json'"):   # files are render/'s: trace=True keeps the bytes
        run("profile", model, x, trace="run.json")


def test_no_kineto_gpu_probe_noise_on_cpu(cli, monkeypatch):
    """Kineto logs 'gpuGetDeviceCount failed with code 35' to fd 2 on a CPU-only machine with a CUDA
    build of torch (issue 15 point 10). Simulated here: the profiler's step writes that line to fd 2;
    a profile on the CPU passes on other lines of that stream but not this one."""
    import os

    from torch.profiler import profile

    step = profile.step

    def noisy_step(self):
        os.write(2, b"ERROR:2026-01-01 00:00:00 1:1 DeviceProperties.cpp:42] gpuGetDeviceCount failed with code 35\n")
        os.write(2, b"a line of the model's own\n")
        return step(self)

    monkeypatch.setattr(profile, "step", noisy_step)
    res = cli("profile", sample("mlp.py:build"), "--device", "cpu", "--wait", "0", "--warmup", "1", "--active", "1")
    assert res.code == 0, res.stderr
    assert "gpuGetDeviceCount" not in res.stderr
    assert "a line of the model's own" in res.stderr    # other lines on fd 2 are kept


def test_trace_gz_is_gzipped_and_python_gets_the_bytes(cli, tmp_path):
    import gzip

    from torchdiag.api import run

    out = tmp_path / "run.json.gz"
    res = cli("profile", sample("mlp.py:build"), "--device", "cpu", "--wait", "0", "--warmup", "1", "--active", "1",
              "--trace", out)
    assert res.code == 0, res.stderr
    assert "traceEvents" in json.loads(gzip.decompress(out.read_bytes()))
    model, x = load("mlp.py:build")
    r = run("profile", model, x, **FAST, trace=True)
    assert "traceEvents" in json.loads(r.artefacts["trace"])
    assert "trace" not in run("profile", model, x, **FAST).artefacts    # nothing kept unless asked


# ----------------------------------------------------------------------------------------- --syncs (issue 16)

def _marked_syncs(name: str) -> set:
    """(file, line, op) of each line of a sample marked `# host sync: <op>`: read from the file, not hard-coded."""
    import os

    from support import SAMPLES

    path = os.path.join(SAMPLES, name)
    with open(path) as f:
        return {(path, i, line.split("# host sync:")[1].strip())
                for i, line in enumerate(f, start=1) if "# host sync:" in line}


def _marked_code(name: str) -> list:
    from support import SAMPLES

    with open(SAMPLES / name) as f:
        return [(name, i, line.split("#")[0].strip()) for i, line in enumerate(f, start=1) if "# host sync:" in line]


def _sync_rows(result) -> set:
    return {(r["file"], r["line"], r["op"]) for r in result.table("syncs").rows}


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_syncs_found_at_the_marked_lines_of_the_sample(untouched, mode):
    expected = _marked_syncs("syncs.py")
    assert len(expected) == 2 and {op for *_, op in expected} == {".item()", "boolean-mask indexing"}
    model, x = load("syncs.py:build")
    with untouched(model):
        r = _run_model(model, x, mode=mode, syncs=True)
    assert _sync_rows(r) == expected
    rows = r.table("syncs").rows
    assert all(row["count"] == 1 and row["function"] == "forward" for row in rows)   # one each per step
    assert [row["line"] for row in rows] == sorted(line for _, line, _ in expected)
    source = {line: text for _, line, text in _marked_code("syncs.py")}
    assert all(row["code"] == source[row["line"]] for row in rows)      # the line's code, its comment left out
    assert {row["detected_op"] for row in rows} == {"aten::_local_scalar_dense", "aten::index"}
    assert r.data["syncs_per_step"] == 2 and r.data["sync_detection"] == "dispatch-level counter"
    found = [f for f in r.findings if f.code == "host-sync"]
    assert sorted(f.where for f in found) == sorted(row["site"] for row in rows)
    assert all(f.severity == "warning" for f in found) and r.exit_code == 0
    if mode == "train":     # torchdiag's loss rule and the optimizer sync too: counted apart, not listed
        assert r.data["syncs_outside_user_code"] > 0


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_syncs_healthy_mlp_reports_none(mode):
    model, x = load("mlp.py:build")
    r = _run_model(model, x, mode=mode, syncs=True)
    assert r.table("syncs").rows == [] and r.data["syncs_per_step"] == 0
    assert not [f for f in r.findings if f.code == "host-sync"]
    assert ("Host syncs", "none in your code") in r.summary


def test_syncs_off_by_default_and_a_yes_no_option():
    from torchdiag.api import run
    from torchdiag.errors import OptionError

    model, x = load("syncs.py:build")
    r = run("profile", model, x, **FAST)
    assert r.table("syncs") is None and "syncs_per_step" not in r.data
    with pytest.raises(OptionError, match=r"^syncs: takes True or False"):
        run("profile", model, x, syncs="yes")


def test_syncs_in_a_user_loss_are_listed_and_torchdiag_frames_are_not(tmp_path):
    """A loss function in the user's file that calls .item() is the user's code: listed at its line;
    the frames of torchdiag (the step, the loss wrapper) and of torch never are."""
    import torch

    from torchdiag.api import run

    loss_file = tmp_path / "myloss.py"
    loss_file.write_text("import torch\n\n\ndef loss(out, target):\n    if out.sum() > 1e9:\n"
                         "        return out.sum() * 0\n    return out.pow(2).mean()\n")
    model, x = load("mlp.py:build")
    r = run("profile", model, x, **FAST, mode="train", loss=f"{loss_file}:loss", syncs=True)
    assert _sync_rows(r) == {(str(loss_file), 5, "bool()")}
    assert all("/torchdiag/" not in row["file"] and row["file"] != torch.__file__ for row in r.table("syncs").rows)


def test_cli_syncs_table_and_json(cli):
    spec = sample("syncs.py:build")
    args = ("--device", "cpu", "--wait", "0", "--warmup", "1", "--active", "1", "--syncs")
    res = cli("profile", spec, *args)
    assert res.code == 0, res.stderr
    for text in ("Host syncs in your code", "syncs.py:", ".item()", "boolean-mask indexing", "host-sync"):
        assert text in res.stdout + res.stderr, text
    res = cli("profile", spec, *args, "--json")
    assert res.code == 0, res.stderr
    doc = res.json
    assert {"syncs", "syncs_per_step", "syncs_outside_user_code", "sync_detection"} <= set(doc)
    assert {(row["line"], row["op"]) for row in doc["syncs"]} == {(line, op) for _, line, op in _marked_syncs("syncs.py")}
    assert set(doc["syncs"][0]) == {"site", "file", "line", "function", "op", "detected_op", "count", "code"}


@pytest.mark.cuda
def test_cuda_syncs_use_sync_debug_mode_and_restore_it(untouched):
    import torch

    model, x = load("syncs.py:build", device="cuda")
    before = torch.cuda.get_sync_debug_mode()
    with untouched(model):
        r = _run_model(model, x, mode="train", syncs=True)
    assert torch.cuda.get_sync_debug_mode() == before
    assert "set_sync_debug_mode" in r.data["sync_detection"]
    assert {(f, line) for f, line, _ in _sync_rows(r)} == {(f, line) for f, line, _ in _marked_syncs("syncs.py")}


def _run_model(model, x, **opts):
    from torchdiag.api import run

    return run("profile", model, x, **{**FAST, **opts})


def test_a_compiled_model_is_profiled_as_one_graph_and_other_commands_run_its_module():
    """A sweep: profile's module labels inside a torch.compile'd MLP broke it into three graphs (16x slower than the
    user's), and summary exited 3 ("no forward() of its own": dynamo refused its hooks). profile now labels only
    outside the compiled part; every other command diagnoses the module it wraps, run eagerly, and says so."""
    import torch
    from torch import nn
    from torch._dynamo.utils import counters

    from torchdiag.api import run

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    model, x = torch.compile(plain, backend="eager"), torch.randn(8, 16)
    torch._dynamo.reset()
    counters.clear()
    r = run("profile", model, x, **FAST)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert set(_modules(r)) == {""} and any("run compiled" in n for n in r.notes)
    s = run("summary", model, x)
    assert [row["name"] for row in s.table("layers").rows][:3] == ["0", "1", "2"]
    assert "run eagerly" in s.header["compiled"] and "compiled" not in run("summary", plain, x).header
    # a compiled model holding a compiled part: that part stays compiled, and the header says so (a review)
    nested = torch.compile(nn.Sequential(torch.compile(nn.Linear(16, 4), backend="eager")), backend="eager")
    assert run("summary", nested, x).header["compiled"].endswith("the compiled modules inside it stay compiled")


def test_activation_checkpointing_recompute_is_backward_time_not_a_second_forward():
    """A sweep: with torch.utils.checkpoint the recompute inside backward opened the blocks' forward ranges again:
    each block counted 10 forward calls for 5 steps, the blocks' forward time exceeded the root's, and the root's
    self time was negative (a C++ warning about an unclosed range on stderr)."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    from torchdiag.api import run
    from torchdiag.core.inputs import ModelInputs

    class Ckpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(3))
            self.head = nn.Linear(64, 4)

        def forward(self, x):
            for b in self.blocks:
                x = x + checkpoint(b, x, use_reentrant=False)
            return self.head(x)

    r = run("profile", Ckpt(), ModelInputs((torch.randn(8, 64),)), mode="train")
    mods = {row["name"]: row for row in r.table("modules").rows}
    steps = mods[""]["calls"]
    assert all(mods[f"blocks.{i}"]["calls"] == steps for i in range(3)), {k: v["calls"] for k, v in mods.items()}
    assert mods[""]["self_cpu_time_us"] >= 0 and mods["blocks"]["cpu_time_us"] <= mods[""]["cpu_time_us"]


def test_syncs_list_a_copy_to_the_cpu_only_where_the_line_writes_the_cpu(cli, tmp_path):
    """A sweep and a review: `.to(w.device)` and `.to(DEV)` (DEV "cuda" where there is one) were listed as host copies
    on the CPU run, and `.to(torch.device("cpu"))` was then missed. The line's source decides: a "cpu" string."""
    (tmp_path / "tocpu.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "DEV = torch.device('cpu')   # a device held in a variable (a GPU where there is one)\n"
        "DEVS = 'cpu'\n\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(16, 16)\n\n"
        "    def forward(self, x):\n"
        "        h = self.l(x)\n"
        "        a = h.to(torch.device('cpu'))\n"
        "        b = h.to(self.l.weight.device) + h.to(DEV) + h.to(DEVS)\n"
        "        c = h.to('cpu', non_blocking=True)\n"
        "        return a + b + c + h.to(dtype=torch.float32, device='cpu')\n\n"
        "def build():\n    return M()\n")
    r = cli("profile", f"{tmp_path / 'tocpu.py'}:build", "-i", "4x16", "--syncs", "--json", "--device", "cpu")
    assert r.code == 0, r.stderr
    assert sorted(row["line"] for row in r.json["syncs"]) == [14, 17], r.json["syncs"]


def test_syncs_read_the_call_the_line_was_in_for_its_target(cli, tmp_path):
    """A review: `h.to(` with `"cpu")` on the next line was dropped, the frame's line alone read; a second review: read
    as the whole statement, an `if`/`for` header was still dropped, `h.to(DEV) if DEV else h.to("cpu")` was listed for
    the `.to(DEV)` that ran, and a dict of stats showed its first line, not the `.item()`'s; a third: a "cpu" in the
    receiver (`torch.zeros(8, device="cpu").to(x.device)`) or in a branch of a conditional on the machine was read as
    the target; a fourth: a conditional on the user's own flag takes the same branch on a GPU, and was dropped; a
    fifth: `non_blocking=dev.type != "cpu"` was read as the target, and so was the plain "cpu" branch of a flag that
    was off, where the run passed a torch.device. The call's own positional arguments and `device=` are read (a "cpu"
    in a comment still is not), and its lines shown."""
    (tmp_path / "split.py").write_text(
        "import torch\nfrom torch import nn\n\nDEV = 'cpu'   # a device held in a variable ('cuda' on a GPU)\nHAS_CUDA, OFFLOAD = False, True\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.l = nn.Linear(16, 16)\n\n"
        "    def forward(self, x):\n"
        "        h = self.l(x)\n"
        "        a = h.to(\n"
        "            'cpu')\n"
        "        b = h.to(self.l.weight.device)   # 'cpu' in a comment\n"
        "        b = b + torch.zeros(16, device='cpu').to(x.device)   # a host-to-device copy on a GPU\n"
        "        b = b + torch.ones(16).to('cuda' if HAS_CUDA else 'cpu')   # on a GPU the other branch\n"
        "        for row in h.to(\n"
        "                'cpu')[:1]:\n"
        "            b = b + row\n"
        "        c = h.to(\n"
        "            DEV) if DEV else h.to('cpu')\n"
        "        self.stats = {\n"
        "            'mean': h.mean(),\n"
        "            'peak': h.abs().amax().item(),\n"
        "        }\n"
        "        f = h.to('cpu' if OFFLOAD else 'cuda')   # the user's own flag: the same branch on a GPU\n"
        "        dev, save_timestamps, off = torch.device('cpu'), True, False\n"
        "        g = h.to(dev, non_blocking=dev.type != 'cpu')   # to a device held in a variable\n"
        "        k = h.to('cpu' if save_timestamps else h.device)   # the flag on: a host copy\n"
        "        m = h.to('cpu' if off else h.device)   # the flag off: the device's own\n"
        "        return a + b + c + f + g + k + m\n\n"
        "def build():\n    return M()\n")
    r = cli("profile", f"{tmp_path / 'split.py'}:build", "-i", "4x16", "--syncs", "--json", "--device", "cpu")
    assert r.code == 0, r.stderr
    rows = {(row["line"], row["op"]): row["code"] for row in r.json["syncs"]}
    assert rows == {(13, '.to("cpu")'): "a = h.to( 'cpu')", (18, '.to("cpu")'): "for row in h.to( 'cpu')[:1]:",
                    (25, ".item()"): "'peak': h.abs().amax().item(),",
                    (27, '.to("cpu")'): "f = h.to('cpu' if OFFLOAD else 'cuda')",
                    (30, '.to("cpu")'): "k = h.to('cpu' if save_timestamps else h.device)"}, rows


def test_syncs_read_a_conditional_target_by_what_it_tests_and_where_it_sits():
    """Reviews: a conditional on the machine names a GPU's branch on a GPU (`useCuda`, `num_gpus` are such names, not
    only `torch.cuda.is_available()`), one on the user's own flag the same branch everywhere (`SAVE_TIMESTAMPS` holds
    no "mps"); a plain string branch of a direct argument cannot have made a torch.device the run passed, while one
    inside `torch.device(...)` makes it."""
    import ast

    from torchdiag.diagnostics.profile import target

    machine = {t: target.on_machine(ast.parse(t, mode="eval").body) for t in (
        "torch.cuda.is_available()", "self.flags.useCuda", "args.num_gpus > 0", "hasGPU", "HAS_CUDA",
        "SAVE_TIMESTAMPS", "accelerator.is_main_process", "OFFLOAD")}
    assert machine == {"torch.cuda.is_available()": True, "self.flags.useCuda": True, "args.num_gpus > 0": True,
                       "hasGPU": True, "HAS_CUDA": True, "SAVE_TIMESTAMPS": False,
                       "accelerator.is_main_process": False, "OFFLOAD": False}, machine
    assert "cpu" in target.target_strings('h.to(torch.device("cpu" if OFFLOAD else "cuda"))', devices_only=True)
    assert target.target_strings('h.to("cpu" if OFFLOAD else h.device)', devices_only=True) == []
    assert target.target_strings('h.to("cpu" if OFFLOAD else h.device)') == ["cpu"]
    assert target.target_strings('h.to(DEV, non_blocking=DEV.type != "cpu")') == []
    assert target.target_strings('h.to("cuda" if self.flags.useCuda else "cpu")') == []
    # a later review: GPUs split as GP + Us, a nested conditional's and an and/or's plain strings counted
    assert target.on_machine(ast.parse("numGPUs", mode="eval").body)
    assert target.target_strings('h.to("cpu" if A else ("cpu" if B else h.device))', devices_only=True) == []
    assert target.target_strings('h.to(A and "cpu" or h.device)', devices_only=True) == []


def test_warmup_zero_is_a_note_not_torchs_warning(cli):
    """A hostile review: --warmup 0 printed torch's "Profiler won't be using warmup" with torchdiag's own source line."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = cli("profile", sample("mlp.py:build"), "--device", "cpu", "--wait", "0", "--warmup", "0", "--active", "2",
                  "--json")
    assert res.code == 0, res.stderr
    assert not [w for w in caught if "warmup" in str(w.message)], [str(w.message) for w in caught]
    assert any(n.startswith("--warmup 0: the first active step") for n in res.json["notes"]), res.json["notes"]
