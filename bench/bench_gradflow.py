"""gradflow cost as ratios against a plain forward+backward of the same model, same process, and
the host syncs one gradflow pass makes (what drains a GPU queue; free on this CPU, counted here).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_gradflow.py

baseline: grads set to None, forward, loss, backward (train mode).
gradflow run(): the whole diagnostic — hooks on every module (execution order, output autograd
nodes, activation statistics), autograd-graph walk, backward, per-parameter statistics, buffer
snapshot/restore, tables and findings. `+ histograms` also copies every weight and gradient to
numpy for --tb. `syncs`: host-sync calls of one run() (torchdiag.core.syncs.SyncCounter)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import compare, load  # noqa: E402


def sync_count(fn) -> int:
    from torchdiag.core.syncs import SyncCounter

    with SyncCounter() as s:
        fn()
    return s.total


def main() -> None:
    import torch

    from torchdiag.core.context import context_for
    from torchdiag.core.run import RunSpec
    from torchdiag.diagnostics import gradflow as gf

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    cases = [("mlp.py:build", ["32x784"], 15), ("cnn.py:build", ["32x3x32x32"], 10),
             ("resnet.py:build", ["32x3x32x32"], 5), ("transformer_lm.py:build", [], 10),
             ("vit.py:build", ["8x3x32x32"], 5)]
    print(f"{'model':26} {'fwd+bwd ms':>10} {'run()':>7} {'+hist':>7} {'syncs':>6}")
    for spec, shapes, reps in cases:
        model, inputs = load(spec, *shapes)
        model.train()
        ctx = context_for(model, RunSpec("gradflow", caller="python"))
        loss = ctx.loss()

        def plain():
            for p in model.parameters():
                p.grad = None
            loss(inputs.call(model)).backward()
            for p in model.parameters():
                p.grad = None

        def diag():
            gf.run(model, inputs, gf.Options(), ctx)

        def diag_hist():
            gf.run(model, inputs, gf.Options(histograms=True), ctx)

        base, rows = compare(plain, {"run": diag, "hist": diag_hist}, repeat=reps)
        r = dict(rows)
        print(f"{spec:26} {base * 1000:10.1f} {r['run'] / base:6.2f}x {r['hist'] / base:6.2f}x {sync_count(diag):>6}")


if __name__ == "__main__":
    main()
