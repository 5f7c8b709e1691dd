"""core.syncs.SyncCounter counts exactly the calls that force a host sync, on CPU; nancheck's
healthy pass makes as many at depth 64 as at depth 4, and few."""
from __future__ import annotations

import pytest
import torch

from torchdiag.core.syncs import SyncCounter


def test_counts_exactly_the_syncs_of_a_hand_written_function():
    t = torch.randn(6)

    def work():
        a = t.sum().item()                  # 1
        b = t.max().item()                  # 2
        c = t.min().item()                  # 3
        y = t * 2 + a + b + c               # no sync: stays on the device
        if bool(y.sum() > -1e9):            # 4
            pass
        return t.nonzero()                  # 5

    with SyncCounter() as s:
        work()
    assert s.total == 5
    assert s.counts == {"aten::_local_scalar_dense": 4, "aten::nonzero": 1}
    assert {e.device for e in s.events} == {"cpu"}


def test_other_sync_forms_and_non_syncs():
    t = torch.randn(6)
    original = torch.Tensor.tolist
    with SyncCounter() as s:
        t.tolist()                          # reads the data without dispatching an op: wrapped
        float(t[0]), int(t[1]), repr(t)     # 2 item-like, repr goes through tolist
        t[t > 0]                            # boolean-mask indexing
        torch.where(t > 0)                  # nonzero
        torch.unique(t)
        torch.repeat_interleave(torch.tensor([1, 2]))
    assert s.counts == {"Tensor.tolist": 2, "aten::_local_scalar_dense": 2, "aten::index": 1,
                        "aten::nonzero": 1, "aten::_unique2": 1, "aten::repeat_interleave": 1}
    with SyncCounter() as s:                # none of these waits for a device
        u = t.clone()
        u.add_(1).mul(2).sum()
        torch.isfinite(t).all()
        t[torch.tensor([0, 2])]             # integer indexing: the output size is known
        t.repeat_interleave(2)
        t.cpu()                             # a no-op on a CPU tensor (invisible on CPU-only runs)
    assert s.total == 0
    assert torch.Tensor.tolist is original     # the wrapper is gone on exit


def test_device_to_cpu_copies_are_counted():
    """Seen with a non-CPU source (meta stands in for a GPU here: the copy is counted, then fails)."""
    with SyncCounter() as s:
        with pytest.raises((NotImplementedError, RuntimeError)):
            torch.empty(3, device="meta").cpu()
    assert s.counts == {"aten::_to_copy": 1} and s.events[0].device == "meta"


def test_frames_name_the_line_that_forced_it():
    t = torch.ones(3)
    with SyncCounter(frames=True) as s:
        t.sum().item(); line = _line()      # noqa: E702  (same line on purpose)
    (event,) = s.events
    file, lineno, function = event.site()
    assert file == __file__ and lineno == line and function == "test_frames_name_the_line_that_forced_it"
    assert s.by_site() == {("aten::_local_scalar_dense", f"{__file__}:{line}"): 1}
    with SyncCounter() as s:                # frames are optional (off by default: cheaper)
        t.sum().item()
    assert s.events[0].frames == ()


def test_counters_nest():
    t = torch.ones(3)
    with SyncCounter() as outer:
        t.tolist()
        with SyncCounter() as inner:
            t.tolist()
            t.sum().item()
    assert (outer.total, inner.total) == (3, 2)


def test_via_names_the_python_call_and_host_copies_are_opt_in():
    t = torch.randn(5)
    original = {n: torch.Tensor.__dict__.get(n) for n in ("item", "__bool__", "__repr__", "cpu")}
    with SyncCounter() as s:
        t.sum().item()
        if t.sum() > 0:
            pass
        float(t[0]), repr(t), t.tolist(), t[t > 0], t.cpu()
    assert [(e.op, e.via) for e in s.events] == [
        ("aten::_local_scalar_dense", ".item()"), ("aten::_local_scalar_dense", "bool()"),
        ("aten::_local_scalar_dense", "float()"), ("Tensor.tolist", "print(tensor)"),
        ("Tensor.tolist", None), ("aten::index", None)]          # .cpu() of a CPU tensor: not by default
    with SyncCounter(host_copies=True) as s:
        t.cpu(), t.to("cpu"), t.to(torch.float64), t.to(device="cpu", dtype=torch.float64)
        t.to(t.device), t.to(device=t.device)   # another tensor's device: the same one on a GPU (a sweep)
        t.to("cpu", non_blocking=True), t.cpu().to("cpu", torch.float32, True)   # pinned: no wait (a review)
    assert s.counts == {"Tensor.cpu": 2, "Tensor.to": 2, "Tensor.to(device)": 2}   # profile reads the line for these
    assert {n: torch.Tensor.__dict__.get(n) for n in original} == original    # every wrapper removed


def test_user_site_skips_library_frames():
    from torchdiag.core.syncs import library_dirs, user_site

    libs = library_dirs()
    torch_file = torch.__file__
    user, pkg = "/home/u/proj/model.py", "/venv/lib/python3.12/site-packages/timm/layers.py"
    here = (user, 3, "forward")
    assert user_site([here, (pkg, 9, "f"), (torch_file, 1, "g")], libs) == here      # innermost user frame
    assert user_site([(pkg, 9, "f"), (torch_file, 1, "g")], libs) == (pkg, 9, "f")   # else an installed package
    import torchdiag.core.loss as ours
    assert user_site([(ours.__file__, 5, "__call__"), (torch_file, 1, "g")], libs) is None   # torchdiag's own


def _line() -> int:
    import sys

    return sys._getframe(1).f_lineno


# --- nancheck: a healthy pass costs the same at depth 4 and 64 ----------------------------------

def mlp(depth: int):
    from support import load_module

    torch.manual_seed(0)
    return load_module("mlp.py").deep(depth)


def nancheck_syncs(depth: int, steps: int = 0) -> SyncCounter:
    import torchdiag.api

    model, x = mlp(depth), torch.randn(8, 16)
    with SyncCounter(frames=True) as s:
        res = torchdiag.api.run("nancheck", model, x, steps=steps)
    assert res.exit_code == 0 and res.data["modules_checked"] == 2 * depth + 2
    return s


def own(s: SyncCounter) -> int:
    """Syncs made by nancheck itself (not by the loss rule in core/loss.py)."""
    return sum(1 for e in s.events if not e.site()[0].replace("\\", "/").endswith("torchdiag/core/loss.py"))


@pytest.mark.parametrize("steps", [0, 3])
def test_healthy_nancheck_syncs_do_not_grow_with_depth(steps):
    shallow, deep = nancheck_syncs(4, steps), nancheck_syncs(64, steps)
    assert deep.counts == shallow.counts          # equal, op by op
    # nancheck's own: one read-back for inputs+parameters+buffers, one per pass (loss, every module
    # output's flag and every parameter gradient together), and per step one more for the updated
    # parameters: 2 + 2 * steps (the per-module check before made 15 at depth 4 and 135 at depth 64)
    assert own(deep) == own(shallow) == 2 + 2 * steps
    # the rest is the cross-entropy rule's one read when it makes up its class targets (does the output hold
    # -inf? a target is kept off the classes a mask bans); a target it drew needs no range check after
    assert deep.total == 2 + 2 * steps + 1


# --- overfit-batch: its per-step checks cost the same at depth 4 and 64 --------------------------

class Residual(torch.nn.Module):
    """x + relu(Wx): deep without collapsing the samples onto one output (a plain 64-layer stack
    does, and then the failure analysis runs on one model and not the other)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


def residual_mlp(depth: int):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Residual() for _ in range(depth)], torch.nn.Linear(16, 4))


def overfit_syncs(depth: int, steps: int):
    import torchdiag.api

    model, x = residual_mlp(depth), torch.randn(8, 16)
    with SyncCounter(frames=True) as s:
        res = torchdiag.api.run("overfit-batch", model, x, steps=steps)
    assert res.data["steps"] == steps and not res.data["passed"]     # too few steps: every check runs
    assert res.data["trainable_tensors"] == 2 * depth + 2
    optimizer = [e for e in s.events if any("/torch/optim/" in f[0].replace("\\", "/") for f in e.frames)]
    ours = [e for e in s.events if e not in optimizer]
    return ours, optimizer


def test_overfit_batch_syncs_do_not_grow_with_depth():
    steps = 3
    (shallow, opt_shallow), (deep, opt_deep) = overfit_syncs(4, steps), overfit_syncs(64, steps)
    site = lambda e: (e.op, e.site()[0], e.site()[2])       # noqa: E731  (line numbers aside)
    assert sorted(map(site, deep)) == sorted(map(site, shallow))     # equal, op by op and place by place
    # ours: one read per loss evaluation (loss + accuracy counts + the previous update's grad norm +
    # "every gradient non-zero yet": steps + 1), the first output's facts (identical samples, bounded
    # box: 2), after the run the parameter facts (changed, ever non-zero: 1) and the final output's
    # facts (2, and 1 for a collapse short of exactly: the label entropy and the labels' probabilities read
    # together), the loss rule's one read when it makes up class targets (1), and the batch's own floor, asked by
    # a run short of its target (ambiguity.py: 1): steps + 9. Before: 84 at
    # depth 4 and 817 at depth 64 in bench_syncs (per-parameter .any()/torch.equal reads). The model has more
    # trainable values than the batch has targets: no two-sample run (capacity.py), no read for it
    assert len(deep) == len(shallow) == steps + 9
    assert sum(1 for e in deep if e.site()[0].replace("\\", "/").endswith("torchdiag/core/loss.py")) == 1
    # torch's own single-tensor Adam reads each parameter's `step` counter (a CPU tensor: no GPU sync
    # with the default capturable=False on CUDA): the optimizer's, proportional to the parameters
    assert len(opt_deep) > len(opt_shallow)


def doctor_syncs(depth: int):
    import torchdiag.api

    model, x = residual_mlp(depth), torch.randn(8, 16)
    with SyncCounter(frames=True) as s:
        res = torchdiag.api.run("doctor", model, x)
    assert res.exit_code == 0, [f.to_dict() for f in res.findings]
    optimizer = [e for e in s.events if any("/torch/optim/" in f[0].replace("\\", "/") for f in e.frames)]
    return [e for e in s.events if e not in optimizer]


def test_doctor_syncs_do_not_grow_with_depth():
    """doctor's per-step checks (determinism fingerprints, the one-step update check) keep their values on the
    device and read them back together: the same syncs, place by place, at depth 4 and 64 (before: 88 and 989,
    two .tolist() per module call and three reads per parameter). torch's CPU Adam reads aside."""
    shallow, deep = doctor_syncs(4), doctor_syncs(64)
    site = lambda e: (e.op, e.site()[0], e.site()[2])       # noqa: E731  (line numbers aside)
    assert sorted(map(site, deep)) == sorted(map(site, shallow))
    # 15: the 12 reads above plus one for the non-finite-loss check before the step (doctor/training.py), one
    # for whether the output cross-entropy reads is already probabilities (doctor/target.py) and the loss rule's
    # one when it makes up class targets (does the output hold -inf a mask wrote? core/loss.py)
    assert len(deep) <= 15, [site(e) for e in deep]
