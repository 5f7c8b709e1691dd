"""overfit-batch: can this model memorise one fixed batch?

A COPY of the model (`ctx.train_copy`, train mode, dropout and stochastic depth off: memorising
needs no regularisation, and dropout's noise is a floor under a regression loss) is trained on one batch with the loss rules of
core/loss.py. Step k evaluates the loss (``loss[k]``); when the target is reached, the budget is
spent or the loss is non-finite the run stops, otherwise one backward and one optimizer step follow.
So ``loss`` has ``steps + 1`` entries: ``loss[0]`` is the initial loss, ``loss[-1]`` the loss after
the last update; ``grad_norm``/``learning_rate`` have one entry per update.

Pass: ``final ≤ target_ratio × initial`` (and batch accuracy 100% when the loss is cross-entropy),
or ``final ≤ target_loss``; against the made-up mse target, × 10 times the loss of answering every sample with the
target's mean when that is lower (Curve.yardstick). On failure the likely causes are checked on the trained copy:
non-finite loss, parameters without gradients, parameters that never changed, a loss flat from the
start, outputs identical across the samples of the batch (and the first module that makes them so),
outputs squashed into [0, 1] or [-1, 1] where cross-entropy needs logits (the target then lies below
the lowest reachable loss).
Ctrl-C inside the loop returns the partial result with ``interrupted: true`` (exit 130).

Layout: `loop` trains and records the curve, `causes` checks what went wrong on the trained copy,
`report` turns both into the Result, `options` holds the torch-free Options. The optimizer, learning rate, seed and autocast come from the
run spec (`ctx`); the options here are overfit-batch's own.
"""
from __future__ import annotations

from ...core.run import DEFAULT_LR
from .options import NEEDS_VALUES, OPTIMIZER, RATIO_HINT, WRAP, Options

__all__ = ["Options", "run", "NEEDS_VALUES", "OPTIMIZER", "WRAP", "DEFAULT_LR", "RATIO_HINT"]


def run(model, inputs, opts: Options | None, ctx):
    """Train a copy of `model` on one batch; the Result holds the curve, the verdict and the causes."""
    from ...core.functional_dropout import modes_restored

    with modes_restored():
        return _run(model, inputs, opts, ctx)


def _run(model, inputs, opts: Options | None, ctx):
    from ...core.guard import leave_no_trace
    from .causes import diagnose
    from .report import build

    opts = opts or Options()
    with leave_no_trace(model), ctx.seeded():
        trainer, curve = _trained(model, inputs, opts, ctx)
        trainer.source = model   # its start: the re-check of parameters without a gradient at step 0
        if ctx.wrapper is not None and curve.interrupted:   # no verdict, and no collective: a peer may be gone
            from .causes import Causes

            found = Causes([], [])
        else:
            if ctx.wrapper is not None:   # under torchrun: the causes' extra passes on a local copy (no collective)
                from .sharded import localise

                localise(trainer, model, "to check the causes on this rank")
            found = diagnose(trainer, curve, opts)

    def second():
        if curve.nonfinite_at == 0 or not _asks(opts, ctx):   # non-finite before any step: no optimizer helps
            return None
        trainer.release()             # the judged copy and its optimizer state: not held beside a second one
        return _default_optimizer(model, inputs, opts, ctx, curve.step)

    def lower():
        if not _collapsed(found, curve) or ctx.wrapper is not None:
            return None
        if opts.steps is not None:   # the budget the user set is the run's whole cost: said, not spent again
            return f"a tenth of the rate was not tried ({ctx.option('steps')} was given)"
        trainer.release()
        return _lower_rate(model, inputs, opts, ctx, curve.step)

    trainable = sum(p.numel() for _, p in trainer.trainable)   # before a release empties the list

    def few(done: int):
        """Two of the batch's samples on a fresh copy (capacity.py), its progress shown after `done` steps; not
        under torchrun (each rank's rows)."""
        from .capacity import limited, pick, train_few

        batch, target = trainer.batch.batch_size, trainer.loss_fn.target
        if ctx.wrapper is not None or not limited(trainable, batch, target) or pick(batch, target, trainer.batch) is None:
            return None   # the judged copy is kept: nothing more to train
        trainer.release()
        with leave_no_trace(model), ctx.seeded():
            return train_few(model, trainer, trainable, _continued(opts, done), ctx,
                             lambda m, i, loss, o: _trained(m, i, o, ctx, loss=loss)[1])

    def held(done: int):
        """A fresh copy trained with the same draws at every step (draws.py), its progress shown after `done`
        steps; only for a forward that drew, not under torchrun."""
        if ctx.wrapper is not None or not curve.drew:
            return None
        loss = _same_target(ctx.loss(), trainer.loss_fn)
        trainer.release()
        with leave_no_trace(model), ctx.seeded():
            return _trained(model, inputs, _continued(opts, done), ctx, loss=loss, hold_draws=True)[1]

    def wide(done: int):
        """A float32 copy trained as the run was (the same batch, loss target, optimizer and number of steps), its
        progress shown after `done` steps: did the updates that round away hold the fall back? Not under torchrun."""
        if ctx.wrapper is not None:
            return None
        loss = _same_target(ctx.loss(), trainer.loss_fn, "float32")
        with leave_no_trace(model), ctx.seeded():
            return _trained(model, inputs, _continued(opts, done, steps=curve.step), ctx, loss=loss,
                            dtype="float32")[1]

    return build(trainer, curve, found, opts, ctx, second, few, lower, held, wide)


def _same_target(loss, judged, dtype: str | None = None):
    """`loss` with the judged run's target (made up or given), its floating values in `dtype` where given."""
    target = judged.target
    if dtype is not None and hasattr(target, "is_floating_point") and target.is_floating_point():
        import torch

        target = target.to(getattr(torch, dtype))
    loss.target, loss.made_target = target, judged.made_target
    return loss


def _asks(opts: Options, ctx) -> bool:
    """A second opinion is asked: one process (not under torchrun), no --steps, an optimizer other than the default."""
    return ctx.wrapper is None and opts.steps is None and ctx.spec.optimizer.describe() != OPTIMIZER.describe()


def _trainer(model, inputs, opts: Options, ctx, optimizer=None, loss=None, functional: bool = True,
             hold_draws: bool = False, dtype: str | None = None):
    """A Trainer on a fresh training copy of `model` with dropout off (memorising needs no regularisation:
    core/design.py; `functional`: the dropout drawn through torch's functions too); the copy is held by the trainer
    alone (Trainer.release drops it). `dtype`: the copy and the inputs' floating values cast to it."""
    import torch

    from ...core.design import dropout_off
    from ...core.precision import cast_inputs
    from .loop import Trainer

    cast = getattr(torch, dtype) if dtype else None
    why = f"to train it in {dtype}" if dtype else "to train it"
    work = ctx.train_copy(model, why, steps=True, optimizer=optimizer, dtype=cast)   # a second opinion's Adam, where given
    if cast is not None:
        work.to(cast)
    dropped = dropout_off(work)
    trainer = Trainer(work, cast_inputs(inputs.clone(), dtype), loss or ctx.loss(), opts, ctx, optimizer=optimizer,
                      functional=functional, hold_draws=hold_draws)
    trainer.dropped = dropped
    return trainer


def _trained(model, inputs, opts: Options, ctx, optimizer=None, loss=None, hold_draws: bool = False,
             dtype: str | None = None):
    """(trainer, curve) of a run on a fresh copy. Where a checkpoint refused its recompute after forwards that
    dropped through torch's functions (a checkpointed function that is no module call, in a nested backward, drew a
    mask there), the run starts again on another fresh copy with that dropout on (the first copy's buffers, caches
    and lazy weights have moved), said in the header."""
    from .loop import DrawnAgain

    trainer = _trainer(model, inputs, opts, ctx, optimizer, loss, hold_draws=hold_draws, dtype=dtype)
    try:
        return trainer, trainer.train()
    except DrawnAgain:
        trainer.release()
    trainer = _trainer(model, inputs, opts, ctx, optimizer, loss, functional=False, hold_draws=hold_draws, dtype=dtype)
    return trainer, trainer.train()


def _default_optimizer(model, inputs, opts: Options, ctx, done: int):
    """A second opinion for a run under an optimizer the user chose that failed or ended still falling (_asks):
    the same batch and loss on a fresh copy, trained with the default optimizer (OPTIMIZER: adam 1e-3) and the
    default budget (extended while still falling). Its Curve; its progress continues the run's (`done` steps so
    far: its step 0 is reported as done + 1)."""
    from ...core.guard import leave_no_trace

    again = _continued(opts, done)
    with leave_no_trace(model), ctx.seeded():
        return _trained(model, inputs, again, ctx, optimizer=OPTIMIZER)[1]


LOWER = 10   # the step size a collapse is re-tried at: the run's divided by this


def _collapsed(causes, curve) -> bool:
    """Training made the outputs identical across samples (they differed at the start, or after a few steps: a
    zero-initialised head answers the same for all at step 0, a review), with nothing else found: a
    step too large for the model (a sweep: Hugging Face BERT-base at Adam 1e-3 answers one class for all, at 1e-4
    memorises the batch in 30 steps; post-LN transformers want a smaller step) or a fault a smaller one cannot undo."""
    return bool(causes.final_same and curve.differed and not causes.zero and not causes.unchanged
                and causes.bounded is None and causes.scaled is None and curve.nonfinite_at is None
                and not curve.missing)


def _lower_rate(model, inputs, opts: Options, ctx, done: int):
    """The same batch, loss and optimizer on a fresh copy at a LOWER times smaller learning rate, with the default
    budget (extended while still falling); its Curve, its progress continuing the run's."""
    import dataclasses

    from ...core.guard import leave_no_trace

    spec = ctx.spec.optimizer
    slower = dataclasses.replace(spec, lr=spec.learning_rate / LOWER)
    with leave_no_trace(model), ctx.seeded():
        return _trained(model, inputs, _continued(opts, done), ctx, optimizer=slower)[1]


def _continued(opts: Options, done: int, steps: int | None = None) -> Options:
    """The options of a further run whose progress continues the run's (`done` steps so far: its step 0 is
    shown as done + 1); `steps`: that many at most, not extended."""
    import dataclasses

    step, budget = opts.on_step, opts.on_budget
    if steps is not None:
        opts = dataclasses.replace(opts, steps=steps)
    again = dataclasses.replace(opts,
                                on_step=step and (lambda k, loss: step(done + 1 + k, loss)),
                                on_budget=budget and (lambda b: budget(done + 1 + b)))
    if budget:
        budget(done + 1 + again.budget)
    return again
