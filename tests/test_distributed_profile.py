"""profile and memory under torchrun (issue 19, part B): the per-rank merges on hand-built per-rank
documents (exact numbers), and one real 2-process gloo launch each for profile and memory."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from torchdiag.diagnostics.memory import ranks as mem_ranks
from torchdiag.diagnostics.profile import ranks as prof_ranks
from torchdiag.render.profile import rank_path
from torchdiag.results import Result


def _prof_doc(rank, step_ms, collective_ms_per_step, active=5, trace=None, steps=None, colls=None):
    """One rank's document: every active step `step_ms` long with `collective_ms_per_step` in collectives,
    or the given per-step lists (a wait step of 99 ms first: it must not count)."""
    steps = steps or [step_ms] * active
    colls = colls or [collective_ms_per_step] * active
    active = len(steps)
    mean = sum(steps) / active
    doc = {"rank": rank, "step_time_ms": {"mean": mean, "median": mean, "p90": mean}, "active_steps": active,
           "step_times_ms": [99.0] + list(steps),
           "collectives": {"time_us": sum(colls) * 1e3, "per_step_us": [c * 1e3 for c in colls], "ops": []}}
    if trace:
        doc["trace"] = trace
    return doc


# ------------------------------------------------------------------------------------ profile, pure

def test_union_counts_overlaps_once():
    assert prof_ranks.union_us([]) == 0
    assert prof_ranks.union_us([(20, 25), (0, 10), (5, 15)]) == 20       # [0,15] + [20,25]
    assert prof_ranks.union_us([(0, 30), (5, 10), (29, 31)]) == 31       # nested, then touching the end
    assert prof_ranks.union_us([(0, 10), (10, 12)]) == 12


@pytest.mark.parametrize("name", ["gloo:all_reduce", "gloo:broadcast", "c10d::allreduce_", "nccl:all_reduce",
                                  "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "record_param_comms"])
def test_collective_names(name):
    assert prof_ranks.is_collective(name)


@pytest.mark.parametrize("name", ["aten::add", "DistributedDataParallel.forward", "ProfilerStep#3",
                                  "torch.distributed.ddp.reducer::copy_bucket_to_grad", "module::fc1"])
def test_not_collective(name):
    assert not prof_ranks.is_collective(name)


def test_collectives_from_events():
    def ev(name, start, end):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end))

    events = [ev("ProfilerStep*", 0, 150), ev("aten::mm", 0, 100), ev("c10d::allreduce_", 10, 12),
              ev("gloo:all_reduce", 11, 61), ev("gloo:all_reduce", 140, 160), ev("ProfilerStep*", 150, 300),
              ev("gloo:all_reduce", 200, 230), ev("aten::add_", 220, 300)]
    got = prof_ranks.collectives(events)
    assert got["time_us"] == 51 + 20 + 30                   # [10,61], [140,160] and [200,230]
    assert got["per_step_us"] == [51 + 10, 10 + 30]         # [140,160] is split at the step boundary
    assert got["ops"] == [{"op": "gloo:all_reduce", "calls": 3, "time_us": 100.0},
                          {"op": "c10d::allreduce_", "calls": 1, "time_us": 2.0}]


def test_straggler_under_ddp_is_the_rank_the_others_wait_for():
    # every step takes 60 ms on each rank (DDP's allreduce evens them out); the fast ranks wait
    docs = [_prof_doc(0, 60.0, 50.0), _prof_doc(1, 60.0, 1.0), _prof_doc(2, 60.0, 45.0), _prof_doc(3, 60.0, 48.0)]
    merged = Result("profile")
    prof_ranks.merge_ranks(docs, merged)
    s = merged.data["straggler"]
    assert s["rank"] == 1 and s["fastest_rank"] == 0
    assert s["compute_ms"] == pytest.approx(59.0)
    assert s["lag_ms"] == pytest.approx(49.0)                 # 59 - 10
    assert s["lag_pct"] == pytest.approx(4.9)                 # 49 / 10
    assert s["median_compute_ms"] == pytest.approx(13.5)      # compute 10, 59, 15, 12 -> (12 + 15) / 2
    assert s["lag_vs_median_ms"] == pytest.approx(45.5)
    assert s["lag_vs_median_pct"] == pytest.approx(45.5 / 13.5, rel=1e-3)
    rows = {r["rank"]: r for r in merged.table("rank_times").rows}
    assert [rows[r]["compute_ms"] for r in range(4)] == pytest.approx([10.0, 59.0, 15.0, 12.0])
    assert [rows[r]["lag_ms"] for r in range(4)] == pytest.approx([0.0, 49.0, 5.0, 2.0])
    assert rows[0]["collective_share"] == pytest.approx(50 / 60, abs=1e-4)
    assert [f.code for f in merged.findings] == ["straggler"] and merged.findings[0].where == "rank 1"
    assert merged.findings[0].severity == "warning" and merged.findings[0].ranks == [1]
    assert merged.findings[0].hint.startswith("the other ranks wait for it in every collective")
    line = dict(merged.summary)["Straggler"]
    assert "rank 1" in line and "+49.00 ms (+490%)" in line and "+45.50 ms (+337%)" in line
    assert "the slowest in 5 of 5 steps; smallest lag in one step +47.00 ms (the others' own compute varies by " \
           "0.00 ms across steps)" in line       # 59 - median(10, 15, 12); the others' compute is constant
    assert rows[1]["compute_steps_ms"] == [59.0] * 5


def test_straggler_without_collectives_is_the_slowest_step():
    docs = [_prof_doc(0, 20.0, 0.0, trace="run.rank0.json"), _prof_doc(1, 30.0, 0.0, trace="run.rank1.json")]
    docs[0].pop("collectives")                                # --wrap none: no collective ever ran
    merged = Result("profile")
    prof_ranks.merge_ranks(docs, merged)
    s = merged.data["straggler"]
    assert (s["rank"], s["lag_ms"], s["lag_pct"]) == (1, 10.0, 0.5)
    assert s["lag_vs_median_ms"] == 5.0 and s["lag_vs_median_pct"] == pytest.approx(0.2)
    assert [r["trace"] for r in merged.table("rank_times").rows] == ["run.rank0.json", "run.rank1.json"]
    assert [f.code for f in merged.findings] == ["straggler"]
    assert merged.findings[0].hint.startswith("no collective ran here")


def test_even_ranks_name_no_straggler_finding():
    docs = [_prof_doc(0, 10.0, 2.0), _prof_doc(1, 10.0, 2.0)]
    merged = Result("profile")
    prof_ranks.merge_ranks(docs, merged)
    s = merged.data["straggler"]
    assert s["rank"] == 0 and s["lag_ms"] == 0 and s["lag_pct"] == 0
    assert merged.findings == []
    assert "_style" not in merged.table("rank_times").rows[0]


def test_noise_that_changes_hands_is_not_a_finding():
    # rank 1 is slower on average (mean compute 16 vs 8 ms) but rank 0 is the slowest in step 3
    steps = [20.0] * 5
    docs = [_prof_doc(0, 0, 0, steps=steps, colls=[15.0, 15.0, 0.0, 15.0, 15.0]),
            _prof_doc(1, 0, 0, steps=steps, colls=[0.0, 0.0, 20.0, 0.0, 0.0])]
    merged = Result("profile")
    prof_ranks.merge_ranks(docs, merged)
    s = merged.data["straggler"]
    assert s["rank"] == 1 and (s["slowest_steps"], s["steps"]) == (4, 5)
    assert s["compute_ms"] == pytest.approx(16.0) and s["lag_ms"] == pytest.approx(8.0)
    assert merged.findings == []
    # step 3: rank 0's compute is 20 ms, rank 1's 0 (the one other rank: its own spread 20 - 5 = 15 ms)
    assert dict(merged.summary)["Straggler"].endswith("the slowest in 4 of 5 steps; smallest lag in one step "
                                                      "-20.00 ms (the others' own compute varies by 15.00 ms across steps)")


def test_small_lag_is_not_a_finding():
    # 10% above the median (below the 20% rule), and 0.3 ms (below the 1 ms floor): no warning
    for a, b in ((10.0, 12.2), (1.0, 1.7)):
        merged = Result("profile")
        prof_ranks.merge_ranks([_prof_doc(0, a, 0.0), _prof_doc(1, b, 0.0)], merged)
        assert merged.data["straggler"]["rank"] == 1 and merged.findings == []


def _compute_docs(*computes, step_ms=6.0):
    """One document per rank whose compute in each active step is the given list (collectives = the rest)."""
    return [_prof_doc(r, 0, 0, steps=[step_ms] * len(c), colls=[step_ms - x for x in c]) for r, c in enumerate(computes)]


def test_descheduling_noise_is_not_a_straggler():
    """Modelled on a healthy 2-rank DDP profile measured here: the fast rank's compute as measured (it wanders
    3.5 → 0.5 ms over the steps by itself); the other rank's made slower by different amounts in each step
    (descheduling), so that it is the slowest in every step, 36% and 1.17 ms over the median on average (the
    old rule warned), while its lag in its best step (1.0 ms) is inside the fast rank's own spread (3.08 ms)."""
    fast, noisy = [3.5, 3.55, 2.13, 0.68, 0.47], [4.5, 6.0, 7.06, 2.25, 2.22]
    merged = Result("profile")
    prof_ranks.merge_ranks(_compute_docs(fast, noisy), merged)
    s = merged.data["straggler"]
    assert s["rank"] == 1 and (s["slowest_steps"], s["steps"]) == (5, 5)
    mean_fast, mean_noisy = sum(fast) / 5, sum(noisy) / 5
    median = (mean_fast + mean_noisy) / 2
    assert s["lag_vs_median_ms"] == pytest.approx(mean_noisy - median, abs=1e-3) and s["lag_vs_median_ms"] > 1.0
    assert s["lag_vs_median_pct"] > 0.2
    assert s["min_step_lag_ms"] == pytest.approx(min(b - a for a, b in zip(fast, noisy)), abs=1e-3)   # 1.0, step 1
    assert s["others_spread_ms"] == pytest.approx(3.55 - 0.47, abs=1e-3)
    assert merged.findings == []
    assert "Straggler" in dict(merged.summary)     # still reported, as information


def test_measured_false_alarm_is_info():
    """A healthy run here that the old rule called a straggler (rank 0: slowest in 5 of 5 steps, +2.3 ms, +67%
    over the median): in its last step it is 0.014 ms behind, nothing."""
    noisy, other = [6.566, 6.3022, 11.3621, 3.1416, 1.3157], [1.6497, 1.5014, 0.8119, 0.4821, 1.3018]
    merged = Result("profile")
    prof_ranks.merge_ranks(_compute_docs(noisy, other, step_ms=12.0), merged)
    s = merged.data["straggler"]
    assert s["rank"] == 0 and (s["slowest_steps"], s["steps"]) == (5, 5)
    assert s["lag_vs_median_ms"] > 2.0 and s["lag_vs_median_pct"] > 0.6
    assert s["min_step_lag_ms"] == pytest.approx(1.3157 - 1.3018, abs=1e-3)
    assert merged.findings == []


def test_deliberate_slow_rank_still_warns_on_a_noisy_machine():
    """ranks_slow.py's shape: rank 1 sleeps ~100 ms in every forward; rank 0's compute wanders by 3 ms."""
    fast, slow = [3.8, 6.9, 3.9, 4.1, 5.0], [102.8, 103.5, 102.6, 104.9, 102.7]
    merged = Result("profile")
    prof_ranks.merge_ranks(_compute_docs(fast, slow, step_ms=107.0), merged)
    s = merged.data["straggler"]
    assert s["min_step_lag_ms"] == pytest.approx(min(b - a for a, b in zip(fast, slow)), abs=1e-3)   # 96.6
    assert s["others_spread_ms"] == pytest.approx(6.9 - 3.8, abs=1e-3)
    assert [(f.code, f.where) for f in merged.findings] == [("straggler", "rank 1")]


def test_consistent_lag_small_against_the_step_is_not_a_finding():
    """3 ms behind in every step of 60 ms (5%): above 1 ms and 20% of the others' 5 ms compute, and the old
    rule warned, but the others lose 3 ms of 60: under the 10% of the step a lag must reach."""
    merged = Result("profile")
    prof_ranks.merge_ranks(_compute_docs([5.0] * 5, [8.0] * 5, step_ms=60.0), merged)
    s = merged.data["straggler"]
    assert s["min_step_lag_ms"] == pytest.approx(3.0) and s["median_step_ms"] == pytest.approx(60.0)
    assert merged.findings == []
    merged = Result("profile")   # the same lag in a 25 ms step is 12%: a straggler
    prof_ranks.merge_ranks(_compute_docs([5.0] * 5, [8.0] * 5, step_ms=25.0), merged)
    assert [f.code for f in merged.findings] == ["straggler"]


def _ctx(wrap="none", wrapper=None):
    from torchdiag.errors import option_name

    spec = SimpleNamespace(wrap=wrap, optimizer=SimpleNamespace(name="adam"), caller="cli")
    return SimpleNamespace(wrapper=wrapper, spec=spec, on_cuda=False, option=lambda n: option_name(n, "cli"))


@pytest.mark.parametrize("wrap, wrapper, given, mode, default", [
    ("none", None, None, "inference", True),           # plain profile: unchanged
    ("ddp", object(), None, "train", True),            # under a wrapper: the train step by default
    ("fsdp", object(), None, "train", True),
    ("ddp", object(), "inference", "inference", False),  # an explicit mode stands
    ("none", None, "train", "train", False)])
def test_profile_mode_default_follows_the_wrapper(wrap, wrapper, given, mode, default):
    from torchdiag.diagnostics.profile.options import Options
    from torchdiag.diagnostics.profile.session import _header, resolved

    opts, was_default = resolved(Options(mode=given), _ctx(wrap, wrapper))
    assert (opts.mode, was_default) == (mode, default)
    header = _header(opts, _ctx(wrap, wrapper), was_default).header["mode"]
    assert ("the default under --wrap" in header) == (default and wrapper is not None)


@pytest.mark.parametrize("wrap, given, coll_us, expected", [
    ("ddp", "inference", 0.0, True),       # explicit inference through DDP: nothing communicated
    ("fsdp", "inference", 0.0, True),      # FSDP at the root keeps the parameters whole between forwards
    ("fsdp", "inference", 12.5, False),    # a collective ran: nothing to say
    ("ddp", None, 0.0, False),             # the default (train) is never idle-by-choice
    ("ddp", "train", 0.0, False)])
def test_idle_wrapper_finding(wrap, given, coll_us, expected):
    from torchdiag.diagnostics.profile.options import Options
    from torchdiag.diagnostics.profile.session import _idle_wrapper, resolved

    ctx = _ctx(wrap, object())
    opts, default = resolved(Options(mode=given, active=4), ctx)
    result = Result("profile", data={"collectives": {"time_us": coll_us}})
    _idle_wrapper(result, opts, default, ctx)
    codes = [f.code for f in result.findings]
    assert codes == (["no-collectives-in-inference"] if expected else [])
    if expected:
        f = result.findings[0]
        assert f.severity == "info" and f"--mode inference under --wrap {wrap}: no collective ran in the 4" in f.message
    _idle_wrapper(plain := Result("profile"), opts, default, _ctx())   # outside torchrun: never
    assert plain.findings == []


@pytest.mark.parametrize("path,rank,want", [
    ("run.json", 0, "run.rank0.json"), ("out/run.json", 3, "out/run.rank3.json"),
    ("run.json.gz", 1, "run.rank1.json.gz"), ("trace", 2, "trace.rank2"), ("a.pt.trace.json", 1, "a.pt.trace.rank1.json"),
    (".hidden", 0, ".hidden.rank0"), ("run.json", None, "run.json")])
def test_rank_trace_names(path, rank, want):
    assert rank_path(path, rank) == want


# ------------------------------------------------------------------------------------- memory, pure

def _mem_doc(rank, peak, fsdp_est=None, world=2):
    doc = {"rank": rank, "peak_bytes": peak, "peak_phase": "backward"}
    if fsdp_est is not None:
        doc["fsdp_estimate"] = {"per_device_peak_bytes": fsdp_est, "devices": world, "phase": "backward"}
    return doc


def test_memory_peak_per_rank():
    merged = Result("memory")
    mem_ranks.merge_ranks([_mem_doc(0, 1000), _mem_doc(1, 5096), _mem_doc(2, 3000)], merged)
    assert merged.data["peak_bytes_per_rank"] == [1000, 5096, 3000]
    assert merged.data["max_peak_rank"] == 1 and merged.data["peak_spread_bytes"] == 4096
    rows = merged.table("rank_memory").rows
    assert [r["peak_bytes"] for r in rows] == [1000, 5096, 3000] and "estimate_bytes" not in rows[0]
    assert "rank 1 4.98 KiB" in dict(merged.summary)["Peak per rank"]
    assert "FSDP estimate" not in dict(merged.summary)


def test_memory_fsdp_estimate_against_each_rank():
    merged = Result("memory", header={"wrap": "fsdp"})
    mem_ranks.merge_ranks([_mem_doc(0, 1000, 900), _mem_doc(1, 2000, 2500)], merged)
    rows = merged.table("rank_memory").rows
    assert [(r["estimate_bytes"], r["estimate_error_bytes"]) for r in rows] == [(900, -100), (2500, 500)]
    assert [r["estimate_error"] for r in rows] == pytest.approx([-0.1, 0.25])
    assert rows[1]["estimate_devices"] == 2
    line = dict(merged.summary)["FSDP estimate"]
    assert "2.44 KiB per device (2 ranks) vs 1.95 KiB measured on rank 1: +500 B (+25.0%)" in line
    assert "over all ranks -10.0% to +25.0%" in line


def test_memory_fsdp_without_a_shard_row_says_so():
    merged = Result("memory", header={"wrap": "fsdp"})
    mem_ranks.merge_ranks([_mem_doc(0, 1000), _mem_doc(1, 2000)], merged)
    assert "FSDP estimate" not in dict(merged.summary)
    assert any("no sharding estimate" in n for n in merged.notes)


def test_memory_estimate_ignored_without_fsdp():
    merged = Result("memory", header={"wrap": "ddp"})
    mem_ranks.merge_ranks([_mem_doc(0, 1000, 900), _mem_doc(1, 2000, 2500)], merged)
    assert "estimate_bytes" not in merged.table("rank_memory").rows[0]


def test_merges_take_gathered_records_and_skip_failed_ranks():
    records = [{"rank": 0, "result": _prof_doc(None, 20.0, 0.0)}, {"rank": 1, "result": None, "error": {"message": "x"}},
               {"rank": 2, "result": _prof_doc(None, 50.0, 0.0)}]
    merged = Result("profile")
    prof_ranks.merge_ranks(records, merged)
    assert [r["rank"] for r in merged.table("rank_times").rows] == [0, 2]
    assert merged.data["straggler"]["rank"] == 2 and merged.data["straggler"]["lag_ms"] == 30.0
    records = [{"rank": 0, "result": _mem_doc(None, 10)}, {"rank": 1, "result": None}]
    merged = Result("memory")
    mem_ranks.merge_ranks(records, merged)
    assert merged.data["peak_bytes_per_rank"] == [10] and merged.table("rank_memory").rows[0]["rank"] == 0


def test_each_rank_writes_its_own_trace(tmp_path):
    from torchdiag.render import profile as render_profile

    written = {}
    for rank in (0, 1):
        res = Result("profile", artefacts={"trace": b'{"traceEvents": [%d]}' % rank})
        written[rank] = render_profile.write_rank_outputs(res, {"trace": str(tmp_path / "run.json")}, rank)
    assert written == {r: {"trace": str(tmp_path / f"run.rank{r}.json")} for r in (0, 1)}
    assert (tmp_path / "run.rank1.json").read_bytes() == b'{"traceEvents": [1]}'
    assert not (tmp_path / "run.json").exists()
    assert render_profile.write_rank_outputs(Result("profile"), {"trace": None}, 0) == {}
    records = [{"rank": r, "result": _prof_doc(None, 10.0 + r, 0.0), "files": written[r]} for r in (0, 1)]
    merged = Result("profile")
    prof_ranks.merge_ranks(records, merged)
    render_profile.record(merged, written[0])
    assert merged.data["traces"] == [written[0]["trace"], written[1]["trace"]] and "trace" not in merged.data
    assert "run.rank1.json" in dict(merged.summary)["Traces"]


def test_rank0_lines_are_labelled_as_rank0():
    merged = Result("memory", summary=[("Peak", "31 KiB"), ("Other", "x")])
    mem_ranks.merge_ranks([_mem_doc(0, 10), _mem_doc(1, 20)], merged)
    assert [k for k, _ in merged.summary][:2] == ["Peak (rank 0)", "Other"]
    merged = Result("profile", summary=[("Step time", "1 ms"), ("Throughput", "2/s")])
    prof_ranks.merge_ranks([_prof_doc(0, 1.0, 0.0), _prof_doc(1, 1.0, 0.0)], merged)
    assert [k for k, _ in merged.summary] == ["Step time (rank 0)", "Throughput (rank 0)", "Straggler"]


def test_fsdp_check_estimates_for_the_world_size(monkeypatch):
    import torch
    import torch.distributed as dist

    from torchdiag import api
    from torchdiag.core.context import context_for
    from torchdiag.core.run import RunSpec
    from torchdiag.diagnostics.memory import Options

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    inputs = api.as_inputs(model, (torch.randn(8, 64),))
    ctx = context_for(model, RunSpec("memory", loss="sum", wrap="fsdp", caller="python"))
    res = Result("memory")
    mem_ranks.fsdp_check(res, model, inputs, Options(), ctx)
    assert "fsdp_estimate" not in res.data                    # no process group: nothing to check
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    mem_ranks.fsdp_check(res, model, inputs, Options(), ctx)
    est = res.data["fsdp_estimate"]
    params = 4 * (64 * 32 + 32 + 32 * 4 + 4)                   # float32, every parameter in the root unit
    assert est["devices"] == 2 and est["unit_bytes"] == params and est["unit"] == "(root)"
    # a root-only unit gathers every parameter: the per-device peak holds them all, and no more than one process
    from torchdiag.diagnostics.memory import estimate

    whole = estimate(model, inputs, Options(), ctx).peak       # the same step unsharded
    assert params <= est["per_device_peak_bytes"] <= whole


# ------------------------------------------------------------------- real 2-process launches (gloo)

ENV = {"OMP_NUM_THREADS": "1", "TORCHDIAG_DIST_TIMEOUT": "600"}


def _doc(launch) -> dict:
    """The one JSON document rank 0 printed, of a run every rank ended with exit 0."""
    code, doc, stderr = launch
    assert code == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    return doc


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch for the three runs here (support.torchrun_many), in a directory of their own (the trace)."""
    from support import sample, torchrun_many

    cwd = tmp_path_factory.mktemp("profile")
    runs = {
        # rank 1 sleeps 0.3 s in every forward; DDP makes rank 0 wait for it in the allreduce. No --mode: under
        # --wrap ddp the default is the train step
        "slow": ["profile", sample("ranks_slow.py:build"), "--arg", "delay=0.3", "--wrap", "ddp", "--wait", "0",
                 "--warmup", "1", "--active", "3", "--trace", "run.json"],
        # --mode inference --wrap ddp profiles the forward through DDP, which makes no collective
        "inference": ["profile", sample("ranks.py:healthy"), "--mode", "inference", "--wrap", "ddp", "--wait", "0",
                      "--warmup", "1", "--active", "2"],
        # under FSDP: rank 1 allocates a 4 MiB temporary in its forward, on a model of a few KiB
        "memory": ["memory", sample("ranks_slow.py:build"), "--arg", "delay=0", "--arg", "extra_mib=4",
                   "--wrap", "fsdp", "--shard", "2"],
    }
    return cwd, torchrun_many(runs, env=ENV, cwd=cwd)


@pytest.fixture(scope="module")
def slow_profile(launched):
    cwd, runs = launched
    return cwd, _doc(runs["slow"])


@pytest.mark.slow
@pytest.mark.distributed
def test_profile_under_ddp_defaults_to_the_train_step(slow_profile):
    _, doc = slow_profile
    assert doc["mode"].startswith("train (forward + loss + backward + adam step")
    assert "the default under --wrap ddp: DDP communicates only in backward" in doc["mode"]
    assert "--mode inference" in doc["mode"]
    for rank in doc["ranks"]:      # the steps profiled are the wrapper's: its allreduce ran on every rank
        assert rank["data"]["collectives"]["time_us"] > 0
    assert "no-collectives-in-inference" not in {f["code"] for f in doc["findings"]}


@pytest.mark.slow
@pytest.mark.distributed
def test_explicit_inference_under_ddp_is_honoured_and_says_the_wrapper_was_idle(launched):
    """--mode inference --wrap ddp profiles the forward through DDP, which makes no collective."""
    doc = _doc(launched[1]["inference"])
    assert doc["mode"] == "inference (eval mode, no grad)" and doc["exit_code"] == 0
    assert [r["data"]["collectives"]["time_us"] for r in doc["ranks"]] == [0.0, 0.0]
    found = [f for f in doc["findings"] if f["code"] == "no-collectives-in-inference"]
    assert len(found) == 1 and found[0]["severity"] == "info" and found[0].get("ranks") in (None, [0, 1])
    assert "no collective ran in the 2 profiled step(s): DDP communicates only in backward" in found[0]["message"]
    assert "--mode train" in found[0]["hint"]
    assert "DistributedDataParallel.forward" in {r["op"] for r in doc["operators"]}   # through the wrapper


@pytest.mark.slow
@pytest.mark.distributed
def test_profile_names_the_slow_rank(slow_profile):
    _, doc = slow_profile
    assert doc["world_size"] == 2 and doc["straggler"]["rank"] == 1 and doc["straggler"]["fastest_rank"] == 0
    assert doc["straggler"]["lag_ms"] > 0
    rows = {r["rank"]: r for r in doc["rank_times"]}
    assert set(rows) == {0, 1}
    # the fast rank spends its step waiting in the allreduce; the slow one hardly waits
    assert rows[0]["collective_ms"] > rows[1]["collective_ms"]
    assert rows[1]["compute_ms"] > rows[0]["compute_ms"]
    assert [(f["code"], f["where"]) for f in doc["findings"] if f["code"] == "straggler"] == [("straggler", "rank 1")]
    for rank in doc["ranks"]:       # what torch 2.13 calls DDP's gradient allreduce on gloo
        assert "gloo:all_reduce" in {op["op"] for op in rank["data"]["collectives"]["ops"]}


@pytest.mark.slow
@pytest.mark.distributed
def test_profile_writes_one_trace_per_rank(slow_profile):
    import json

    cwd, doc = slow_profile
    for rank in (0, 1):
        trace = json.loads((cwd / f"run.rank{rank}.json").read_text())
        assert trace["traceEvents"]
    assert doc["traces"] == [str(cwd / "run.rank0.json"), str(cwd / "run.rank1.json")] or \
        doc["traces"] == ["run.rank0.json", "run.rank1.json"]


@pytest.mark.slow
@pytest.mark.distributed
def test_memory_under_torchrun_fsdp_peak_per_rank(launched):
    """Under FSDP: rank 1 allocates a 4 MiB temporary in its forward, on a model of a few KiB."""
    doc = _doc(launched[1]["memory"])
    assert doc["wrap"] == "fsdp"
    assert "shard" in doc and [r["header"]["batch_shard"] for r in doc["ranks"]] == ["rows 0:4 of 8", "rows 4:8 of 8"]
    peaks = doc["peak_bytes_per_rank"]
    assert peaks[1] >= 4 * 2**20 > peaks[0] > 0
    assert doc["max_peak_rank"] == 1 and doc["peak_spread_bytes"] == peaks[1] - peaks[0]
    rows = doc["rank_memory"]
    assert [r["rank"] for r in rows] == [0, 1] and [r["peak_bytes"] for r in rows] == peaks
    for r in rows:   # each rank's own estimate, checked against its own measured peak
        assert r["estimate_devices"] == 2
        assert r["estimate_error_bytes"] == r["estimate_bytes"] - r["peak_bytes"]
        assert r["estimate_error"] == pytest.approx(r["estimate_error_bytes"] / r["peak_bytes"])
    assert rows[1]["estimate_bytes"] >= 4 * 2**20 > rows[0]["estimate_bytes"]   # the temporary is in rank 1's step


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.cuda
def test_profile_on_nccl_names_the_slow_rank(tmp_path):
    """Two GPUs, NCCL: the same straggler, and the collective time comes from NCCL's ranges/kernels."""
    import torch

    from support import sample, torchrun

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    doc = _doc(torchrun("profile", sample("ranks_slow.py:build"), "--arg", "delay=0.3", "--mode", "train", "--wrap",
                        "ddp", "--wait", "0", "--warmup", "1", "--active", "3", device="cuda", env=ENV, cwd=tmp_path))
    assert doc["backend"] == "nccl" and doc["straggler"]["rank"] == 1
    for rank in doc["ranks"]:
        names = {op["op"] for op in rank["data"]["collectives"]["ops"]}
        assert any(prof_ranks.is_collective(n) and "nccl" in n.lower() for n in names), names
