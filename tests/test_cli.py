"""The CLI contract: help without torch, versions, examples in every command's help."""
import subprocess
import sys

import json

import pytest

from conftest import FAST_RUNS, ROOT

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


def test_help_does_not_import_torch():
    out = _probe(["--help"])
    assert "Commands" in out and "HEAVY=\n" in out


def test_version_does_not_import_torch():
    out = _probe(["--version"])
    assert "torchdiag 0." in out and "HEAVY=\n" in out


def test_command_help_does_not_import_torch_and_shows_example():
    from torchdiag.cli.app import COMMANDS, app

    registered = [c.name for c in app.registered_commands]
    assert registered, "no commands registered"
    for name in registered:
        out = _probe([name, "--help"])
        assert "HEAVY=\n" in out, f"{name} --help imported {out.splitlines()[-1]}"
        assert f"torchdiag {name} " in out, f"{name} --help has no example"


def test_python_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "torchdiag", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.startswith("torchdiag ")


@pytest.mark.parametrize("command", sorted(FAST_RUNS))
def test_every_command_prints_exactly_one_json_document(cli, command):
    res = cli(command, *FAST_RUNS[command], "--json")
    assert res.code in (0, 1), res.stderr
    doc = json.loads(res.stdout)  # the whole stdout is one document
    assert doc["schema_version"] == 1 and doc["command"] == command and doc["exit_code"] == res.code
    assert isinstance(doc["findings"], list)


def test_option_errors_are_one_error_line_and_json_document():
    out = subprocess.run([sys.executable, "-m", "torchdiag", "summary", "sample_models/mlp.py:build", "--depth", "-1",
                          "--json"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.startswith("error: Invalid value for '--depth'") and "Traceback" not in out.stderr
    assert json.loads(out.stdout)["exit_code"] == 2
    out = subprocess.run([sys.executable, "-m", "torchdiag", "flops", "--bogus"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.splitlines()[0].startswith("error: No such option: --bogus")
