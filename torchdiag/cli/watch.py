"""`torchdiag watch -- python train.py ARGS...`: the user's own training script run in-process, watched."""
from __future__ import annotations

import contextlib
import shlex
from pathlib import Path
from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag watch -- python sample_models/watch_healthy_cnn.py --epochs 1

  torchdiag watch --every 10 --plot watch.png --tb runs -- python train.py --lr 0.1

  torchdiag watch --json -- python -m mypackage.train --config small.yaml"""

Command = Annotated[list[str], typer.Argument(metavar="COMMAND", show_default=False,
                                              help="After --: python train.py [ARGS...], python -m package.module "
                                                   "[ARGS...], or train.py [ARGS...] (a .py file or a python #! script).")]
Every = Annotated[int, typer.Option("--every", metavar="N", help="Optimizer steps between read-backs (one host sync "
                                                                 "each on a healthy run); findings are decided there.")]
Accumulate = Annotated[bool, typer.Option("--accumulate", help="The loop carries gradients over optimizer steps on "
                                                               "purpose: the missing-zero_grad check is off. Not "
                                                               "needed for micro-batch accumulation that calls "
                                                               "zero_grad() after each optimizer step.")]
Status = Annotated[bool | None, typer.Option("--status/--no-status", show_default=False,
                                                help="The live status line on stderr (default: only when stderr is a "
                                                     "terminal; never under --json).")]
NoHist = Annotated[bool, typer.Option("--no-histograms", help="No weight/gradient histograms in --tb (they copy every "
                                                              "parameter to the host at each read).")]
NoReplay = Annotated[bool, typer.Option("--no-replay", help="Do not replay the first non-finite batch on a copy of the "
                                                            "model to name the module.")]
Spike = Annotated[float, typer.Option("--spike", metavar="X", help="A loss above X times the running median is a spike.")]
Explode = Annotated[float, typer.Option("--explode", metavar="X", help="A gradient norm above X times the running "
                                                                      "median is an explosion.")]
Ratio = Annotated[float, typer.Option("--ratio-high", metavar="R", help="Update/weight ratio above which a layer's "
                                                                       "updates are too large.")]
Plot = Annotated[Path | None, typer.Option("--plot", parser=c.nonempty_path, metavar="FILE", show_default=False,
                                              help="Write the loss and gradient norm per step (.png, .svg, .pdf).")]

DETAILS = """Runs the command in this process, as if run directly: the script sees its own sys.argv,
__name__ == "__main__", its folder first on sys.path, the current folder, stdin and stdout. Every
optimizer that steps and every model it trains are watched; nothing in the script changes.
--json: the script's stdout goes to stderr (stdout then holds exactly the one JSON document).
The report is printed when the script ends; when it raises (exit 3) or is interrupted (Ctrl-C:
130, SIGTERM: 143) the report so far. --tb DIR is written while the run goes (DIR/watch/).
A script may log metrics: torchdiag.diagnostics.watch.log(name, value) (a no-op without a watch).
Exit 0 nothing failed, 1 an error finding, 2 no such script / not Python / no optimizer step."""

OWN = {"every": (Every, 50), "accumulate": (Accumulate, False), "status": (Status, None),
       "no_histograms": (NoHist, False), "no_replay": (NoReplay, False), "spike": (Spike, 5.0),
       "explode": (Explode, 20.0), "ratio_high": (Ratio, 0.1), "plot": (Plot, None)}


def run(o) -> None:
    from ..diagnostics.watch import Options, script
    from ..render.plots import check_plot

    made = {}
    command = list(o.spec or [])
    tb = None if o.tb is None else str(o.tb)

    def options():   # validated before the script is looked at
        made["opts"] = Options(every=o.every, accumulate=o.accumulate, status=o.status, histograms=not o.no_histograms,
                               replay=not o.no_replay, spike=o.spike, explode=o.explode, ratio_high=o.ratio_high,
                               logdir=tb)
        return made["opts"]

    def precheck():   # no such script, not Python: one line, exit 2, before torch is imported
        check_plot(o.plot)
        script.parse_command(command)

    def produce():
        from ..core.distributed import current
        from ..diagnostics.watch import Watch
        from ..render.watch import Live

        opts = made["opts"]
        ranks = current()
        main = ranks is None or ranks.main   # under torchrun every rank runs the script; rank 0 writes --tb
        live = Live(status=opts.status if main else False, logdir=tb if main else None, json=bool(o.json))
        try:
            if ranks is None:
                return script.run_command(command, Watch(None, None, opts=opts, **live.callbacks()))
            # every rank watches; rank 0 reports every rank's findings
            from ..runner.isolation import stuck_exit
            from ..runner.scripts import run_on_ranks

            watch = Watch(None, None, opts=opts, **live.callbacks())
            with stuck_exit(lambda signum: _stuck(job, watch, ranks, signum)):
                return run_on_ranks(ranks, lambda: script.run_command(command, watch))
        finally:
            if live.tb is not None:   # closed by the watch's end already, unless the script never started
                live.tb.close()

    def extras(result, written):
        if "plot" in written and not o.json:
            c.err(f"plot: {written['plot']}")

    job = c.job("watch", o, options=options, outputs={"plot": o.plot}, precheck=precheck, produce=produce)
    job.fields["model"] = shlex.join(command)
    job.progress = lambda message: contextlib.nullcontext()   # the script's own output, no spinner
    c.execute(job, render_extra=extras)


def _stuck(job, watch, ranks, signum: int) -> int:
    """This rank's script stayed blocked in a collective after Ctrl-C/SIGTERM (a peer that skipped a step: a sweep's
    ZeRO run hung, and under watch torchrun killed both ranks 30 s later with nothing printed): rank 0 prints its own
    report so far from isolation.stuck_exit's thread, the others end quietly. The other ranks' cannot be gathered."""
    import signal
    import sys

    from ..runner.isolation import real_stdout
    from ..runner.outcome import Outcome

    code = 128 + signum
    if not ranks.main or job.show is None:
        return code
    result = watch.finish_within(5.0, interrupted=code)
    if result is None:   # the main thread's own finish is stuck too: nothing to print
        return code
    result.code = code
    what = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    result.verdict = (f"INTERRUPTED ({what}) after {watch.engine.step} step(s), blocked in a collective that the "
                      "other ranks never joined: this rank's report up to then")
    result.notes.append("the other ranks' reports could not be gathered: this rank stayed blocked in a collective "
                        "(a rank that skipped a step, a backward or an all_reduce the others took)")
    real_stdout()
    shown = job.show(Outcome(code, result=result))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return int(shown)


def register(app) -> None:
    # options end at the command: `torchdiag watch --every 5 python train.py --epochs 1` gives --epochs to the script
    c.register(app, "watch", run, OWN, DETAILS, EXAMPLE, target=Command,
               context_settings={"allow_interspersed_args": False}, options_metavar="[OPTIONS] --")
