"""overfit-batch step cost as a ratio to a plain training step of the same model, same process.

Baseline: `zero_grad; loss = loss_fn(model(x)); loss.backward(); Adam.step()` on a deepcopy, the
same batch and loss rule, for the same number of steps. overfit-batch adds per step: float(loss)
(a device sync), the accuracy check, one gradient norm over all parameters and a zero-gradient
check. Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_overfit_batch.py"""
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

from torchdiag.api import run as api_run  # noqa: E402
from torchdiag.core.loss import Loss  # noqa: E402

from conftest import load  # noqa: E402

STEPS = 60
REPEATS = 5
MODELS = [("mlp.py:build", None), ("cnn.py:build", ["8x3x32x32"]), ("resnet.py:build", None),
          ("transformer_lm.py:build", None)]


def baseline(model, x, steps):
    work = copy.deepcopy(model).train()
    loss_fn = Loss("auto", 0)
    opt = torch.optim.Adam(work.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(x.call(work))
        loss.backward()
        opt.step()
    float(loss.detach())
    return time.perf_counter() - t0


def ours(model, x, steps):
    # target unreachable: exactly `steps` updates; time measured inside run() (the loop only)
    r = api_run("overfit-batch", model, x, steps=steps, target_ratio=1e-12, loss="auto", seed=0)
    assert r.data["steps"] == steps
    return r.data["seconds"]


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {STEPS} steps, min of {REPEATS} interleaved runs")
    print(f"{'model':28} {'baseline ms/step':>17} {'overfit-batch ms/step':>22} {'ratio':>7}")
    for name, inputs in MODELS:
        model, x = load(name, inputs=inputs)
        baseline(model, x, 5)  # warm-up (optimizer import, kernels)
        ours(model, x, 5)
        bs, os_ = [], []
        for _ in range(REPEATS):  # interleaved; the minimum is the least disturbed by other load
            bs.append(baseline(model, x, STEPS))
            os_.append(ours(model, x, STEPS))
        b, o = min(bs), min(os_)
        print(f"{name:28} {1000 * b / STEPS:17.2f} {1000 * o / STEPS:22.2f} {o / b:7.2f}x")


if __name__ == "__main__":
    main()
