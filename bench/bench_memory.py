"""bench_memory: cost of `torchdiag memory` as ratios to a plain training step (forward, loss,
backward, Adam step on a copy) of the same model in the same process, and its accuracy.

Accuracy reference: the tensor-level peak measured on real CPU tensors for the same steady-state
step (optimizer state present, output and loss alive until after the step); and, when the private
API imports, torch's MemTracker (torch.distributed._tools.mem_tracker) on real CPU tensors.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_memory.py"""
import copy
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

from torchdiag.api import run  # noqa: E402
from torchdiag.core.context import context_for  # noqa: E402
from torchdiag.core.loss import Loss  # noqa: E402
from torchdiag.core.run import RunSpec  # noqa: E402
from torchdiag.diagnostics import memory as M  # noqa: E402

from conftest import load  # noqa: E402

MODELS = [("mlp.py:build", None), ("cnn.py:build", ["32x3x32x32"]), ("transformer_lm.py:build", None),
          ("llama.py:build", None), ("vit.py:build", None)]


def _ctx(model, **spec):
    return context_for(model, RunSpec("memory", optimizer=M.OPTIMIZER, caller="python", **spec))


def _median(fn, reps=5):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def plain_step(model, inputs):
    m = copy.deepcopy(model).train()
    opt = torch.optim.Adam(m.parameters(), foreach=False)
    out = inputs.call(m)
    Loss("auto")(out).backward()
    opt.step()


def memtracker_peak(model, inputs):
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except Exception:
        return None
    m = copy.deepcopy(model).train()
    opt = torch.optim.Adam(m.parameters(), foreach=False)
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    mt = MemTracker()
    mt.track_external(m, opt, *inputs.args, *inputs.kwargs.values())
    with mt:
        out = inputs.call(m)
        loss = Loss("auto")(out)
        loss.backward()
        opt.step()
    return mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def main():
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'model':26} {'base step':>10} {'measure':>8} {'estimate':>8} {'run()':>7}  "
          f"{'measured peak':>14} {'estimate':>9} {'MemTracker':>11}")
    for name, ins in MODELS:
        model, inputs = load(name, inputs=ins)
        base = _median(lambda: plain_step(model, inputs))
        ctx = _ctx(model)
        t_meas = _median(lambda: M.measure(model, inputs, M.Options(), ctx))
        t_est = _median(lambda: M.estimate(model, inputs, M.Options(), ctx))
        t_run = _median(lambda: run("memory", model, inputs), reps=3)
        measured = M.measure(model, inputs, M.Options(), ctx).peak
        est = M.estimate(model, inputs, M.Options(), ctx).peak
        ref = memtracker_peak(model, inputs)
        ref_s = f"{(measured - ref) / ref:+.2%}" if ref else "n/a"
        print(f"{name:26} {base * 1e3:8.1f}ms {t_meas / base:7.2f}x {t_est / base:7.2f}x {t_run / base:6.2f}x  "
              f"{measured:14,d} {(est - measured) / measured:+8.2%} {ref_s:>11}")
    print("measure/estimate/run(): time ÷ plain step; estimate column: (estimate − measured) ÷ measured; "
          "MemTracker column: (measured − MemTracker) ÷ MemTracker")

    t0 = time.perf_counter()
    model, inputs = load("llama.py:build", "size='7b'", device="meta", inputs=["1x2048:int64"])
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = M.estimate(model, inputs, M.Options(), _ctx(model), emulate="cuda")
    t_est = time.perf_counter() - t0
    t0 = time.perf_counter()
    rb = M.estimate(model, inputs, M.Options(), _ctx(model, dtype="bfloat16"), emulate="cuda")
    t_bf = time.perf_counter() - t0
    print(f"Llama-7B on meta, 1x2048, Adam fp32: build {t_build:.1f}s, estimate {t_est:.1f}s "
          f"({t_est / t_build:.1f}x the meta build), peak {r.peak / 2**30:.1f} GiB in {r.peak_phase}; "
          f"bf16: {t_bf:.1f}s, peak {rb.peak / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
