"""lr-find's cost as a ratio to the plain training steps it runs, same process.

lr-find runs at most steps × repeats + 3 × check_steps updates (stated in its header); `data["updates"]`
says how many it ran. Baseline: that many plain `zero_grad; loss = loss_fn(model(x)); backward; step`
updates on one deepcopy with the same optimizer and loss rule (no copies, no reads, no rules). The ratio
is what lr-find adds: a fresh copy and optimizer per run, one loss read per range-test update, the rules,
the checked runs' reads. Interleaved rounds, median of the per-round ratios (bench/common.round_ratios).
Run: OMP_NUM_THREADS=1 .venv/bin/python bench/bench_lr_find.py"""
import copy
import time

from common import load, round_ratios

import torch

from torchdiag.api import run as api_run
from torchdiag.core.loss import Loss

OPTIONS = dict(steps=100, repeats=3, check_steps=30)
MODELS = [("mlp.py:build", (), "adam"), ("cnn.py:build", ("8x3x32x32",), "sgd"),
          ("transformer_lm.py:build", (), "adamw")]


def plain(model, x, optimizer: str, updates: int):
    work = copy.deepcopy(model).train()
    loss_fn = Loss("auto", 0)
    opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(optimizer, torch.optim.SGD)(work.parameters(), lr=1e-4)
    for _ in range(updates):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(x.call(work))
        loss.backward()
        opt.step()
    float(loss.detach())


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, lr-find {OPTIONS}")
    print(f"{'model':26} {'updates run':>12} {'plain ms/update':>16} {'lr-find':>9}")
    for name, inputs, optimizer in MODELS:
        model, x = load(name, *inputs)
        probe = api_run("lr-find", model, x, optimizer=optimizer, **OPTIONS)
        n = probe.data["updates"]
        t0 = time.perf_counter()
        plain(model, x, optimizer, n)
        per = (time.perf_counter() - t0) / n
        base, ratios = round_ratios(lambda: plain(model, x, optimizer, n),
                                    {"lr-find": lambda: api_run("lr-find", model, x, optimizer=optimizer, **OPTIONS)},
                                    repeat=3)
        print(f"{name:26} {n:12d} {1000 * per:16.2f} {ratios['lr-find']:8.2f}x   ({probe.verdict})")


if __name__ == "__main__":
    main()
