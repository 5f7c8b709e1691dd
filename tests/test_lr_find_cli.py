"""`torchdiag lr-find` as a command: the CLI (exit codes, JSON, files, option errors), the Python function
from the registry, the `check` section, and the console rendering (golden). The diagnostic's numbers are
tested in tests/test_lr_find.py; here the command is checked against truth computed independently (a
least-squares model whose limit is known in closed form, a checked run redone by hand)."""
import json
import os
from pathlib import Path

import pytest

from support import load_module, one_error_line, sample

torch = pytest.importorskip("torch")

GOLDEN = Path(__file__).resolve().parent / "golden" / "lr_find_least_squares.txt"
UPDATE = os.environ.get("TORCHDIAG_UPDATE_GOLDEN") == "1"
# least squares, the batch and target from lr_linear.batch(): nothing random, so 2 repeats are identical
LSQ = (sample("lr_linear.py:build"), "--batch", sample("lr_linear.py:batch"), "--loss", "mse", "--optimizer", "sgd",
       "--steps", "60", "--repeats", "2", "--check-steps", "10", "--device", "cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Many tiny steps: one thread is faster on a shared machine (see tests/test_lr_find.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def lsq_doc():
    from typer.testing import CliRunner

    from torchdiag.cli.app import app

    r = CliRunner().invoke(app, ["lr-find", *map(str, LSQ), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def sgd_losses(lr: float, steps: int) -> list[float]:
    """The checked run redone from scratch: SGD (momentum 0.9, as the CLI's sgd) at a constant rate on the
    least-squares batch, from the factory's weights: L0 … L_steps."""
    lin = load_module("lr_linear.py")
    model = lin.build()
    x, y = lin.batch()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    out = []
    for k in range(steps + 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        out.append(float(loss.detach()))
        if k < steps:
            opt.zero_grad()
            loss.backward()
            opt.step()
    return out


def test_cli_json_against_the_closed_form_and_a_run_by_hand(lsq_doc):
    doc = lsq_doc
    for key in ("suggestion", "band", "recommended", "recommended_factor", "status", "rules_lr", "curves", "rules",
                "checked", "lr", "loss_r0", "checked_1x", "updates", "max_updates", "optimizer", "exit_code", "findings"):
        assert key in doc, key
    assert doc["exit_code"] == 0 and doc["command"] == "lr-find" and doc["optimizer"] == "sgd"
    assert doc["max_updates"] == 60 * 2 + 3 * 10 and doc["updates"] <= doc["max_updates"]
    # given target, no dropout: the two repeats are the same curve
    assert doc["repeats_identical"] is True and doc["loss_r0"] == doc["loss_r1"]
    # heavy-ball SGD (β = 0.9) on least squares is stable below 2(1 + β)/L, L = 2 λ_max(XᵀX)/N
    x, _ = load_module("lr_linear.py").batch()
    limit = 2 * 1.9 / float(2 * torch.linalg.eigvalsh(x.T @ x).max() / x.shape[0])
    assert doc["suggestion"] < limit and doc["recommended"] < limit
    # each checked run is plain SGD at its rate from the same weights: redone by hand
    rows = {r["factor"]: r for r in doc["checked"]}
    for label, series in (("0.1×", "checked_0.1x"), ("1×", "checked_1x")):
        assert doc[series] == pytest.approx(sgd_losses(rows[label]["lr"], 10), rel=1e-4)
    assert rows["1×"]["lr"] == pytest.approx(doc["suggestion"])


def test_python_function_from_the_registry_matches_the_cli_and_leaves_the_model(lsq_doc, untouched):
    import torchdiag

    lin = load_module("lr_linear.py")
    model = lin.build()
    x, y = lin.batch()
    with untouched(model):
        r = torchdiag.lr_find(model, x, target=y, loss="mse", optimizer="sgd", steps=60, repeats=2, check_steps=10)
    assert torchdiag.lr_find.__name__ == "lr_find" and r.command == "lr-find"
    assert r.data["suggestion"] == pytest.approx(lsq_doc["suggestion"])
    assert r.series["loss_r0"] == pytest.approx(lsq_doc["loss_r0"])
    from torchdiag.errors import UsageError

    with pytest.raises(UsageError, match="stepz"):
        torchdiag.lr_find(model, x, target=y, stepz=3)


def test_cli_console_plot_and_tensorboard(cli, tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    plot = tmp_path / "lr.png"
    r = cli("lr-find", *LSQ, "--plot", plot, "--tb", tmp_path / "tb", "--lr", "0.5")
    assert r.code == 0, r.stderr
    assert "--lr 0.5 is not used: the range test sets the rate of every update" in " ".join(r.stdout.split())
    assert "Range test: one curve per repeat" in r.stdout and "Checked runs" in r.stdout
    assert f"Curves: {plot}" in r.stderr
    w, h = Image.open(plot).size
    assert w > 800 and h > 300
    assert list((tmp_path / "tb" / "lr-find").iterdir())          # the event file of the run


def test_json_names_the_plot_written(cli, tmp_path):
    plot = tmp_path / "lr.svg"
    doc = cli("lr-find", *LSQ, "--check-steps", "0", "--plot", plot, "--json").json
    assert doc["plot"] == str(plot) and plot.read_text().lstrip().startswith("<?xml")
    assert doc["suggestion"] is not None and doc["recommended"] is None      # --check-steps 0: not checked


@pytest.mark.parametrize("args, flag", [
    (("--max-lr", "1e-9"), "--max-lr"),
    (("--steps", "3"), "--steps"),
    (("--check-steps", "2"), "--check-steps"),
    (("--repeats", "0"), "--repeats"),
    (("--diverge", "1"), "--diverge"),
    (("--plot", "curves.txt"), "--plot"),
    (("--optimizer", "lion"), "--optimizer"),
])
def test_bad_option_exit_2_naming_the_flag(cli, args, flag):
    r = cli("lr-find", sample("lr_linear.py:build"), "--device", "cpu", *args)
    assert r.code == 2, (r.code, r.stderr)
    one_error_line(r)
    assert flag in r.stderr.splitlines()[0], r.stderr
    doc = cli("lr-find", sample("lr_linear.py:build"), "--device", "cpu", *args, "--json").json
    assert doc["exit_code"] == 2 and flag in doc["error"]["message"]


def test_model_that_climbs_at_every_rate_exits_1(cli):
    r = cli("lr-find", sample("lr_broken.py:ascends"), "--steps", "20", "--repeats", "2", "--device", "cpu", "--json")
    assert r.code == 1
    doc = r.json
    assert doc["exit_code"] == 1 and doc["suggestion"] is None and doc["status"] == "rises"
    assert [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["no-rate-trains"]
    assert min(doc["loss_r0"]) >= doc["curves"][0]["initial_loss"]       # it really only climbed


def test_live_progress_follows_every_update_on_a_terminal_only(cli, monkeypatch):
    import torchdiag
    from torchdiag.cli import progress

    class Bar:   # records what the live line would show
        def __init__(self):
            self.total, self.shown = None, []

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def add_task(self, name, total, **fields):
            self.total = total
            return 0

        def update(self, task, completed, loss, rate):
            self.shown.append((completed, loss))

    bar = Bar()
    monkeypatch.setattr(progress, "_bar", lambda label, unit: bar)
    monkeypatch.setattr(progress, "_terminal", lambda: False)
    assert cli("lr-find", *LSQ).code == 0 and bar.shown == []           # not a terminal: no bar
    monkeypatch.setattr(progress, "_terminal", lambda: True)
    assert cli("lr-find", *LSQ, "--json").code == 0 and bar.shown == []  # --json: no bar
    assert cli("lr-find", *LSQ).code == 0
    lin = load_module("lr_linear.py")
    x, y = lin.batch()
    r = torchdiag.lr_find(lin.build(), x, target=y, loss="mse", optimizer="sgd", steps=60, repeats=2, check_steps=10)
    done = [n for n, _ in bar.shown]
    assert bar.total == 60 * 2 + 3 * 10 and done == sorted(done) and done[-1] == r.data["updates"]
    assert len(done) == r.data["updates"] - 3 * 10 + 3        # one line per range-test update, one per checked run
    assert bar.shown[0][1] == f"{r.series['loss_r0'][0]:.4g}"


# --- check: the lr-find section -------------------------------------------------------------------------

def _check(cli, tmp_path, model: str, table: str, extra: str = ""):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'model = "{model}"\ndevice = "cpu"\n{extra}[check]\nlr-find = {table}\n')
    return cli("check", "--config", cfg, "--json")


def test_check_section_passes_with_the_recommended_rate(cli, tmp_path):
    extra = f'batch = "{sample("lr_linear.py:batch")}"\nloss = "mse"\n'
    r = _check(cli, tmp_path, sample("lr_linear.py:build"),
               '{steps = 40, repeats = 2, check-steps = 5, optimizer = "sgd"}', extra)
    assert r.code == 0, r.stderr
    row = r.json["checks"][0]
    assert row["check"] == "lr-find" and row["status"] == "PASS" and row["figure"].startswith("recommended lr ")


def test_check_section_fails_on_an_error_finding(cli, tmp_path):
    r = _check(cli, tmp_path, sample("lr_broken.py:ascends"), "{steps = 20, repeats = 1}")
    assert r.code == 1, r.stderr
    row = r.json["checks"][0]
    assert row["status"] == "FAIL" and row["figure"] == "no suggestion" and row["message"].startswith("no-rate-trains")
    # switched on from the command line alone (defaults), and off again
    r = cli("check", sample("lr_broken.py:ascends"), "--lr-find", "--device", "cpu", "--json")
    assert r.code == 1 and [c["check"] for c in r.json["checks"]] == ["lr-find"], r.stderr
    r = cli("check", "--config", tmp_path / "c.toml", "--no-lr-find")
    assert r.code == 2 and "no checks configured" in r.stderr, r.stderr


@pytest.mark.parametrize("table, words", [
    ("{stepz = 3}", "unknown key 'stepz' in lr-find"),
    ("{lr = 0.1}", "unknown key 'lr' in lr-find"),
    ("{max-lr = 1e-9}", "lr-find max-lr: must be above min-lr (1e-07)"),
    ('"yes"', "lr-find = 'yes'"),
])
def test_check_section_refuses_bad_keys_by_name(cli, tmp_path, table, words):
    r = _check(cli, tmp_path, sample("lr_linear.py:build"), table)
    assert r.code == 2 and words in r.stderr, r.stderr


def test_a_bound_named_in_the_message_is_the_callers_option_too(cli):
    # a hostile review: "--max-lr: must be above min_lr (1)" named the other bound by its Python field
    r = cli("lr-find", sample("lr_linear.py:build"), "--min-lr", "1", "--max-lr", "0.1")
    assert r.code == 2 and "--max-lr: must be above --min-lr (1), got 0.1" in r.stderr, r.stderr
    assert "e.g. --min-lr 1e-7 to --max-lr 10" in r.stderr
    from torchdiag.diagnostics.lr_find.options import Options
    from torchdiag.errors import OptionError
    with pytest.raises(OptionError, match=r"max_lr: must be above min_lr \(1\)"):   # in Python, its own names
        Options(min_lr=1.0, max_lr=0.1)


# --- the console, pinned ---------------------------------------------------------------------------------

def test_console_rendering_matches_golden():
    """The least-squares run rendered 100 columns wide, no colour (as tests/test_render_golden.py); no field
    of lr-find's console output is a timing (seconds are in the JSON only). TORCHDIAG_UPDATE_GOLDEN=1 rewrites it."""
    from io import StringIO

    from rich.console import Console

    import torchdiag
    from torchdiag.render.console import print_result

    lin = load_module("lr_linear.py")
    x, y = lin.batch()
    r = torchdiag.lr_find(lin.build(), x, target=y, loss="mse", optimizer="sgd", steps=60, repeats=2, check_steps=10)
    r.header["model"] = "sample_models/lr_linear.py:build"
    out = StringIO()
    print_result(r, console=Console(file=out, width=100, color_system=None, force_terminal=False, highlight=False,
                                    soft_wrap=False, legacy_windows=False, _environ={}))
    got = "\n".join(line.rstrip() for line in out.getvalue().splitlines()).rstrip() + "\n"
    assert "second" not in got and " s " not in got
    if UPDATE:
        GOLDEN.write_text(got, encoding="utf-8")
    assert got == GOLDEN.read_text(encoding="utf-8")
