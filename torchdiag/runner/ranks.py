"""A per-rank command under torchrun (core.distributed): each rank runs the diagnostic on its shard of the
batch (on a copy wrapped per --wrap where its diagnostic declares WRAP); every rank hands rank 0 a record
(its Result as data, or its error), so a rank that fails never leaves the others waiting at the gather;
rank 0 merges and its Outcome is shown once. Other ranks show nothing unless they fail (one
`error: [rank N] …` line, unless every rank failed alike: rank 0 says that once). Torch-free at import."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from ..errors import DiagError, ExitCode, Terminated, one_line
from .isolation import isolated, real_stdout, sigterm_as_interrupt, stuck_exit
from .job import Job
from .outcome import Outcome, failed, produced

# How each --wrap reaches a command: its diagnostic declares WRAP = {how: (where, what the header says)}.
#   "train": every copy the command trains is wrapped as made (ctx.train_copy → ctx.wrapper);
#   "pass":  its one main forward+backward runs on a wrapped copy (ctx.wrapped_copy → ctx.pass_wrapper),
#            the extra passes the values call for run on the rank's own model, so no rank waits in a
#            collective its peers skip.
# A command without an entry for `how` runs each rank's own model; the cross-rank step checks the wrapper.


def wrap_mode(diagnostic, how: str) -> str | None:
    """"train", "pass" or None: how --wrap `how` reaches `diagnostic`."""
    entry = getattr(diagnostic, "WRAP", {}).get(how) if how != "none" else None
    return entry[0] if entry else None


def wrap_header(diagnostic, command: str, how: str) -> str:
    if how == "none":
        return how
    entry = getattr(diagnostic, "WRAP", {}).get(how)
    if entry:
        return f"{how} ({entry[1]})" if entry[1] else how
    return f"{how} (checked by the cross-rank step; {command} itself runs on each rank's own copy)"


@dataclass
class Local:
    """What one rank built: kept for the checks after the diagnostic."""

    model: Any = None
    inputs: Any = None
    ctx: Any = None
    result: Any = None
    unused: list | None = None
    pristine: Any = None      # a copy as built, before the diagnostic or a wrapper touched the model
    trace: str | None = None  # a bug of ours on this rank: its traceback, shown under --debug


def execute_ranks(job: Job, ranks) -> Outcome:
    """The one-process run under torchrun. Errors before the process group exists are the same on every
    rank: rank 0 reports them, the others end with the same code silently."""
    from ..core.distributed import session
    from .local import checked

    try:
        # SIGTERM as Terminated over the whole rank, not only where the user's code runs: a rank waiting
        # in the gather (or in a collective) when torchrun forwards SIGTERM would otherwise die silently
        with sigterm_as_interrupt(), stuck_exit(lambda signum: _stuck(job, ranks, signum)):
            spec, o = checked(job)
            with session(ranks, spec) as sess:
                return _in_session(job, spec, sess, o)
    except BaseException as exc:   # noqa: B036 — the ladder sorts every exception (outcome.failed)
        out = failed(exc, None, job.caller)
        if out.code == ExitCode.INTERNAL:   # one line from every rank: stdout (--json) holds rank 0's document only
            out.message = f"[rank {ranks.rank}] {out.message}"
            if not ranks.main:
                out.lines, out.quiet = [f"error: {out.message}"], True
        elif not ranks.main:
            out.quiet = True
        return out


def _stuck(job: Job, ranks, signum: int) -> int:
    """This rank stayed blocked in native code after Ctrl-C/SIGTERM (isolation.stuck_exit): rank 0 reports the
    interruption as an unblocked rank does (one line, or the --json error document), the others end quietly."""
    import signal
    import sys

    out = failed(Terminated() if signum == signal.SIGTERM else KeyboardInterrupt(), None, job.caller)
    if not ranks.main or job.show is None:
        return int(out.code)
    real_stdout()
    code = job.show(out)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return int(code)


def _in_session(job: Job, spec, sess, o) -> Outcome:
    local = Local()
    diagnostic = job.diagnostic()
    rec = _run_rank(job, spec, sess, diagnostic, o, local)
    errors = sess.all_gather(rec["error"])
    # the cross-rank step exchanges data: every rank runs it, or none does (a rank that failed cannot)
    if job.command.cross_rank and not any(errors):
        rec["consistency"] = _consistency(job, spec, sess, local)
    rec["unused"] = local.unused
    records = sess.gather(rec)
    lines = _own_line(sess.ranks.rank, errors)
    if not sess.ranks.main:   # rank 0's exit code is the worst over ranks: torchrun reports one failure
        return Outcome(ExitCode.OK, lines=lines, quiet=True, trace=local.trace)
    out = all_failed(spec, records) if all(r["error"] for r in records) else \
        _merged(job, spec, sess, diagnostic, records, local)
    out.lines, out.trace = lines + out.lines, local.trace
    return out


def _own_line(rank: int, errors: list) -> list[str]:
    """This rank's error line, unless rank 0 says it once for every rank: when every rank failed, the lead
    failure (all_failed) is one line tagged with the ranks that had it (a sweep: each rank printed the same)."""
    mine = errors[rank]
    if mine is None or (all(errors) and mine["message"] == _lead(errors)["message"]):
        return []
    return [f"error: [rank {rank}] {mine['message']}"]


def _lead(errors: list[dict]) -> dict:
    """The first failure, not its echoes (a rank stopped by a peer's failure says so; else the earliest)."""
    return min(errors, key=lambda e: (bool(e.get("echo")), e["at"]))


def _built_everywhere(spec, sess, diagnostic, local: Local):
    """Model, context and this rank's shard, built on every rank or on none: the ranks agree (one all-reduce) before
    any collective. A rank whose factory, checkpoint or inputs failed would leave its peers waiting in the next one
    (the parameter check under --wrap, the copy cross-rank checks make) for twice the distributed timeout, and the
    report led with their timeout (a sweep)."""
    from ..core.context import prepare
    from ..core.distributed import agree, rank_spec, shard
    from ..errors import ModelError

    r = sess.ranks
    try:
        local.model, inputs, local.ctx = prepare(rank_spec(spec, r), needs_values=getattr(diagnostic, "NEEDS_VALUES",
                                                                                           False))
        local.inputs, local.ctx.batch_target, rows = shard(inputs, local.ctx.batch_target, r)
    except BaseException:   # noqa: B036 - sys.exit and Ctrl-C in a factory too: the peers are told, then it goes on
        agree([True], "cpu")
        raise
    if agree([False], "cpu")[0]:
        err = ModelError("another rank could not build the model or its inputs (that rank's error says why)")
        err.follows_peer = True   # never the report's lead
        raise err
    return inputs, rows


def _run_rank(job: Job, spec, sess, diagnostic, o, local: Local) -> dict:
    """This rank's record: its Result, or its error with the exit code it would have had alone."""
    from .merge import record

    r = sess.ranks
    try:
        with isolated(job.json):
            _prepare(spec, sess, diagnostic, local)
            with job.working(f"torchdiag {job.command.name}") if r.main else contextlib.nullcontext():   # rank 0 says
                local.result = (job.run or diagnostic.run)(local.model, local.inputs, o, local.ctx)
            _interrupted(local.result)
            local.ctx.finish(local.result)
            files = _rank_files(job, local.result, r.rank)   # a failed write is this rank's error (exit 2)
        return record(r.rank, r.device, local.result.exit_code, local.result, files=files)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:   # noqa: B036 — the ladder sorts every exception (outcome.failed)
        _cut_hint(exc, local)
        out = failed(exc, local.ctx, job.caller)
        if out.code == ExitCode.INTERNAL:
            local.trace = out.trace
        rec = _error(r, out, local)
        rec["error"]["echo"] = bool(getattr(exc, "follows_peer", False))   # a peer's failure seen here: never the lead
        return rec


def _cut_hint(exc, local: Local) -> None:
    """The model raised on its rank's rows where torchrun cut some inputs and gave others whole: they may index into
    each other along dim 0 (a new user's EmbeddingBag: flat ids cut 20/20, every offset on both ranks; "the model's
    own code raised"), so the hint says what was cut."""
    from ..core.tracking import RAISED_HINT

    shard = (getattr(local.ctx, "header", None) or {}).get("batch_shard", "")
    if isinstance(exc, DiagError) and exc.hint == RAISED_HINT and "given whole to every rank" in shard:
        # added, not in place of the hint: a shared mask is the usual whole input, and the model's own bug stays
        # its own (a review)
        exc.hint = (f"{RAISED_HINT}; if it runs in one process, torchrun's cut is why: the inputs were cut along "
                    f"dim 0 ({shard}), and inputs that index into each other (an EmbeddingBag's offsets into flat "
                    "ids, a packed sequence's lengths) are cut apart")


def _interrupted(result) -> None:
    """A partial result kept on Ctrl-C/SIGTERM (overfit-batch) ends this rank here, before the gather: a
    peer may be blocked in a model collective this rank will never join, and a signal acts only between
    Python bytecodes, so the peer's own interrupt waits until this rank exits (its collective then fails)."""
    code = int(result.exit_code)
    if code == ExitCode.TERMINATED:
        raise Terminated()
    if code == ExitCode.INTERRUPTED:
        raise KeyboardInterrupt()


def _rank_files(job: Job, result, rank: int) -> dict:
    """The files each rank writes itself (its renderer's write_rank_outputs, e.g. profile's run.rank<N>.json),
    before the gather."""
    renderer = job.command.renderer_module()
    hook = getattr(renderer, "write_rank_outputs", None)
    return hook(result, job.render_spec().outputs, rank) if hook is not None else {}


def _rank0_outputs(job: Job):
    """Rank 0's render spec without the kinds every rank already wrote (its renderer's RANK_OUTPUTS)."""
    import dataclasses

    out = job.render_spec()
    kinds = getattr(job.command.renderer_module(), "RANK_OUTPUTS", ())
    return dataclasses.replace(out, outputs={k: v for k, v in out.outputs.items() if k not in kinds})


def _prepare(spec, sess, diagnostic, local: Local) -> None:
    """Model, this rank's shard, the context; under DDP, which parameters get no gradient here."""
    from ..core.distributed import shard_bounds

    r = sess.ranks
    inputs, rows = _built_everywhere(spec, sess, diagnostic, local)
    if getattr(local.ctx, "lm", None) is not None:   # the language model's ids, read on the whole batch, this rank's rows
        local.ctx.observe(local.model, local.inputs)   # now (a sweep: their shape no longer fit the logits: mse)
    local.ctx.rows = (*shard_bounds(inputs.batch_size, r), inputs.batch_size)   # random targets: cut, not drawn per rank
    local.ctx.header.update({"rank": r.describe(), "batch_shard": rows, "backend": r.backend,
                             "wrap": wrap_header(diagnostic, spec.command, spec.wrap)})
    if spec.needs_inputs:
        local.ctx.header["inputs"] = local.inputs.describe()
    from ..commands import get

    mode = wrap_mode(diagnostic, spec.wrap)
    if spec.wrap in ("ddp", "fsdp") and (mode is not None or get(spec.command).cross_rank):
        from ..core.distributed import (
            refuse_divergent,  # before any wrapper collective: the same parameters
        )

        refuse_divergent(local.model, spec.wrap)
    if mode is not None:
        from ..core.distributed import wrap

        setattr(local.ctx, "wrapper" if mode == "train" else "pass_wrapper", lambda work: wrap(work, r, spec.wrap))
    if get(spec.command).cross_rank:   # made on every rank or none: the ranks compare it later
        from ..core.distributed import on_every_rank
        from ..core.train import train_copy

        local.pristine = on_every_rank(lambda: train_copy(local.model, "to compare ranks after a step"), local.ctx.device)
    if spec.wrap in ("ddp", "fsdp"):   # before a wrapper hooks the parameters: the probe's backward is local
        from .unused import unused_params

        try:
            local.unused = unused_params(local.model, local.inputs, local.ctx)
        except Exception:   # the model's own failure: the diagnostic meets it and reports it its own way
            local.unused = None
    if spec.wrap == "fsdp":
        _refuse_uneven_grads(local)


def _refuse_uneven_grads(local: Local) -> None:
    """Under fully_shard a parameter with a gradient on some ranks only makes the ranks' reduce-scatters
    differ in size, and gloo/NCCL abort the process: refuse before wrapping, naming them (every rank
    decides the same: the flags are agreed)."""
    from ..core.distributed import agree
    from ..errors import ModelError

    names = [n for n, p in local.model.named_parameters() if p.requires_grad]
    mine = {u["name"]: u for u in local.unused or []}
    missing = agree([n in mine for n in names], local.ctx.device)
    present = agree([n not in mine for n in names], local.ctx.device)
    uneven = [n for n, m, p in zip(names, missing, present) if m and p]
    if uneven:
        here = [f"{n} ({mine[n]['reason']}: {mine[n]['why']})" for n in uneven if n in mine]
        raise ModelError(f"--wrap fsdp: {len(uneven)} parameter(s) get a gradient on some ranks only "
                         f"({', '.join(uneven[:6])}{' …' if len(uneven) > 6 else ''}); FSDP's reduce-scatter needs the "
                         "same gradients on every rank, and a mismatch aborts the process"
                         + (f"; here none for {'; '.join(here[:3])}" if here else ""),
                         hint="make every rank use the same parameters in forward (or freeze the ones some ranks skip)")


def _error(r, out: Outcome, local: Local) -> dict:
    from .merge import record

    header = local.ctx.header if local.ctx is not None else {}
    doc = out.partial.to_dict() if out.partial is not None else None
    # when it failed: a rank whose peer failed first often fails later, waiting in a collective until the timeout
    return record(r.rank, r.device, out.code, None, {"message": out.message, "hint": out.hint, "at": time.time()},
                  header=header, partial=doc)


def _consistency(job: Job, spec, sess, local: Local) -> dict:
    """The cross-rank check on every rank (it exchanges checksums); an error in it is reported, not raised."""
    from .consistency import check

    try:
        with isolated(job.json):
            return check(local.pristine, local.inputs, local.ctx, sess, spec.wrap)
    except DiagError as e:
        return {"error": f"the cross-rank check could not run: {e.message}"}
    except Exception as e:   # never skip the gather: rank 0 would wait for this rank
        return {"error": f"the cross-rank check could not run (internal error in torchdiag: {one_line(e)})"}


def _merged(job: Job, spec, sess, diagnostic, records: list[dict], local: Local) -> Outcome:
    """Rank 0: one Result for all ranks, and its files."""
    from ..render import write_outputs
    from .merge import finish, merge
    from .report import add_rank_findings

    # only a command that ran the DDP copy has DDP's "module." before the names (a user's own `module` stays)
    ddp_names = spec.wrap == "ddp" and wrap_mode(diagnostic, "ddp") == "train"
    merged = merge(records, local.result, spec.command, unwrap="module." if ddp_names else "")
    merged.header.update({"world_size": sess.ranks.world_size, "backend": sess.ranks.backend})
    add_rank_findings(merged, records, spec.wrap)
    hook = getattr(diagnostic, "merge_ranks", None)
    if hook is not None:
        hook(records, merged)
    finish(merged, records)
    written = dict(records[0].get("files") or {})
    with isolated(job.json):
        if local.result is not None:
            written.update(write_outputs(merged, _rank0_outputs(job)))
        # rendered even when rank 0 failed (the other ranks' results); the caller's own step only with rank 0's
        return produced(job, merged, written, after=local.result is not None)


def all_failed(spec, records: list[dict]) -> Outcome:
    """No rank has a result: the error names the first failure and the document lists every rank."""
    from .merge import tag
    from .report import unused_hint

    first = _lead([r["error"] for r in records])
    same = [r["rank"] for r in records if r["error"]["message"] == first["message"]]
    code = max(r["exit_code"] for r in records)
    hint = unused_hint(records) if spec.wrap == "ddp" else None
    return Outcome(code, message=f"[{tag(same)}] {first['message']}", hint=hint or first.get("hint"),
                   document={"world_size": len(records),
                             "ranks": [{k: v for k, v in r.items() if k != "result"} for r in records]})
