"""Host syncs of a healthy pass, counted on CPU (core.syncs.SyncCounter), at depth 4 vs 64.

    .venv/bin/python bench/bench_syncs.py

A sync is free on CPU but drains the GPU queue: a diagnostic whose count grows with depth costs a
multiple of a training step on a GPU. Each row: a Linear+ReLU MLP of that depth, batch 8, the
command through the Python API; counts per op, and where (file:line) the most frequent ones are.
Syncs made inside torch.optim (torch's single-tensor Adam reads each parameter's `step` counter, a
CPU tensor even on a GPU) are the optimizer's, not the command's: counted apart in the `optimizer`
column, with a plain loop of the same optimizer and steps for comparison. A command that fails is
skipped with the reason."""
from __future__ import annotations

from common import ROOT  # noqa: E402  (also puts the repository on sys.path)

RUNS = [("nancheck", {}), ("nancheck", {"steps": 3}), ("gradflow", {}), ("overfit-batch", {"steps": 3}),
        ("doctor", {})]


def mlp(depth: int):
    """sample_models/mlp.py:deep, seeded."""
    import torch

    from torchdiag.core.loading import import_module

    torch.manual_seed(0)
    return import_module(str(ROOT / "sample_models" / "mlp.py")).deep(depth)


def in_optimizer(event) -> bool:
    return any("/torch/optim/" in f[0].replace("\\", "/") for f in event.frames)


def count(command: str, depth: int, options: dict):
    """(the command's own sync events, the optimizer's)."""
    import torch

    import torchdiag.api
    from torchdiag.core.syncs import SyncCounter

    model, x = mlp(depth), torch.randn(8, 16)
    with SyncCounter(frames=True) as s:
        torchdiag.api.run(command, model, x, **options)
    optimizer = [e for e in s.events if in_optimizer(e)]
    return [e for e in s.events if not in_optimizer(e)], optimizer


def plain_adam(depth: int, steps: int) -> int:
    """Syncs of a plain loop of torch's Adam (lr 1e-3) for `steps` steps: what the optimizer alone makes."""
    import torch

    from torchdiag.core.syncs import SyncCounter

    model, x = mlp(depth), torch.randn(8, 16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with SyncCounter() as s:
        for _ in range(steps):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    return s.total


def main() -> None:
    import torch

    print(f"torch {torch.__version__}")
    print(f"{'command':28} {'depth 4':>8} {'depth 64':>9} {'optimizer 4/64':>15}  ops (depth 64, command's own)")
    for command, options in RUNS:
        label = command + "".join(f" --{k} {v}" for k, v in options.items())
        try:
            (shallow, opt4), (deep, opt64) = count(command, 4, options), count(command, 64, options)
        except Exception as exc:  # a command mid-migration, or not there: say so and go on
            print(f"{label:28} skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}")
            continue
        from collections import Counter

        ops = ", ".join(f"{op} {n}" for op, n in Counter(e.op for e in deep).most_common())
        print(f"{label:28} {len(shallow):8d} {len(deep):9d} {f'{len(opt4)}/{len(opt64)}':>15}  {ops}")
        sites = Counter((e.op, "{}:{}".format(*e.site()[:2]) if e.site() else "?") for e in deep)
        for (op, site), n in sites.most_common(3):
            print(f"{'':28} {'':8} {n:9d} {'':15}  {op} at {site.replace(str(ROOT) + '/', '')}")
    print(f"{'plain Adam loop, 3 steps':28} {plain_adam(4, 3):8d} {plain_adam(64, 3):9d}  "
          "(the optimizer alone: compare the optimizer column)")


if __name__ == "__main__":
    main()
