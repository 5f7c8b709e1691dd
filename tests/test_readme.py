"""The README's console excerpts are what the commands print (issue 13): a handful of deterministic
excerpts are taken from README.md by their command line and compared with a real run.

An excerpt may leave lines out (table borders, a `…` line, rows it does not show), so every line it
does show must appear in the output, in the same order, with trailing spaces ignored. Each excerpt is
compared at the terminal width it was captured at (COLUMNS), so a wording, number, row or wrapping
change that is not reflected in the README fails here; update the README from the real output.
The excerpts were captured on a machine without a GPU; the tests simulate one, so they pass on a GPU
box too."""
from __future__ import annotations

import re
import shutil

import pytest

from support import ROOT

README = ROOT / "README.md"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def excerpt(marker: str) -> list[str]:
    """The console excerpt for `marker` (a command line as the README writes it).

    `$ torchdiag …` inside a block: the lines after it, up to the next `$ ` line or the block's end.
    Otherwise (the command in prose or alone in its own block): the next code block."""
    lines = README.read_text(encoding="utf-8").splitlines()
    hits = [i for i, line in enumerate(lines) if marker in line]
    assert hits, f"README.md no longer holds {marker!r}: update tests/test_readme.py with the README"
    start = hits[0]
    inside = sum(line.startswith("```") for line in lines[:start]) % 2 == 1
    if lines[start].startswith("$ "):
        body = []
        for line in lines[start + 1:]:
            if line.startswith(("$ ", "```")):
                break
            body.append(line)
        return body
    i = start + 1
    if inside:                                   # skip the rest of the command's own block
        while not lines[i].startswith("```"):
            i += 1
        i += 1
    while not lines[i].startswith("```"):        # the next block is the output
        i += 1
    body = []
    for line in lines[i + 1:]:
        if line.startswith("```"):
            break
        body.append(line)
    return body


def assert_shown(marker: str, output: str) -> None:
    """Every line the excerpt shows is in the output, in order (trailing spaces and colour ignored)."""
    shown = [line.rstrip() for line in excerpt(marker) if line.strip() and not line.lstrip().startswith("…")]
    real = [ANSI.sub("", line).rstrip() for line in output.splitlines()]
    pos = 0
    for line in shown:
        try:
            pos = real.index(line, pos) + 1
        except ValueError:
            pytest.fail(f"README excerpt for {marker!r} no longer matches the real output.\n"
                        f"README line not found (in order):\n  {line}\nreal output:\n" + "\n".join(real))


@pytest.fixture
def readme_run(cli, monkeypatch):
    """readme_run(columns, *args) → CliResult: the command as the README shows it, run from the
    repository root (the excerpts name sample_models/... relative to it; `cwd=` elsewhere) at a fixed
    width, uncoloured."""
    def run(columns: int, *args, cwd=ROOT):
        monkeypatch.chdir(cwd)
        monkeypatch.setenv("COLUMNS", str(columns))
        for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
            monkeypatch.delenv(name, raising=False)
        return cli(*args)

    return run


# (README marker, width the excerpt was captured at, exit code the README documents or implies)
CASES = [
    pytest.param("`torchdiag summary sample_models/transformer_lm.py:build --depth 2`", 100, 0, id="quick-start-summary"),
    pytest.param("torchdiag flops sample_models/resnet.py:resnet50 -i 1x3x224x224 --device meta --depth 1", 120, 0,
                 id="flops-meta"),
    pytest.param("torchdiag nancheck sample_models/broken_nan_forward.py:build", 100, 1, id="nancheck-forward"),
    pytest.param("torchdiag gradflow sample_models/broken_detached.py:build --depth 2", 100, 1, id="gradflow-detached"),
    pytest.param("torchdiag doctor sample_models/broken_doctor_device.py:build", 120, 1, id="doctor-device"),
    pytest.param("torchdiag gradcheck sample_models/custom_autograd.py:WrongMulSquare -i 3 -i 3", 120, 1,
                 id="gradcheck-wrong"),
    pytest.param("$ torchdiag summary sample_models/mlp.py:buidl", 120, 2, id="error-factory"),
    pytest.param("$ torchdiag summary sample_models/broken_shape.py:build", 120, 3, id="error-forward"),
]


@pytest.mark.parametrize("marker, columns, code", CASES)
def test_readme_excerpt_matches_the_real_output(marker, columns, code, readme_run, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)   # the excerpts are CPU-only runs, even on a GPU box
    args = marker.strip("`").removeprefix("$ ").split()
    assert args[0] == "torchdiag"
    r = readme_run(columns, *args[1:])
    assert r.code == code, r.stdout + r.stderr
    assert_shown(marker, r.stdout + r.stderr)


def test_readme_check_excerpt_with_the_readme_config(readme_run, tmp_path, monkeypatch):
    """`torchdiag check` on the README's own [tool.torchdiag] example: the documented config is valid
    and gives the documented table (the JUnit file lands where the excerpt says)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)   # a CPU-only machine, even on a GPU box
    text = README.read_text(encoding="utf-8")
    config = re.search(r"```toml\n(\[tool\.torchdiag\].*?)```", text, re.S).group(1)
    (tmp_path / "pyproject.toml").write_text(config)
    (tmp_path / "sample_models").mkdir()
    shutil.copy(ROOT / "sample_models" / "cnn.py", tmp_path / "sample_models")
    r = readme_run(100, "check", "--junit", "reports/torchdiag.xml", cwd=tmp_path)
    assert r.code == 0, r.stdout + r.stderr
    assert_shown("$ torchdiag check --junit reports/torchdiag.xml", r.stdout + r.stderr)
    assert (tmp_path / "reports" / "torchdiag.xml").is_file()
