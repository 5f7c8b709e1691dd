"""Hostile cases at the CLI boundary (issue 15): a model that prints, asks for input, exits, raises
BaseException or is killed; odd environments. Real subprocesses: file descriptors, os._exit and
signals cannot be faked in-process. None of them may be exit 4 or print a traceback without --debug."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import ENDS_WITHIN, one_error_line, spawn

HANG_GUARD = 600  # seconds: only stops a hung test; no assertion depends on how fast anything is

MODEL = """
import os, sys, torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        {forward}
        return self.fc(x)

def build(**kw):
    {factory}
    return Net()

def example_inputs():
    return torch.randn(2, 4)
"""


def write_model(folder: Path, forward: str = "pass", factory: str = "pass", top: str = "") -> str:
    path = folder / "hostile_model.py"
    path.write_text(top + textwrap.dedent(MODEL).format(forward=forward, factory=factory))
    return f"{path}:build"


def torchdiag(*args, env=None, stdin=subprocess.DEVNULL, cwd=None, **kw) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "COLUMNS": "120", **(env or {})}
    return subprocess.run([sys.executable, "-m", "torchdiag", *args], capture_output=True, text=True,
                          env=full_env, stdin=stdin, cwd=cwd, timeout=HANG_GUARD, **kw)


def one_line_error(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "error:" in stderr, stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_prints_in_model_file_factory_and_forward_go_to_stderr_under_json(tmp_path):
    spec = write_model(tmp_path, forward='print("from forward"); os.write(1, b"raw fd 1 write\\n")',
                       factory='print("from factory" * 1000)', top='print("from import")\n')
    r = torchdiag("summary", spec, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)                      # stdout is exactly one JSON document
    assert doc["command"] == "summary"
    for text in ("from import", "from factory", "from forward", "raw fd 1 write"):
        assert text in r.stderr
        assert text not in r.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_prints_stay_on_stdout_without_json(tmp_path):
    r = torchdiag("summary", write_model(tmp_path, forward='print("from forward")'))
    assert r.returncode == 0, r.stderr
    assert "from forward" in r.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_input_in_forward_fails_fast_with_exit_3(tmp_path):
    spec = write_model(tmp_path, forward='input("continue? ")')
    # stdin is an open pipe nobody writes to: without the guard, input() would wait forever
    p = subprocess.Popen([sys.executable, "-m", "torchdiag", "summary", spec, "--json"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=HANG_GUARD)
    assert p.returncode == 3, err
    one_line_error(err)
    assert "input()" in err
    assert json.loads(out)["exit_code"] == 3


@pytest.mark.slow
@pytest.mark.subprocess
def test_os_exit_in_forward_is_a_model_failure_not_exit_0(tmp_path):
    r = torchdiag("summary", write_model(tmp_path, forward="os._exit(0)"), "--json")
    assert r.returncode == 3, (r.stdout, r.stderr)
    one_line_error(r.stderr)
    assert "os._exit(0)" in r.stderr
    assert json.loads(r.stdout)["exit_code"] == 3


@pytest.mark.slow
@pytest.mark.subprocess
def test_base_exception_subclass_is_exit_3_with_json(tmp_path):
    top = "class Stop(BaseException):\n    pass\n"
    r = torchdiag("summary", write_model(tmp_path, forward='raise Stop("halt")', top=top), "--json")
    assert r.returncode == 3, r.stderr
    one_line_error(r.stderr)
    assert "Stop" in r.stderr
    assert json.loads(r.stdout)["error"]["message"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_exception_whose_str_raises(tmp_path):
    top = "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no str')\n"
    r = torchdiag("summary", write_model(tmp_path, forward="raise Odd()", top=top))
    assert r.returncode == 3, r.stderr
    one_line_error(r.stderr)
    assert "Odd" in r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_is_handled_like_ctrl_c(tmp_path):
    marker = tmp_path / "started"
    spec = write_model(tmp_path, forward=f'open({str(marker)!r}, "w").close(); import time; time.sleep(3600)')
    p = spawn([sys.executable, "-m", "torchdiag", "summary", spec, "--json"], stdin=subprocess.DEVNULL,
              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_GUARD
    while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)   # follows the subprocess's progress: its forward has started
    assert marker.exists(), p.communicate()[1]
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=ENDS_WITHIN)
    assert p.returncode == 143, err
    one_line_error(err)
    doc = json.loads(out)
    assert doc["exit_code"] == 143 and "SIGTERM" in doc["error"]["message"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_huge_seed_is_a_usage_error(tmp_path):
    r = torchdiag("summary", write_model(tmp_path), "--seed", str(2**70))
    assert r.returncode == 2, r.stderr
    one_line_error(r.stderr)
    assert "--seed" in r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_deeply_nested_arg_is_a_string_not_a_crash(tmp_path):
    spec = write_model(tmp_path, factory="assert isinstance(kw['x'], str), type(kw['x'])")
    r = torchdiag("summary", spec, "--arg", "x=" + "-" * 5000 + "1")
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_non_utf8_pyproject_is_a_usage_error(tmp_path):
    (tmp_path / "pyproject.toml").write_bytes(b"[tool.torchdiag]\nmodel = \"m.py:build\" # \xff\xfe\n")
    r = torchdiag("check", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line_error(r.stderr)
    assert "UTF-8" in r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_ascii_only_terminal_encoding(tmp_path):
    """Case 9: an ascii-only stdout crashed on the "—" of a table cell (memory's fits column prints one). One
    real process with PYTHONIOENCODING=ascii; the other commands in-process on a strict ascii stdout."""
    r = torchdiag("memory", write_model(tmp_path), "--device", "cpu", "--budget", "1K", env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stderr
    r.stdout.encode("ascii")
    from typer.testing import CliRunner

    from torchdiag.cli.app import app

    for command, *extra in (("summary",), ("memory", "--batch-sizes", "1,8")):
        res = CliRunner(charset="ascii").invoke(app, [command, write_model(tmp_path), "--device", "cpu", *extra])
        assert res.exit_code in (0, 1) and res.exception is None or isinstance(res.exception, SystemExit), res.exception
        res.stdout.encode("ascii")


@pytest.mark.slow
@pytest.mark.subprocess
def test_users_rich_py_does_not_shadow_the_library(tmp_path):
    (tmp_path / "rich.py").write_text("raise ImportError('this is the user\\'s own rich.py')\n")
    r = torchdiag("summary", write_model(tmp_path))
    assert r.returncode == 0, r.stderr


def scripted_model(folder: Path) -> str:
    spec = write_model(folder).replace(":build", ":scripted")
    Path(spec.split(":")[0]).write_text(Path(spec.split(":")[0]).read_text() +
                                        "\ndef scripted():\n    return torch.jit.script(Net())\n")
    return spec


@pytest.mark.slow
@pytest.mark.subprocess
def test_torchscript_model_is_a_usage_error_in_its_own_process(tmp_path):
    """End to end once, as a shell sees it (the process's exit code, its stderr); every command below."""
    r = torchdiag("summary", scripted_model(tmp_path), "--device", "cpu")
    assert r.returncode == 2, r.stderr
    one_line_error(r.stderr)
    assert "TorchScript" in r.stderr


@pytest.mark.parametrize("command, device", [("summary", "cpu"), ("gradflow", "cpu"), ("doctor", "cpu"),
                                             ("summary", "meta"), ("flops", "meta"), ("memory", "meta"),
                                             ("doctor", "meta"), ("nancheck", "cpu"), ("overfit-batch", "cpu"),
                                             ("gradcheck", "cpu")])
def test_torchscript_model_is_a_usage_error(cli, tmp_path, command, device):
    """Case 9: exit 4 in summary, gradflow and on meta; doctor said exit 3 and blamed the user's code.
    In-process (the `cli` fixture): the exit code and the error line are the command's, not the process's."""
    r = cli(command, scripted_model(tmp_path), "--device", device)
    assert r.code == 2, (command, r.stderr)
    one_error_line(r)
    assert "TorchScript" in r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_closed_stdout_keeps_the_exit_code(tmp_path):
    spec = write_model(tmp_path)
    r = subprocess.run(f'"{sys.executable}" -m torchdiag summary "{spec}" >&-', shell=True, capture_output=True,
                       text=True, timeout=HANG_GUARD)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr


RNG_COMMANDS = (("summary",), ("nancheck",), ("gradflow",), ("overfit-batch", "--steps", "5"),
                ("profile", "--mode", "train", "--active", "1"), ("memory",), ("doctor",), ("flops",),
                ("activations", "--layer", "fc"))


def test_rng_state_after_each_command_is_where_the_factory_left_it(tmp_path, cli):
    """Through the CLI as through the API: diagnostics put the global RNG back where build() left it (in-process,
    every command; the end-to-end child below checks it at the process's exit)."""
    import torch

    saved = tmp_path / "after.pt"
    # the first build's state (doctor builds again to compare): what the atexit check below reads too
    spec = write_model(tmp_path, factory=f"net = Net(); torch.randn(3); os.path.exists({str(saved)!r}) or "
                                         f"torch.save(torch.random.get_rng_state(), {str(saved)!r}); return net")
    for command, *extra in RNG_COMMANDS:
        saved.unlink(missing_ok=True)
        r = cli(command, spec, "--device", "cpu", *extra)
        assert r.code in (0, 1), (command, r.stderr)
        assert torch.equal(torch.load(saved), torch.random.get_rng_state()), command


@pytest.mark.slow
@pytest.mark.subprocess
def test_rng_state_at_exit_is_where_the_factory_left_it(tmp_path):
    """The same at a real process's exit (atexit), for the command that draws most (overfit-batch trains)."""
    out = tmp_path / "rng.txt"
    factory = (f"import atexit; net = Net(); torch.randn(3); after = torch.random.get_rng_state().clone(); "
               f"atexit.register(lambda: open({str(out)!r}, 'w').write(str(torch.equal(after, torch.random.get_rng_state())))); "
               f"return net")
    spec = write_model(tmp_path, factory=factory)
    r = torchdiag("overfit-batch", spec, "--device", "cpu", "--steps", "5")
    assert r.returncode in (0, 1), r.stderr
    assert out.read_text() == "True"


@pytest.mark.slow
@pytest.mark.subprocess
def test_megabytes_printed_before_the_json_document(tmp_path):
    """Case 4: 1-7 MB of text from the model file, the factory and forward, then one JSON document."""
    spec = write_model(tmp_path, forward='print("f" * (2 << 20))', factory='print("b" * (2 << 20))',
                       top='print("i" * (3 << 20))\n')
    r = torchdiag("summary", spec, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["command"] == "summary"
    assert len(r.stderr) >= 7 << 20 and "Traceback" not in r.stderr[-5000:]


COMPLEX_MODEL = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, dtype=torch.cfloat))
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc((x.to(torch.cfloat) @ self.w).abs())

def build():
    return Net()

def example_inputs():
    return torch.randn(2, 4)
"""

@pytest.mark.slow
@pytest.mark.subprocess
def test_complex_parameters_in_its_own_process(tmp_path):
    """gradflow (the command that was exit 4) end to end once, as a shell sees it; every command below."""
    (tmp_path / "cplx.py").write_text(COMPLEX_MODEL)
    r = torchdiag("gradflow", f"{tmp_path}/cplx.py:build", "--device", "cpu")
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("command", ["gradflow", "nancheck", "doctor", "memory", "profile", "summary", "flops",
                                     "overfit-batch"])
def test_complex_parameters_are_a_model_like_any_other(cli, tmp_path, command):
    """Case 9: a model with complex parameters (was exit 4 in gradflow): it runs, no traceback. In-process
    (the `cli` fixture): an exception escaping the command fails the test here too."""
    (tmp_path / "cplx.py").write_text(COMPLEX_MODEL)
    extra = ["--steps", "5"] if command == "overfit-batch" else []
    r = cli(command, f"{tmp_path}/cplx.py:build", "--device", "cpu", *extra)
    assert r.code in (0, 1), (command, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout


MARKER_LOSS = """
import pathlib
import torch.nn.functional as F

calls = []

def loss(output, target):
    calls.append(1)
    if len(calls) == 3:          # training is under way: tell the test to send the signal
        pathlib.Path(__file__).with_suffix(".started").write_text("1")
    return F.mse_loss(output, output.detach() * 0 + 1)
"""


def _started(proc, marker: Path) -> None:
    """Wait for the subprocess's own progress marker; the guard only stops a hung test."""
    guard = time.monotonic() + HANG_GUARD
    while not marker.exists() and proc.poll() is None and time.monotonic() < guard:
        time.sleep(0.05)
    if not marker.exists():
        proc.kill()
        raise AssertionError(proc.communicate()[1])


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_keeps_partial_results_json_and_tensorboard(tmp_path):
    """Case 7: SIGTERM mid-training (CI timeouts) is handled like Ctrl-C: exit 143, overfit-batch's
    partial curve in the JSON document and in TensorBoard; profile's --tb folder records what
    happened (it was left empty)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = {"overfit-batch": ["--steps", "1000000", "--target-ratio", "1e-30"],
            "profile": ["--mode", "train", "--wait", "0", "--warmup", "1", "--active", "10000"]}   # its most
    procs = {}
    for command, extra in runs.items():
        folder = tmp_path / command
        folder.mkdir()
        (folder / "marker.py").write_text(MARKER_LOSS)
        procs[command] = spawn(
            [sys.executable, "-m", "torchdiag", command, write_model(folder), "--device", "cpu", "--loss",
             f"{folder}/marker.py:loss", "--tb", str(folder / "tb"), "--json", *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for command, proc in procs.items():
            _started(proc, tmp_path / command / "marker.started")
            proc.send_signal(signal.SIGTERM)
        outs = {command: proc.communicate(timeout=ENDS_WITHIN) for command, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    for command, (out, err) in outs.items():
        assert procs[command].returncode == 143, (command, err)
        assert "Traceback" not in err
        doc = json.loads(out)
        assert doc["exit_code"] == 143, doc
    curve = json.loads(outs["overfit-batch"][0])
    assert curve["interrupted"] is True and curve["steps"] >= 2
    assert "cannot-overfit" not in [f["code"] for f in curve["findings"]]
    acc = EventAccumulator(str(tmp_path / "overfit-batch" / "tb" / "overfit-batch"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("overfit-batch/loss")] == pytest.approx(curve["loss"])
    acc = EventAccumulator(str(tmp_path / "profile" / "tb" / "profile"))
    acc.Reload()
    assert "profile/error/text_summary" in acc.Tags()["tensors"]       # not an empty folder


def _device_twin(folder: Path, major: int, minor: int) -> Path:
    """A character device node like /dev/full in the test's own folder (no real device is touched),
    or skip where device nodes cannot be made (not root, nodev mount)."""
    node = folder / "full"
    try:
        os.mknod(node, 0o666 | __import__("stat").S_IFCHR, os.makedev(major, minor))
        open(node, "wb").close()
    except (PermissionError, OSError) as exc:
        node.unlink(missing_ok=True)
        pytest.skip(f"cannot make a device node here: {exc}")
    return node


@pytest.mark.slow
@pytest.mark.subprocess
def test_trace_onto_a_full_device_is_written_in_place_never_replaced(tmp_path):
    """Case 1: `profile --trace /dev/full` (as root) replaced the device node with a regular file, exit 0."""
    import stat

    node = _device_twin(tmp_path, 1, 7)     # /dev/full: every write fails with ENOSPC
    r = torchdiag("profile", write_model(tmp_path), "--device", "cpu", "--active", "1", "--trace", str(node))
    assert r.returncode == 2, r.stderr
    one_line_error(r.stderr)
    assert f"error: no space left on device writing {node}" in r.stderr
    assert stat.S_ISCHR(os.stat(node).st_mode)                      # still the device
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["full", "hostile_model.py"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_trace_onto_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
    """Case 1: `--trace` onto a symlink replaced the link with a file."""
    real = tmp_path / "traces" / "run.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    r = torchdiag("profile", write_model(tmp_path), "--device", "cpu", "--active", "1", "--trace", str(link))
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "traceEvents" in json.loads(real.read_text())
    assert [p.name for p in real.parent.iterdir()] == ["run.json"]    # no .tmp left beside it


@pytest.mark.slow
@pytest.mark.subprocess
def test_closed_stdout_with_json_keeps_the_exit_code(tmp_path):
    """Case 8: stdout closed (`>&-`) gave a traceback and exit 1; with --json and on an error too."""
    for args, code in (([write_model(tmp_path), "--json"], 0), ([f"{tmp_path}/missing.py:build", "--json"], 2)):
        cmd = " ".join(f'"{a}"' for a in ("summary", *args))
        r = subprocess.run(f'"{sys.executable}" -m torchdiag {cmd} >&-', shell=True, capture_output=True,
                           text=True, timeout=HANG_GUARD)
        assert r.returncode == code, r.stderr
        assert "Traceback" not in r.stderr


RSS_PROBE = """
import json, resource, sys
from torchdiag.cli.app import main
sys.argv = ["torchdiag", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
sys.stderr.write("\\nmax-rss-bytes %d\\n" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
"""

WIDE_MODEL = """
import torch
from torch import nn

def build():
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))

def example_inputs():
    return torch.randn(1, 1024)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_batch_sizes_and_budget_allocate_nothing(tmp_path):
    """Resource guards: memory's --batch-sizes and --budget are estimated on fake tensors (nothing is
    allocated), so a batch size whose step would take gigabytes costs the process nothing."""
    if sys.platform != "linux":
        pytest.skip("ru_maxrss is in KiB on Linux only")
    (tmp_path / "wide.py").write_text(WIDE_MODEL)
    (tmp_path / "probe.py").write_text(RSS_PROBE)
    r = subprocess.run([sys.executable, str(tmp_path / "probe.py"), "memory", f"{tmp_path}/wide.py:build", "--device",
                        "cpu", "--batch-sizes", "262144", "--budget", "64G", "--json"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=HANG_GUARD)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    peak = next(row["peak_bytes"] for row in doc["batch_sizes"] if row["batch_size"] == 262144)
    rss = int(r.stderr.rsplit("max-rss-bytes", 1)[1])
    assert peak > 4 * 2**30 and rss < peak / 4, (peak, rss)


@pytest.mark.slow
@pytest.mark.subprocess
def test_tokens_file_that_is_not_utf8_is_a_usage_error(tmp_path):
    (tmp_path / "tokens.txt").write_bytes(b"the\ncat\n\xff\xfe\n")
    r = torchdiag("attention", str(Path(__file__).resolve().parent.parent / "sample_models" / "vit.py:build"),
                  "--device", "cpu", "--tokens", f"@{tmp_path / 'tokens.txt'}")
    assert r.returncode == 2, r.stderr
    one_line_error(r.stderr)
    assert "UTF-8" in r.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_os_exit_in_a_thread_or_an_atexit_handler_cannot_pass_a_failed_run(tmp_path):
    """Case 5, the two ways round the guard: os._exit from a thread of the model (was a traceback,
    then exit 0 with the full result), and an atexit handler of the model's module calling
    os._exit(0) after a failed run (the JSON said exit 3, the process exited 0)."""
    spec = write_model(tmp_path, forward="import threading; t = threading.Thread(target=os._exit, args=(0,)); "
                                         "t.start(); t.join()")
    r = torchdiag("summary", spec, "--json")
    assert r.returncode == 3, r.stderr
    one_line_error(r.stderr)
    assert "os._exit(0) in a thread" in r.stderr and json.loads(r.stdout)["exit_code"] == 3
    spec = write_model(tmp_path, factory='raise ValueError("no model today")',
                       top="import atexit, os\natexit.register(lambda: os._exit(0))\n")
    r = torchdiag("summary", spec, "--json")
    assert r.returncode == 3, r.stderr
    one_line_error(r.stderr)
    assert json.loads(r.stdout)["exit_code"] == 3 and "os._exit(0) at exit; ignored" in r.stderr


@pytest.mark.parametrize("command", ["summary", "nancheck", "gradflow", "doctor"])
def test_a_float_input_into_an_embedding_says_to_use_integer_ids(cli, tmp_path, command):
    """The first-hour report: `-i 2x32` into a model whose first layer is an nn.Embedding said only "the
    model's own code raised"; the tool knows the module is an embedding and says what dtype it wants."""
    (tmp_path / "emb.py").write_text("from torch import nn\n"
                                     "def build():\n"
                                     "    return nn.Sequential(nn.Embedding(100, 8), nn.Flatten(), nn.Linear(8 * 32, 4))\n")
    r = cli(command, f"{tmp_path}/emb.py:build", "-i", "3x32", "--device", "cpu")
    assert r.code == 3
    assert "0 is an nn.Embedding and was given floating-point values" in r.stderr
    assert "hint: give the input an integer dtype: -i 3x32:int64[0,100)" in r.stderr
    assert r.stderr.count("\n") == 2 and "Traceback" not in r.stderr
    # a sweep: ids past the vocabulary said only "IndexError: index out of range in self"
    r = cli(command, f"{tmp_path}/emb.py:build", "-i", "3x32:int64[0,500)", "--device", "cpu")
    assert r.code == 3 and "0 is an nn.Embedding of 100 rows and got an index of 100 or more" in r.stderr, r.stderr
    assert "give ids in [0, 100)" in r.stderr and r.stderr.count("\n") == 2


def test_an_index_past_a_position_table_says_both_causes_and_another_index_error_neither(cli, tmp_path):
    """A review of the message above: a position table (32 rows) read by positions the model makes was told to take
    ids in [0, 32) (the sequence, 64, was the cause), and a list index error inside an Embedding subclass was read as
    an id out of range."""
    (tmp_path / "pos.py").write_text(
        "import torch\nfrom torch import nn\n"
        "class Pos(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.tok, self.pos = nn.Embedding(1000, 8), nn.Embedding(32, 8)\n"
        "    def forward(self, x):\n"
        "        return self.tok(x) + self.pos(torch.arange(x.shape[1]))\n"
        "class Listed(nn.Embedding):\n"
        "    def forward(self, x):\n"
        "        return super().forward(x) * [1.0][5]\n"
        "def pos():\n    return Pos()\n"
        "def listed():\n    return Listed(10, 4)\n")
    r = cli("summary", f"{tmp_path}/pos.py:pos", "-i", "2x64:int64[0,1000)", "--device", "cpu")
    assert r.code == 3 and "pos is an nn.Embedding of 32 rows" in r.stderr, r.stderr
    assert "a sequence of at most 32" in r.stderr
    r = cli("summary", f"{tmp_path}/pos.py:listed", "-i", "4:int64[0,10)", "--device", "cpu")
    assert r.code == 3 and "list index out of range" in r.stderr and "nn.Embedding of" not in r.stderr, r.stderr
