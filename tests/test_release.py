"""The release and the site: the documentation builds with warnings as errors, the built wheel installs
into a fresh virtualenv and runs, and the CI examples run the command the suite runs.

The wheel test makes a fresh virtualenv and lets it see the dependencies already installed for the suite
(torch, typer, rich, ...) through a .pth line naming the suite's site-packages, the same effect as
`python -m venv --system-site-packages` when those live in the system Python: no download of gigabytes.
A path added that way is not a site directory, so the suite's own editable torchdiag (a .pth finder
there) is not activated: torchdiag comes only from the wheel, installed with --no-deps, and is run from
outside the source tree, so a file missing from the package (package data, a module left out) fails here."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from support import ROOT

yaml = pytest.importorskip("yaml")


def run(cmd, cwd, timeout=900, env=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    return r


@pytest.mark.slow
def test_docs_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    r = run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for page in ("index.html", "summary/index.html", "troubleshooting/index.html", "reference/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    # the reference is generated from the docstrings: the command functions are there
    reference = (tmp_path / "site" / "reference" / "index.html").read_text(encoding="utf-8")
    for name in ("torchdiag.api.summary", "torchdiag.api.gradcheck", "torchdiag.testing.assert_finite"):
        assert f'id="{name}"' in reference, name


@pytest.mark.slow
def test_built_wheel_installs_and_runs(tmp_path):
    pytest.importorskip("build")
    dist = tmp_path / "dist"
    r = run([sys.executable, "-m", "build", "--wheel", "--sdist", "--no-isolation", "--outdir", str(dist), str(ROOT)], ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels, sdists = list(dist.glob("torchdiag-*.whl")), list(dist.glob("torchdiag-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    # no PYTHONPATH: one naming the source tree would show pip (and python) the tree's torchdiag as installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)   # the suite's pip installs into it (--python): no ensurepip
    py = env_dir / "bin" / "python"
    purelib = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env=env).stdout.strip()
    Path(purelib, "_suite_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
             "--no-compile", str(wheels[0])], tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    outside = tmp_path / "elsewhere"                  # not the source tree: the wheel's files only
    outside.mkdir()
    r = run([str(py), "-c", "import torchdiag, pathlib; print(pathlib.Path(torchdiag.__file__).parent)"], outside, env=env)
    assert r.returncode == 0 and str(env_dir) in r.stdout, r.stdout + r.stderr   # not an editable or the tree's copy
    exe = env_dir / "bin" / "torchdiag"
    r = run([str(exe), "--help"], outside, env=env)
    assert r.returncode == 0 and "summary" in r.stdout, r.stdout + r.stderr
    r = run([str(exe), "--version"], outside, env=env)
    assert r.returncode == 0 and r.stdout.split()[-1] in wheels[0].name, r.stdout + r.stderr
    model = outside / "tiny.py"
    model.write_text("import torch\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))\n")
    r = run([str(exe), "summary", "tiny.py:build", "-i", "2x4", "--json"], outside, env=dict(env, CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    doc = json.loads(r.stdout)
    assert doc["total_params"] == 4 * 3 + 3 + 3 * 2 + 2     # 23, by hand
    sample = ROOT / "sample_models" / "mlp.py"                 # and a sample model of the repository
    r = run([str(exe), "flops", f"{sample}:build", "--json"], outside, env=dict(env, CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    batch = doc["inputs"][0].split(":")[1].strip().split("x")[0]       # 'input[0]: 16x784 float32'
    assert doc["forward_macs"] == int(batch) * (784 * 256 + 256 * 128 + 128 * 10)   # the three Linear layers


def ci_command_of_the_docs() -> str:
    """The `torchdiag check` step of docs/ci.md's GitHub Actions workflow."""
    text = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    workflow = yaml.safe_load(block)
    assert "jobs" in workflow, workflow
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    runs = [s["run"] for s in steps if "run" in s and s["run"].startswith("torchdiag")]
    assert len(runs) == 1, runs
    reporter = [s for s in steps if "junit" in s.get("uses", "")]
    assert reporter and reporter[0]["with"]["report_paths"] in runs[0], "the reporter reads the file check writes"
    return runs[0]


def test_ci_examples_run_the_gate(tmp_path):
    """The pre-commit hook (run as pre-commit runs it: its entry, no file names) and the GitHub Actions
    step of docs/ci.md run the same command, and that command passes on the check page's config."""
    import re
    import shutil

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))
    hook = next(h for h in hooks if h["id"] == "torchdiag-check")
    assert hook["entry"] == "torchdiag check" and hook["language"] == "system" and hook["pass_filenames"] is False
    step = ci_command_of_the_docs()
    assert shlex.split(step)[:2] == shlex.split(hook["entry"])
    config = re.search(r"```toml\n(\[tool\.torchdiag\].*?)```", (ROOT / "docs" / "check.md").read_text(encoding="utf-8"), re.S)
    (tmp_path / "pyproject.toml").write_text(config.group(1))
    (tmp_path / "sample_models").mkdir()
    shutil.copy(ROOT / "sample_models" / "cnn.py", tmp_path / "sample_models")
    exe = Path(sys.executable).parent / "torchdiag"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", COLUMNS="100")
    for command in (hook["entry"], step):              # language: system runs the entry as a command line
        args = shlex.split(command)
        r = run([str(exe), *args[1:]], tmp_path, env=env)
        assert r.returncode == 0, command + "\n" + r.stdout + r.stderr
        assert "PASS: 5 check(s) passed" in r.stdout
    assert (tmp_path / "reports" / "torchdiag.xml").is_file()
