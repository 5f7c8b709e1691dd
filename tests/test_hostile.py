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


def test_prints_stay_on_stdout_without_json(tmp_path):
    r = torchdiag("summary", write_model(tmp_path, forward='print("from forward")'))
    assert r.returncode == 0, r.stderr
    assert "from forward" in r.stdout


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


def test_os_exit_in_forward_is_a_model_failure_not_exit_0(tmp_path):
    r = torchdiag("summary", write_model(tmp_path, forward="os._exit(0)"), "--json")
    assert r.returncode == 3, (r.stdout, r.stderr)
    one_line_error(r.stderr)
    assert "os._exit(0)" in r.stderr
    assert json.loads(r.stdout)["exit_code"] == 3


def test_base_exception_subclass_is_exit_3_with_json(tmp_path):
    top = "class Stop(BaseException):\n    pass\n"
    r = torchdiag("summary", write_model(tmp_path, forward='raise Stop("halt")', top=top), "--json")
    assert r.returncode == 3, r.stderr
    one_line_error(r.stderr)
    assert "Stop" in r.stderr
    assert json.loads(r.stdout)["error"]["message"]


def test_exception_whose_str_raises(tmp_path):
    top = "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no str')\n"
    r = torchdiag("summary", write_model(tmp_path, forward="raise Odd()", top=top))
    assert r.returncode == 3, r.stderr
    one_line_error(r.stderr)
    assert "Odd" in r.stderr


def test_sigterm_is_handled_like_ctrl_c(tmp_path):
    marker = tmp_path / "started"
    spec = write_model(tmp_path, forward=f'open({str(marker)!r}, "w").close(); import time; time.sleep(3600)')
    p = subprocess.Popen([sys.executable, "-m", "torchdiag", "summary", spec, "--json"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_GUARD
    while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)   # follows the subprocess's progress: its forward has started
    assert marker.exists(), p.communicate()[1]
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=HANG_GUARD)
    assert p.returncode == 143, err
    one_line_error(err)
    doc = json.loads(out)
    assert doc["exit_code"] == 143 and "SIGTERM" in doc["error"]["message"]


def test_huge_seed_is_a_usage_error(tmp_path):
    r = torchdiag("summary", write_model(tmp_path), "--seed", str(2**70))
    assert r.returncode == 2, r.stderr
    one_line_error(r.stderr)
    assert "--seed" in r.stderr


def test_deeply_nested_arg_is_a_string_not_a_crash(tmp_path):
    spec = write_model(tmp_path, factory="assert isinstance(kw['x'], str), type(kw['x'])")
    r = torchdiag("summary", spec, "--arg", "x=" + "-" * 5000 + "1")
    assert r.returncode == 0, r.stderr


def test_non_utf8_pyproject_is_a_usage_error(tmp_path):
    (tmp_path / "pyproject.toml").write_bytes(b"[tool.torchdiag]\nmodel = \"m.py:build\" # \xff\xfe\n")
    r = torchdiag("check", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    one_line_error(r.stderr)
    assert "UTF-8" in r.stderr


def test_ascii_only_terminal_encoding(tmp_path):
    r = torchdiag("summary", write_model(tmp_path), env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr


def test_users_rich_py_does_not_shadow_the_library(tmp_path):
    (tmp_path / "rich.py").write_text("raise ImportError('this is the user\\'s own rich.py')\n")
    r = torchdiag("summary", write_model(tmp_path))
    assert r.returncode == 0, r.stderr


def test_torchscript_model_is_a_usage_error(tmp_path):
    spec = write_model(tmp_path).replace(":build", ":scripted")
    Path(spec.split(":")[0]).write_text(Path(spec.split(":")[0]).read_text() +
                                        "\ndef scripted():\n    return torch.jit.script(Net())\n")
    for command in ("summary", "gradflow", "doctor"):
        r = torchdiag(command, spec, "--device", "cpu")
        assert r.returncode == 2, (command, r.stderr)
        one_line_error(r.stderr)
        assert "TorchScript" in r.stderr


def test_closed_stdout_keeps_the_exit_code(tmp_path):
    spec = write_model(tmp_path)
    r = subprocess.run(f'"{sys.executable}" -m torchdiag summary "{spec}" >&-', shell=True, capture_output=True,
                       text=True, timeout=HANG_GUARD)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr


def test_rng_state_at_exit_is_where_the_factory_left_it(tmp_path):
    """Through the CLI as through the API: diagnostics put the global RNG back where build() left it."""
    out = tmp_path / "rng.txt"
    factory = (f"import atexit; net = Net(); torch.randn(3); after = torch.random.get_rng_state().clone(); "
               f"atexit.register(lambda: open({str(out)!r}, 'w').write(str(torch.equal(after, torch.random.get_rng_state())))); "
               f"return net")
    spec = write_model(tmp_path, factory=factory)
    for command in ("summary", "nancheck", "gradflow"):
        r = torchdiag(command, spec, "--device", "cpu")
        assert r.returncode == 0, (command, r.stderr)
        assert out.read_text() == "True", command
