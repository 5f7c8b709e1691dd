"""nancheck cost as ratios against a plain forward+backward of the same model, same process.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_nancheck.py [--large]

Columns: plain fwd+bwd (ms, the baseline); no-op hooks / baseline: a pre- and post-hook doing
nothing on every module (the floor of any per-module check); checked / baseline: the pass nancheck runs on a healthy
model (the flagged pass: one device-side sum per module output, loss and parameter gradients read back
in one host sync); exact / baseline: the per-module pass (one sync per module output) it runs only when
something is non-finite; +grad hooks / baseline: the pass it adds only when a gradient is non-finite
(tensor hooks on every module input/output gradient); full `run()` / baseline (also inputs,
parameters, buffers snapshot and restore, report), and autograd anomaly mode / baseline for comparison.
Host syncs per healthy pass: bench/bench_syncs.py."""
from __future__ import annotations

import sys
import warnings

from common import ROOT, round_ratios  # noqa: E402  (bench/ is on sys.path when run as a script)


def main() -> None:
    import torch

    import torchdiag.api
    from torchdiag.core.context import loss_rule
    from torchdiag.core.inputs import resolve_inputs
    from torchdiag.core.loading import load_model
    from torchdiag.diagnostics import nancheck

    torch.manual_seed(0)
    cases = [("mlp.py:build", ["32x784"], 60), ("cnn.py:build", ["32x3x32x32"], 30),
             ("resnet.py:build", ["32x3x32x32"], 15), ("transformer_lm.py:build", [], 40),
             ("vit.py:build", [], 40)]
    if "--large" in sys.argv:  # the reference sizes (slow: minutes on 2 cores)
        cases = [("resnet.py:resnet50", ["4x3x224x224"], 3), ("bert.py:build", ["4x128:int64"], 3)]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'model':26} {'fwd+bwd ms':>10} {'no-op hooks':>11} {'checked':>8} {'exact':>7} {'+grad hooks':>10} {'run()':>7} {'anomaly':>8}")
    for spec, shapes, reps in cases:
        dev = torch.device("cpu")
        loaded = load_model(str(ROOT / "sample_models" / spec), [], dev)
        model = loaded.model
        inputs = resolve_inputs(shapes, loaded, dev, 0)
        model.train()
        loss = loss_rule("auto", seed=0)

        def plain():
            for p in model.parameters():
                p.grad = None
            loss(inputs.call(model)).backward()

        def noop_hooks():  # the floor of any per-module hook check: torch's hook path, nothing else
            handles = []
            for m in model.modules():
                handles.append(m.register_forward_pre_hook(lambda *a, **k: None, with_kwargs=True))
                handles.append(m.register_forward_hook(lambda *a: None))
            plain()
            for h in handles:
                h.remove()

        def checked():
            for p in model.parameters():
                p.grad = None
            nancheck.localized_pass(model, inputs, loss)

        def exact():
            for p in model.parameters():
                p.grad = None
            nancheck.checked_pass(model, inputs, loss, track_grads=False)

        def grad_hooks():
            for p in model.parameters():
                p.grad = None
            nancheck.checked_pass(model, inputs, loss, track_grads=True)

        def full():
            torchdiag.api.run("nancheck", model, inputs, loss="auto")

        def anomaly():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.autograd.detect_anomaly(check_nan=True):
                    plain()

        b, r = round_ratios(plain, {"noop": noop_hooks, "checked": checked, "exact": exact, "hooks": grad_hooks, "run": full, "anomaly": anomaly}, reps)
        print(f"{spec:26} {b * 1000:10.1f} {r['noop']:10.2f}x {r['checked']:7.2f}x {r['exact']:6.2f}x {r['hooks']:9.2f}x {r['run']:6.2f}x "
              f"{r['anomaly']:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
