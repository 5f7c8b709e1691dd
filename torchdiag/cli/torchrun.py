"""The CLI under torchrun (core.distributed): each rank runs the diagnostic on its shard of the batch
(on a copy wrapped per --wrap where its diagnostic declares WRAP); every rank hands rank 0 a record (its
Result as data, or its error), so a rank that fails never leaves the others waiting at the gather; rank
0 merges and renders once. Other ranks print nothing unless they fail (one `error: [rank N] …` line).
Torch-free at import (`--help`)."""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable

import typer

from ..errors import DiagError, ExitCode, Terminated, interrupt_code, one_line
from .isolation import UserExit, sigterm_as_interrupt, isolated

CONSISTENCY = ("doctor", "gradflow")     # commands that also compare ranks after a real step
# commands that run per rank; the others do not depend on the rank: rank 0 runs them as usual
COMMANDS = ("profile", "memory", "nancheck", "gradflow", "overfit-batch", "doctor")
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


def under_torchrun(opts, ranks, diagnostic=None, options=None, *, run=None, render_extra=None, precheck=None,
                   produce=None) -> None:
    """Per-rank commands run on every rank (never returns); any other command runs on rank 0 alone
    (returns there), the other ranks exit 0 at once."""
    if opts.command in COMMANDS and produce is None:
        execute_ranks(opts, ranks, diagnostic, options, run=run, render_extra=render_extra, precheck=precheck)
    if not ranks.main:
        raise typer.Exit(0)


def execute_ranks(opts, ranks, diagnostic=None, options: Callable | None = None, *, run: Callable | None = None,
                  render_extra: Callable | None = None, precheck: Callable | None = None) -> None:
    """common.execute under torchrun. Errors before the process group exists are the same on every
    rank: rank 0 reports them, the others exit with the same code silently."""
    from ..core.distributed import session
    from . import common

    code = ExitCode.OK
    try:
        # SIGTERM as Terminated over the whole rank, not only where the user's code runs: a rank waiting
        # in the gather (or in a collective) when torchrun forwards SIGTERM would otherwise die silently
        with sigterm_as_interrupt():
            common.output_dir(opts.tb, "--tb")
            spec = opts.run_spec(diagnostic)
            o = options() if options is not None else None
            if precheck is not None:
                precheck()
            with session(ranks, spec) as sess:
                code = _in_session(opts, spec, sess, diagnostic, o, run, render_extra)
    except DiagError as e:
        code = common._diag_error(e, opts, None) if ranks.main else e.code
    except KeyboardInterrupt as e:   # torchrun passes Ctrl-C/SIGTERM to every rank
        code = interrupt_code(e)
        if ranks.main:
            common._report("interrupted" if code == ExitCode.INTERRUPTED else "terminated (SIGTERM)", None, code, opts)
    except Exception as e:  # a bug of ours
        code = ExitCode.INTERNAL
        message = f"[rank {ranks.rank}] internal error in torchdiag: {one_line(e)}"
        if ranks.main:
            common._report(message, "this is a bug in torchdiag: run again with --debug and please report the traceback", code, opts)
        else:   # one line: stdout (--json) holds rank 0's document only
            common.err(f"error: {message}")
        if opts.debug:
            traceback.print_exc()
    raise typer.Exit(int(code))


def _in_session(opts, spec, sess, diagnostic, o, run, render_extra) -> int:
    local = Local()
    rec = _run_rank(opts, spec, sess, diagnostic, o, run, local)
    # the cross-rank step exchanges data: every rank runs it, or none does (a rank that failed cannot)
    if spec.command in CONSISTENCY and all(sess.all_gather(rec["error"] is None)):
        rec["consistency"] = _consistency(opts, spec, sess, local)
    rec["unused"] = local.unused
    records = sess.gather(rec)
    if rec["error"]:
        from .common import err

        err(f"error: [rank {sess.ranks.rank}] {rec['error']['message']}")
    if not sess.ranks.main:   # rank 0's exit code is the worst over ranks: torchrun reports one failure
        return ExitCode.OK
    if all(r["error"] for r in records):
        return _all_failed(opts, spec, records)
    return _render(opts, spec, sess, diagnostic, records, local, render_extra)


def _run_rank(opts, spec, sess, diagnostic, o, run, local: Local) -> dict:
    """This rank's record: its Result, or its error with the exit code it would have had alone."""
    from ..diagnostics.ranks.merge import record

    r = sess.ranks
    try:
        with isolated(opts.json):
            _prepare(spec, sess, diagnostic, local)
            local.result = (run or diagnostic.run)(local.model, local.inputs, o, local.ctx)
            _interrupted(local.result)
            local.ctx.finish(local.result)
            files = _rank_files(opts, local.result, r.rank)   # a failed write is this rank's error (exit 2)
        return record(r.rank, r.device, local.result.exit_code, local.result, files=files)
    except DiagError as e:
        if local.ctx is not None:
            local.ctx.explain(e)
        rec = _error(r, e.code, e.message, e.hint, local, getattr(e, "partial", None))
        rec["error"]["echo"] = bool(getattr(e, "follows_peer", False))   # a peer's failure seen here: never the lead
        return rec
    except UserExit as e:
        return _error(r, ExitCode.MODEL, f"the model's own code called {e.code}", None, local)
    except SystemExit as e:
        return _error(r, ExitCode.MODEL, f"the model's own code called sys.exit({e.code!r})", None, local)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        if opts.debug:
            traceback.print_exc()
        return _error(r, ExitCode.INTERNAL, f"internal error in torchdiag: {one_line(e)}",
                      "this is a bug in torchdiag: run again with --debug and please report the traceback", local)
    except BaseException as e:
        return _error(r, ExitCode.MODEL, f"the model's own code raised {one_line(e)}", None, local)


def _interrupted(result) -> None:
    """A partial result kept on Ctrl-C/SIGTERM (overfit-batch) ends this rank here, before the gather: a
    peer may be blocked in a model collective this rank will never join, and a signal acts only between
    Python bytecodes, so the peer's own interrupt waits until this rank exits (its collective then fails)."""
    code = int(result.exit_code)
    if code == ExitCode.TERMINATED:
        raise Terminated()
    if code == ExitCode.INTERRUPTED:
        raise KeyboardInterrupt()


def _renderer(command: str):
    import importlib

    return importlib.import_module(f"torchdiag.render.{command.replace('-', '_')}")


def _rank_files(opts, result, rank: int) -> dict:
    """The files each rank writes itself (render/<command>.py: write_rank_outputs, e.g. profile's
    run.rank<N>.json), before the gather."""
    try:
        hook = getattr(_renderer(opts.command), "write_rank_outputs", None)
    except ImportError:
        return {}
    return hook(result, opts.render_spec().outputs, rank) if hook is not None else {}


def _rank0_outputs(out, command: str):
    """Rank 0's render spec without the kinds every rank already wrote (RANK_OUTPUTS)."""
    import dataclasses

    try:
        kinds = getattr(_renderer(command), "RANK_OUTPUTS", ())
    except ImportError:
        return out
    return dataclasses.replace(out, outputs={k: v for k, v in out.outputs.items() if k not in kinds})


def _prepare(spec, sess, diagnostic, local: Local) -> None:
    """Model, this rank's shard, the context; under DDP, which parameters get no gradient here."""
    from ..core.context import prepare
    from ..core.distributed import rank_spec, shard, shard_bounds

    r = sess.ranks
    local.model, inputs, local.ctx = prepare(rank_spec(spec, r), needs_values=getattr(diagnostic, "NEEDS_VALUES", False))
    local.inputs, local.ctx.batch_target, rows = shard(inputs, local.ctx.batch_target, r)
    local.ctx.rows = (*shard_bounds(inputs.batch_size, r), inputs.batch_size)   # random targets: cut, not drawn per rank
    local.ctx.header.update({"rank": r.describe(), "batch_shard": rows, "backend": r.backend,
                             "wrap": wrap_header(diagnostic, spec.command, spec.wrap)})
    if spec.needs_inputs:
        local.ctx.header["inputs"] = local.inputs.describe()
    mode = wrap_mode(diagnostic, spec.wrap)
    if spec.wrap in ("ddp", "fsdp") and (mode is not None or spec.command in CONSISTENCY):
        from ..core.distributed import refuse_divergent   # before any wrapper collective: the same parameters

        refuse_divergent(local.model, spec.wrap)
    if mode is not None:
        from ..core.distributed import wrap

        setattr(local.ctx, "wrapper" if mode == "train" else "pass_wrapper", lambda work: wrap(work, r, spec.wrap))
    if spec.command in CONSISTENCY:
        from ..core.train import train_copy

        local.pristine = train_copy(local.model, "to compare ranks after a step")
    if spec.wrap in ("ddp", "fsdp"):   # before a wrapper hooks the parameters: the probe's backward is local
        from ..diagnostics.ranks.unused import unused_params

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


def _error(r, code, message, hint, local: Local, partial=None) -> dict:
    from ..diagnostics.ranks.merge import record

    if partial is not None and local.ctx is not None:
        local.ctx.finish(partial)
    header = local.ctx.header if local.ctx is not None else {}
    doc = partial.to_dict() if partial is not None else None
    # when it failed: a rank whose peer failed first often fails later, waiting in a collective until the timeout
    import time

    return record(r.rank, r.device, code, None, {"message": message, "hint": hint, "at": time.time()},
                  header=header, partial=doc)


def _consistency(opts, spec, sess, local: Local) -> dict:
    """The cross-rank check on every rank (it exchanges checksums); an error in it is reported, not raised."""
    from ..diagnostics.ranks.consistency import check

    try:
        with isolated(opts.json):
            return check(local.pristine, local.inputs, local.ctx, sess, spec.wrap)
    except DiagError as e:
        return {"error": f"the cross-rank check could not run: {e.message}"}
    except Exception as e:   # never skip the gather: rank 0 would wait for this rank
        return {"error": f"the cross-rank check could not run (internal error in torchdiag: {one_line(e)})"}


def _render(opts, spec, sess, diagnostic, records: list[dict], local: Local, render_extra) -> int:
    """Rank 0: one Result for all ranks, its files, then one report."""
    from ..diagnostics.ranks.merge import finish, merge
    from ..diagnostics.ranks.report import add_rank_findings
    from ..render import render, write_outputs
    from .common import to_stdout

    # only a command that ran the DDP copy has DDP's "module." before the names (a user's own `module` stays)
    ddp_names = spec.wrap == "ddp" and wrap_mode(diagnostic, "ddp") == "train"
    merged = merge(records, local.result, spec.command, unwrap="module." if ddp_names else "")
    merged.header.update({"world_size": sess.ranks.world_size, "backend": sess.ranks.backend})
    add_rank_findings(merged, records, spec.wrap)
    hook = getattr(diagnostic, "merge_ranks", None)
    if hook is not None:
        hook(records, merged)
    finish(merged, records)
    with isolated(opts.json):
        written = dict(records[0].get("files") or {})
        if local.result is not None:
            written.update(write_outputs(merged, _rank0_outputs(opts.render_spec(), spec.command)))
        if render_extra and local.result is not None:
            render_extra(merged, written)
    to_stdout(lambda: render(merged, opts.render_spec()))
    return int(merged.exit_code)


def _all_failed(opts, spec, records: list[dict]) -> int:
    """No rank has a result: the error document (--json) names the first failure and lists every rank."""
    import json
    import sys

    from ..diagnostics.ranks.merge import tag
    from ..diagnostics.ranks.report import unused_hint
    from ..results import error_document
    from .common import err, to_stdout

    # the first failure, not its echoes (a rank stopped by a peer's failure says so; else the earliest)
    first = min((r["error"] for r in records), key=lambda e: (bool(e.get("echo")), e["at"]))
    same = [r["rank"] for r in records if r["error"]["message"] == first["message"]]
    code = max(r["exit_code"] for r in records)
    hint = unused_hint(records) if spec.wrap == "ddp" else None
    hint = hint or first.get("hint")
    if hint:
        err(f"hint: {hint}")
    if opts.json:
        doc = error_document(spec.command, f"[{tag(same)}] {first['message']}", hint, code)
        doc["world_size"] = len(records)
        doc["ranks"] = [{k: v for k, v in r.items() if k != "result"} for r in records]
        to_stdout(lambda: sys.stdout.write(json.dumps(doc) + "\n"))
    return code
