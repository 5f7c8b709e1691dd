"""lr-find: the learning-rate range test, with a suggestion that is checked, not trusted.

On fresh copies of the model (ctx.train_copy: the user's model, optimizer state and RNG are untouched), the
range test runs `steps` updates on the one batch with the rate growing geometrically from `min_lr` to
`max_lr`, recording the loss right after each update, and stops early once the smoothed loss exceeds
`diverge` × its best. It is repeated `repeats` times with seeds seed … seed+repeats-1: the seed draws the
random targets torchdiag makes (none with --batch or a given target) and drives the RNG of the forward
(dropout, sampling); the weights always start as the user's, and the batch is the same one (there is no
batch order to vary). When the first two repeats give bit-identical curves nothing random varies, and the
remaining repeats are skipped (they would be the same). The curves are read by the point rules of `rules.py` (valley, steepest, min/10,
side by side); the suggestion is the valley rule's median over the repeats, with its band (min–max).
A flat or noisy curve gives no suggestion (a warning saying why), never a made-up one.

Then the suggestion is checked: `check_steps` updates at 0.1×, 1× and 10× of it, from the same weights,
on the same batch, with the same seed; what the losses do (rules.judge) decides which trained fastest and
whether the suggestion diverged or was unstable, and the recommended rate is the one the checked runs
support (rules.pick). Cost: at most steps × repeats + 3 × check_steps updates, stated in the header.

Layout: `options` (torch-free), `rules` (torch-free reading of the curves), `loop` (the runs), `report`
(the Result). The optimizer, seed, loss rule and autocast come from the run spec (ctx); --lr is unused.
"""
from __future__ import annotations

from ...core.run import OptimizerSpec
from .options import Options

NEEDS_VALUES = True
# under torchrun: how each --wrap reaches this command (runner/ranks.py: wrap_mode)
WRAP = {"ddp": ("train", "every copy lr-find trains (each repeat, each checked run); the early stop is agreed "
                         "across ranks every update and the losses are averaged over the ranks"),
        "fsdp": ("train", "every copy lr-find trains is sharded by fully_shard; the early stop is agreed across "
                          "ranks every update and the losses are averaged over the ranks")}
OPTIMIZER = OptimizerSpec("adam")     # its lr is unused: the range test sets the rate of every update
FACTORS = (0.1, 1.0, 10.0)

__all__ = ["Options", "run", "NEEDS_VALUES", "OPTIMIZER", "WRAP", "FACTORS"]


def run(model, inputs, opts: Options | None, ctx):
    """The range test on copies of `model`, the rules, and the checked runs; data only."""
    from ...core.guard import leave_no_trace
    from ...errors import interrupt_code
    from .loop import Runner
    from .report import build
    from .rules import analyse, combine

    opts = opts or Options()
    runner = Runner(model, inputs.clone(), opts, ctx)
    analyses, suggestion, interrupted = [], None, 0
    with leave_no_trace(model):
        try:
            for r in range(opts.repeats):
                rep = runner.range_test(r)
                analyses.append(analyse(rep.lrs, rep.initial, rep.losses, opts.steps, rep.stopped))
                if r == 1 and runner.identical():   # nothing random varies: more repeats would be the same
                    break
            suggestion = combine(analyses)
            if suggestion.lr is not None and opts.check_steps:
                for factor in FACTORS:
                    runner.checked(factor, factor * suggestion.lr)
        except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM: keep what ran (the partial curve too), no verdict
            interrupted = int(interrupt_code(exc))
            analyses += [analyse(rep.lrs, rep.initial, rep.losses, opts.steps, rep.stopped)
                         for rep in runner.repeats[len(analyses):]]
    return build(runner, analyses, suggestion, opts, ctx, interrupted)
