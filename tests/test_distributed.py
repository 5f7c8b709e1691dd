"""torchdiag under torchrun: real 2-process gloo runs on this CPU machine (torch.distributed.run
launching `-m torchdiag`, or one launch running the scenarios every rank ends normally in turn), each
scenario shared by its assertions, plus the pieces that
need no launch (torchrun's environment, sharding, merging, refusals)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import (
    HANG_GUARD,
    ROOT,
    by_code,
    launched_fixtures,
    one_error_line,
    sample,
    torchrun,
    torchrun_many,
    torchrun_started,
)

# ---- the launches -----------------------------------------------------------------------------------

# the runs every rank ends normally: one launch for all of them (support.torchrun_many), each rank running the
# commands in turn in-process
RUNS = {
    "diverging": ["doctor", sample("ranks.py:diverging"), "--wrap", "ddp"],
    "healthy": ["gradflow", sample("ranks.py:healthy"), "--wrap", "ddp"],
    # gradflow: one judged pass. overfit-batch trains the DDP copy, and DDP itself raises at its second step
    # on every rank (the error's hint then names the parameters: test_unused_hint_when_every_rank_failed)
    "unused": ["gradflow", sample("ranks.py:unused"), "--wrap", "ddp"],
    "overfit": ["overfit-batch", sample("ranks.py:healthy"), "--wrap", "ddp", "--steps", "300", "--target-loss", "0.5"],
    "nan_rank": ["nancheck", sample("ranks.py:nan_on_rank"), "--arg", "rank=1", "--wrap", "ddp"],
    "fsdp_grads": ["gradflow", sample("ranks.py:unused"), "--wrap", "fsdp"],
    "fsdp_nan": ["nancheck", sample("ranks.py:nan_on_rank"), "--arg", "rank=1", "--wrap", "fsdp"],
    "lm": ["gradflow", sample("gpt_tiny.py:build"), "--wrap", "ddp"],
    "build_fails": ["gradflow", sample("ranks.py:build_fails_on_rank"), "--arg", "rank=1", "--wrap", "ddp"],
    "extra_layer": ["doctor", sample("ranks.py:extra_on_rank"), "--arg", "rank=1"],
    "build_exits": ["doctor", sample("ranks.py:build_fails_on_rank"), "--arg", "rank=1", "--arg", "exits=True"],
    "buffer_ddp": ["doctor", sample("ranks.py:buffer_on_rank"), "--arg", "rank=1", "--wrap", "ddp"],
    "buffer_dtype": ["gradflow", sample("ranks.py:buffer_on_rank"), "--arg", "rank=1", "--arg", "dtype_only=True"],
    "buffer_ignored": ["gradflow", sample("ranks.py:buffer_on_rank"), "--arg", "rank=1", "--arg", "ignored=True",
                       "--wrap", "ddp"],
}


@pytest.fixture(scope="module")
def waiting():
    """The launches that wait out a 10 s collective timeout, started first so the others run meanwhile."""
    return {
        # rank 1 raises before DDP's first broadcast; rank 0 waits in it until the timeout
        "fails_in_collective": torchrun_started("profile", sample("ranks.py:fails_on_rank"), "--arg", "rank=1", "--mode",
                                                "train", "--wrap", "ddp", "--active", "1", "--warmup", "0", "--wait",
                                                "0", env={"TORCHDIAG_DIST_TIMEOUT": "10"}),
        # rank 1 fails in DDP's backward while rank 0 waits in the reduction; rank 0 waits it out
        "branch_ddp": torchrun_started("doctor", sample("ranks.py:branch_on_rank"), "--wrap", "ddp",
                                       env={"TORCHDIAG_DIST_TIMEOUT": "10"}),
    }


@pytest.fixture(scope="module")
def launched(waiting):
    return torchrun_many(RUNS)


diverging, healthy, unused, overfit, nan_rank, fsdp_grads, fsdp_nan, lm, build_fails, extra_layer, build_exits, \
    buffer_ddp, buffer_dtype, buffer_ignored = launched_fixtures(*RUNS)


@pytest.fixture(scope="module")
def failing():
    return torchrun("nancheck", sample("ranks.py:fails_on_rank"), "--arg", "rank=1")


@pytest.mark.slow
@pytest.mark.distributed
def test_healthy_ddp_ranks_agree(healthy):
    code, doc, _ = healthy
    assert code == 0 and doc["exit_code"] == 0
    assert doc["world_size"] == 2 and [r["rank"] for r in doc["ranks"]] == [0, 1]
    # the 8 rows of example_inputs split 4 + 4, each rank its own (different losses)
    assert [r["header"]["batch_shard"] for r in doc["ranks"]] == ["rows 0:4 of 8", "rows 4:8 of 8"]
    assert doc["ranks"][0]["data"]["loss_value"] != doc["ranks"][1]["data"]["loss_value"]
    # the judged pass ran through the DDP copy: the gradients are the reduced ones, equal on both ranks
    assert all(r["header"]["wrap"].startswith("ddp (the judged pass runs on the DDP copy") for r in doc["ranks"])
    assert doc["ranks"][0]["data"]["reduced_grad_norm"] == pytest.approx(doc["ranks"][1]["data"]["reduced_grad_norm"], rel=1e-6)
    cons = doc["consistency"]
    # Linear(8,16) + Linear(16,4): 4 parameter tensors, compared as built and after 2 DDP steps
    assert cons["compared"] == 4 and cons["steps"] == 2
    assert cons["differs"] == [] and cons["grads_differ"] == []
    assert doc["ranks"][0]["unused"] == [] and doc["ranks"][1]["unused"] == []


@pytest.mark.slow
@pytest.mark.distributed
def test_random_targets_are_the_single_process_ones_cut_by_rank(healthy, cli):
    # cross-entropy against random targets, mean over rows: with 4 + 4 rows the single-process loss over
    # all 8 rows is the mean of the ranks' losses only if each rank took its rows of the same 8 targets
    # (a draw per rank from the same seed would give both ranks targets 0:4)
    r = cli("gradflow", sample("ranks.py:healthy"), "--device", "cpu", "--json")
    whole = json.loads(r.stdout)["loss_value"]
    ranks = [x["data"]["loss_value"] for x in healthy[1]["ranks"]]
    assert whole == pytest.approx(sum(ranks) / 2, rel=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
def test_divergent_parameter_named_with_its_first_step(diverging):
    code, doc, _ = diverging
    assert doc["exit_code"] == 1 and code != 0
    found = {f["where"]: f for f in by_code(doc, "rank-divergence")}
    # scale (nudged by rank) and side.* (gradients DDP ignores, so each rank steps its own way)
    assert set(found) == {"scale", "side.weight", "side.bias"}
    assert all(f["severity"] == "error" for f in found.values()) and "from step 1" in found["scale"]["message"]
    # side.*: gradients differ at step 1, but Adam's first update is lr × sign(grad): a parameter whose
    # gradient signs agree on both ranks moves alike at step 1 and parts only at step 2
    assert all(f"from step {d['step']}" in found[d["name"]]["message"] and d["step"] in (1, 2)
               for d in doc["consistency"]["differs"] if d["name"].startswith("side."))
    [d] = [d for d in doc["consistency"]["differs"] if d["name"] == "scale"]
    # the model adds 0.01 × RANK to scale in each train forward; the step's update is the same on
    # both ranks (DDP-averaged gradient), so after step 1 rank 1 is ahead by exactly one nudge
    assert d["step"] == 1 and d["max_abs_diff"]["1"] == pytest.approx(0.01, abs=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
def test_gradients_not_reduced_are_named(diverging):
    _, doc, _ = diverging
    grads = doc["consistency"]["grads_differ"]
    # each rank's own rows give side.* different gradients; DDP averaged everything else
    assert {(g["name"], g["step"]) for g in grads} == {("side.weight", 1), ("side.bias", 1)}
    assert {f["where"] for f in by_code(doc, "rank-grads-differ")} == {"side.weight", "side.bias"}
    # the divergence says why: an unreduced gradient for side.*, an update outside autograd for scale
    hints = {f["where"]: f["hint"] for f in by_code(doc, "rank-divergence")}
    assert "rank-grads-differ" in hints["side.weight"] and "outside autograd" in hints["scale"]


@pytest.mark.slow
@pytest.mark.distributed
def test_batchnorm_running_stats_differing_is_info_with_syncbn_hint(diverging):
    _, doc, _ = diverging
    [f] = by_code(doc, "batchnorm-stats-differ")     # one finding for the module's two buffers
    assert f["where"] == "body.1" and f["severity"] == "info" and "SyncBatchNorm" in f["hint"]
    assert "in 1 module(s) (body.1)" in f["message"]
    assert {d["name"] for d in doc["consistency"]["differs"] if d["batchnorm"]} == {"body.1.running_mean", "body.1.running_var"}
    assert doc["consistency"]["ddp_ignored"] == ["side.bias", "side.weight"]


def test_batchnorm_stats_of_many_modules_are_one_finding():
    from torchdiag.results import Result
    from torchdiag.runner.report import add_rank_findings

    def row(name, diff):
        return {"name": name, "kind": "buffer", "step": 1, "max_abs_diff": {"1": diff}, "batchnorm": True}

    names = [f"layer{i}.bn" for i in range(8)]
    differs = [row(f"{m}.{s}", 0.01 * i) for i, m in enumerate(names) for s in ("running_mean", "running_var")]
    merged = Result("gradflow")
    cons = {"compared": 16, "steps": 2, "differs": differs, "grads_differ": [], "notes": []}
    add_rank_findings(merged, [{"rank": 0, "consistency": cons}, {"rank": 1}], "ddp")
    [f] = merged.findings
    assert f.code == "batchnorm-stats-differ" and f.severity == "info" and f.ranks == [0, 1]
    assert "in 8 module(s) (layer0.bn, layer1.bn, layer2.bn, layer3.bn, layer4.bn, layer5.bn, … 2 more)" in f.message
    assert "largest: layer7.bn.running_mean" in f.message and "rank 1: 0.07" in f.message


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_unused_parameters_named(unused):
    code, doc, _ = unused
    assert doc["exit_code"] == 1 and code != 0
    [f] = by_code(doc, "ddp-unused-parameter")
    # every rank: no "[rank N]" tag; the names, not DDP's indices, with gradflow's cause
    assert f["ranks"] == [0, 1] and f["where"] == "extra" and f["severity"] == "error"
    assert "(extra.weight, extra.bias)" in f["message"] and "module extra (Linear) never ran in forward" in f["message"]
    assert "find_unused_parameters=True" in f["hint"]
    assert [u["name"] for u in doc["ranks"][1]["unused"]] == ["extra.weight", "extra.bias"]
    # DDP never launched the allreduce of the bucket holding extra.*: the gradients are not all reduced
    assert [r["data"]["reduced_grad_norm"] for r in doc["ranks"]] == [None, None]


@pytest.mark.slow
@pytest.mark.distributed
def test_overfit_batch_trains_the_ddp_copy_and_ranks_stop_together(overfit):
    code, doc, _ = overfit
    assert code == 0 and doc["exit_code"] == 0
    r0, r1 = (r["data"] for r in doc["ranks"])
    assert all(r["header"]["wrap"].startswith("ddp (the copy overfit-batch trains;") for r in doc["ranks"])
    # the stop is agreed across ranks each step: the same number of steps everywhere, and the target
    # counts when every rank's rows reach it
    assert r0["passed"] and r1["passed"] and r0["steps"] == r1["steps"] == r0["steps_to_target"] == r1["steps_to_target"]
    assert r0["final_loss"] <= 0.5 and r1["final_loss"] <= 0.5
    # rank 0's own loss (the curve in the document) never stops the run before it reaches the target
    # (rank 1's rows may reach it later: the stop waits for every rank; tests/test_distributed_fsdp.py checks
    # the curve against plain torch's averaged-gradient training)
    assert min(i for i, v in enumerate(doc["loss"]) if v <= 0.5) <= r0["steps"]


def test_unused_hint_when_every_rank_failed():
    """When DDP itself raised on every rank ("Expected to have finished reduction … indices"), the
    error's hint names the parameters and why, per rank where they differ."""
    from torchdiag.runner.report import unused_hint

    gone = {"name": "aux.weight", "reason": "unused", "why": "module aux (Linear) never ran in forward"}
    cut = {"name": "head.bias", "reason": "detached", "why": "module head (Linear) ran under torch.no_grad()"}
    records = [{"rank": 0, "unused": [gone]}, {"rank": 1, "unused": [gone, cut]}]
    hint = unused_hint(records)
    assert "aux.weight (unused: module aux (Linear) never ran in forward)" in hint
    assert "head.bias (detached: module head (Linear) ran under torch.no_grad() on rank 1)" in hint
    assert unused_hint([{"rank": 0, "unused": []}, {"rank": 1, "unused": None}]) is None


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("rank, reports", [("0", True), ("1", False)])
def test_option_error_under_torchrun_is_reported_by_rank_0_only(rank, reports):
    # click rejects the line before any process group exists; every rank parses the same line
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": rank, "WORLD_SIZE": "2", "LOCAL_RANK": rank}
    r = subprocess.run([sys.executable, "-m", "torchdiag", "doctor", sample("ranks.py:healthy"), "--lr", "1", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD, env=env)
    assert r.returncode == 2
    assert (r.stdout.count('"exit_code": 2') == 1) is reports and ("No such option: --lr" in r.stderr) is reports
    assert reports or (r.stdout == "" and r.stderr == "")


def test_every_rank_failed_leads_with_the_cause_not_its_echo(capsys):
    """A rank stopped because its peer failed (its error marked an echo) may fail first by the clock: the
    report still leads with the peer's own error."""
    from types import SimpleNamespace

    from torchdiag.cli.common import show
    from torchdiag.commands import get
    from torchdiag.runner.job import Job
    from torchdiag.runner.ranks import all_failed

    def rec(rank, message, at, echo):
        return {"rank": rank, "exit_code": 3, "error": {"message": message, "hint": None, "at": at, "echo": echo}}

    records = [rec(0, "stopped at step 3: the model raised on another rank", 1.0, True),
               rec(1, "the model raised in forward: boom", 2.0, False)]
    outcome = all_failed(SimpleNamespace(wrap="none", command="overfit-batch"), records)
    assert outcome.code == 3
    show(outcome, Job(get("overfit-batch"), {"json": True}))
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["message"] == "[rank 1] the model raised in forward: boom"


@pytest.mark.slow
@pytest.mark.distributed
def test_failing_rank_does_not_hold_the_others(failing):
    code, doc, stderr = failing
    assert doc["exit_code"] == 3 and code != 0
    r0, r1 = doc["ranks"]
    assert r0["exit_code"] == 0 and r0["error"] is None          # rank 0 finished its run
    assert r1["exit_code"] == 3 and "fails on rank 1" in r1["error"]["message"]
    [f] = by_code(doc, "rank-failed")
    assert f["ranks"] == [1] and f["message"].startswith("[rank 1] ")
    assert "error: [rank 1]" in stderr and "error: [rank 0]" not in stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_rank_failing_while_its_peer_waits_in_a_collective(waiting):
    """Rank 1 raises before DDP's first broadcast; rank 0 waits in it until the collective timeout
    (set low here), then both hand in their errors: the report leads with the first failure."""
    code, doc, stderr = waiting["fails_in_collective"].result()
    assert doc["exit_code"] == 3 and code != 0
    assert doc["error"]["message"] == "[rank 1] " + doc["ranks"][1]["error"]["message"]
    assert "fails on rank 1" in doc["error"]["message"]
    assert all(r["error"] for r in doc["ranks"])        # rank 0 came back from its wait too
    assert "error: [rank 0]" in stderr and "error: [rank 1]" in stderr


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("command", [
    # the copy profile trains, wrapped in DDP (which broadcasts its parameters)
    ["profile", "--mode", "train", "--active", "1", "--warmup", "0", "--wait", "0"],
    # the pristine copy gradflow's ranks compare after a step (a review: it went on waiting)
    ["gradflow"]], ids=["wrapped", "compared"])
def test_a_copy_refused_on_one_rank_stops_every_rank_before_the_wrapper_waits(command):
    """A copy every rank uses in a collective that one rank has no room for: that rank raised and its peer waited in
    the collective for the distributed timeout (600 s by default). Now every rank stops at once, the refusing rank's
    error leading the report."""
    code, doc, stderr = torchrun(command[0], sample("ranks.py:full_on_rank"), "--arg", "rank=1", "--wrap", "ddp",
                                 *command[1:], env={"TORCHDIAG_DIST_TIMEOUT": "120"})
    assert doc["exit_code"] == 3 and code != 0
    r0, r1 = doc["ranks"]
    assert "rank 1's memory is full" in r1["error"]["message"] and not r1["error"]["echo"]
    assert r0["error"]["echo"] and "did not fit on another rank" in r0["error"]["message"]
    assert doc["error"]["message"] == "[rank 1] " + r1["error"]["message"]
    assert r1["error"]["at"] - r0["error"]["at"] < 60   # not after a wait in the broadcast


@pytest.mark.slow
@pytest.mark.distributed
def test_a_factory_failing_on_one_rank_does_not_hold_the_others(build_fails):
    """A sweep: rank 1's factory raised, rank 0 went on to --wrap's parameter check and waited there for twice the
    distributed timeout (20 min at the default), and the report led with its timeout. The ranks now agree the model
    was built everywhere before any collective: rank 0 stops at once, its error an echo, the report rank 1's."""
    code, doc, err = build_fails
    assert code == 3 and doc["exit_code"] == 3
    assert doc["error"]["message"].startswith("[rank 1] ") and "this factory fails on rank 1" in doc["error"]["message"]
    r0 = doc["ranks"][0]["error"]
    assert r0["echo"] and "another rank could not build" in r0["message"]
    assert "Timed out" not in err and "internal error" not in err


@pytest.mark.slow
@pytest.mark.distributed
def test_a_factory_exiting_on_one_rank_does_not_hold_the_others(build_exits):
    """A review: sys.exit (and Ctrl-C) in one rank's factory left the others waiting in the next collective, and the
    report led with their timeout as an internal error. They are told as of an exception."""
    code, doc, err = build_exits
    assert doc["exit_code"] == 3 and "sys.exit(3)" in doc["error"]["message"], doc["error"]
    assert doc["error"]["message"].startswith("[rank 1] ") and "internal error" not in err


@pytest.mark.slow
@pytest.mark.distributed
def test_a_buffer_on_one_rank_only_is_refused_before_ddp_wraps(buffer_ddp):
    """A review: DDP's broadcast of buffers hung on a buffer one rank alone had, and doctor then passed (its
    rank-check-failed a warning). The ranks' buffers are compared with their parameters before DDP wraps."""
    _, doc, _ = buffer_ddp
    assert doc["exit_code"] != 0
    said = json.dumps(doc)
    assert "the ranks built different models" in said and "first extra" in said, doc.get("error") or doc["findings"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_buffer_ddp_is_told_to_ignore_may_differ(buffer_ignored):
    """A review: a rank-local cache of another shape per rank, which DDP is told to ignore and plain DDP trains, was
    refused as a different model once buffers were compared before DDP wraps. What DDP ignores is not compared."""
    code, doc, _ = buffer_ignored
    assert code == 0 and doc["exit_code"] == 0, doc.get("error") or doc["findings"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_buffer_of_another_dtype_on_one_rank_is_rank_divergence(buffer_dtype):
    """A review: a buffer float64 on rank 1 and float32 on rank 0, of the same values, passed: the float64 checksums
    cannot tell them apart. The dtypes are compared too."""
    _, doc, _ = buffer_dtype
    (f,) = by_code(doc, "rank-divergence")
    assert doc["exit_code"] == 1 and f["where"] == "extra" and "rank 1: float64" in f["message"], f


@pytest.mark.slow
@pytest.mark.distributed
def test_a_layer_on_one_rank_only_is_rank_divergence(extra_layer):
    """A sweep: a factory adding a layer on rank 1 passed (the ranks' tensors were matched by position, rank 1's
    extra ones never looked at); on rank 0 it was an IndexError shown as a warning. Matched by name now."""
    _, doc, _ = extra_layer
    assert doc["exit_code"] == 1
    found = by_code(doc, "rank-divergence")
    assert sorted(f["where"] for f in found) == ["3.bias", "3.weight"], found
    assert all("absent on rank 0" in f["message"] for f in found)
    assert not by_code(doc, "rank-check-failed")


@pytest.mark.slow
@pytest.mark.distributed
def test_nancheck_names_rank_and_module(nan_rank):
    _, doc, _ = nan_rank
    assert doc["exit_code"] == 1
    [f] = by_code(doc, "non-finite-output")
    assert f["where"] == "2" and f["ranks"] == [1] and f["message"].startswith("[rank 1] ")
    # the main pass ran on the DDP copy: rank 0's rows are finite, its gradients after the reduction are not
    assert all(r["header"]["wrap"].startswith("ddp (the main pass runs on the DDP copy") for r in doc["ranks"])
    assert [g["code"] for g in doc["ranks"][0]["findings"]] == ["non-finite-after-reduction"]
    [g] = by_code(doc, "non-finite-after-reduction")
    assert g["ranks"] == [0] and "another rank" in g["message"]


@pytest.mark.slow
@pytest.mark.distributed
def test_gradflow_judges_the_fsdp_gradients_made_whole(fsdp_grads, healthy):
    code, doc, _ = fsdp_grads
    assert doc["exit_code"] == 1
    assert all(r["header"]["wrap"].startswith("fsdp (the judged pass runs on the fully_shard copy") for r in doc["ranks"])
    r0, r1 = (r["data"] for r in doc["ranks"])
    assert r0["loss_value"] != r1["loss_value"]             # each rank its own rows
    # the gradients after FSDP's reduce-scatter, gathered whole: the same on both ranks, and the same as DDP's
    # allreduce gives for `healthy` (its layers are `unused`'s body, built first from the same seed; the same
    # rows and targets): two different reductions, one number
    assert r0["reduced_grad_norm"] == pytest.approx(r1["reduced_grad_norm"], rel=1e-6)
    ddp = healthy[1]["ranks"][0]["data"]["reduced_grad_norm"]
    assert r0["reduced_grad_norm"] == pytest.approx(ddp, rel=1e-5)
    # FSDP tolerates a parameter no rank uses (no DDP error); gradflow names it with its cause
    [f] = by_code(doc, "no-grad")
    assert f["where"] == "extra" and "never ran in forward" in f["message"] and f["ranks"] == [0, 1]


@pytest.mark.slow
@pytest.mark.distributed
def test_nancheck_under_fsdp_names_rank_and_module(fsdp_nan):
    _, doc, _ = fsdp_nan
    assert doc["exit_code"] == 1
    assert all(r["header"]["wrap"].startswith("fsdp (the main pass runs on the fully_shard copy") for r in doc["ranks"])
    [f] = by_code(doc, "non-finite-output")
    assert f["where"] == "2" and f["ranks"] == [1]
    # rank 0's shard of the reduced gradients may be finite or not: the ranks agree, so rank 0 says where it came from
    assert [g["code"] for g in doc["ranks"][0]["findings"]] == ["non-finite-after-reduction"]


@pytest.fixture(scope="module")
def branch_ddp(waiting):
    return waiting["branch_ddp"].result()


@pytest.fixture(scope="module")
def branch_fsdp():
    return torchrun("gradflow", sample("ranks.py:branch_on_rank"), "--wrap", "fsdp", env={"TORCHDIAG_DIST_TIMEOUT": "10"})


@pytest.mark.slow
@pytest.mark.distributed
def test_a_parameter_unused_on_one_rank_under_ddp_is_named_not_a_crash(branch_ddp):
    # the failing rank's agreement used to pair with its peer's pending allreduce: gloo aborted (exit 4)
    code, doc, stderr = branch_ddp
    assert doc["exit_code"] == 1 and "terminate called" not in stderr and "internal error" not in stderr
    [f] = by_code(doc, "ddp-unused-parameter")
    assert f["ranks"] == [1] and "(aux.weight, aux.bias)" in f["message"] and "never ran in forward" in f["message"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_parameter_unused_on_one_rank_under_fsdp_is_refused_by_name(branch_fsdp):
    code, doc, stderr = branch_fsdp
    assert doc["exit_code"] == 3 and "terminate called" not in stderr
    assert "get a gradient on some ranks only (aux.weight, aux.bias)" in doc["error"]["message"]
    assert [r["exit_code"] for r in doc["ranks"]] == [3, 3]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.cuda
def test_two_gpus_use_nccl_one_gpu_per_rank():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs (nccl: one GPU per rank)")
    code, doc, _ = torchrun("gradflow", sample("ranks.py:healthy"), "--wrap", "ddp", device="cuda")
    assert code == 0 and doc["backend"] == "nccl"
    assert [r["device"] for r in doc["ranks"]] == ["cuda:0", "cuda:1"]
    assert doc["consistency"]["differs"] == [] and doc["consistency"]["grads_differ"] == []


# ---- no launch ---------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.distributed
def test_current_reads_torchrun_env(monkeypatch):
    from torchdiag.core.distributed import Ranks, current

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert current() is None
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert current() is None
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert current() == Ranks(3, 4, 1, local_world=1)   # no LOCAL_WORLD_SIZE (not torchrun): this process alone
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert current() == Ranks(3, 4, 1, local_world=2)
    for given, local in (("8", 4), ("0", 1), ("2.0", 1), ("", 1)):   # never past the world, never below one
        monkeypatch.setenv("LOCAL_WORLD_SIZE", given)
        assert current() == Ranks(3, 4, 1, local_world=local), given


@pytest.mark.parametrize("n,world", [(8, 2), (7, 3), (5, 5), (10, 4)])
def test_shard_bounds_follow_tensor_split(n, world):
    import torch

    from torchdiag.core.distributed import Ranks, shard_bounds

    expected = [t.tolist() for t in torch.tensor_split(torch.arange(n), world)]
    got = [list(range(*shard_bounds(n, Ranks(r, world, r)))) for r in range(world)]
    assert got == expected


def test_shard_smaller_than_world_refused():
    from torchdiag.core.distributed import Ranks, shard_bounds
    from torchdiag.errors import UsageError

    with pytest.raises(UsageError, match="cannot give each of the 4 ranks a row"):
        shard_bounds(3, Ranks(0, 4, 0))


def test_shard_cuts_batch_tensors_and_target_only():
    import torch

    from torchdiag.core.distributed import Ranks, shard
    from torchdiag.core.inputs import ModelInputs

    x, mask, target = torch.arange(24.).reshape(6, 4), torch.ones(3, 3), torch.arange(6)
    inputs, tgt, text = shard(ModelInputs((x,), {"mask": mask}), target, Ranks(1, 2, 1))
    assert torch.equal(inputs.args[0], x[3:6]) and inputs.kwargs["mask"] is mask
    assert torch.equal(tgt, target[3:6]) and text == "rows 3:6 of 6; given whole to every rank: mask (3x3)"


def test_a_model_that_raised_on_cut_and_whole_inputs_is_told_what_was_cut():
    """A new user's EmbeddingBag under torchrun: its flat ids were cut 20/20 and every offset went to both ranks; the
    model's error said "the model's own code raised", where torchdiag's cut was the cause. The hint says what was cut
    and what was given whole; with every input cut, the model's own hint stands."""
    from types import SimpleNamespace

    from torchdiag.core.tracking import RAISED_HINT
    from torchdiag.errors import ModelError
    from torchdiag.runner.ranks import _cut_hint

    def hinted(shard):
        err = ModelError("forward failed in emb (EmbeddingBag): offsets[-1] ...", hint=RAISED_HINT)
        _cut_hint(err, SimpleNamespace(ctx=SimpleNamespace(header={"batch_shard": shard})))
        return err.hint

    said = hinted("rows 0:20 of 40; given whole to every rank: input[1] (4)")
    assert said.startswith(RAISED_HINT + "; if it runs in one process, torchrun's cut is why: the inputs were cut "
                           "along dim 0 (rows 0:20 of 40; given whole to every rank: input[1] (4))"), said
    assert hinted("rows 0:20 of 40") == RAISED_HINT


def test_an_error_every_rank_had_is_said_once_and_the_others_by_their_rank():
    from torchdiag.runner.ranks import _own_line

    same = [{"message": "boom", "at": 1.0}, {"message": "boom", "at": 2.0}]
    assert _own_line(0, same) == [] and _own_line(1, same) == []        # rank 0's report says "[ranks 0,1] boom"
    # the lead is the first failure that is not an echo of a peer's: the echo is said by its rank
    echoed = [{"message": "timed out", "at": 3.0, "echo": True}, {"message": "boom", "at": 2.0}]
    assert _own_line(0, echoed) == ["error: [rank 0] timed out"] and _own_line(1, echoed) == []
    # a rank that failed beside one that ran is said by its rank (the report holds it as rank-failed)
    some = [None, {"message": "boom", "at": 2.0}]
    assert _own_line(0, some) == [] and _own_line(1, some) == ["error: [rank 1] boom"]


def test_merge_tags_ranks_and_takes_the_worst_code():
    from torchdiag.results import Result
    from torchdiag.runner.merge import finish, merge, record

    a, b = Result("nancheck"), Result("nancheck")
    for res in (a, b):
        res.add("same", "warning", "fc", "on both")
    b.add("only-one", "error", "fc", "only on rank 1")
    a.verdict = "PASS: fine"
    records = [record(0, "cpu", 0, a), record(1, "cpu", b.exit_code, b),
               record(2, "cpu", 3, None, {"message": "boom", "hint": None})]
    merged = merge(records, a, "nancheck")
    finish(merged, records)
    got = {f.code: (f.ranks, f.message) for f in merged.findings}
    assert got["same"] == ([0, 1], "[ranks 0,1] on both")
    assert got["only-one"] == ([1], "[rank 1] only on rank 1")
    assert got["rank-failed"] == ([2], "[rank 2] boom")
    assert int(merged.exit_code) == 3 and merged.verdict.startswith("FAIL")
    assert [r["rank"] for r in merged.to_dict()["ranks"]] == [0, 1, 2]


def test_merge_says_ranks_that_failed_alike_once():
    """A sweep: watch under torchrun refused FSDP2 on both ranks: two rank-failed errors with one message, and a
    verdict that both ranks "did not finish", where both scripts had run to their end."""
    from torchdiag.runner.merge import finish, merge, record

    refusal = {"message": "watch: an optimizer over fully_shard (FSDP2) sharded parameters is not watched",
               "hint": "watch the run under DDP"}
    records = [record(0, "cpu", 2, None, dict(refusal)), record(1, "cpu", 2, None, dict(refusal)),
               record(2, "cpu", 3, None, {"message": "boom", "hint": None}),
               # a review: each rank's shard in its words (5 rows over 3 ranks: 2, 2, 1)
               record(3, "cpu", 3, None, {"message": "forward raised on input shapes (2x8)", "hint": None}),
               record(4, "cpu", 3, None, {"message": "forward raised on input shapes (1x8)", "hint": None})]
    merged = merge(records, None, "watch")
    finish(merged, records)
    failed = [(f.ranks, f.message, f.hint) for f in merged.findings if f.code == "rank-failed"]
    assert failed == [([0, 1], f"[ranks 0,1] {refusal['message']}", refusal["hint"]), ([2], "[rank 2] boom", None),
                      ([3, 4], "[ranks 3,4] forward raised on input shapes (2x8) (rank 3's numbers; each rank's own in "
                               "--json `ranks`)", None)]
    assert merged.verdict.startswith("FAIL: rank(s) 0, 1, 2, 3, 4 ended with an error")


def test_merge_one_finding_when_ranks_differ_only_in_numbers():
    from torchdiag.results import Result
    from torchdiag.runner.merge import merge, record

    a, b = Result("doctor"), Result("doctor")
    a.add("mode-dependent", "info", "bn1", "outputs differ (max 0.39)")
    b.add("mode-dependent", "info", "bn1", "outputs differ (max 0.48)")
    b.add("mode-dependent", "info", "bn2", "outputs differ (max 0.1)")
    merged = merge([record(0, "cpu", 0, a), record(1, "cpu", 0, b)], a, "doctor")
    got = {f.where: (f.ranks, f.message) for f in merged.findings}
    assert got["bn1"] == ([0, 1], "outputs differ (max 0.39) (rank 0's numbers; each rank's own in --json `ranks`)")
    assert got["bn2"] == ([1], "[rank 1] outputs differ (max 0.1)")


def test_merge_takes_ddps_prefix_off_names():
    from torchdiag.results import Result
    from torchdiag.runner.merge import merge, record

    a = Result("memory")
    a.add("x", "warning", "module.fc", "module.fc is big")
    a.add("y", "warning", "module", "the whole model")
    merged = merge([record(0, "cpu", 0, a), record(1, "cpu", 0, a)], a, "memory", unwrap="module.")
    assert [(f.where, f.message) for f in merged.findings] == [("fc", "fc is big"), ("(root)", "the whole model")]


@pytest.mark.slow
@pytest.mark.distributed
def test_wrap_without_torchrun_is_a_usage_error(cli, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    r = cli("gradflow", sample("ranks.py:healthy"), "--wrap", "ddp", "--device", "cpu")
    assert r.code == 2 and "needs several processes started by torchrun" in r.stderr
    one_error_line(r)


@pytest.mark.slow
@pytest.mark.distributed
def test_meta_refused_under_torchrun(cli, monkeypatch):
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    r = cli("nancheck", sample("ranks.py:healthy"), "--device", "meta")
    assert r.code == 2 and "--device meta cannot run under torchrun" in r.stderr
    one_error_line(r)


def _one_process_world(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)


def test_a_process_group_already_up_is_borrowed_and_left_up(tmp_path):
    """A program that runs the command line in-process on each rank (support.torchrun_many does) keeps its
    default group: torchdiag makes and destroys only its own groups on it."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from torchdiag.core.distributed import Ranks, session

    _one_process_world(tmp_path)
    try:
        default = dist.group.WORLD
        with session(Ranks(0, 1, 0), SimpleNamespace(device="cpu")) as sess:
            assert sess.group is not default and sess.gather({"x": 1}) == [{"x": 1}]
        assert dist.is_initialized() and dist.group.WORLD is default
        dist.barrier()      # still usable
    finally:
        dist.destroy_process_group()


def test_a_process_group_of_another_world_is_refused(tmp_path):
    from types import SimpleNamespace

    import torch.distributed as dist

    from torchdiag.core.distributed import Ranks, session
    from torchdiag.errors import UsageError

    _one_process_world(tmp_path)
    try:
        with pytest.raises(UsageError, match=r"already has a process group \(rank 0 of 1, gloo\)"):
            with session(Ranks(0, 2, 0), SimpleNamespace(device="cpu")):
                pass
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


def test_a_language_model_keeps_its_next_token_loss_on_each_rank(lm):
    """A sweep: under torchrun the language model's ids were found on the whole batch, then the inputs were cut per
    rank, and the logits no longer fit them: the auto loss fell back to MSE against a random target. Each rank's loss
    is the next-token cross-entropy of its own rows, computed here by hand."""
    import importlib.util

    import torch

    code, doc, _ = lm
    assert code == 0, doc
    spec = importlib.util.spec_from_file_location("gpt_tiny_truth", ROOT / "sample_models" / "gpt_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.build()
    (ids,) = mod.example_inputs()
    half = ids.shape[0] // 2
    for r, rows in zip(doc["ranks"], (ids[:half], ids[half:])):
        assert r["header"]["loss"].startswith("next-token cross_entropy"), r["header"]["loss"]
        with torch.no_grad():
            out = model(rows)
            logits = out["logits"] if isinstance(out, dict) else out
            want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        assert r["data"]["loss_value"] == pytest.approx(float(want), rel=1e-5), (r["data"]["loss_value"], float(want))


def test_nancheck_does_not_count_the_ddp_wrapper_as_a_module_call(tmp_path):
    """The flagged pass runs on our DDP copy; the wrapper's own call is not one of the model's (a sweep: 7 module
    calls under --wrap ddp, 6 without)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from torchdiag.core.inputs import ModelInputs
    from torchdiag.core.loss import Loss
    from torchdiag.diagnostics.nancheck.flags import flagged_pass

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))   # 4 module calls
    x = ModelInputs((torch.randn(6, 4),))
    loss = Loss("cross_entropy", 0, None)
    _one_process_world(tmp_path)
    try:
        wrapped = DistributedDataParallel(model)
        outer = flagged_pass(wrapped, x, loss, outer=wrapped)
        plain = flagged_pass(model, x, loss)
    finally:
        dist.destroy_process_group()
    assert plain.modules_checked == 4 and outer.modules_checked == 4
