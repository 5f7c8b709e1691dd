"""Ctrl-C and SIGTERM under torchrun, where torchrun forwards them to every rank: real 2-process gloo launches.

Ranks run in sessions of their own (torch's SubprocessHandler: start_new_session), so Ctrl-C in a terminal
reaches torchrun alone; torchrun's agent turns SIGINT/SIGTERM into SignalException, sends the same signal to
every rank, waits 30 s, then SIGKILLs what is left, and exits 1 with its own traceback. What torchdiag must
do: every rank exits on the forwarded signal (none left for the SIGKILL, no wait for the collective timeout),
rank 0 prints one `error: interrupted` / `error: terminated (SIGTERM)` line, its code is 130/143 (in --json
the error document). Each launch waits for the marker the model writes when its forward starts
(sample_models/ranks_signals.py), and where a rank must be blocked in a collective, for the kernel to show
its main thread waiting on a futex; the guards only stop a hung test.

At the end, torch-free: the cross-rank report's wording for state that differs as built under DDP
(runner/report.py), on hand-built consistency dicts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import ENDS_WITHIN, HANG_GUARD, spawn

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "sample_models" / "ranks_signals.py") + ":build"
GUARD = HANG_GUARD   # seconds: stops a hung test, never asserted on


def _until(ready, proc) -> None:
    guard = time.monotonic() + GUARD
    while not ready() and proc.poll() is None and time.monotonic() < guard:
        time.sleep(0.05)


def _blocked(pid: int) -> bool:
    """The rank's main thread waits on a futex (a collective, the gather): not running Python."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return True
    return wchan in ("", "0") or "futex" in wchan   # no wchan exposed: nothing to wait for


def _still_blocked(pid: int, looks: int = 20) -> bool:
    for _ in range(looks):
        if not _blocked(pid):
            return False
        time.sleep(0.1)
    return True


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def launch(tmp_path, command, hold, send, how, *extra, blocked_rank=None):
    """Start torchrun in a session of its own, wait for both ranks' forwards (and `blocked_rank` to block),
    send `send` to torchrun's process group (Ctrl-C) or to torchrun alone (a scheduler)."""
    marker = tmp_path / "m"
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "torchdiag",
            command, MODEL, "--arg", f"marker={marker}", "--arg", f"hold={hold}", "--device", "cpu", *extra]
    env = {**os.environ, "TORCHDIAG_DIST_TIMEOUT": "600", "COLUMNS": "200"}
    proc = spawn(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 start_new_session=True)
    files = [Path(f"{marker}.rank{r}.pid") for r in (0, 1)]
    try:
        _until(lambda: all(f.exists() for f in files), proc)
        assert all(f.exists() for f in files), proc.communicate()[1]
        pids = [int(f.read_text()) for f in files]
        if blocked_rank == "both":   # both in native waits, for good: sampled over a few seconds
            _until(lambda: all(_still_blocked(p) for p in pids), proc)
        elif blocked_rank is not None:
            _until(lambda: _blocked(pids[blocked_rank]), proc)
        if how == "group":
            os.killpg(proc.pid, send)
        else:
            proc.send_signal(send)
        out, err = proc.communicate(timeout=ENDS_WITHIN)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err, pids


def _torchdiag_traceback(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.lstrip().startswith('File "') and "/torchdiag/" in line]


def _check_ended(code, out, err, pids, line: str) -> None:
    assert code == 1, err            # torchrun's own: its SignalException, whatever the ranks return
    assert "SignalException" in err  # torchrun's traceback, documented
    assert err.splitlines().count(f"error: {line}") == 1, err          # rank 0 alone, once
    assert "Unable to shutdown process" not in err, err                # no rank was left for SIGKILL
    assert not _torchdiag_traceback(err), err
    assert "internal error" not in err, err
    assert [p for p in pids if _alive(p)] == []


@pytest.fixture(scope="module")
def ctrl_c(tmp_path_factory):
    """Ctrl-C in a terminal: SIGINT to torchrun's whole process group while both ranks are in forward."""
    return launch(tmp_path_factory.mktemp("ctrl_c"), "nancheck", "all", signal.SIGINT, "group", "--json")


@pytest.mark.slow
@pytest.mark.distributed
def test_ctrl_c_ends_every_rank_with_one_line(ctrl_c):
    _check_ended(*ctrl_c, "interrupted")


@pytest.mark.slow
@pytest.mark.distributed
def test_ctrl_c_json_is_the_interrupted_document(ctrl_c):
    code, out, err, pids = ctrl_c
    doc = json.loads(out)   # exactly one document: rank 1 prints nothing
    assert doc["exit_code"] == 130 and doc["error"]["message"] == "interrupted" and doc["command"] == "nancheck"


@pytest.fixture(scope="module")
def sigterm_in_gather(tmp_path_factory):
    """SIGTERM to torchrun alone (a scheduler, a CI timeout) while rank 1 is in forward and rank 0, done,
    waits for it in torchdiag's gather (outside the user's code, where SIGTERM used to kill it silently)."""
    return launch(tmp_path_factory.mktemp("sigterm"), "nancheck", "1", signal.SIGTERM, "torchrun", "--json",
                  blocked_rank=0)


@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_while_a_rank_waits_in_the_gather(sigterm_in_gather):
    _check_ended(*sigterm_in_gather, "terminated (SIGTERM)")
    doc = json.loads(sigterm_in_gather[1])
    assert doc["exit_code"] == 143 and doc["error"]["message"] == "terminated (SIGTERM)"


@pytest.fixture(scope="module")
def ctrl_c_in_allreduce(tmp_path_factory):
    """Ctrl-C mid-training under DDP: rank 1 holds its 21st forward (inside overfit-batch's loop: a tiny lr
    never reaches the target), rank 0 waits for it in DDP's gradient allreduce. overfit-batch keeps a
    partial curve on Ctrl-C; a rank that went on to the gather with it left rank 0 in the allreduce until
    torchrun's SIGKILL (30 s, then an internal error)."""
    return launch(tmp_path_factory.mktemp("allreduce"), "overfit-batch", "1", signal.SIGINT, "group",
                  "--wrap", "ddp", "--arg", "start=20", "--lr", "1e-7", "--steps", "500", blocked_rank=0)


@pytest.mark.slow
@pytest.mark.distributed
def test_ctrl_c_while_a_rank_waits_in_ddp_allreduce(ctrl_c_in_allreduce):
    code, out, err, pids = ctrl_c_in_allreduce
    _check_ended(code, out, err, pids, "interrupted")
    assert out == ""   # no partial report under torchrun: the interrupted ranks hand in nothing


@pytest.fixture(scope="module")
def ctrl_c_both_blocked(tmp_path_factory):
    """A sweep: a layer used on rank 0 only under DDP (gradflow --wrap ddp). Rank 0 waits in the allreduce of that
    layer's bucket, rank 1 in the next collective: both in native code, where Python's signal handler never runs.
    torchrun killed both 30 s after Ctrl-C and nothing was printed; a thread that reads the signal now reports and
    ends each rank (runner/isolation.py stuck_exit)."""
    return launch(tmp_path_factory.mktemp("both"), "gradflow", "9", signal.SIGINT, "group", "--wrap", "ddp",
                  "--arg", "aux_on=0", "--json", blocked_rank="both")


@pytest.mark.slow
@pytest.mark.distributed
def test_ctrl_c_while_both_ranks_are_blocked_in_native_code(ctrl_c_both_blocked):
    code, out, err, pids = ctrl_c_both_blocked
    _check_ended(code, out, err, pids, "interrupted")
    doc = json.loads(out)
    assert doc["exit_code"] == 130 and doc["error"]["message"] == "interrupted" and doc["command"] == "gradflow"


# ------------------------------------------- the cross-rank report's wording (torch-free, hand-built dicts)

def _report(differs, grads_differ=(), ignored=None, wrap="ddp"):
    from torchdiag.results import Result
    from torchdiag.runner.report import add_rank_findings

    cons = {"compared": 6, "steps": 2, "differs": list(differs), "grads_differ": list(grads_differ), "notes": []}
    if ignored is not None:
        cons["ddp_ignored"] = ignored
    merged = Result("doctor")
    add_rank_findings(merged, [{"rank": 0, "consistency": cons}, {"rank": 1}], wrap)
    return {f.where: f for f in merged.findings}


def _diff(name, step=0, kind="parameter", delta=0.5):
    return {"name": name, "kind": kind, "step": step, "max_abs_diff": {"1": delta}, "batchnorm": False}


def test_init_difference_of_a_parameter_ddp_ignores_is_an_error_not_a_broadcast():
    """DDP's wrap-time broadcast (torch.distributed.utils._sync_module_states) skips the names in
    _ddp_params_and_buffers_to_ignore: such a tensor differing as built stays different."""
    found = _report([_diff("side.weight"), _diff("side.count", kind="buffer"), _diff("body.0.weight")],
                    ignored=["side.weight", "side.bias", "side.count"])
    for name in ("side.weight", "side.count"):
        f = found[name]
        assert (f.code, f.severity) == ("rank-divergence", "error")
        assert "never broadcasts rank 0's value" in f.message and "broadcasts rank 0's value when" not in f.message
        assert "max |Δ| against rank 0: rank 1: 0.5" in f.message and "DDP will not" in f.hint
        assert f.ranks == [0, 1]
    f = found["body.0.weight"]   # not ignored: DDP does broadcast it, so training starts equal
    assert (f.code, f.severity) == ("rank-init-differs", "info")
    assert "DDP broadcasts rank 0's value when it wraps the model" in f.message


def test_init_difference_with_an_unreduced_gradient_is_not_called_equal_at_start():
    """Without the ignore list (a consistency dict that lacks it), a parameter whose reduced gradient differs
    too is not said to start equal: whatever the broadcast did, the steps part the ranks."""
    from torchdiag.results import Result
    from torchdiag.runner.report import add_rank_findings

    cons = {"compared": 2, "steps": 2, "differs": [_diff("side.weight")],
            "grads_differ": [_diff("side.weight", step=1)], "notes": []}
    merged = Result("doctor")
    add_rank_findings(merged, [{"rank": 0, "consistency": cons}, {"rank": 1}], "ddp")
    assert [(f.code, f.severity) for f in merged.findings] == [("rank-divergence", "error"), ("rank-grads-differ", "error")]
    f = merged.findings[0]
    assert "not the same on every rank after DDP's reduction" in f.message and "training starts equal" not in f.message
    assert "DDP will not" not in f.hint   # it may have broadcast it: the gradient is what parts the ranks


def test_init_difference_without_ddp_is_unchanged():
    found = _report([_diff("side.weight")], ignored=["side.weight"], wrap="none")
    assert found["side.weight"].code == "rank-divergence" and "built it differently" in found["side.weight"].hint


def test_the_ranks_table_says_what_its_findings_count_leaves_out():
    """A sweep: both ranks' rows said 0 findings above "FAIL: rank-divergence", a finding only the ranks together
    show."""
    from torchdiag.results import Result
    from torchdiag.runner.merge import finish, rank_table

    records = [{"rank": r, "device": "cpu", "header": {}, "findings": [], "error": None, "exit_code": 0} for r in (0, 1)]
    merged = Result("gradflow")
    merged.tables.insert(0, rank_table(records))
    merged.add("rank-divergence", "error", "offset", "buffer offset differs across ranks")
    finish(merged, records)
    assert "1 more come from comparing the ranks" in merged.tables[0].note
    alone = Result("gradflow")
    alone.tables.insert(0, rank_table(records))
    finish(alone, records)
    assert alone.tables[0].note is None


def test_a_buffer_updated_per_rank_is_info_under_ddp_and_an_error_under_fsdp():
    """A sweep: an EMA of each rank's batch mean was a rank-divergence error under DDP, whose default
    broadcast_buffers puts rank 0's buffers on every rank at each forward (as for BatchNorm's statistics, info);
    FSDP never synchronises buffers, and a buffer DDP was told to ignore is never broadcast."""
    f = _report([_diff("ema", step=1, kind="buffer")])["ema"]
    assert (f.code, f.severity) == ("rank-buffer-differs", "info") and "broadcasts rank 0's buffers" in f.message
    f = _report([_diff("ema", step=1, kind="buffer")], wrap="fsdp")["ema"]
    assert (f.code, f.severity) == ("rank-divergence", "error")
    f = _report([_diff("ema", step=1, kind="buffer")], ignored=["ema"])["ema"]
    assert (f.code, f.severity) == ("rank-divergence", "error")
    f = _report([_diff("w", step=1)])["w"]   # a parameter: DDP syncs gradients only, never parameter values
    assert (f.code, f.severity) == ("rank-divergence", "error")
