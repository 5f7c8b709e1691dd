"""--tb DIR: every command writes events under DIR/<command>/, read back with tensorboard's own
reader; and a real `tensorboard` server lists the runs and tags."""
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import FAST_RUNS as COMMANDS, sample


def events(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0, "histograms": 0, "images": 0})
    acc.Reload()
    return acc


def text_of(acc, tag) -> str:
    return acc.Tensors(tag)[0].tensor_proto.string_val[0].decode()


# the commands FAST_RUNS does not cover; together: every command of the app
MORE_RUNS = {
    "gradcam": [sample("gradcam_region.py:build"), "--layer", "features.0", "--image", "{image}"],
    "embeddings": [sample("cnn.py:build"), "--layer", "head.0"],
    "gradcheck": [sample("custom_autograd.py:MulSquare"), "-i", "3", "-i", "3"],
    "check": [sample("mlp.py:build"), "--max-params", "1M", "--nancheck"],
}
MORE_RUNS["watch"] = ["--every", "10", "--", "python", sample("watch_healthy_lm.py"), "--steps", "20"]


def test_every_command_has_a_tb_run_here():
    from typer.main import get_command

    from torchdiag.cli.app import COMMANDS as APP_COMMANDS, app

    assert sorted({**COMMANDS, **MORE_RUNS}) == sorted(APP_COMMANDS)
    assert sorted(get_command(app).commands) == sorted(APP_COMMANDS)


@pytest.mark.parametrize("command", sorted({**COMMANDS, **MORE_RUNS}))
def test_every_command_writes_readable_events(cli, tmp_path, monkeypatch, command):
    import numpy as np

    from torchdiag.render.images import save_png

    monkeypatch.chdir(tmp_path)   # check: no pyproject.toml here
    image = save_png(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8), tmp_path / "img.png")
    args = [str(a).replace("{image}", str(image)) for a in {**COMMANDS, **MORE_RUNS}[command]]
    res = cli(command, "--tb", tmp_path / "tb", *args)   # first: watch's options end at its script
    assert res.code == 0, res.stderr  # healthy sample models
    run_dir = tmp_path / "tb" / command
    assert list(run_dir.glob("events.out.tfevents.*")), f"no event file in {run_dir}"
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == [command]   # DIR/<command>/ only
    acc = events(run_dir)
    tags = acc.Tags()
    assert text_of(acc, f"{command}/header/text_summary")
    if command == "embeddings":   # the projector's files, read by TensorBoard's PROJECTOR tab
        assert (run_dir / "projector_config.pbtxt").is_file()
        assert len(next(run_dir.rglob("tensors.tsv")).read_text().splitlines()) == 8
    else:
        assert any(tags[k] for k in ("scalars", "histograms", "images")) or \
            any(t.endswith(("/text_summary",)) and "/header/" not in t for t in tags["tensors"]), tags


def test_summary_events_hold_tables_and_graph(cli, tmp_path):
    assert cli("summary", sample("cnn.py:build"), "--tb", tmp_path).code == 0
    acc = events(tmp_path / "summary")
    layers = text_of(acc, "summary/layers/text_summary")
    assert "| features | Sequential | 8x32x8x8 | 5,088 | yes |" in layers  # 3*16*9+16 + 16*32*9+32
    assert acc.Scalars("summary/total_params")[0].value == 25_578
    assert acc.Graph() is not None


def test_summary_tb_on_untraceable_model_keeps_json_pure_and_says_why(cli, tmp_path):
    """add_graph print()s the tracer's failure to stdout; --json must still be one document."""
    (tmp_path / "dictout.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class M(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(3, 2)\n"
        "    def forward(self, x):\n        return {'logits': self.fc(x), 'note': 'text', 'n': 3}\n"
        "def build():\n    return M()\n")
    res = cli("summary", f"{tmp_path}/dictout.py:build", "-i", "2x3", "--tb", tmp_path / "tb", "--json")
    assert res.code == 0, res.stderr
    doc = res.json                                      # stdout is exactly one JSON document
    assert doc["total_params"] == 3 * 2 + 2
    [note] = [n for n in doc["notes"] if n.startswith("model graph not written")]
    assert "Found Tensor and str" in note and "tensor(" not in note
    acc = events(tmp_path / "tb" / "summary")
    assert acc.Scalars("summary/total_params")[0].value == 8
    assert not acc.Tags()["graph"]


def test_flops_scalars(cli, tmp_path):
    assert cli("flops", sample("mlp.py:build"), "--tb", tmp_path).code == 0
    acc = events(tmp_path / "flops")
    macs = 16 * (784 * 256 + 256 * 128 + 128 * 10)
    assert acc.Scalars("flops/forward_macs")[0].value == macs


def test_model_error_is_logged_and_flushed(cli, tmp_path):
    res = cli("summary", sample("broken_shape.py:build"), "--tb", tmp_path)
    assert res.code == 3
    acc = events(tmp_path / "summary")
    assert "forward failed in 2.0 (Linear)" in text_of(acc, "summary/error/text_summary")


HANG_GUARD = 1800  # seconds: stops a hung test only; no assertion depends on how fast anything is


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_tensorboard_server_lists_runs_and_tags(cli, tmp_path):
    assert cli("flops", sample("mlp.py:build"), "--tb", tmp_path).code == 0
    assert cli("overfit-batch", sample("mlp.py:build"), "--steps", "20", "--tb", tmp_path).code == 0
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path), "--port", str(port),
                             "--host", "127.0.0.1", "--reload_interval", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        guard, tags = time.time() + HANG_GUARD, {}   # until the server lists both runs; only a hang guard
        while time.time() < guard:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=HANG_GUARD) as r:
                    tags = json.load(r)
                if "flops" in tags and "overfit-batch" in tags:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert "flops/forward_macs" in tags.get("flops", {}), tags
        assert tags.get("overfit-batch"), tags
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            proc.kill()


SLOW_MODEL = '''
import os, time
import torch
from torch import nn

class Slow(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls >= int(os.environ["SLOW_AFTER"]):
            open(os.environ["SLOW_MARKER"], "w").close()      # the test sends Ctrl-C now
            while True:                                        # until the signal arrives
                time.sleep(0.02)
        return self.fc(x)

def build():
    return Slow()
'''


def test_ctrl_c_flushes_the_events(tmp_path):
    """A real SIGINT while the model runs: exit 130, and the events already written are on disk and
    readable (summary: the error text; overfit-batch: the partial loss curve)."""
    import os
    import signal

    from conftest import ROOT

    (tmp_path / "slow.py").write_text(SLOW_MODEL)
    runs = {"summary": ([], 1), "overfit-batch": (["--steps", "100000"], 6)}
    procs = {}
    for command, (extra, after) in runs.items():
        env = dict(os.environ, SLOW_AFTER=str(after), SLOW_MARKER=str(tmp_path / f"{command}.ready"))
        procs[command] = subprocess.Popen(
            [sys.executable, "-m", "torchdiag", command, f"{tmp_path}/slow.py:build", "-i", "8x4", *extra,
             "--tb", str(tmp_path / "tb")], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for command, proc in procs.items():
            # follow each subprocess's progress to its marker; the guard only stops a hung test
            marker, guard = tmp_path / f"{command}.ready", time.time() + HANG_GUARD
            while not marker.exists() and proc.poll() is None and time.time() < guard:
                time.sleep(0.05)
            assert marker.exists(), proc.communicate()[1]
            proc.send_signal(signal.SIGINT)
        outs = {command: proc.communicate(timeout=HANG_GUARD) for command, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    for command, proc in procs.items():
        assert proc.returncode == 130, outs[command][1]
        assert "Traceback" not in outs[command][1], outs[command][1]
    acc = events(tmp_path / "tb" / "summary")
    assert "**exit 130**: interrupted" in text_of(acc, "summary/error/text_summary")
    acc = events(tmp_path / "tb" / "overfit-batch")
    losses = acc.Scalars("overfit-batch/loss")
    assert len(losses) >= 4 and [e.step for e in losses] == list(range(len(losses)))


def test_per_layer_figures_as_scalars(cli, tmp_path):
    """flops writes per-module MACs as scalars; the values are the closed-form MACs of the MLP
    (batch x in x out of every Linear, read off the built model)."""
    import torch

    from conftest import load

    model, inputs = load("mlp.py:build")
    batch = inputs.args[0].shape[0]
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert len(linears) >= 2
    r = cli("flops", sample("mlp.py:build"), "--tb", tmp_path)
    assert r.code == 0, r.stderr
    acc = events(tmp_path / "flops")
    tags = set(acc.Tags()["scalars"])
    for name, lin in linears.items():
        (ev,) = acc.Scalars(f"flops/modules/macs/{name}")
        assert ev.value == batch * lin.in_features * lin.out_features
    by_row = [e.value for e in acc.Scalars("flops/modules/macs_by_row")]
    assert sorted(by_row) == sorted(e.value for t in tags if t.startswith("flops/modules/macs/")
                                    for e in acc.Scalars(t))
    # memory: per-module bytes the same way
    r = cli("memory", sample("mlp.py:build"), "--tb", tmp_path)
    assert r.code == 0, r.stderr
    mtags = set(events(tmp_path / "memory").Tags()["scalars"])
    assert any(t.startswith("memory/modules/activation_bytes/") for t in mtags)
