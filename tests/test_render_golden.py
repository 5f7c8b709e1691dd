"""Golden tests of the console renderer (issue 13): fixed, hand-built Results rendered by
`torchdiag.render.console.print_result` at a fixed width, compared with checked-in text.

Each case below renders into tests/golden/console_<case>.txt: a Rich console 100 columns wide, no colour,
not a terminal (what a CI log gets, apart from the width); trailing whitespace is dropped from every line.
A mismatch fails with a unified diff (golden file → rendered now).

When a change to the renderer is intended, regenerate the files and read the diff before committing:

    TORCHDIAG_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_render_golden.py
    git diff tests/golden/

Colours and styles do not show in plain text: `test_row_style_and_severity_colours` checks them on an
ANSI console instead.
"""
from __future__ import annotations

import difflib
import os
import re
from io import StringIO
from pathlib import Path

import pytest

from torchdiag.results import Column, Finding, Result, Table

GOLDEN = Path(__file__).resolve().parent / "golden"
WIDTH = 100
UPDATE = os.environ.get("TORCHDIAG_UPDATE_GOLDEN") == "1"


def render(result: Result, **console_options) -> str:
    from rich.console import Console

    from torchdiag.render.console import print_result

    out = StringIO()
    options = dict(width=WIDTH, color_system=None, force_terminal=False, highlight=False, soft_wrap=False,
                   legacy_windows=False, _environ={})  # _environ: no COLUMNS/FORCE_COLOR/NO_COLOR from outside
    options.update(console_options)
    print_result(result, console=Console(file=out, **options))
    return out.getvalue()


def normalise(text: str) -> str:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- cases

def header_and_column_kinds() -> Result:
    """Header (model, device, inputs, input notes, other choices) and one column of every kind."""
    r = Result("summary", header={
        "model": "sample_models/cnn.py:build", "device": "cpu", "input_source": "--input",
        "inputs": ["8x3x32x32 float32", "8 int64 in [0, 10)"], "input_notes": ["second input drawn at random"],
        "loss": "cross_entropy (auto: (N, C) float output)", "seed": 0, "mode": "train"})
    r.tables.append(Table("layers", "Layers", kinds_columns(), kinds_rows()))
    return r


def kinds_columns() -> list[Column]:
    return [Column("name", "module"), Column("params", "params", "int"), Column("calls", "calls", "count"),
            Column("bytes", "memory", "bytes"), Column("flops", "MACs", "flops"), Column("share", "share", "pct"),
            Column("time", "time", "float", "ms"), Column("_bar", "share", "bar")]


def kinds_rows() -> list[dict]:
    return [
        {"name": "features.0", "params": 448, "calls": 1, "bytes": 1023, "flops": 3538944, "share": 0.5,
         "time": 0.123456, "_bar": "██████████          "},
        {"name": "features.1", "params": 0, "calls": 12, "bytes": 1048576, "flops": 0, "share": 0.0004,
         "time": 123456.7, "_bar": "▏                   "},
        {"name": "head", "params": 1234567, "calls": 1, "bytes": 3 * 2**30, "flops": 2.5e12, "share": 1.0,
         "time": 0.0, "_bar": "████████████████████"},
        {"name": "aux", "params": None, "calls": None, "bytes": None, "flops": None, "share": None,
         "time": float("nan"), "_bar": None},
    ]


def limit_note_and_hidden_tables() -> Result:
    """A row limit (the rest is in --json), a note under a table; tables with show=False or no rows
    are not printed; rows marked `_hidden` (a brief table: gradflow's activation health) are not printed."""
    r = Result("profile", header={"model": "m.py:build", "device": "cpu"})
    r.tables.append(Table("ops", "Top 3 of 5 operators by self CPU time", [
        Column("name", "operator"), Column("shapes", "input shapes"), Column("calls", "calls", "count"),
        Column("self", "self CPU", "float", "ms")],
        [{"name": f"aten::op{i}", "shapes": [[16, 784], [784]] if i == 1 else [], "calls": 10 * i, "self": 5.0 / i}
         for i in range(1, 6)],
        note="totals over 2 active step(s)", limit=3))
    r.tables.append(Table("all_ops", "Every operator (JSON only)", [Column("name", "operator")],
                          [{"name": "aten::mm"}], show=False))
    r.tables.append(Table("kernels", "CUDA kernels", [Column("name", "kernel")], []))
    r.tables.append(Table("modules", "Time per module", [
        Column("name", "module"), Column("t", "time", "float", "ms")],
        [{"name": "0", "t": 1.5}, {"name": "1", "t": 0.25}], limit=2, note="limit equal to the row count: no '… more'"))
    r.tables.append(Table("activations", "Brief table", [
        Column("module", "module"), Column("dead", "dead units", "pct")],
        [{"module": "relu1", "dead": 0.01, "_hidden": True}, {"module": "relu2", "dead": 0.75},
         {"module": "relu3", "dead": 0.02, "_hidden": True}]))
    return r


def findings_each_severity_failing() -> Result:
    """Findings of each severity, with and without hint and module path; summary; notes; an error makes
    the verdict a failure."""
    r = Result("gradflow", header={"model": "broken.py:build", "device": "cpu"})
    r.findings = [
        Finding("no-grad", "error", "encoder.layers.0.linear1", "gradient is None after backward",
                "the parameter is not used in forward, or its output was detached"),
        Finding("exploding-grad", "warning", "head.weight", "grad norm 3.2e+04 is above 1e+03"),
        Finding("zero-grad", "info", "", "2 of 14 parameters have an all-zero gradient",
                "normal for a bias before a train-mode BatchNorm"),
        Finding("custom", "debug", "x", "a severity the renderer has no colour for"),
    ]
    r.summary = [("Loss", "2.3026 (cross_entropy)"), ("Parameters checked", "14"), ("Flagged", "3")]
    r.notes = ["gradients of one batch, seed 0", "depth ≤ 4"]
    r.verdict = "FAIL: 1 error, 1 warning"
    return r


def summary_notes_passing_verdict() -> Result:
    """No tables, no findings: summary lines aligned on the longest label, notes, a passing verdict."""
    r = Result("overfit-batch", header={"model": "mlp.py:build", "device": "cpu", "optimizer": "adam lr=0.001",
                                        "steps": 30})
    r.summary = [("Loss", "2.30 → 0.0012 in 30 steps"), ("Accuracy on the batch", "100.0%"), ("Time", "0.8 s")]
    r.notes = ["the model was trained on a copy; yours is untouched"]
    r.verdict = "PASS: the model can overfit one batch"
    return r


def empty() -> Result:
    """Nothing but the command: one line."""
    return Result("summary")


def long_text_wraps() -> Result:
    """Long module names (first column: never broken), long cells (folded), long notes, findings and
    hints wider than the console."""
    long_name = "encoder.layers.11.self_attention.out_proj"
    r = Result("nancheck", header={"model": "a/rather/deep/path/to/some/project/models/transformer_factory.py:build",
                                   "device": "cpu", "checks": "forward outputs, parameter gradients, parameters "
                                   "and buffers after an optimizer step, each module's output in execution order"})
    r.tables.append(Table("first", "First non-finite values", [
        Column("name", "module"), Column("what", "what"), Column("detail", "detail"), Column("count", "count", "count")], [
        {"name": long_name, "what": "output", "count": 3,
         "detail": "NaN in 3 of 4096 elements; the inputs were finite, so this module produced them first"},
        {"name": "head", "what": "grad", "count": 1, "detail": "inf"},
    ], note="a note under the table that is long enough to run past the hundredth column of the console, "
            "so it has to wrap onto a second line"))
    r.findings = [Finding("non-finite-output", "error", long_name,
                          "the output holds NaN (3 of 4096 elements) while every input was finite: "
                          "look at the arithmetic of this module first, then at its parameters",
                          "run with --anomaly to get the backward function that produced it, or check for "
                          "log/sqrt/division of values that can reach zero or below")]
    r.notes = ["a note that is long enough to run past the hundredth column of the console, so that it "
               "has to wrap onto a second line"]
    r.verdict = ("FAIL: non-finite values first appear in the output of " + long_name +
                 ", after 3 forward passes of a batch of 16, at step 2 of 3")
    return r


def styled_rows() -> Result:
    """Rows carrying `_style` (shown as colour only: the key is not a column and the text is unchanged)."""
    r = Result("gradcheck", header={"model": "custom_autograd.py:MulSquare", "device": "cpu"})
    r.tables.append(Table("checks", "Gradient checks", [
        Column("input", "input"), Column("passed", "passed"), Column("max_abs_error", "max |error|", "float")], [
        {"input": "input[0]", "passed": True, "max_abs_error": 1.2e-12, "_style": None},
        {"input": "input[1]", "passed": False, "max_abs_error": 0.5, "_style": "red"},
        {"input": "input[2]", "passed": True, "max_abs_error": 0.0, "_style": "dim"},
    ]))
    r.failed = True
    r.verdict = "FAIL: input[1] has a wrong gradient"
    return r


CASES = {f.__name__: f for f in (header_and_column_kinds, limit_note_and_hidden_tables,
                                 findings_each_severity_failing, summary_notes_passing_verdict, empty,
                                 long_text_wraps, styled_rows)}


# ------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("case", sorted(CASES))
def test_console_output_matches_golden(case):
    path = GOLDEN / f"console_{case}.txt"
    got = normalise(render(CASES[case]()))
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"{path.relative_to(GOLDEN.parent.parent)} is missing: generate it with "
                    "TORCHDIAG_UPDATE_GOLDEN=1 and read it before committing", pytrace=False)
    want = path.read_text(encoding="utf-8")
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(keepends=True), got.splitlines(keepends=True),
                                            fromfile=f"tests/golden/{path.name}", tofile="rendered now"))
        pytest.fail(f"console output of case '{case}' changed (intended? regenerate with "
                    f"TORCHDIAG_UPDATE_GOLDEN=1, then read git diff tests/golden/):\n{diff}", pytrace=False)


def test_every_golden_file_has_a_case():
    wide = {f"console_{c}_{w}.txt" for c in WIDE_CASES for w in (80, 120)}
    stale = {p.name for p in GOLDEN.glob("console_*.txt")} - {f"console_{c}.txt" for c in CASES} - wide
    assert not stale, f"golden files without a case (delete them): {sorted(stale)}"


def test_no_line_is_wider_than_the_console():
    for case, build in CASES.items():
        for line in render(build()).splitlines():
            assert len(line.rstrip()) <= WIDTH, (case, line)


def test_row_style_and_severity_colours():
    """What plain text cannot show: a row's `_style` colours that row only; severities and the verdict
    have their colours (red failing verdict, green passing)."""
    ansi = render(styled_rows(), color_system="standard", force_terminal=True)
    rows = {m: line for line in ansi.splitlines() if line.startswith("│")
            for m in ("input[0]", "input[1]", "input[2]") if m in line}
    assert "\x1b[31m" in rows["input[1]"] and "\x1b[2m" in rows["input[2]"]
    assert not re.search(r"\x1b\[(31|2)m", rows["input[0]"])
    verdict = [line for line in ansi.splitlines() if "FAIL:" in line][0]
    assert "\x1b[1;31m" in verdict

    ansi = render(findings_each_severity_failing(), color_system="standard", force_terminal=True)
    line = {sev: next(ln for ln in ansi.splitlines() if sev in ln) for sev in ("ERROR", "WARNING", "INFO")}
    assert "\x1b[1;31m" in line["ERROR"] and "\x1b[33m" in line["WARNING"] and "\x1b[36m" in line["INFO"]

    ansi = render(summary_notes_passing_verdict(), color_system="standard", force_terminal=True)
    assert "\x1b[1;32mPASS:" in ansi


# Renderer defects found while writing the goldens, fixed in render/console.py: user text is never markup,
# numbers and bars are never split, a long row name leaves room for the other columns.

def test_text_in_brackets_is_printed_verbatim():
    r = Result("summary", header={"model": "m.py:build", "annotation": "dict[str, int]"})
    r.tables.append(Table("t", "T", [Column("name", "name")], [{"name": "blocks[i]"}], note="range [low, high]"))
    r.summary = [("Output", "list[tensor]")]
    r.findings = [Finding("x", "info", "", "message", hint="use [bold] as a word")]
    out = render(r)
    for text in ("dict[str, int]", "blocks[i]", "range [low, high]", "list[tensor]", "use [bold] as a word"):
        assert text in out, text


def test_closing_tag_text_in_a_note_does_not_crash():
    r = Result("summary", notes=["a closing [/tag] in a message"])
    assert "a closing [/tag] in a message" in render(r)


def too_wide_table() -> Result:
    """Ten columns whose natural width is about 130 columns, at 100."""
    cols = kinds_columns()
    cols[1:1] = [Column("type", "type")]
    cols.append(Column("shape", "output"))
    rows = kinds_rows()
    for row, (kind, shape) in zip(rows, [("Conv2d", [8, 16, 32, 32]), ("ReLU", [8, 16, 32, 32]),
                                         ("Linear", [8, 10]), ("Identity", None)]):
        row.update(type=kind, shape=shape)
    r = Result("summary")
    r.tables.append(Table("layers", "Layers", cols, rows))
    return r


def test_numbers_and_bars_are_never_split_across_lines():
    """At 140 columns everything fits whole; at 100 the bar (decoration) gives way first and is named as not
    shown, and every number is still whole."""
    wide = render(too_wide_table(), width=140).splitlines()
    for text in ("1,234,567", "1.235e+05", "1.00 MiB", "3.00 GiB", "████████████████████"):
        assert any(text in line for line in wide), text
    lines = normalise(render(too_wide_table())).splitlines()
    for text in ("1,234,567", "1.235e+05", "1.00 MiB", "3.00 GiB"):
        assert any(text in line for line in lines), text
    assert not any("█" in line for line in lines)
    assert "  not shown at 100 columns: share (a wider terminal or --json has them)" in lines


def test_a_long_first_column_leaves_room_for_the_others():
    name = "encoder.layers.11.self_attention.multi_head_attention_with_a_very_long_name.out_proj"
    r = Result("nancheck")
    r.tables.append(Table("first", "First non-finite values", [
        Column("name", "module"), Column("what", "what"), Column("detail", "detail")],
        [{"name": name, "what": "output", "detail": "NaN in 3 of 4096 elements"}]))
    lines = render(r).splitlines()
    assert len(lines) < 20, f"{len(lines)} lines for one row"
    assert any("output" in line for line in lines) and any("elements" in line for line in lines)


def test_a_crowded_table_wraps_headers_not_values():
    """gradflow's Parameters table (and an empty header) at 90 columns: numeric headers give way ('grad/weight' wraps), and no value
    is cut mid-word ('no-grad', '32x20'); the table stays inside the console."""
    cols = [Column("name", "parameter"), Column("shape", "shape"), Column("blank", ""), Column("g", "grad norm", "float"),
            Column("w", "weight norm", "float"), Column("r", "grad/weight", "float"), Column("m", "mean |grad|", "float"),
            Column("x", "max |grad|", "float"), Column("status", "status")]
    rows = [{"name": "context.0.weight", "shape": "32x20", "g": None, "w": 3.339, "r": None, "m": None, "x": None,
             "status": "no-grad"},
            {"name": "trunk.0.weight", "shape": "32x20", "g": 0.5928, "w": 3.319, "r": 0.1786, "m": 0.01641, "x": 0.1161,
             "status": "ok"}]
    r = Result("gradflow")
    r.tables.append(Table("params", "Parameters", cols, rows))
    lines = render(r, width=90).splitlines()       # the narrowest this table can be without cutting a value: 87
    assert all(len(line) <= 90 for line in lines), "\n".join(lines)
    body = [line for line in lines if "context.0.weight" in line or "trunk.0.weight" in line]
    assert len(body) == 2 and all("32x20" in line for line in body)
    assert "no-grad" in body[0] and "0.01641" in body[1] and "3.339" in body[0]


def test_long_headers_over_short_numbers_are_wrapped_not_cut():
    """lr-find's range-test table at 100 columns: too wide with every header whole, narrow enough with some
    headers wrapped (text columns at their comfortable width). Rich cannot narrow a no_wrap header, so it
    used to cut the last column: 'updates' and its value 48 showed as 'update' and '4'."""
    cols = [Column("seed", "seed", "int"), Column("status", "curve"), Column("i", "initial loss", "float"),
            Column("m", "lowest (smoothed)", "float"), Column("a", "at lr", "float"), Column("v", "valley", "float"),
            Column("stopped", "stopped"), Column("s", "at lr", "float"), Column("u", "updates", "int")]
    rows = [{"seed": k, "status": "ok", "i": 29.76, "m": 5.716, "a": 0.001597, "v": 3.353e-04, "stopped": "diverged",
             "s": 0.236, "u": 48} for k in range(2)]
    r = Result("lr-find")
    r.tables.append(Table("curves", "Range test: one curve per repeat", cols, rows))
    lines = render(r).splitlines()
    assert all(len(line.rstrip()) <= WIDTH for line in lines), "\n".join(lines)
    body = [line for line in lines if "diverged" in line]
    assert len(body) == 2 and all(line.rstrip().endswith("48 │") for line in body), "\n".join(lines)
    assert any("updates" in line for line in lines) and any("(smoothed)" in line for line in lines)


# ------------------------------------------------------------------- the same results at 80 and 120 columns

def checklist() -> Result:
    """doctor's checklist shape: a status column and a long hint column (a `note`), one failing row."""
    r = Result("doctor", header={"model": "sample_models/broken_doctor_frozen.py:build", "device": "cpu"})
    rows = [
        {"check": "devices", "status": "ok", "verdict": "no off-device tensor in forward (meta run)", "where": "", "hint": ""},
        {"check": "params update", "status": "error", "verdict": "2 of 6 params never change after 1 Adam step",
         "where": "encoder.layers.0.self_attn.out_proj", "hint": "register constants as buffers; give every trainable "
         "parameter to the optimizer"},
        {"check": "frozen params", "status": "info", "verdict": "1,600 of 1,732 params frozen in 1 module(s)",
         "where": "backbone", "hint": "intended? unfreeze with requires_grad_(True)"},
    ]
    r.tables.append(Table("checks", "Checklist", [
        Column("check", "check"), Column("status", "result", "status"), Column("verdict", "verdict"),
        Column("where", "where"), Column("hint", "hint", "note")], rows, note="full hints with each finding below"))
    r.findings = [Finding("param-not-updated", "error", "encoder.layers.0.self_attn.out_proj",
                          "2 of 6 parameters never change", "register constants as buffers; give every trainable "
                          "parameter to the optimizer with model.parameters()")]
    r.verdict = "FAIL: 1 error(s): param-not-updated"
    return r


def gradient_layers() -> Result:
    """gradflow's layer table shape: many numeric columns, a bar and a status column."""
    r = Result("gradflow", header={"model": "sample_models/cnn.py:build", "device": "cpu"})
    rows = [{"layer": f"features.{i}", "type": "Conv2d", "params": 448 * (i + 1), "grad_norm": 0.4442 / (i + 1),
             "mean": 0.01642, "max": 0.06929, "bar": "██████████▏", "status": s}
            for i, s in enumerate(["ok", "vanishing-grad", "no-grad"])]
    r.tables.append(Table("layers", "Gradient flow by layer (execution order)", [
        Column("layer", "layer"), Column("type", "type"), Column("params", "params", "count"),
        Column("grad_norm", "grad norm", "float"), Column("mean", "mean |grad|", "float"),
        Column("max", "max |grad|", "float"), Column("bar", "mean |grad| (log)", "bar"),
        Column("status", "status", "status")], rows))
    return r


WIDE_CASES = {f.__name__: f for f in (checklist, gradient_layers)}


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("case", sorted(WIDE_CASES))
def test_readable_at_80_and_120_columns(case, width):
    """Golden at both widths; no line wider than the console; status words whole on their row; at 80 the
    hints go under the table and hidden columns are named."""
    got = normalise(render(WIDE_CASES[case](), width=width))
    path = GOLDEN / f"console_{case}_{width}.txt"
    if UPDATE:
        path.write_text(got, encoding="utf-8")
    assert got == path.read_text(encoding="utf-8"), f"regenerate with TORCHDIAG_UPDATE_GOLDEN=1 and read the diff:\n{got}"
    lines = got.splitlines()
    assert all(len(line) <= width for line in lines)
    for row in WIDE_CASES[case]().tables[0].rows:
        name = row.get("check", row.get("layer"))
        line = next(ln for ln in lines if f"│ {name} " in ln)
        assert f" {row['status']} " in line, (name, line)


def test_an_empty_header_value_is_not_printed():
    """A sweep: watch of a script that failed before its first step printed "optimizers: " and "models: " with
    nothing after them. Empty values are left out; 0 and False are values."""
    text = render(Result("watch", header={"every": 10, "optimizers": [], "models": [], "note": "", "seed": 0}))
    assert "every: 10" in text and "seed: 0" in text, text
    assert "optimizers" not in text and "models" not in text and "note:" not in text, text
