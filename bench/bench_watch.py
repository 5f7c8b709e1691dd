"""watch (issue 27): step-time overhead of watching a real training loop, and the cost of each check.

    .venv/bin/python bench/bench_watch.py [--steps 50] [--rounds 5] [--every 50] [--device cpu|cuda]
                                          [--cnn-batch 16] [--only cnn|lm]

Two loops, each a plain `zero_grad / forward / cross-entropy / backward / step`:
- cnn: sample_models/resnet.py:resnet18 (10 classes), batch 16 of 3x32x32 (`--cnn-batch`: 128 is CIFAR's usual
  recipe; 16 is the worst case for the per-step gradient-norm pass, a fixed cost against a small step), SGD
  momentum 0.9;
- lm: sample_models/transformer_lm.py:build (vocab 1000, dim 64, 2 layers, context 64), batch 8, AdamW.
Each round runs `--steps` steps plain and `--steps` steps inside `Watch(model, opt, every=--every)`
back to back (alternating which goes first); the overhead is the median over rounds of watched/plain - 1.
Steps are timed with this thread's CPU time (`time.thread_time`, OMP_NUM_THREADS=1) on CPU, so other
processes on a shared machine do not enter the figure; `--wall` (and any GPU run) uses the wall clock. A block of 50 steps at every=50 holds one read
step plus the final read of the `with` block's exit: an upper bound of the default's cost.

Per check (median of 20 calls, on the model's real gradients after one step):
- per step: the gradient norms, total and first-non-finite update (Track.pre_step, no sample), the loss
  capture (Tensor.backward wrapper: a detach and an add);
- per read step (once every `every`): the strided parameter samples before/after the update and the
  ratios (Track.pre_step sample + post_step), the dead-unit probe forward (vs a plain forward), and the
  read-back itself (one sync per device)."""
from __future__ import annotations

import argparse
import statistics
import time

from common import ROOT  # noqa: E402  (also puts the repository on sys.path)

# CPU time of this thread, not wall time: on a shared machine other processes' load never enters it
# (run with OMP_NUM_THREADS=1 so torch computes in this thread). --wall for wall-clock time (a GPU).
CLOCK = time.thread_time


def models(device, cnn_batch: int = 16):
    import torch

    from torchdiag.core.loading import import_module

    torch.manual_seed(0)
    res = import_module(str(ROOT / "sample_models" / "resnet.py")).resnet18(10).to(device)
    lm = import_module(str(ROOT / "sample_models" / "transformer_lm.py")).build().to(device)
    g = torch.Generator().manual_seed(0)
    images = (torch.randn(cnn_batch, 3, 32, 32, generator=g).to(device),
              torch.randint(0, 10, (cnn_batch,), generator=g).to(device))
    tokens = torch.randint(0, 1000, (8, 65), generator=g).to(device)
    return {
        f"cnn (resnet18, batch {cnn_batch}x3x32x32, SGD)": (
            res, torch.optim.SGD(res.parameters(), lr=0.01, momentum=0.9), images,
            lambda out, y: torch.nn.functional.cross_entropy(out, y)),
        "lm (transformer, 2 layers, batch 8x64, AdamW)": (
            lm, torch.optim.AdamW(lm.parameters(), lr=1e-3), (tokens[:, :-1], tokens[:, 1:]),
            lambda out, y: torch.nn.functional.cross_entropy(out["logits"].reshape(-1, 1000), y.reshape(-1)))}


def steps(model, opt, batch, loss_fn, n, sync, times=None):
    x, y = batch
    for _ in range(n):
        t0 = CLOCK()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        sync()
        if times is not None:
            times.append(CLOCK() - t0)


def interleaved(model, opt, batch, loss_fn, pairs: int, every: int, sync) -> tuple[float, float]:
    """Two copies of the model from the same weights, each with its own optimizer of the same kind: one steps
    plain, the other inside `Watch(copy, its optimizer, every)`, one step each in turn (which goes first
    alternates). A drift in the machine's speed, which moves whole blocks by more than the overhead on a shared
    VM, hits both of a pair alike. Returns (the watched copy's total time over the plain copy's, read steps
    included, - 1; the median over steady pairs, not read steps, of watched/plain - 1). The Tensor.backward
    wrapper is global while watching: the plain copy's backward passes through it too (a reference to the loss)."""
    import copy

    from torchdiag.diagnostics.watch import Watch

    x, y = batch
    copies = [copy.deepcopy(model), copy.deepcopy(model)]
    import inspect

    takes = inspect.signature(type(opt).__init__).parameters   # defaults can hold what __init__ does not take
    opts = [type(opt)(c.parameters(), **{k: v for k, v in opt.defaults.items() if k in takes}) for c in copies]
    times: list[list[float]] = [[], []]

    def one(k: int) -> None:
        t0 = CLOCK()
        opts[k].zero_grad()
        loss_fn(copies[k](x), y).backward()
        opts[k].step()
        sync()
        times[k].append(CLOCK() - t0)

    with Watch(copies[1], opts[1], every=every):
        for i in range(pairs + 2):
            for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                one(k)
    plain, watched = times[0][2:], times[1][2:]   # the first two pairs: warm-up, the watch's start
    steady = [w / p for i, (p, w) in enumerate(zip(plain, watched)) if (i + 3) % every]
    return sum(watched) / sum(plain) - 1, statistics.median(steady) - 1


def per_check(model, opt, batch, loss_fn, sync) -> dict:
    """Seconds per call of each check, on the model's real gradients."""
    from torchdiag.diagnostics.watch import Options
    from torchdiag.diagnostics.watch.engine import Engine
    from torchdiag.diagnostics.watch.stats import DeadUnits, Track, read_parts

    x, y = batch
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    track = Track(opt, Options())

    def timed(fn, n=20):
        fn()
        sync()
        out = []
        for _ in range(n):
            t0 = CLOCK()
            fn()
            sync()
            out.append(CLOCK() - t0)
        return statistics.median(out)

    def sample_step():
        track.pre_step(2, True)
        track.post_step(2, carry_probe=False)
        track.queue.clear()

    def read():
        parts = [q[2] for q in track.queued(False)]
        read_parts(parts)

    engine = Engine(Options(), [model], [opt])

    def probe_forward():
        p = DeadUnits(engine, model)
        p.attach()
        model(x)
        p.collect()
        engine.pending.clear()

    costs = {"grad norms per step": timed(lambda: track.pre_step(2, False)),
             "sampled update ratio (read step)": timed(sample_step),
             "read-back (read step)": timed(read)}
    plain_fwd = timed(lambda: model(x))
    costs["dead-unit probe forward, extra (read step)"] = max(0.0, timed(probe_forward) - plain_fwd)
    track.rows()
    return costs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--wall", action="store_true", help="time with the wall clock (needed on a GPU)")
    ap.add_argument("--pairs", type=int, default=200, help="interleaved plain/watched step pairs (0: none)")
    ap.add_argument("--cnn-batch", type=int, default=16,
                    help="the CNN's batch (16: the per-step norm pass's worst case; 128: CIFAR's usual recipe)")
    ap.add_argument("--only", choices=("cnn", "lm"), help="one of the two loops")
    args = ap.parse_args()
    import torch

    global CLOCK
    if args.wall or args.device != "cpu":
        CLOCK = time.perf_counter

    from torchdiag.diagnostics.watch import Watch

    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads; {args.steps} steps per block, "
          f"every={args.every}, {args.rounds} rounds; clock: {CLOCK.__name__}")
    for name, (model, opt, batch, loss_fn) in models(device, args.cnn_batch).items():
        if args.only and not name.startswith(args.only):
            continue
        plain_steps, watched_steps = [], []

        def plain():
            steps(model, opt, batch, loss_fn, args.steps, sync, plain_steps)

        def watched():
            with Watch(model, opt, every=args.every):
                steps(model, opt, batch, loss_fn, args.steps, sync, watched_steps)

        plain()
        watched()   # warm-up blocks, dropped
        plain_steps.clear()
        watched_steps.clear()
        for r in range(args.rounds):   # A B, then B A: a drift in load or clocks hits both alike
            for fn in ((plain, watched) if r % 2 == 0 else (watched, plain)):
                fn()
        n = args.steps
        ratio = statistics.median(sum(watched_steps[i * n:(i + 1) * n]) / sum(plain_steps[i * n:(i + 1) * n])
                                  for i in range(args.rounds))
        step_ms = 1000 * statistics.median(plain_steps)
        # steady steps: not the first two of a block (the watch's first step takes its start norms and
        # samples) nor read steps; the fastest decile (a shared machine's load only ever adds time)
        def steady(times):
            return [t for i, t in enumerate(times) if i % args.steps >= 2 and (i % args.steps + 1) % args.every]

        low = [statistics.quantiles(steady(t), n=10)[0] for t in (plain_steps, watched_steps)]
        print(f"\n{name}: plain step {step_ms:.1f} ms; watched blocks: {100 * (ratio - 1):+.1f}% (median of "
              f"per-round ratios, read steps included); steady steps, fastest decile: {1000 * low[0]:.2f} → {1000 * low[1]:.2f} ms "
              f"({100 * (low[1] / low[0] - 1):+.1f}%)")
        total, pair = interleaved(model, opt, batch, loss_fn, args.pairs, args.every, sync) if args.pairs else (0, 0)
        print(f"  interleaved, {args.pairs} pairs of a plain and a watched step on two copies: {100 * total:+.1f}% "
              f"(all of the watched copy's time, read steps included), steady pairs {100 * pair:+.1f}% (median)")
        costs = per_check(model, opt, batch, loss_fn, sync)
        for check, seconds in costs.items():
            print(f"  {check:45s} {1000 * seconds:8.3f} ms  ({100 * seconds / low[0]:.2f}% of a fastest step)")
        read = sum(v for k, v in costs.items() if "read step" in k)
        print(f"  estimate at every={args.every}: {100 * ((low[1] - low[0]) + read / args.every) / low[0]:+.1f}% "
              "(steady per-step overhead + read step / every)")


if __name__ == "__main__":
    main()
