"""bench/bugs (issue 32): one ported program end to end through run.py, on 1 seed and 2 epochs.

Checks that the buggy and correct scripts run and print their result line, that watch and the one-shot
commands ran on them, that the results file has every field the table reads, and that a second run skips
what is done (resumable). No timings are asserted.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "bugs"))
import report  # noqa: E402
import taxonomy  # noqa: E402

PROGRAM = "so_34311586"
ONESHOT = ("doctor",)   # one of run.py's model commands: each is the same subprocess call with its own flags


def _run(tmp_path: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "bench" / "bugs" / "run.py"), "--programs", PROGRAM, "--seeds", "1",
           "--epochs", "2", "--oneshot", ",".join(ONESHOT), "--results", str(tmp_path / "r.json"), "--readme", str(tmp_path / "README.md")]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.subprocess
def test_one_program_end_to_end(tmp_path):
    p = _run(tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    for v in ("buggy", "correct"):
        plain = runs[f"{PROGRAM}/{v}/plain/0"]
        assert plain["rc"] == 0 and plain["result"]["epochs"] == 2
        assert {"loss", "acc", "steps", "seconds", "finite"} <= set(plain["result"])
        watch = runs[f"{PROGRAM}/{v}/watch/0"]
        assert watch["rc"] in (0, 1), watch["stderr_tail"]
        assert watch["result"]["epochs"] == 2          # the script ran under watch to its end
        assert watch["steps"] == plain["result"]["steps"]
        timing = runs[f"{PROGRAM}/{v}/timing/0"]   # the overhead pair, back to back, order alternating
        assert timing["order"] == (["plain", "watch"] if v == "buggy" else ["watch", "plain"])
        assert timing["plain"]["result"]["steps"] == timing["watch"]["result"]["steps"] == plain["result"]["steps"]
        for c in ONESHOT:
            shot = runs[f"{PROGRAM}/{v}/{c}/0"]
            assert shot["rc"] in (0, 1), (c, shot["stderr_tail"])
            assert all({"code", "severity", "where", "message"} <= set(f) for f in shot["findings"])
    summary = json.loads((tmp_path / "r.json").read_text())["summary"]["programs"][PROGRAM]
    assert summary["reproduction"]["status"] in ("reproduces", "does not reproduce")
    for v in ("buggy", "correct"):
        assert {"detected", "codes", "types", "diagnosed", "localised", "first_alarm_step", "overhead"} <= set(summary[v])
        assert summary[v]["overhead_paired"] and summary[v]["overhead"] == pytest.approx(
            runs[f"{PROGRAM}/{v}/timing/0"]["watch"]["result"]["cpu_seconds"]
            / runs[f"{PROGRAM}/{v}/timing/0"]["plain"]["result"]["cpu_seconds"] - 1)
    assert "## Training-bug benchmarks" in (tmp_path / "README.md").read_text()
    again = _run(tmp_path)                              # resumable: nothing left to run
    assert again.returncode == 0 and f"{PROGRAM}/buggy/plain/0" not in again.stdout


def test_mann_whitney_exact():
    # 5 vs 5, completely separated: the one-sided exact p is 1/C(10,5) = 1/252
    assert report.mann_whitney_less([0, 1, 2, 3, 4], [5, 6, 7, 8, 9]) == pytest.approx(1 / 252)
    # identical samples: every split ties or beats, p = 1
    assert report.mann_whitney_less([1] * 5, [1] * 5) == 1.0
    # the other direction is not significant
    assert report.mann_whitney_less([5, 6, 7, 8, 9], [0, 1, 2, 3, 4]) == 1.0


def test_wilson_interval():
    lo, hi = report.wilson(5, 10)      # the textbook value for 5/10: 0.237 to 0.763
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert report.wilson(0, 0) == (0.0, 1.0)


def test_taxonomy_names_known_types_only():
    allowed = {"act", "loss", "lr", "opt", "init", "epoch", "batch_size", "missing_prep", "wrong_prep",
               "training_data_quality", "layer_properties", "missing/redundant/wrong_layers"}
    assert all(set(t) <= allowed for t in taxonomy.CODES.values())
    assert taxonomy.diagnosed(["loss-diverged"], ["lr"]) and not taxonomy.diagnosed(["cannot-overfit"], ["lr"])


@pytest.mark.slow
@pytest.mark.subprocess
def test_seeds_runner_matches_a_standalone_run():
    # run.py's plain runs share one process per variant (seeds.py): seed 1 there must train exactly as
    # `python buggy.py --seed 1` does (the previous seed in the process leaves nothing behind)
    script = str(ROOT / "bench" / "bugs" / "so_50306988" / "buggy.py")
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    shared = subprocess.run([sys.executable, str(ROOT / "bench" / "bugs" / "seeds.py"), script, "0", "1", "--",
                             "--epochs", "2"], capture_output=True, text=True, env=env, timeout=600)
    alone = subprocess.run([sys.executable, script, "--seed", "1", "--epochs", "2"], capture_output=True, text=True,
                           env=env, timeout=600)
    last = [ln for ln in shared.stdout.splitlines() if ln.startswith("BUGS_RESULT ")][-1]
    mine = json.loads(last.split(" ", 1)[1])
    theirs = json.loads(alone.stdout.splitlines()[-1].split(" ", 1)[1])
    assert mine["steps"] == theirs["steps"] == 10
    assert mine["loss"] == theirs["loss"] and mine["acc"] == theirs["acc"]


def test_a_constant_predictor_scores_what_hand_counting_says():
    import baseline
    import numpy as np

    y = np.array([[1.0], [1.0], [0.0]])                       # training majority: 1
    val = np.array([[1.0], [0.0], [0.0], [0.0]])               # a constant 1 is right once in 4
    assert baseline.constant_score(None, y, task="binary", y_val=val) == pytest.approx(0.25)
    onehot = np.eye(3)[[2, 2, 0]]                              # most frequent class 2
    assert baseline.constant_score(None, onehot, task="categorical", y_val=np.eye(3)[[2, 1]]) == pytest.approx(0.5)
    assert baseline.constant_score(None, np.array([0.0, 1.0, 2.0]), task="sparse",
                                   y_val=np.array([1.0, 1.0, 0.0])) == pytest.approx(1 / 3)   # a tie: class 0, right once
    reg = np.array([[1.0], [3.0]])                             # mean 2; errors 1 and 4 on (3, 0): mse 2.5
    assert baseline.constant_score(None, reg, task="regression", y_val=np.array([[3.0], [0.0]]),
                                   y_scale=0.5) == pytest.approx(2.5 / 0.25)


def test_learning_is_judged_against_the_constant_with_the_reproduction_margin():
    acc = {"higher_is_better": True}
    assert report.learns(acc, {"median_correct": 0.70}, {"median": 0.60}) is True
    assert report.learns(acc, {"median_correct": 0.64}, {"median": 0.60}) is False
    mse = {"higher_is_better": False}
    assert report.learns(mse, {"median_correct": 0.8}, {"median": 1.0}) is True
    assert report.learns(mse, {"median_correct": 0.9}, {"median": 1.0}) is False
    assert report.learns(acc, {"median_correct": 0.9}, None) is None


def test_data_reads_the_script_s_own_loader():
    """dataspec: the arrays, batch size and target dtype a script's H.fit call gets (its main stops there); a script
    that validates on its training data has no split to pass as --val."""
    import dataspec
    import torch

    script = str(ROOT / "bench" / "bugs" / "so_59325381" / "buggy.py")   # labels / 255, sparse CE, batch 1
    train, val = dataspec.train(script), dataspec.val(script)
    assert train.batch_size == 1 and dataspec.has_val(script)
    targets = torch.cat([y for _, y in train])
    assert targets.dtype == torch.int64 and int(targets.abs().max()) == 0   # every class index 0, as the loss reads it
    assert torch.cat([y for _, y in val]).unique().numel() == 10           # the validation labels are untouched
    assert not dataspec.has_val(str(ROOT / "bench" / "bugs" / "so_31556268" / "buggy.py"))
    # a copy of the training arrays passed as validation (so_52800582's quartic(): the post fits the same points) is
    # no split either; a real held-out set of the same size stays one
    assert not dataspec.has_val(str(ROOT / "bench" / "bugs" / "so_52800582" / "correct.py"))
    assert dataspec._held_apart({"x": [[1.0], [2.0]], "y": [0, 1], "x_val": [[1.0], [3.0]], "y_val": [0, 1]})
