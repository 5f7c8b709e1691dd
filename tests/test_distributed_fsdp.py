"""--wrap fsdp under torchrun, real 2-process gloo launches (one running every scenario in turn, shared by its assertions):
overfit-batch trains the fully_shard copy (its curve recomputed here with plain torch from the averaged
gradient), and the cross-rank consistency check takes its real steps on a fully_shard copy."""
from __future__ import annotations

import pytest
import torch

from support import (
    by_code,
    launched_fixtures,
    load_module,
    sample,
    torchrun_args,
    torchrun_many,
)

STEPS = 30
ROWS = [slice(0, 4), slice(4, 8)]       # 8 rows on 2 ranks: rank r takes rows 4r:4r+4


# one launch for every run here (support.torchrun_many: each rank runs them in turn; every rank ends normally)
RUNS = {
    # a model that cannot overfit (softmax before cross-entropy), on a fixed batch
    "bounded": ["overfit-batch", sample("ranks_fsdp.py:softmax"), "--batch", sample("ranks_fsdp.py:batch"),
                "--wrap", "fsdp", "--steps", STEPS],
    "healthy": ["overfit-batch", sample("ranks.py:healthy"), "--wrap", "fsdp", "--steps", "300", "--target-loss", "0.5"],
    "counted": ["gradflow", sample("ranks_fsdp.py:counted"), "--wrap", "fsdp"],
    "memory": ["memory", sample("mlp.py:build"), "--arg", "hidden=1024", "--wrap", "fsdp"],
}


@pytest.fixture(scope="module")
def launched():
    return torchrun_many(RUNS)


bounded, healthy, counted = launched_fixtures("bounded", "healthy", "counted")


def _curves(averaged: bool):
    """Plain torch, no torchdiag: Adam (lr 1e-3) on ranks_fsdp.softmax; each step's gradient is the
    mean over the two ranks of the gradient of each rank's own mean loss (what FSDP's reduce-scatter
    gives every rank), or rank 0's own only. Returns (loss per step on each rank's rows, grad norms)."""
    m = load_module("ranks_fsdp.py")
    model, (x, y) = m.softmax(), m.batch()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, norms = [[], []], []
    for k in range(STEPS + 1):
        opt.zero_grad()
        per = [torch.nn.functional.cross_entropy(model(x[r]), y[r]) for r in ROWS]
        for r in range(2):
            losses[r].append(per[r].item())
        if k == STEPS:
            break
        ((per[0] + per[1]) / 2 if averaged else per[0]).backward()
        norms.append(torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item())
        opt.step()
    return losses, norms


@pytest.mark.slow
@pytest.mark.distributed
def test_overfit_batch_fsdp_trains_the_averaged_gradient(bounded):
    code, doc, _ = bounded
    assert doc["exit_code"] == 1 and code != 0
    (truth0, truth1), norms = _curves(averaged=True)
    own0 = _curves(averaged=False)[0][0]
    assert abs(own0[-1] - truth0[-1]) > 1e-3     # the premise: training on rank 0's rows alone ends elsewhere
    assert doc["loss"] == pytest.approx(truth0, rel=1e-5, abs=1e-6)          # rank 0's whole curve
    assert doc["grad_norm"] == pytest.approx(norms, rel=1e-4)                # the whole gradient's norm
    r0, r1 = (r["data"] for r in doc["ranks"])
    assert (r1["initial_loss"], r1["final_loss"]) == pytest.approx((truth1[0], truth1[-1]), rel=1e-5)
    assert r0["steps"] == r1["steps"] == STEPS
    assert all(r["header"]["wrap"].startswith("fsdp (the copy overfit-batch trains is sharded by fully_shard")
               for r in doc["ranks"])


@pytest.mark.slow
@pytest.mark.distributed
def test_overfit_batch_fsdp_fails_as_without_torchrun(bounded, cli):
    """The causes run on a local copy of the gathered weights: the same findings as one process."""
    _, doc, _ = bounded
    plain = cli("overfit-batch", sample("ranks_fsdp.py:softmax"), "--batch", sample("ranks_fsdp.py:batch"),
                "--steps", STEPS, "--device", "cpu", "--json")
    assert plain.code == 1
    codes = {f["code"] for f in plain.json["findings"]}
    assert codes == {"cannot-overfit", "bounded-output"}
    for r in doc["ranks"]:
        assert {f["code"] for f in r["findings"]} == codes and r["error"] is None
    # 4 classes, outputs in [0, 1]: cross-entropy cannot go below log(1 + 3/e)
    [f] = [f for f in doc["ranks"][1]["findings"] if f["code"] == "bounded-output"]
    assert f"{torch.log(torch.tensor(1 + 3 / torch.e)).item():.4g}" in f["message"]


@pytest.mark.slow
@pytest.mark.distributed
def test_overfit_batch_fsdp_healthy_passes_with_ranks_in_step(healthy):
    code, doc, _ = healthy
    assert code == 0 and doc["exit_code"] == 0
    r0, r1 = (r["data"] for r in doc["ranks"])
    assert r0["passed"] and r1["passed"] and r0["steps"] == r1["steps"] == r0["steps_to_target"]
    assert r0["final_loss"] <= 0.5 and r1["final_loss"] <= 0.5
    assert all(r["header"]["wrap"].startswith("fsdp (the copy overfit-batch trains is sharded by fully_shard")
               for r in doc["ranks"])


@pytest.mark.slow
@pytest.mark.distributed
def test_consistency_under_fsdp_compares_after_two_steps(counted):
    code, doc, _ = counted
    cons = doc["consistency"]
    model = load_module("ranks_fsdp.py").counted()
    assert cons["steps"] == 2 and not cons["notes"]
    assert cons["compared"] == len(list(model.named_parameters())) + len(list(model.named_buffers()))
    # parameters and gradients (made whole) are the same on every rank; what FSDP leaves to each rank is not
    assert cons["grads_differ"] == []
    assert {d["name"]: d["step"] for d in cons["differs"]} == {"1.running_mean": 1, "1.running_var": 1, "3.count": 1}
    [count] = by_code(doc, "rank-divergence")
    assert count["where"] == "3.count" and count["severity"] == "error"
    # count += 1 + RANK per train-mode forward: after step 1, 1 on rank 0 and 2 on rank 1
    assert "rank 1: 1" in count["message"] and doc["exit_code"] == 1 and code != 0


@pytest.mark.slow
@pytest.mark.distributed
def test_batchnorm_stats_under_fsdp_are_info_with_the_exact_difference(counted):
    _, doc, _ = counted
    [f] = by_code(doc, "batchnorm-stats-differ")     # one finding for the module's two buffers
    assert f["where"] == "1" and f["severity"] == "info" and "SyncBatchNorm" in f["hint"]
    # step 1's forward uses the weights as built: running stats = 0.9 × initial + 0.1 × the rows' own stats
    m = load_module("ranks_fsdp.py")
    lin, x = m.counted()[0], m.example_inputs()[0]
    with torch.no_grad():
        h = [lin(x[r]) for r in ROWS]
    mean = [0.1 * t.mean(0) for t in h]
    var = [0.9 + 0.1 * t.var(0, unbiased=True) for t in h]
    diffs = {d["name"]: d["max_abs_diff"]["1"] for d in doc["consistency"]["differs"]}
    assert diffs["1.running_mean"] == pytest.approx((mean[1] - mean[0]).abs().max().item(), rel=1e-5)
    assert diffs["1.running_var"] == pytest.approx((var[1] - var[0]).abs().max().item(), rel=1e-5)


# ---- no launch: the loop's agreement when a rank's model raises -------------------------------------

class _RaisesAt(torch.nn.Module):
    """Raises in forward (inside `inner`) from its `at`-th call on."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0
        self.body = torch.nn.Linear(8, 4)
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.calls += 1
        h = self.body(x)
        return self.inner(h if self.calls < self.at else h.view(-1))   # (32,) does not fit Linear(4, 4)


def _run_as_wrapped(model, agree, monkeypatch, steps=5):
    """overfit-batch as a rank runs it under a wrapper, without a process group: the wrapper is the
    identity and the cross-rank agreement is `agree` (flags → flags)."""
    from torchdiag.api import as_inputs, run_spec
    from torchdiag.core.context import context_for
    from torchdiag.diagnostics import overfit_batch
    from torchdiag.diagnostics.overfit_batch import loop

    ctx = context_for(model, run_spec("overfit-batch", overfit_batch), loss="auto", target=None)
    ctx.wrapper = lambda work: work
    monkeypatch.setattr(loop, "_agreement", lambda ctx, group: agree)
    return overfit_batch.run(model, as_inputs(model, (torch.randn(8, 8),)), overfit_batch.Options(steps=steps), ctx)


def test_a_rank_whose_forward_raises_still_makes_the_steps_agreement(monkeypatch):
    """Its peers are about to make the step's all_reduce: it makes it too, flagged failed, then raises
    its own error (the module named by a re-run on the plain module, never through the wrapper)."""
    from torchdiag.errors import ModelError

    calls = []
    with pytest.raises(ModelError) as info:
        _run_as_wrapped(_RaisesAt(3), lambda flags: calls.append(list(flags)) or flags, monkeypatch)
    assert len(calls) == 3 and calls[-1] == [False, False, False, True]
    assert all(len(c) == 4 and not c[3] for c in calls[:2])
    assert "inner" in info.value.message and "forward (step 2)" in info.value.message


def test_a_peers_failure_stops_this_rank_with_an_error(monkeypatch):
    from torchdiag.errors import ModelError

    with pytest.raises(ModelError) as info:
        _run_as_wrapped(torch.nn.Linear(8, 4), lambda flags: flags[:3] + [True], monkeypatch)
    assert "the model raised on another rank" in info.value.message and info.value.follows_peer
    assert info.value.partial is not None and info.value.partial.data["steps"] == 0


def test_an_interrupted_rank_makes_no_collective_after_the_loop(monkeypatch):
    """Ctrl-C reaches every rank, but not at the same step: the partial result is built without
    gathering the shards (sharded.localise), which a peer already gone would never join."""
    from torchdiag.diagnostics.overfit_batch import sharded

    def stop(step, loss):
        if step == 2:
            raise KeyboardInterrupt

    def never(*a, **k):
        raise AssertionError("localise gathers across ranks: not after an interrupt")

    monkeypatch.setattr(sharded, "localise", never)
    from torchdiag.api import as_inputs, run_spec
    from torchdiag.core.context import context_for
    from torchdiag.diagnostics import overfit_batch
    from torchdiag.diagnostics.overfit_batch import loop

    model = torch.nn.Linear(8, 4)
    ctx = context_for(model, run_spec("overfit-batch", overfit_batch), loss="auto", target=None)
    ctx.wrapper = lambda work: work
    monkeypatch.setattr(loop, "_agreement", lambda ctx, group: lambda flags: flags)
    result = overfit_batch.run(model, as_inputs(model, (torch.randn(8, 8),)),
                               overfit_batch.Options(steps=5, on_step=stop), ctx)
    assert result.code == 130 and result.data["interrupted"] and result.data["steps"] == 2


# ---- memory's FSDP estimate against a real fully_shard step's per-rank peak ----------------------

@pytest.fixture(scope="module")
def fsdp_peaks(tmp_path_factory) -> dict:
    """bench/fsdp_peak.py under torchrun (2 gloo processes), one launch for both wraps: per (wrap, model), each
    rank's peak live tensor bytes during a real FSDP2 training step, counted by the script's own census (not
    torchdiag's tracker), and memory's ZeRO-3/FSDP estimate of the same step."""
    import json

    from support import ROOT

    out = tmp_path_factory.mktemp("fsdp") / "fsdp.json"
    r = torchrun_args(ROOT / "bench" / "fsdp_peak.py", "--plan", "root:mlp,cnn,transformer/units:mlp,cnn",
                        "--json", out, env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return {(row["wrap"], row["model"]): row for row in json.loads(out.read_text())}


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_estimate_within_10_percent_of_the_measured_peak_per_rank(fsdp_peaks):
    """fully_shard at the root (as --wrap fsdp shards): an MLP, a CNN and a transformer LM."""
    rows = {model: row for (wrap, model), row in fsdp_peaks.items() if wrap == "root"}
    assert set(rows) == {"mlp", "cnn", "transformer"}
    for name, row in rows.items():
        assert row["world"] == 2 and len(row["measured_bytes"]) == 2
        for peak in row["measured_bytes"]:
            assert abs(row["estimate_bytes"] - peak) <= 0.10 * peak, (name, row)
    # the measurement itself, in closed form: the MLP (fp32, Adam, every dim 0 even) peaks in the root's
    # reduce-scatter, where each rank holds its parameter shard (P/2), Adam's two moments of it (P), the
    # reduce-scatter input (P), gloo's copy of it (P) and the output shard (P/2): 4P, plus the batch
    mlp = rows["mlp"]
    P = mlp["param_bytes"]
    for peak in mlp["measured_bytes"]:
        assert 4 * P <= peak < 4 * P + 64 * 1024


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_estimate_per_layer_units_within_10_percent(fsdp_peaks):
    """fully_shard on each layer and the root (the units memory's --shard plans for)."""
    rows = {model: row for (wrap, model), row in fsdp_peaks.items() if wrap == "units"}
    assert set(rows) == {"mlp", "cnn"}
    for name, row in rows.items():
        assert row["unit_bytes"] > 0
        for peak in row["measured_bytes"]:
            assert abs(row["estimate_bytes"] - peak) <= 0.10 * peak, (name, row)


@pytest.mark.slow
@pytest.mark.distributed
def test_memory_wrap_fsdp_measures_and_estimates_each_rank(launched):
    """torchdiag's own launch: each rank's measured peak (its tracker re-reads storages fully_shard resizes
    in place) is the closed form of the root's reduce-scatter, 4P plus the batch, and the FSDP estimate is
    within 10% of it."""
    code, doc, _ = launched["memory"]
    assert code == 0 and doc["exit_code"] == 0
    model = load_module("mlp.py").build(hidden=1024)
    P = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = doc["rank_memory"]
    assert len(rows) == 2
    for r in rows:
        assert 4 * P <= r["peak_bytes"] < 4 * P + 64 * 1024
        assert abs(r["estimate_error"]) <= 0.10
