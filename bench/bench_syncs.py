"""Host syncs of a healthy pass, counted on CPU (core.syncs.SyncCounter), at depth 4 vs 64.

    .venv/bin/python bench/bench_syncs.py

A sync is free on CPU but drains the GPU queue: a diagnostic whose count grows with depth costs a
multiple of a training step on a GPU. Each row: a Linear+ReLU MLP of that depth, batch 8, the
command through the Python API; counts per op, and where (file:line) the most frequent ones are.
Commands not migrated yet, or missing, are skipped with the reason."""
from __future__ import annotations

from common import ROOT  # noqa: F401,E402  (puts the repository on sys.path)

RUNS = [("nancheck", {}), ("nancheck", {"steps": 3}), ("gradflow", {}), ("overfit-batch", {"steps": 3}),
        ("doctor", {})]


def mlp(depth: int):
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(16, 16), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(16, 4))


def count(command: str, depth: int, options: dict):
    import torch

    import torchdiag.api
    from torchdiag.core.syncs import SyncCounter

    model, x = mlp(depth), torch.randn(8, 16)
    with SyncCounter(frames=True) as s:
        torchdiag.api.run(command, model, x, **options)
    return s


def main() -> None:
    import torch

    print(f"torch {torch.__version__}")
    print(f"{'command':28} {'depth 4':>8} {'depth 64':>9}  ops (depth 64)")
    for command, options in RUNS:
        label = command + "".join(f" --{k} {v}" for k, v in options.items())
        try:
            shallow, deep = count(command, 4, options), count(command, 64, options)
        except Exception as exc:  # a command mid-migration, or not there: say so and go on
            print(f"{label:28} skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}")
            continue
        ops = ", ".join(f"{op} {n}" for op, n in deep.counts.most_common())
        print(f"{label:28} {shallow.total:8d} {deep.total:9d}  {ops}")
        for (op, site), n in deep.by_site().most_common(3):
            print(f"{'':28} {'':8} {n:9d}  {op} at {site.replace(str(ROOT) + '/', '')}")


if __name__ == "__main__":
    main()
