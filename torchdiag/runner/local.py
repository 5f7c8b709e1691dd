"""A command in one process: options checked, the model and inputs loaded, the diagnostic run, the files
written; every exception an Outcome (runner/outcome.py). Under torchrun a per-rank command goes to
runner/ranks.py, any other runs on rank 0 alone. Torch-free at import."""
from __future__ import annotations

import contextlib

from .isolation import isolated
from .job import Job
from .outcome import Outcome, failed, produced


def invoke(diagnostic, model, inputs, opts, ctx):
    """A diagnostic on a model already in hand (the Python API, `check`, the one-process run)."""
    if getattr(diagnostic, "NEEDS_VALUES", False):
        ctx.require_values()
    ctx.activations = {}   # its own passes size its copies (check runs several diagnostics on one context's copies)
    from ..core.tracking import TRANSFORMED, remove_copied_hooks

    TRANSFORMED.clear()
    before = {id(m) for m in model.modules()} if hasattr(model, "modules") else set()
    try:
        result = diagnostic.run(model, inputs, opts, ctx)
    except Exception as exc:
        ctx.explain(exc)
        raise
    finally:
        if hasattr(model, "modules"):
            remove_copied_hooks(model, before)
    ctx.finish(result)
    return result


def execute(job: Job) -> Outcome:
    """Run `job` and say how it ended. Under torchrun (core.distributed.current()): per rank when the
    registry says so, else on rank 0 alone (the other ranks get a quiet Outcome at once)."""
    from ..core.distributed import current

    ranks = current()
    if ranks is not None:
        try:
            _import_torch()
        except KeyboardInterrupt as exc:   # held over the import, raised after it
            return failed(exc, None, job.caller)
        if job.command.per_rank and job.produce is None:
            from .ranks import execute_ranks

            return execute_ranks(job, ranks)
        if not ranks.main and job.command.target != "script":   # a script (watch) runs on every rank
            return Outcome(quiet=True)
    ctx = None
    try:
        spec, o = checked(job)   # a mistyped spec or option is answered before torch loads (seconds)
        _import_torch()
        if ranks is None:
            from ..core.distributed import refuse_wrap

            refuse_wrap(spec)
        with isolated(job.json, keep_stdin=job.command.target == "script"):  # the user's code runs in here
            if job.produce is not None:
                # (no notice around a script: watch's run is the user's own, its log theirs, a review)
                with job.progress(f"torchdiag {job.command.name}: {spec.model}"), \
                        job.working(f"torchdiag {job.command.name}") if job.command.target != "script" \
                        else contextlib.nullcontext():
                    result = job.produce()
            else:
                diagnostic = job.diagnostic()
                with job.progress(f"torchdiag {job.command.name}: loading {spec.model}"):
                    from ..core.context import prepare

                    model, inputs, ctx = prepare(spec, needs_values=getattr(diagnostic, "NEEDS_VALUES", False))
                # outside the loading spinner: a command may show its own live progress
                with job.working(f"torchdiag {job.command.name}"):
                    result = (job.run or diagnostic.run)(model, inputs, o, ctx)
                ctx.finish(result)
            from ..render import write_outputs

            # files first: a failure then cannot follow a printed JSON document
            if ranks is not None and not ranks.main:   # a script on every rank: rank 0 reports and writes
                return Outcome(int(result.exit_code), quiet=True)
            return produced(job, result, write_outputs(result, job.render_spec()))
    except BaseException as exc:   # noqa: B036 — the ladder sorts every exception (outcome.failed)
        outcome = failed(exc, ctx, job.caller)
        outcome.quiet = ranks is not None and not ranks.main   # only rank 0 reports (a script on every rank)
        return outcome


def _import_torch() -> None:
    """torch imported whole, with Ctrl-C/SIGTERM held (core/interrupts.py): interrupted half-way it stays
    half-initialised, and the error path's next torch import aborted the process (exit 134, no JSON); the
    numpy it imports from C swallowed the interrupt (torch takes any failure there for "no numpy"). One that
    arrived is raised when the import ends."""
    from ..core.interrupts import deferred

    with deferred():
        import torch  # noqa: F401


def checked(job: Job):
    """Everything checked before anything loads: the --tb folder, the RunSpec, the Options, the MODEL_SPEC's
    file and factory (core.spec_check, torch-free), the files."""
    from ..render.output import check_dir

    check_dir(job.given("tb"), "--tb")
    spec = job.run_spec()
    o = job.options() if job.options is not None else None
    if job.command.target == "model":   # a missing file or factory: said before torch is imported
        from ..core.spec_check import precheck

        precheck(spec.model, spec.download)
    if job.precheck is not None:
        job.precheck()
    return spec, o


def run_data_specs(spec, opts, val: str | None = None, model: str | None = None, model_args=()):
    """target="data" (commands.py): `spec` is the run's RunSpec with the DATA_SPEC as its `model` and the data
    factory's --arg pairs as its `args` (the --val factory gets the same ones); `model` a MODEL_SPEC built with
    `model_args`, its --checkpoint, --dtype and --amp (those need it). Loads them and runs `data`'s run_data."""
    import dataclasses

    from ..core.datasets import load_data
    from ..diagnostics.data import context, run_data
    from ..errors import UsageError

    if model is None:
        given = [flag for flag, on in (("--checkpoint", spec.checkpoint), ("--dtype", spec.dtype), ("--amp", spec.amp),
                                       ("--model-arg", model_args)) if on]
        if given:
            raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to the model of --model, "
                             "and no --model is given",
                             hint="add --model MODEL_SPEC (the model whose training step is timed against the loader)")
    from ..core.context import prepare, raise_meta
    from ..core.device import resolve_device
    from ..core.loading import parse_args

    parse_args(list(model_args), "--model-arg")   # said with its own flag (a sweep: "malformed --arg")
    if resolve_device(spec.device).type == "meta":   # before the user's data is loaded
        raise_meta("data")
    train = load_data(spec.model, list(spec.args), spec.seed)
    val_data = load_data(val, list(spec.args), spec.seed, option="--val") if val else None
    net = None
    if model is not None:
        net, _, ctx = prepare(dataclasses.replace(spec, model=model, args=tuple(model_args), needs_inputs=False),
                              needs_values=True)
    else:
        ctx = context(spec.device, spec.seed, spec.loss, spec.caller)
    result = run_data(train, opts, ctx, val=val_data, model=net)
    ctx.finish(result)
    return result
