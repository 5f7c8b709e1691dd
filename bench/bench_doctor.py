"""doctor's cost as a ratio to one plain forward+backward of the same model, same process.

doctor runs: a meta rebuild + 2 meta forwards, 1 deepcopy, 3 eval forwards (baseline + 2 for
determinism, with per-module fingerprint hooks), 1 train forward+backward, 1 Adam step, 1 forward
after the step, and for BatchNorm models a batch-1 probe. The first call in a process also pays
torch's one-time set-up of meta kernels (shown as "first call"). Run: python bench/bench_doctor.py"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import torch  # noqa: E402

from torchdiag.core.context import prepare  # noqa: E402
from torchdiag.core.run import RunSpec  # noqa: E402
from torchdiag.diagnostics import doctor  # noqa: E402
from torchdiag.diagnostics.doctor.shared import tensors  # noqa: E402

from conftest import sample  # noqa: E402


def best(fn, n=5):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    torch.set_num_threads(1)
    for name in ("mlp.py:build", "cnn.py:build", "resnet.py:build", "transformer_lm.py:build"):
        # as the CLI runs it: the context carries the factory (for the meta rebuild)
        model, inputs, ctx = prepare(RunSpec("doctor", model=sample(name), device="cpu", caller="python"))
        loss = lambda out: tensors(out)[0][1].float().pow(2).mean()  # noqa: E731

        def fwd_bwd():
            model.zero_grad(set_to_none=True)
            loss(inputs.call(model)).backward()

        def fwd():
            with torch.no_grad():
                inputs.call(model)

        fwd_bwd()
        base = best(fwd_bwd)
        base_f = best(fwd)
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        doctor.run(model, inputs, doctor.Options(), ctx)
        first = time.perf_counter() - t
        run = best(lambda: doctor.run(model, inputs, doctor.Options(), ctx), n=3)
        print(f"{name:26s} forward+backward {base * 1e3:8.2f} ms   forward {base_f * 1e3:8.2f} ms   "
              f"doctor {run * 1e3:8.1f} ms (first call {first * 1e3:7.1f} ms)   = {run / base:5.1f}x fwd+bwd, "
              f"{run / base_f:5.1f}x forward")


if __name__ == "__main__":
    main()
