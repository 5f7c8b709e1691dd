"""A command in one process: options checked, the model and inputs loaded, the diagnostic run, the files
written; every exception an Outcome (runner/outcome.py). Under torchrun a per-rank command goes to
runner/ranks.py, any other runs on rank 0 alone. Torch-free at import."""
from __future__ import annotations

from .isolation import isolated
from .job import Job
from .outcome import Outcome, failed, produced


def invoke(diagnostic, model, inputs, opts, ctx):
    """A diagnostic on a model already in hand (the Python API, `check`, the one-process run)."""
    if getattr(diagnostic, "NEEDS_VALUES", False):
        ctx.require_values()
    try:
        result = diagnostic.run(model, inputs, opts, ctx)
    except Exception as exc:
        ctx.explain(exc)
        raise
    ctx.finish(result)
    return result


def execute(job: Job) -> Outcome:
    """Run `job` and say how it ended. Under torchrun (core.distributed.current()): per rank when the
    registry says so, else on rank 0 alone (the other ranks get a quiet Outcome at once)."""
    from ..core.distributed import current

    ranks = current()
    if ranks is not None:
        if job.command.per_rank and job.produce is None:
            from .ranks import execute_ranks

            return execute_ranks(job, ranks)
        if not ranks.main and job.command.target != "script":   # a script (watch) runs on every rank
            return Outcome(quiet=True)
    ctx = None
    try:
        spec, o = checked(job)
        if ranks is None:
            from ..core.distributed import refuse_wrap

            refuse_wrap(spec)
        with isolated(job.json, keep_stdin=job.command.target == "script"):  # the user's code runs in here
            if job.produce is not None:
                with job.progress(f"torchdiag {job.command.name}: {spec.model}"):
                    result = job.produce()
            else:
                diagnostic = job.diagnostic()
                with job.progress(f"torchdiag {job.command.name}: loading {spec.model}"):
                    from ..core.context import prepare

                    model, inputs, ctx = prepare(spec, needs_values=getattr(diagnostic, "NEEDS_VALUES", False))
                # outside the loading spinner: a command may show its own live progress
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


def checked(job: Job):
    """Everything checked before anything loads: the --tb folder, the RunSpec, the Options, the files."""
    from ..render.output import check_dir

    check_dir(job.given("tb"), "--tb")
    spec = job.run_spec()
    o = job.options() if job.options is not None else None
    if job.precheck is not None:
        job.precheck()
    return spec, o
