"""The per-rank peak of a real FSDP2 training step (torch's fully_shard, gloo, CPU), measured without
torchdiag's tracker, against memory's sharding estimate (memory/shard.py) of the same step.

Run under torchrun (every rank builds the same models, seeded):
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node 2 bench/fsdp_peak.py \
        [--models mlp,cnn,transformer] [--wrap root|units] [--json FILE]

The measurement (`Census`), independent of the estimator and of core/live_tensors.py: a census of every
tensor storage the garbage collector can reach once the model is sharded and the optimizer state exists
(what was alive before the model was built is left out), then a TorchDispatchMode that adopts every
storage an op reads or writes and, before and after every op, sums the bytes each live storage holds
*now*. Reading the size at each op matters under FSDP: it frees and re-allocates the unsharded parameters
by resizing their storages in place (`untyped_storage().resize_`), which no op reports. The peak is
sampled op by op; gloo's own staging buffers (C++, no tensor) are not in it.

The step is memory's steady-state step: optimizer state present (one warm-up step), gradients None,
forward + loss, backward, Adam step (foreach=False, torch's CPU default), loss and output alive until
after the step. `--wrap root` shards as `torchdiag ... --wrap fsdp` does (fully_shard at the root
alone: one unit holding every parameter); `--wrap units` also shards each element of the model's
ModuleList/Sequential containers (the unit memory's `--shard` plans for, memory/shard.py)."""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import warnings
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "sample_models"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402


def _storages(t):
    """Untyped storages behind a tensor; a DTensor (or another wrapper subclass) by its inner tensors."""
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    todo, out = [t], []
    while todo:
        x = todo.pop()
        if isinstance(x, DTensor):
            todo.append(x._local_tensor)
        elif is_traceable_wrapper_subclass(x):
            attrs, _ = x.__tensor_flatten__()
            todo += [v for a in attrs if isinstance(v := getattr(x, a), torch.Tensor)]
        else:
            try:
                out.append(x.untyped_storage())
            except (RuntimeError, NotImplementedError, TypeError, AttributeError):
                pass
    return out


def _live_storages() -> dict:
    """Every CPU tensor storage the garbage collector reaches now, by its C++ address."""
    found = {}
    warnings.simplefilter("ignore", FutureWarning)      # isinstance on deprecated module attributes
    for obj in gc.get_objects():
        try:
            is_tensor = isinstance(obj, torch.Tensor)
        except Exception:       # objects whose __class__ raises
            continue
        if is_tensor:
            for st in _storages(obj):
                if st.device.type == "cpu":
                    found[st._cdata] = st
    return found


class Census(TorchDispatchMode):
    """Live bytes of the adopted storages, summed before and after every op; the peak."""

    def __init__(self, exclude: dict):
        super().__init__()
        self.exclude = exclude      # address -> storage, held: a live storage's address cannot be reused
        self.refs: dict[int, weakref.ref] = {}
        self.peak = 0

    def adopt(self, st) -> None:
        key = st._cdata
        if key in self.exclude or st.device.type != "cpu":
            return
        ref = self.refs.get(key)
        if ref is None or ref() is None:    # new, or a freed storage's address taken by a new one
            self.refs[key] = weakref.ref(st)

    def total(self) -> int:
        n, dead = 0, []
        for key, ref in self.refs.items():
            st = ref()
            if st is None:
                dead.append(key)
            else:
                n += int(st.nbytes())
        for key in dead:
            del self.refs[key]
        return n

    def sample(self) -> None:
        self.peak = max(self.peak, self.total())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                for st in _storages(t):
                    self.adopt(st)
        self.sample()
        out = func(*args, **kwargs)
        for t in tree_leaves((out, args, kwargs)):     # an op writing into `out=` may have resized it
            if isinstance(t, torch.Tensor):
                for st in _storages(t):
                    self.adopt(st)
        self.sample()
        return out


# ---- models ---------------------------------------------------------------------------------------

def build(name: str):
    """(model, example inputs as torchdiag's ModelInputs) for one rank's batch, seeded alike on every rank."""
    from torchdiag.api import as_inputs

    torch.manual_seed(0)
    if name == "mlp":
        import mlp

        model, args = mlp.build(hidden=1024), (torch.randn(16, 784),)
    elif name == "cnn":
        import cnn

        model = cnn.build(width=32)
        args = (torch.randn(8, 3, 32, 32),)
    elif name == "transformer":
        import transformer_lm

        model = transformer_lm.build(dim=128, layers=4)
        ids = torch.randint(0, 1000, (4, 32))
        args = {"input_ids": ids, "labels": torch.roll(ids, -1, dims=1)}
    else:
        raise SystemExit(f"unknown model {name}")
    return model, as_inputs(model, args)


def units(model):
    """The modules `--wrap units` shards before the root: what memory/shard.py's fsdp_unit_bytes
    takes as units (elements of ModuleList/Sequential containers, else the root's children)."""
    from torch import nn

    found, inside = [], set()
    for _, mod in model.named_modules():
        if id(mod) in inside:        # nested in a unit already taken: the outermost unit holds it
            continue
        if isinstance(mod, (nn.ModuleList, nn.Sequential)):
            for c in mod.children():
                if any(True for _ in c.parameters()):
                    found.append(c)
                    inside |= {id(m) for m in c.modules()}
    if not found:
        found = [c for c in model.children() if any(True for _ in c.parameters())]
    return found


def _ctx(model):
    from torchdiag.core.context import context_for
    from torchdiag.core.run import RunSpec
    from torchdiag.diagnostics import memory as M

    return context_for(model, RunSpec("memory", optimizer=M.OPTIMIZER, caller="python"))


def estimated(model, inputs, world: int, wrap: str) -> dict:
    """memory's ZeRO-3/FSDP row for this step over `world` devices, from the unwrapped model on fake tensors."""
    from torchdiag.diagnostics import memory as M
    from torchdiag.diagnostics.memory.step import nbytes, unique

    rep = M.estimate(model, inputs, M.Options(), _ctx(model))
    units = M.Units(0, nbytes(unique(model.parameters()))) if wrap == "root" else M.fsdp_units(model)
    row = next(r for r in M.shard_rows(rep, world, units, True, gloo=True) if r["stage"] == "zero-3 / fsdp")
    return {"estimate_bytes": row["per_device_peak_bytes"], "estimate_phase": row["phase"], "unit_bytes": units.largest,
            "root_bytes": units.root, "unsharded_peak_bytes": rep.peak,
            "estimate_by_moment": M.fsdp_peaks(rep, world, units, True, gloo=True)}


REPEATS = 3     # steps measured; the least peak is the step's own (on a busy machine one step's peak was once 11%
                # above the others: a buffer held a little longer, a timing, not the step's memory)


def measured(model, inputs, wrap: str, exclude: dict) -> int:
    """The census peak of a steady-state FSDP step on this rank (the model sharded in place): the least of
    REPEATS steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    loss_rule = _ctx(model).loss()      # the loss and target memory's step uses (on the plain model)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if wrap == "units":
        for mod in units(model):
            fully_shard(mod, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    def forward():   # the model called as a user's loop does (ModelInputs.call keeps a copy of the inputs)
        return model(*inputs.args, **inputs.kwargs)

    for _ in range(2):                  # FSDP's lazy init, the optimizer state: as from step 2 on
        loss_rule(forward()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    peaks = []
    for _ in range(REPEATS):
        gc.collect()
        census = Census(exclude)
        for st in _live_storages().values():
            census.adopt(st)
        census.sample()
        with census:
            out = forward()
            loss = loss_rule(out)
            loss.backward()
            opt.step()
        census.sample()
        del out, loss
        opt.zero_grad(set_to_none=True)
        peaks.append(census.peak)
    return min(peaks)


def one(name: str, wrap: str) -> dict:
    world = dist.get_world_size()
    model, inputs = build(name)
    est = estimated(model, inputs, world, wrap)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    del model, inputs
    gc.collect()
    exclude = _live_storages()          # what existed before this model: not its step's
    model, inputs = build(name)
    peak = measured(model, inputs, wrap, exclude)
    peaks = [None] * world
    dist.all_gather_object(peaks, peak)
    return {"model": name, "wrap": wrap, "world": world, "param_bytes": params, "measured_bytes": peaks,
            **est, "error": [(est["estimate_bytes"] - p) / p for p in peaks]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,cnn,transformer")
    ap.add_argument("--wrap", default="root", choices=("root", "units"))
    ap.add_argument("--plan", help="several wraps in one launch, e.g. root:mlp,cnn/units:mlp (overrides the two above)")
    ap.add_argument("--json")
    a = ap.parse_args()
    plan = [part.split(":", 1) for part in a.plan.split("/")] if a.plan else [(a.wrap, a.models)]
    if any(wrap not in ("root", "units") for wrap, _ in plan):
        ap.error(f"--plan: a wrap is root or units, not {a.plan!r}")
    dist.init_process_group("gloo")
    rows = [one(name, wrap) for wrap, models in plan for name in models.split(",")]
    if dist.get_rank() == 0:
        for r in rows:
            errs = " ".join(f"{100 * e:+.1f}%" for e in r["error"])
            print(f"{r['model']:12} wrap={r['wrap']:5} world={r['world']} params {r['param_bytes']:>10,} "
                  f"unsharded step {r['unsharded_peak_bytes']:>11,}  estimate {r['estimate_bytes']:>11,} "
                  f"({r['estimate_phase']})  measured {r['measured_bytes']}  error {errs}")
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1))
    dist.barrier()   # neither rank tears its group down while the other still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    # past the interpreter's teardown: a gloo thread still joinable at static destruction aborts the process
    # ("terminate called without an active exception", exit -6; once in a CI run of the suite, 0 in 15 runs alone)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
