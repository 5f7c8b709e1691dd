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


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_writes_readable_events(cli, tmp_path, command):
    from torchdiag.cli.app import app

    if command not in [c.name for c in app.registered_commands]:
        pytest.fail(f"{command} is not registered")
    res = cli(command, *COMMANDS[command], "--tb", tmp_path)
    assert res.code == 0, res.stderr  # healthy sample models
    run_dir = tmp_path / command
    assert list(run_dir.glob("events.out.tfevents.*")), f"no event file in {run_dir}"
    acc = events(run_dir)
    tags = acc.Tags()
    assert any(tags[k] for k in ("scalars", "tensors", "histograms", "images")), tags


def test_summary_events_hold_tables_and_graph(cli, tmp_path):
    assert cli("summary", sample("cnn.py:build"), "--tb", tmp_path).code == 0
    acc = events(tmp_path / "summary")
    layers = text_of(acc, "summary/layers/text_summary")
    assert "| features | Sequential | 8x32x8x8 | 5,088 | yes |" in layers  # 3*16*9+16 + 16*32*9+32
    assert acc.Scalars("summary/total_params")[0].value == 25_578
    assert acc.Graph() is not None


def test_summary_graph_says_plainly_when_it_cannot_trace(tmp_path):
    import torch
    from torch import nn

    from torchdiag.core.inputs import ModelInputs
    from torchdiag.diagnostics.summary import write_graph

    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return {"logits": self.fc(x), "note": "not a tensor", "n": 3}

    note = write_graph(DictOut(), ModelInputs((torch.randn(2, 3),)), tmp_path)
    assert note.startswith("model graph not written: the tracer could not follow this model")


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
        deadline, tags = time.time() + 90, {}
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
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
        proc.wait(timeout=20)
