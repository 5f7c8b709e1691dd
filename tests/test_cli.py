"""The CLI contract: help without torch, versions, examples in every command's help."""
import subprocess
import sys

from conftest import ROOT

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
