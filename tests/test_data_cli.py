"""`torchdiag data` wired (issue 28): the command line through the runner (exit codes 0/1/2/3/130, the JSON
document, --images/--plot/--tb), the Python function `torchdiag.data`, and check's `data` table. The
diagnostic's own numbers are tested in tests/test_data.py; here, that each caller reaches them."""
from __future__ import annotations

import json

import pytest
import torch

from support import SAMPLES, load_module, one_error_line, sample

QUICK = ("--no-sweep", "--batches", "2")


@pytest.fixture(autouse=True)
def samples_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(SAMPLES))   # the samples import data_fake


def finding(doc, code):
    found = [f for f in doc["findings"] if f["code"] == code]
    assert len(found) == 1, doc["findings"]
    return found[0]


# ---- the command line ---------------------------------------------------------------------------------------

def test_digits_healthy_json(cli):
    r = cli("data", sample("data_digits.py:train"), "--val", sample("data_digits.py:val"), "--samples", "200",
            *QUICK, "--json")
    assert r.code == 0, r.stderr
    doc = r.json   # the whole stdout is one document
    assert doc["command"] == "data" and doc["exit_code"] == 0
    assert doc["data"] == sample("data_digits.py:train") and doc["data_kind"].startswith("dataloader")
    assert {"splits", "overlap", "loader", "order", "throughput", "num_classes", "field_stats"} <= set(doc)
    train, val = doc["splits"]["train"], doc["splits"]["val"]
    # scikit-learn's digits: 1,797 samples, a quarter (450, rounded up) kept for validation
    assert (train["samples"], train["total"], train["subset"]) == (200, 1797 - 450, True)
    assert val["total"] == 450
    assert val["samples"] == 200 and doc["overlap"]["val_samples_in_train"] == 0
    assert not doc["throughput"].get("sweep") and doc["throughput"]["as_configured"]["batches"] == 2   # --no-sweep
    assert not [f for f in doc["findings"] if f["severity"] in ("error", "warning")]


def test_broken_loader_is_exit_1_with_the_finding(cli):
    mod = load_module("data_content.py")
    r = cli("data", sample("data_content.py:non_finite"), *QUICK)
    assert r.code == 1, r.stderr
    assert "ERROR   non-finite train:[0]" in r.stdout and f"sample {mod.NAN_AT}" in r.stdout
    assert "FAIL: 1 error(s): non-finite" in r.stdout
    doc = cli("data", sample("data_content.py:non_finite"), *QUICK, "--json").json
    assert doc["exit_code"] == 1 and f"sample {mod.NAN_AT}" in finding(doc, "non-finite")["message"]


def test_factory_returning_an_int_is_usage(cli):
    r = cli("data", sample("data_errors.py:a_number"))
    assert r.code == 2 and r.stdout == ""
    one_error_line(r)
    assert r.stderr.startswith("error: a_number() returned an int, not a torch Dataset, a DataLoader or an iterable")
    r = cli("data", sample("data_errors.py:a_number"), "--json")
    assert r.code == 2
    one_error_line(r)
    doc = r.json
    assert doc["exit_code"] == 2 and "returned an int" in doc["error"]["message"] and "partial" not in doc


def test_dataset_raising_is_exit_3_naming_the_index(cli):
    r = cli("data", sample("data_errors.py:raising"), *QUICK)
    assert r.code == 3
    one_error_line(r)
    assert r.stderr.startswith("error: dataset[57] raised ValueError: cannot decode image 57")
    assert "STOPPED during the content pass" in r.stdout and "OK:" not in r.stdout   # the partial result, never "OK"
    doc = cli("data", sample("data_errors.py:raising"), *QUICK, "--json").json
    assert doc["exit_code"] == 3 and doc["error"]["message"].startswith("dataset[57] raised")
    assert doc["partial"]["command"] == "data" and doc["partial"]["throughput"]["as_configured"]["batches"] == 2


def test_missing_data_file_is_named_as_data(cli, tmp_path):
    for args in ([tmp_path / "nope.py:train"], [sample("data_digits.py:train"), "--val", tmp_path / "nope.py:val"]):
        r = cli("data", *args)
        assert r.code == 2 and r.stderr.startswith(f"error: data file not found: {tmp_path / 'nope.py'}"), r.stderr
        one_error_line(r)


@pytest.mark.parametrize("args, said", [
    (["--batches", "0"], "error: --batches: must be ≥ 1, got 0"),
    (["--workers", "a,b"], "error: --workers: 'a,b' is not a list of worker counts"),
    (["--classes", "0"], "error: --classes: must be ≥ 1, got 0"),
    (["--dtype", "bfloat16"], "error: --dtype applies to the model of --model, and no --model is given"),
    (["--model-arg", "width=3"], "error: --model-arg applies to the model of --model"),
    (["--device", "meta"], "error: data needs real values; the meta device has none"),
    # a sweep: said as "malformed --arg"
    (["--model", sample("mlp.py:build"), "--model-arg", "=x"], "error: malformed --model-arg '=x'"),
])
def test_bad_options_are_usage_before_loading(cli, args, said):
    r = cli("data", sample("data_errors.py:factory_raises"), *args)   # exit 3 had the factory been called
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert r.stderr.startswith(said), r.stderr


def test_arg_goes_to_the_data_factories_and_model_arg_to_the_model(cli, tmp_path):
    (tmp_path / "net.py").write_text("from torch import nn\n\n\ndef build(classes=10):\n"
                                     "    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, classes))\n")
    r = cli("data", sample("data_fake.py:dataset"), "--val", sample("data_fake.py:val"), "--arg", "size=96",
            "--model", f"{tmp_path}/net.py:build", "--model-arg", "classes=7", "--no-speed", "--json")
    doc = r.json
    assert (doc["splits"]["train"]["total"], doc["splits"]["val"]["total"]) == (96, 96)   # --arg: both data factories
    assert doc["model"] == f"{tmp_path}/net.py:build" and doc["num_classes"] == 7      # --model-arg: the model's
    # FakeData's labels are 0..9: those >= 7 are outside the 7 outputs, counted here from the dataset itself
    fake = load_module("data_fake.py")
    outside = {split: sum(1 for i in range(96) if data[i][1] >= 7)
               for split, data in (("train", fake.dataset(96)), ("val", fake.val(96)))}
    found = {f["where"]: f for f in doc["findings"] if f["code"] == "labels-out-of-range"}
    assert r.code == 1 and sorted(found) == ["train:[1]", "val:[1]"]
    for split, n in outside.items():
        assert found[f"{split}:[1]"]["severity"] == "error" and f": {n} sample(s)" in found[f"{split}:[1]"]["message"]


def test_checkpoint_goes_into_the_model(cli, tmp_path):
    model = load_module("data_digits.py").model()
    torch.save(model.state_dict(), tmp_path / "w.pt")
    torch.save({"x": torch.zeros(2)}, tmp_path / "other.pt")
    args = (sample("data_digits.py:train"), "--model", sample("data_digits.py:model"), "--no-speed", "--samples", "100")
    r = cli("data", *args, "--checkpoint", tmp_path / "w.pt", "--json")
    assert r.code == 0, r.stderr
    assert r.json["checkpoint"] == [f"{tmp_path / 'w.pt'}: {len(model.state_dict())} tensors loaded"]
    r = cli("data", *args, "--checkpoint", tmp_path / "other.pt")
    assert r.code == 2 and "does not fit the model" in r.stderr
    one_error_line(r)


def test_files_written_and_refused(cli, tmp_path):
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    r = cli("data", sample("data_fake.py:loader"), "--val", sample("data_fake.py:val"), *QUICK,
            "--images", tmp_path / "img", "--plot", tmp_path / "plot.png", "--tb", tmp_path / "tb")
    assert r.code == 0, r.stderr
    for p in ("img/samples_train.png", "img/samples_val.png", "plot.png"):
        with Image.open(tmp_path / p) as im:
            assert im.size[0] > 100
    assert f"data histograms: {tmp_path / 'plot.png'}" in r.stderr
    acc = EventAccumulator(str(tmp_path / "tb" / "data"), size_guidance={"images": 0, "histograms": 0})
    acc.Reload()
    assert "data/train/samples_per_class" in acc.Tags()["images"]
    assert "data/val/samples_per_class" in acc.Tags()["images"]
    assert any(t.endswith("/labels") for t in acc.Tags()["histograms"])
    # a directory where the plot goes, a file where the folder goes: refused before the data loads
    r = cli("data", sample("data_errors.py:factory_raises"), "--plot", tmp_path)
    assert r.code == 2 and r.stderr.startswith(f"error: --plot {tmp_path}: is a directory"), r.stderr
    (tmp_path / "afile").write_text("keep")
    r = cli("data", sample("data_errors.py:factory_raises"), "--images", tmp_path / "afile")
    assert r.code == 2 and "--images" in r.stderr and (tmp_path / "afile").read_text() == "keep"
    r = cli("data", sample("data_errors.py:factory_raises"), "--plot", tmp_path / "plot.gif")
    assert r.code == 2 and "--plot" in r.stderr


def test_ctrl_c_is_130_keeping_what_was_measured(cli):
    # data_errors.Interrupting: Ctrl-C at the 71st sample, after the probe's batches of 10
    r = cli("data", sample("data_errors.py:interrupting"), "--batch-size", "10", *QUICK, "--json")
    assert r.code == 130
    doc = r.json
    assert doc["exit_code"] == 130 and doc["interrupted"] is True
    assert doc["throughput"]["as_configured"]["batches"] == 2 and doc["splits"]["train"]["samples"] == 40


# ---- Python -------------------------------------------------------------------------------------------------

def test_python_function():
    import torchdiag
    from torchdiag.errors import OptionError, UsageError

    dd = load_module("data_digits.py")
    model = dd.model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = torchdiag.data(dd.train(), val=dd.leaky_val(), model=model, samples=400, sweep=False, batches=2, classes=10)
    assert r.command == "data" and r.exit_code == 1
    assert [f.code for f in r.findings if f.severity == "error"] == ["train-val-overlap"]
    assert r.data["num_classes"] == 10 and r.data["throughput"]["training"] is not None
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())   # trained on a copy
    with pytest.raises(UsageError, match="returned an int"):
        torchdiag.data(3)
    with pytest.raises(UsageError, match="unknown option"):
        torchdiag.data(dd.train(), sampels=10)
    with pytest.raises(OptionError, match="^dtype: applies to the model"):
        torchdiag.data(dd.train(), dtype="bfloat16")
    with pytest.raises(OptionError, match="^batches: must be ≥ 1"):
        torchdiag.data(dd.train(), batches=0)


# ---- check --------------------------------------------------------------------------------------------------

def _config(tmp_path, data: str, extra: str = "") -> str:
    path = tmp_path / "pyproject.toml"
    path.write_text(f'[tool.torchdiag]\nmodel = "{sample("data_digits.py:model")}"\ninputs = ["4x1x8x8"]\n'
                    f"[tool.torchdiag.check]\n{extra}data = {{{data}}}\n")
    return str(path)


def test_check_data_section_passes_and_fails(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # check reads ./pyproject.toml
    _config(tmp_path, f'spec = "{sample("data_digits.py:train")}", val = "{sample("data_digits.py:val")}", '
                      "samples = 300, sweep = false, batches = 2, with-model = true, speed = false")
    r = cli("check", "--json")   # no speed: input-bound depends on how busy the machine is (a CI run warned)
    assert r.code == 0, r.stderr
    rows = r.json["checks"]
    assert [(row["check"], row["status"], row["figure"]) for row in rows] == [("data", "PASS", "clean")]
    _config(tmp_path, f'spec = "{sample("data_digits.py:train")}", val = "{sample("data_digits.py:leaky_val")}", '
                      "speed = false", extra='max-params = "1M"\n')
    r = cli("check", "--json")
    assert r.code == 1
    rows = {row["check"]: row for row in r.json["checks"]}
    assert rows["max-params"]["status"] == "PASS" and rows["data"]["status"] == "FAIL"
    assert rows["data"]["message"].startswith("train-val-overlap val:[0]")
    assert finding(r.json, "check-failed")["where"].endswith("::data")


def test_check_data_warnings_are_counted_and_fail_under_strict(cli, tmp_path):
    """A sweep: raw pixels and a 45x class imbalance passed the gate as `clean`, strict or not."""
    data = f'spec = "{sample("data_labels.py:imbalanced")}", speed = false'
    r = cli("check", "--config", _config(tmp_path, data), "--json")
    assert r.code == 0 and r.json["checks"][0]["figure"] == "1 warning(s)", r.json["checks"]
    r = cli("check", "--config", _config(tmp_path, data, extra="strict = true\n"), "--json")
    row = r.json["checks"][0]
    assert r.code == 1 and row["status"] == "FAIL" and "class-imbalance" in row["message"], r.json["checks"]


def test_check_allow_globs_do_not_accept_data_errors(cli, tmp_path):
    """A review: allow's parameter globs were applied to data findings (places like `train:[1]`): `allow = ["t*"]`
    made a single-class error `clean`."""
    data = f'spec = "{sample("data_labels.py:all_zero")}", speed = false'
    r = cli("check", "--config", _config(tmp_path, data, extra='allow = ["t*"]\n'), "--json")
    assert r.code == 1 and r.json["checks"][0]["figure"] == "1 error finding(s)", r.json["checks"]


@pytest.mark.parametrize("data, said", [
    ('spec = "x.py:train", sampels = 3', "unknown key 'sampels' in data in the check table of [tool.torchdiag] of"),
    ('val = "x.py:val"', "data in the check table of [tool.torchdiag] of"),
    ('spec = "x.py:train", batch-size = 0', "data batch-size: must be ≥ 1, got 0 in the check table of [tool.torchdiag]"),
    ('spec = "x.py:train", with-model = "yes"', "data with-model = 'yes' in"),
])
def test_check_data_table_refused_by_name_before_loading(cli, tmp_path, data, said):
    r = cli("check", "--config", _config(tmp_path, data))
    assert r.code == 2, r.stderr
    one_error_line(r)
    assert said in r.stderr, r.stderr


def test_check_data_dataset_raising_is_exit_3(cli, tmp_path):
    r = cli("check", "--config", _config(tmp_path, f'spec = "{sample("data_errors.py:raising")}", speed = false'),
            "--json")
    assert r.code == 3
    row = json.loads(r.stdout)["checks"][0]
    assert row["status"] == "ERROR" and row["message"].startswith("dataset[57] raised")


def test_workers_start_under_the_cli(cli):
    """The runner's stdin guard (runner/isolation.py) must let a forked DataLoader worker close stdin: every
    worker died at start through the CLI (AttributeError in multiprocessing's _close_stdin), not in Python."""
    r = cli("data", sample("data_fake.py:loader"), "--arg", "size=64", "--workers", "0,1", "--batches", "2", "--json")
    assert r.code == 0, r.stderr
    sweep = r.json["throughput"]["sweep"]
    # 64 samples in batches of 32: the first batch timed on its own, one after it, in each configuration
    # (on a GPU machine a pin_memory run joins them)
    assert [s["num_workers"] for s in sweep if not s["pin_memory"]] == [0, 1] and all(s["batches"] == 64 // 32 - 1 for s in sweep)


def test_a_loss_the_user_named_that_cannot_load_ends_the_run(cli):
    """Only the auto loss refusing an output leaves the step untimed; a --loss typo is the user's to fix (exit 2)."""
    r = cli("data", sample("data_digits.py:train"), "--model", sample("data_digits.py:model"), "--loss",
            "nofile.py:fn", *QUICK)
    assert r.code == 2 and "loss file not found: nofile.py" in r.stderr, (r.code, r.stderr)


def test_images_into_a_folder_that_cannot_be_made_is_one_line_exit_2(cli, tmp_path, monkeypatch):
    # a hostile review: data's own mkdir let the PermissionError through as an internal error (exit 4); root ignores
    # a read-only folder, so the refusal is the operating system's, made here
    import os

    real = os.mkdir
    blocked = tmp_path / "blocked"

    def mkdir(path, *args, **kwargs):
        if os.fspath(path).startswith(os.fspath(blocked)):
            raise PermissionError(1, "Operation not permitted", os.fspath(path))
        return real(path, *args, **kwargs)
    monkeypatch.setattr(os, "mkdir", mkdir)
    r = cli("data", sample("data_fake.py:dataset"), "--no-speed", "--images", blocked / "dd")
    one_error_line(r)
    assert r.code == 2 and "not writable (Operation not permitted)" in r.stderr, r.stderr
