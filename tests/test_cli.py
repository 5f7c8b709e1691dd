"""The CLI contract: help without torch, versions, examples in every command's help."""
import json
import subprocess
import sys

import pytest

from support import FAST_RUNS, ROOT, spawn

PROBE = """
import sys
from torchdiag.cli.app import main
sys.argv = ["torchdiag"] + {args!r}
try:
    main()
except SystemExit:
    pass
heavy = [m for m in ("torch", "torchinfo", "fvcore", "tensorboard", "numpy") if m in sys.modules]
print("HEAVY=" + ",".join(heavy))
"""


def _probe(args):
    out = subprocess.run([sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True, cwd=ROOT)
    return out.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_help_does_not_import_torch():
    out = _probe(["--help"])
    assert "Commands" in out and "HEAVY=\n" in out


@pytest.mark.slow
@pytest.mark.subprocess
def test_version_does_not_import_torch():
    out = _probe(["--version"])
    assert "torchdiag 0." in out and "HEAVY=\n" in out


@pytest.mark.slow
@pytest.mark.subprocess
def test_command_help_does_not_import_torch_and_shows_example():
    from torchdiag.cli.app import COMMANDS

    for name in COMMANDS:
        out = _probe([name, "--help"])
        assert "HEAVY=\n" in out, f"{name} --help imported {out.splitlines()[-1]}"
        assert f"torchdiag {name} " in out, f"{name} --help has no example"


@pytest.mark.slow
@pytest.mark.subprocess
def test_python_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "torchdiag", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.startswith("torchdiag ")


JSON_RUNS = {**FAST_RUNS,
             "gradcam": [f"{ROOT}/sample_models/gradcam_region.py:build", "--layer", "features.3",
                         "--image", f"{ROOT}/docs/images/sample_input.png"],
             "gradcheck": [f"{ROOT}/sample_models/custom_autograd.py:MulSquare", "-i", "3", "-i", "3"],
             "check": [f"{ROOT}/sample_models/mlp.py:build", "--max-params", "1M", "--nancheck"]}


@pytest.mark.parametrize("command", sorted(JSON_RUNS))
def test_every_command_prints_exactly_one_json_document(cli, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # check must not find the project's pyproject.toml
    res = cli(command, *JSON_RUNS[command], "--json")
    assert res.code == 0, res.stderr  # healthy sample models
    doc = json.loads(res.stdout)  # the whole stdout is one document
    assert doc["schema_version"] == 1 and doc["command"] == command and doc["exit_code"] == res.code
    assert isinstance(doc["findings"], list)


@pytest.mark.slow
@pytest.mark.subprocess
def test_option_errors_are_one_error_line_and_json_document():
    # click's own check (not an integer) and the Options' check (out of range): the same shape of error
    for value, words in (("x", "error: Invalid value for '--depth'"), ("-1", "error: --depth: must be ≥ 0, got -1")):
        out = subprocess.run([sys.executable, "-m", "torchdiag", "summary", "sample_models/mlp.py:build", "--depth",
                              value, "--json"], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 2
        assert out.stderr.startswith(words) and "Traceback" not in out.stderr, out.stderr
        assert json.loads(out.stdout)["exit_code"] == 2
    out = subprocess.run([sys.executable, "-m", "torchdiag", "flops", "--bogus"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.splitlines()[0].startswith("error: No such option: --bogus")


def test_embeddings_json_with_and_without_tb(cli, tmp_path):
    """A new user's hour: the figures alone (--json) needed TensorBoard files written first, and a bad --layer was
    told of the missing --tb. --tb is optional: without it nothing is written and the figures are the same."""
    res = cli("embeddings", f"{ROOT}/sample_models/cnn.py:build", "--layer", "head.0", "--tb", tmp_path, "--json")
    assert res.code == 0 and json.loads(res.stdout)["command"] == "embeddings" and res.json["projector_dir"]
    alone = cli("embeddings", f"{ROOT}/sample_models/cnn.py:build", "--layer", "head.0", "--json")
    assert alone.code == 0 and "projector_dir" not in alone.json
    assert alone.json["sample_norms"] == res.json["sample_norms"] and alone.json["dim"] == res.json["dim"] == 2048
    shown = cli("embeddings", f"{ROOT}/sample_models/cnn.py:build", "--layer", "head.0")
    assert shown.code == 0 and "not written (--tb DIR writes it" in shown.stdout, shown.stdout
    bad = cli("embeddings", f"{ROOT}/sample_models/cnn.py:build", "--layer", "nope")
    assert bad.code == 2 and "no module named 'nope'" in bad.stderr and "--tb" not in bad.stderr, bad.stderr
    r = cli("embeddings", f"{ROOT}/sample_models/cnn.py:build")
    assert r.code == 2 and "Traceback" not in r.stderr and "embeddings needs the module" in r.stderr, r.stderr


def test_output_file_under_a_file_says_so(cli, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    r = cli("gradflow", f"{ROOT}/sample_models/mlp.py:build", "--plot", str(afile / "flow.png"))
    assert r.code == 2 and "is a file, not a folder" in r.stderr and "Traceback" not in r.stderr
    assert afile.read_text() == "keep me"


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("args, code", [
    (["summary", "sample_models/broken_shape.py:build"], 3),             # the rows that ran, then the error
    (["summary", "sample_models/broken_shape.py:build", "--json"], 3),   # the error document with 'partial'
    (["summary", "sample_models/mlp.py:build", "--bogus", "--json"], 2),  # click's usage error, as JSON
])
def test_stdout_closed_by_reader_on_an_error_keeps_exit_code(args, code):
    """`torchdiag … | head` where the reader leaves early: the error path writes to stdout too. Was
    exit 1 (click's broken-pipe exit, Rich's SystemExit) or a BrokenPipeError traceback."""
    p = spawn([sys.executable, "-m", "torchdiag", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
              cwd=ROOT, text=True)
    p.stdout.close()   # nobody reads: the first write to stdout fails with a broken pipe
    err = p.stderr.read()
    assert p.wait() == code, err
    assert err.startswith("error: ") and "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_command_list_is_each_commands_own_summary_and_imports_no_command():
    """`torchdiag --help` lists commands from app.SUMMARIES without importing cli/<command>.py; each entry
    must stay the first paragraph of that command's docstring (what click would have shown)."""
    import subprocess

    from torchdiag.cli.app import COMMANDS, SUMMARIES, load_command

    assert list(SUMMARIES) == COMMANDS
    for name in COMMANDS:
        first = " ".join((load_command(name).help or "").split("\n\n")[0].split())
        assert SUMMARIES[name] == first, name
    code = ("import sys; sys.argv = ['torchdiag', '--help']\n"
            "from torchdiag.cli.app import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('LOADED=' + ','.join(sorted(m for m in sys.modules if m.startswith('torchdiag.cli.') and "
            "m.rsplit('.', 1)[1] not in ('app', 'common', 'isolation'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("LOADED="), r.stdout.splitlines()[-1]
    for name in COMMANDS:
        assert name in r.stdout


def test_help_lists_watch_without_importing_torch():
    out = _probe(["--help"])
    assert "\n  watch " in out and "HEAVY=\n" in out
    out = _probe(["watch", "--help"])
    assert "watch [OPTIONS] -- {COMMAND}..." in out and "stdout goes to stderr" in out and "HEAVY=\n" in out


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_command_with_nothing_to_run_on_is_a_usage_error_with_its_help():
    """`torchdiag` alone is the overview (exit 0); `torchdiag summary` with no model is a usage error (exit 2), its
    help on stderr: a CI line that lost its spec must fail, not pass on the help text (a review: exit 0). Through
    the entry point (main), which the in-process runner bypasses."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "torchdiag", *args], capture_output=True, text=True, cwd=ROOT)

    bare = run()
    assert bare.returncode == 0 and "Commands" in bare.stdout
    for name in ("summary", "watch", "data", "lr-find"):
        r = run(name)
        assert r.returncode == 2 and r.stdout == "" and f"torchdiag {name}" in r.stderr, (name, r.returncode, r.stderr)
    assert run("check").returncode == 2   # check reads its model from pyproject.toml: none here, one line


def test_an_infinite_option_value_is_said_to_be_not_finite(cli):
    # a review: `--max-lr inf` said "inf is not a number"
    r = cli("lr-find", "sample_models/mlp.py:build", "--max-lr", "inf")
    assert r.code == 2 and "inf is not a finite number" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["lr-find", "overfit-batch"])
def test_a_model_with_no_parameters_is_not_said_to_be_frozen(cli, command):
    # a review: lr-find on nn.ReLU() said "requires_grad is False everywhere"; it has no parameters at all
    r = cli(command, "torch.nn:ReLU", "-i", "2x4")
    assert r.code == 2 and "the model has no parameters" in r.stderr, r.stderr


def test_a_missing_factory_lists_the_functions_before_the_classes(cli, tmp_path):
    # a review: the names were sorted in ASCII order and cut at 8, so 8 classes hid every factory function
    classes = "".join(f"class C{i}:\n    pass\n" for i in range(9))
    (tmp_path / "m.py").write_text(classes + "def build():\n    pass\ndef make_small():\n    pass\n")
    r = cli("summary", f"{tmp_path}/m.py:nosuch")
    hint = next(line for line in r.stderr.splitlines() if line.startswith("hint:"))
    assert r.code == 2 and hint.startswith("hint: callables there: build, make_small, C0") and "(+3)" in hint, hint


@pytest.mark.parametrize("args", [("summary", "sample_models/mlp.py:build", "--checkpoint"),
                                  ("gradcam", "sample_models/cnn.py:build", "--out"),
                                  ("profile", "sample_models/mlp.py:build", "--trace"),
                                  ("gradflow", "sample_models/mlp.py:build", "--tb"),
                                  ("check", "sample_models/mlp.py:build", "--junit")])
def test_an_empty_path_is_said_empty_not_the_working_folder(cli, args):
    """A hostile review: `--checkpoint ""` said "--checkpoint . is a folder" (Path("") is "."), a path never typed."""
    res = cli(*args, "")
    assert res.code == 2 and "an empty path" in res.stderr and " . " not in res.stderr, res.stderr


SLOW = '''
import time
import torch
from torch import nn


class Slow(nn.Module):
    """A zero-initialised head (its layers' gradients are exactly 0: gradflow re-checks them on a trained copy)
    whose forward takes a while."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(4, 4), nn.Linear(4, 3)
        nn.init.zeros_(self.head.weight)

    def forward(self, x):
        time.sleep(0.05)
        return self.head(torch.relu(self.body(x)))


def build():
    return Slow()


def example_inputs():
    return (torch.randn(4, 4),)
'''


def test_a_long_run_says_it_is_still_running_in_a_log(cli, tmp_path, monkeypatch):
    """A perf review: swinv2's gradflow ran 10 minutes printing nothing where stderr is a file (a CI log cannot
    tell it from a hang). Past TORCHDIAG_STILL_RUNNING seconds a line says so and what the run is doing; the
    result is unchanged, and 0 turns the lines off."""
    from torchdiag.cli import common

    (tmp_path / "slow.py").write_text(SLOW)
    monkeypatch.setattr(common, "NOTICE_EVERY", 0.05)
    monkeypatch.setenv("TORCHDIAG_STILL_RUNNING", "0.05")
    noted = cli("gradflow", f"{tmp_path / 'slow.py'}:build", "--json")
    lines = [line for line in noted.stderr.splitlines() if "still running" in line]
    assert noted.code == 0 and lines and all(line.startswith("torchdiag gradflow: still running after ") for line in lines)
    assert any(line.endswith("on a copy trained for 3 steps, and their gates") for line in lines), lines
    gate = cli("check", f"{tmp_path / 'slow.py'}:build", "--gradflow", "--json")   # a review: check had none
    assert gate.code == 0 and "torchdiag check: still running after " in gate.stderr, gate.stderr
    monkeypatch.setenv("TORCHDIAG_STILL_RUNNING", "0")
    quiet = cli("gradflow", f"{tmp_path / 'slow.py'}:build", "--json")
    assert "still running" not in quiet.stderr and quiet.json["findings"] == noted.json["findings"]
    for odd in ("nan", "1e20", "soon"):   # the default minute (nan said it at once; 1e20 broke the timer's thread)
        monkeypatch.setenv("TORCHDIAG_STILL_RUNNING", odd)
        r = cli("gradflow", f"{tmp_path / 'slow.py'}:build", "--json")
        assert r.code == 0 and "still running" not in r.stderr and "Traceback" not in r.stderr, (odd, r.stderr)
