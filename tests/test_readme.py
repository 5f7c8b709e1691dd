"""Every console example in README.md and the documentation site (docs/**/*.md) is what the command
prints: each `$ torchdiag …` line inside a fenced block is run, and its excerpt compared with the real
output and exit code.

An example block is fenced with its exit code, and the terminal width it was captured at, in the
block's title (which the site shows above the block):

    ```text title="exit 1 · 100 columns"
    $ torchdiag nancheck sample_models/broken_nan_forward.py:build
    …lines of the output…
    ```

The excerpt is the lines after the `$ torchdiag` line up to the next `$ ` line or the block's end. It
may leave lines out (table borders, rows it does not show; a `…` or `...` line marks a cut), so every
line it does show must appear in the output, in the same order, with trailing spaces and colour
ignored. A command may continue over lines ending in ` \\`. A block with a `$ torchdiag` line and no
`exit N` in its title fails: every example states its exit code. Not run: a block whose title starts
with `illustration` (the title says why, e.g. it needs torchvision), commands shown without `$ ` (in
prose, or alone in a block), and the pages mkdocs.yml's `exclude_docs` keeps out of the site.

Examples run in a scratch folder that links `sample_models/` and `docs/` from the repository, so
the relative paths they print are the documented ones and the files they write (`--out`, `--images`,
`--junit`) land in the scratch folder; the files an example names that the repository does not hold
(`net.py` and its checkpoints, a Hugging Face config folder, a Hugging Face cache under the scratch folder, which
is the example's home folder) are made there by tests/doc_examples.py.
A `torchdiag check` example reads the first
`[tool.torchdiag]` TOML block of its own page as its pyproject.toml. The excerpts were captured on a
machine without a GPU; the tests simulate one, so they pass on a GPU box too."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import doc_examples
import pytest

from support import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TITLE = re.compile(r'title="([^"]*)"')
ELIDED = ("…", "...")

# Excerpts the README used to test by name (issue 13), now on the pages where they live: the
# collection below must keep finding them, so moving or rewording one cannot drop it silently.
MUST_COVER = [
    "torchdiag summary sample_models/transformer_lm.py:build --depth 2",
    "torchdiag flops sample_models/resnet.py:resnet50 -i 1x3x224x224 --device meta --depth 1",
    "torchdiag nancheck sample_models/broken_nan_forward.py:build",
    "torchdiag gradflow sample_models/broken_detached.py:build --depth 2",
    "torchdiag doctor sample_models/broken_doctor_device.py:build",
    "torchdiag gradcheck sample_models/custom_autograd.py:WrongMulSquare -i 3 -i 3",
    "torchdiag summary sample_models/mlp.py:buidl",
    "torchdiag summary sample_models/broken_shape.py:build",
    "torchdiag check --junit reports/torchdiag.xml",
]


@dataclass
class Example:
    page: Path
    line: int            # 1-based line of the `$ torchdiag` line
    command: str         # as written, continuations joined
    shown: list[str]     # the excerpt's lines
    code: int | None     # the exit code the block's title states
    columns: int

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def excluded() -> set[Path]:
    """Pages mkdocs.yml's `exclude_docs` keeps out of the site (one file name per line): not published,
    so their examples are not run either."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    block = re.search(r"^exclude_docs: \|\n((?:  .*\n)+)", text, re.M)
    return {DOCS / line.strip() for line in block.group(1).splitlines()} if block else set()


def pages() -> list[Path]:
    return [README, *sorted(set(DOCS.rglob("*.md")) - excluded())]


def examples_in(page: Path) -> list[Example]:
    """The `$ torchdiag …` examples of one Markdown file, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("```"):
            i += 1
            continue
        title = TITLE.search(lines[i])
        end = next((j for j in range(i + 1, len(lines)) if lines[j].lstrip().startswith("```")), len(lines))
        code = columns = None
        if title and title.group(1).startswith("illustration"):    # shown, not run (says why in its title)
            i = end + 1
            continue
        if title:
            m = re.search(r"\bexit (\d+)", title.group(1))
            code = int(m.group(1)) if m else None
            m = re.search(r"(\d+) columns", title.group(1))
            columns = int(m.group(1)) if m else None
        j = i + 1
        while j < end:
            if not lines[j].startswith("$ torchdiag"):
                j += 1
                continue
            start, command = j, lines[j][2:]
            while command.endswith("\\") and j + 1 < end:
                j += 1
                command = command[:-1].rstrip() + " " + lines[j].strip()
            body = []
            j += 1
            while j < end and not lines[j].startswith("$ "):
                body.append(lines[j])
                j += 1
            found.append(Example(page, start + 1, command, body, code, columns or 120))
        i = end + 1
    return found


def all_examples() -> list[Example]:
    return [ex for page in pages() for ex in examples_in(page)]


def assert_shown(ex: Example, output: str) -> None:
    """Every line the excerpt shows is in the output, in order (trailing spaces and colour ignored)."""
    shown = [line.rstrip() for line in ex.shown if line.strip() and line.strip() not in ELIDED
             and not line.lstrip().startswith("…")]
    real = [ANSI.sub("", line).rstrip() for line in output.splitlines()]
    pos = 0
    for line in shown:
        try:
            pos = next(i for i in range(pos, len(real)) if _same_line(line, real[i])) + 1
        except StopIteration:
            pytest.fail(f"{ex.id}: the excerpt of {ex.command!r} no longer matches the real output.\n"
                        f"line not found (in order):\n  {line}\nreal output:\n" + "\n".join(real))


NUMBER = re.compile(r"\d+\.\d+")


def _same_line(shown: str, real: str) -> bool:
    """The same line, or one whose decimals differ by at most one in the last digit shown: a float32 result's last
    digit flips with the CPU and the thread count (Adam's loss 0.0160904 on one machine, 0.0160903 on another with one
    thread). Every other character must match."""
    if shown == real:
        return True
    a, b = NUMBER.split(shown), NUMBER.split(real)
    if a != b:
        return False
    for x, y in zip(NUMBER.findall(shown), NUMBER.findall(real)):
        places = len(x.split(".")[1])
        if len(y.split(".")[1]) != places or abs(float(x) - float(y)) > 1.01 * 10 ** -places:
            return False
    return True


def test_a_shown_number_may_differ_in_its_last_digit_only():
    assert _same_line("Final loss      0.0160904  (0.00701 × initial)", "Final loss      0.0160903  (0.00701 × initial)")
    assert not _same_line("Final loss      0.0160904", "Final loss      0.0160914")
    assert not _same_line("Final loss      0.0160904", "Final loss      0.016090")
    assert not _same_line("Steps 13 of 500", "Steps 14 of 500")   # whole numbers are exact
    assert not _same_line("loss 0.5 → 0.1 PASS", "loss 0.5 → 0.1 FAIL")


def scratch_folder(tmp_path: Path, ex: Example) -> Path:
    """A working folder where the example's relative paths resolve as in the repository root."""
    for name in ("sample_models", "docs"):
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    doc_examples.make(tmp_path, shlex.split(ex.command))
    if shlex.split(ex.command)[1] == "check":
        text = ex.page.read_text(encoding="utf-8")
        config = re.search(r"```toml\n(\[tool\.torchdiag\].*?)```", text, re.S)
        assert config, f"{ex.id}: a check example needs a [tool.torchdiag] TOML block on its page"
        (tmp_path / "pyproject.toml").write_text(config.group(1))
    return tmp_path


EXAMPLES = all_examples()


def test_the_examples_are_collected():
    """The parser finds the examples that used to be tested by name, and each states its exit code."""
    commands = [ex.command for ex in EXAMPLES]
    for wanted in MUST_COVER:
        assert wanted in commands, f"no `$ {wanted}` example in README.md or docs/ any more"
    undocumented = [ex.id for ex in EXAMPLES if ex.code is None]
    assert not undocumented, f"examples without `exit N` in their block's title: {undocumented}"


def test_the_parser_reads_titles_excerpts_and_continuations(tmp_path):
    """The collection itself: a title's exit code and width, `\\` continuations, the excerpt's end."""
    page = tmp_path / "page.md"
    page.write_text('text\n```text title="exit 3 · 90 columns"\n$ torchdiag summary a.py:b \\\n    --depth 1\n'
                    'one\n…\ntwo\n$ echo done\n```\n```\n$ torchdiag flops x.py:y\n```\n', encoding="utf-8")
    first, second = examples_in(page)
    assert (first.line, first.command, first.code, first.columns) == (3, "torchdiag summary a.py:b --depth 1", 3, 90)
    assert first.shown == ["one", "…", "two"]
    assert (second.command, second.code, second.columns) == ("torchdiag flops x.py:y", None, 120)


@pytest.mark.parametrize("ex", EXAMPLES, ids=[ex.id for ex in EXAMPLES])
def test_example_matches_the_real_output(ex, cli, tmp_path, monkeypatch):
    assert ex.code is not None, f"{ex.id}: state the exit code in the block's title (title=\"exit N\")"
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)   # the excerpts are CPU-only runs, even on a GPU box
    # hf:NAME examples: ~ is the scratch folder, so the Hugging Face cache is one the example made (or none)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(scratch_folder(tmp_path, ex))
    monkeypatch.setenv("COLUMNS", str(ex.columns))
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    args = shlex.split(ex.command)
    assert args[0] == "torchdiag"
    r = cli(*args[1:])
    assert r.code == ex.code, f"{ex.id}: exit {r.code}, documented {ex.code}\n" + r.stdout + r.stderr
    assert_shown(ex, r.stdout + r.stderr)
    assert not (tmp_path / "PWNED").exists()     # the checkpoint that would run code was never run
    if args[1] == "check" and "--junit" in args:
        assert (tmp_path / args[args.index("--junit") + 1]).is_file()
