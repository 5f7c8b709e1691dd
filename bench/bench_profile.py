"""profile vs the same number of unprofiled steps of the same model, in one process.

Each row runs wait+warmup+active steps (1+2+10) and is timed end to end, results included:
  baseline                     plain steps (inference: eval + no_grad forward; train: forward + loss
                               + backward + Adam step on a copy)
  torch.profiler               the same steps under torch.profiler with the same schedule, results
                               processed (key_averages), nothing printed
  + key_averages().table()     what most people do: the profiler's default table
  torchdiag profile            diagnostics.profile.run: module hooks + record_function ranges,
                               our own operator/module tables, step statistics
Issue 5 target: torchdiag near torch.profiler alone (~1.1x), well under the .table() path (1.6-1.8x).
The last column is torchdiag's measured mean active step over the plain step (in-loop overhead).
torch runs on one thread here: on a shared 2-core machine two spinning OpenMP threads turn a
sub-millisecond step into tens of milliseconds of scheduler noise, and the ratios become meaningless."""
import copy
import statistics

from common import load

WAIT, WARMUP, ACTIVE = 1, 2, 10
STEPS = WAIT + WARMUP + ACTIVE


def make_step(model, x, mode):
    import torch

    from torchdiag.core.loss import Loss

    if mode == "inference":
        model.eval()

        def step():
            with torch.no_grad():
                x.call(model)
        return step
    work = copy.deepcopy(model).train()
    opt = torch.optim.Adam(work.parameters(), lr=1e-3)
    loss = Loss("auto")   # the same loss rule torchdiag uses

    def step():
        loss(x.call(work)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def bench(spec, *inputs, mode="inference", repeat=5):
    from torch.profiler import ProfilerActivity, profile, schedule

    from torchdiag.api import run
    from torchdiag.diagnostics import profile as P

    model, x = load(spec, *inputs)
    step = make_step(model, x, mode)

    def plain():
        for _ in range(STEPS):
            step()

    def profiled(table=False, times=None):
        import time

        with P.quiet_kineto(), profile(activities=[ProfilerActivity.CPU],   # quiet: kineto's start/stop lines
                                       schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)) as prof:
            for _ in range(STEPS):
                t0 = time.perf_counter()
                step()
                if times is not None:
                    times.append(time.perf_counter() - t0)
                prof.step()
        ka = prof.key_averages()
        if table:
            ka.table(sort_by="self_cpu_time_total", row_limit=15)

    ours_steps, torch_steps = [], []

    def ours():
        r = run("profile", model, x, mode=mode, wait=WAIT, warmup=WARMUP, active=ACTIVE, loss="auto")
        ours_steps.extend(t / 1e3 for t in r.series["step_times_ms"][WAIT + WARMUP:])

    def torch_only():
        times = []
        profiled(times=times)
        torch_steps.extend(times[WAIT + WARMUP:])

    # Round-robin: each repetition runs every variant once, so load drift on a shared machine hits
    # all of them alike; medians over repetitions.
    import time

    variants = [("baseline", plain), ("torch.profiler", torch_only),
                ("  + key_averages().table()", lambda: profiled(True)), ("torchdiag profile", ours)]
    times = {name: [] for name, _ in variants}
    for _name, fn in variants:   # warm-up
        fn()
    ours_steps.clear(), torch_steps.clear()
    step_times = []
    for _ in range(repeat):
        for name, fn in variants:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        for _ in range(ACTIVE):
            t0 = time.perf_counter()
            step()
            step_times.append(time.perf_counter() - t0)
    base = statistics.median(times["baseline"])
    rows = [(name, statistics.median(times[name])) for name, _ in variants[1:]]
    plain_step = statistics.median(step_times)
    print(f"\n{spec} {' '.join(inputs)} --mode {mode}  ({STEPS} steps, median of {repeat} runs)")
    print("  end to end, results included")
    print(f"    baseline (plain steps)       {base * 1000:8.1f} ms  1.00x")
    for name, t in rows:
        print(f"    {name:<28} {t * 1000:8.1f} ms  {t / base:5.2f}x")
    print("  one step (median), in the loop")
    print(f"    plain step                   {plain_step * 1e3:8.2f} ms  1.00x")
    for name, ts in (("torch.profiler active step", torch_steps), ("torchdiag active step", ours_steps)):
        med = statistics.median(ts)
        print(f"    {name:<28} {med * 1e3:8.2f} ms  {med / plain_step:5.2f}x")


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    bench("mlp.py:build", "64x784")
    bench("resnet.py:build", "16x3x32x32")
    bench("resnet.py:build", "16x3x32x32", mode="train")
    bench("transformer_lm.py:build", "8x64:int64", mode="train")
