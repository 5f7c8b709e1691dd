"""doctor under torchrun --wrap ddp|fsdp: its training checks run on the wrapped copy. Two real 2-process gloo
launches (one per wrapper) of sample_models/ranks_doctor.py:masked, whose three hooked branches tell the
wrapped run from each rank's own: `dead` (gradient zeroed everywhere: a finding whatever runs), `lone`
(zeroed on rank 1 only: only the reduced gradient is non-zero there) and `split` (zeroed exactly on rank 0's
FSDP shard: only a whole-parameter judgment sees it change), plus `pre` → `head` (zero-initialised): an all-zero
gradient by design, re-checked on a plain local copy of the stepped wrapped one; `gain`, which the forward writes
over in rank 0's rows; and a hook on body.0.weight, which fully_shard drops."""
from __future__ import annotations

import importlib.util

import pytest

from support import ROOT, by_code, launched_fixtures, sample, torchrun_many

SPEC = "ranks_doctor.py:masked"
NOT_UPDATED = {"dead", "gain"}   # dead.weight and dead.bias alike: one finding on their module


@pytest.fixture(scope="module")
def launched():
    """One launch for both wraps (support.torchrun_many)."""
    runs = {wrap: ["doctor", sample(SPEC), "--wrap", wrap, "--loss", "sum"] for wrap in ("ddp", "fsdp")}
    runs["frozen_on_one"] = ["doctor", sample("ranks_doctor.py:frozen_on_one"), "--wrap", "ddp"]
    return torchrun_many(runs)


ddp, fsdp, frozen_on_one = launched_fixtures("ddp", "fsdp", "frozen_on_one")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_model_the_wrapper_refuses_is_an_error(frozen_on_one):
    """A sweep: a layer frozen on rank 1 only, which DDP refuses to wrap (gradflow exits 3 on it), passed doctor:
    its training checks fell back to each rank's own copy with a note."""
    code, doc, _ = frozen_on_one
    (f,) = [f for f in doc["findings"] if f["code"] == "wrap-failed"]
    assert f["severity"] == "error" and "DDP expects same model across all ranks" in f["message"]
    assert doc["exit_code"] == 1 and code != 0


def _grads(monkeypatch, rank: int, steps: int = 0) -> dict:
    """Rank `rank`'s own gradients under --loss sum on its rows (4:8 for rank 1 of 2), by plain torch; after
    `steps` Adam steps (lr 1e-3, doctor's) on those gradients."""
    import torch

    spec = importlib.util.spec_from_file_location("ranks_doctor_truth", ROOT / "sample_models" / "ranks_doctor.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setenv("RANK", str(rank))
    model = mod.masked()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps + 1):
        opt.zero_grad()
        model(mod.example_inputs()[0][4 * rank:4 * rank + 4]).sum().backward()
        opt.step()
    return {n: p.grad for n, p in model.named_parameters()}


def test_premise_own_gradients_by_plain_torch(monkeypatch):
    """What each rank's own rows give, without torchdiag: dead.* zero on both, lone.* zero on rank 1 only
    (its DDP/FSDP mean is half of rank 0's, non-zero), split's rows 0-1 zero and rows 2-3 not."""
    g0, g1 = _grads(monkeypatch, 0), _grads(monkeypatch, 1)
    for g in (g0, g1):
        assert not g["dead.weight"].any() and not g["dead.bias"].any()
        assert not g["split.weight"][:2].any() and g["split.weight"][2:].ne(0).all()
    assert g0["lone.weight"].ne(0).all() and not g1["lone.weight"].any()
    assert g0["gain"].ne(0).all() and g1["gain"].ne(0).all()
    assert ((g0["lone.weight"] + g1["lone.weight"]) / 2).ne(0).all()
    # head is zero: pre.* get no gradient through it until a step has moved head
    assert not g0["pre.weight"].any() and not g0["pre.bias"].any() and g0["head.weight"].ne(0).any()
    stepped = _grads(monkeypatch, 0, steps=1)
    assert stepped["pre.weight"].ne(0).any() and stepped["pre.bias"].ne(0).any()
    # the clamp hook on body.0.weight changes nothing here: dropping it changes no verdict
    assert max(g["body.0.weight"].abs().max() for g in (g0, g1)) < 100


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("how", ["ddp", "fsdp"])
def test_training_checks_ran_wrapped(how, request):
    code, doc, _ = request.getfixturevalue(how)
    assert doc["exit_code"] == 1 and code != 0
    for r in doc["ranks"]:
        assert r["error"] is None and r["exit_code"] == 1
        assert r["header"]["wrap"].startswith(f"{how} (the training checks (train-mode forward, backward, one optimizer step) run on")
    # no rank fell back to its own copy
    assert not [n for n in doc["notes"] if "own copy, not the wrapped one" in n]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("how", ["ddp", "fsdp"])
def test_zeroed_gradient_named_on_every_rank(how, request):
    _, doc, _ = request.getfixturevalue(how)
    found = {f["where"]: f for f in by_code(doc, "param-not-updated")}
    # lone.*: rank 1's own gradient is zero, the reduced one is not (it would be named on rank 1 on its own copy)
    assert set(found) == NOT_UPDATED
    assert all(f["ranks"] == [0, 1] and f["severity"] == "error" for f in found.values())
    assert "all zeros" in found["dead"]["message"] and found["dead"]["members"] == ["dead.weight", "dead.bias"]
    # the forward writes 1 into gain[0:2]; under fsdp into the all-gathered gain it uses (the shards keep the
    # stepped value), and only in rank 0's rows: rank 1 sees it too, by comparing the whole parameter
    assert "the next forward overwrites it" in found["gain"]["message"]
    for r in doc["ranks"]:
        assert {f["where"] for f in r["findings"] if f["code"] == "param-not-updated"} == NOT_UPDATED
    [row] = [c for c in doc["checks"] if c["id"] == "update"]
    assert row["status"] == "error" and row["verdict"] == "3 parameter(s) get a gradient but do not change after a step"


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("how", ["ddp", "fsdp"])
def test_zero_initialised_head_is_info_after_the_recheck(how, request):
    _, doc, _ = request.getfixturevalue(how)
    [f] = by_code(doc, "zero-init")
    assert f["where"] == "head" and f["severity"] == "info" and f["ranks"] == [0, 1]
    assert "2 parameter(s) (pre.weight, pre.bias) get an all-zero gradient at initialisation" in f["message"]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("how", ["ddp", "fsdp"])
def test_parameter_hook_dropped_by_fully_shard_only(how, request):
    _, doc, _ = request.getfixturevalue(how)
    found = by_code(doc, "param-hook-dropped")
    if how == "ddp":   # DDP keeps the user's parameters and their hooks
        assert found == []
        return
    [f] = found
    assert f["where"] == "body.0.weight" and f["severity"] == "warning" and f["ranks"] == [0, 1]
    assert "register_post_accumulate_grad_hook" in f["hint"]


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_judges_whole_parameters(fsdp):
    """split.weight rows 0-1 (rank 0's shard) get a zero gradient and stay put; rows 2-3 move: whole, it changes,
    and rank 0 says so too (a shard-by-shard judgment would name split.* there)."""
    _, doc, _ = fsdp
    r0 = doc["ranks"][0]
    assert not [f for f in r0["findings"] if f["where"].startswith("split.")]
    assert r0["data"]["params_without_grad"] == []
