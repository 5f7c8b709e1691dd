"""Options every command shares, and the one error boundary that turns errors into exit codes."""
from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from ..errors import DiagError, ExitCode, OptionError, interrupt_code, one_line
from .isolation import UserExit, isolated

Spec = Annotated[str, typer.Argument(metavar="MODEL_SPEC", show_default=False,
                                     help="path/to/file.py:factory or dotted.module:factory (split on the last ':').")]
Args = Annotated[Optional[list[str]], typer.Option("--arg", "-a", metavar="KEY=VALUE", show_default=False,
                                                   help="Keyword argument for the factory; value parsed as a Python literal, else a string. Repeatable.")]
Inputs = Annotated[Optional[list[str]], typer.Option("--input", "-i", metavar="SHAPE[:DTYPE]", show_default=False,
                                                     help="Positional input, e.g. 8x3x32x32, 2x128:int64[0,30000), 4x16:bool. Repeatable. "
                                                          "Default: example_inputs() in the model's module, else model.example_input_array.")]
Device = Annotated[str, typer.Option("--device", "-d", help="auto|cpu|cuda|cuda:N|mps|meta (auto = cuda when available).")]
Seed = Annotated[int, typer.Option("--seed", help="Seed for random inputs and targets.")]
Json = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]
Tb = Annotated[Optional[Path], typer.Option("--tb", metavar="DIR", help="Also write TensorBoard event files under DIR/<command>/.")]
Debug = Annotated[bool, typer.Option("--debug", help="Show full tracebacks.")]
Depth = Annotated[int, typer.Option("--depth", help="Module nesting depth shown in tables (≥ 0).")]
# Loss/targets, for commands that run backward.
Loss = Annotated[str, typer.Option("--loss", help="auto|cross_entropy|mse|sum|PATH:fn (fn(output, target) -> scalar).")]
# Weights for the model built from MODEL_SPEC (core.checkpoint): never unpickled beyond tensors.
Checkpoint = Annotated[Optional[Path], typer.Option("--checkpoint", metavar="FILE", show_default=False,
                                                    help="Weights to load: .safetensors, *.safetensors.index.json (sharded), .pt/.pth/.bin "
                                                         "(torch.load weights_only=True), Lightning .ckpt. Never runs code from the file.")]
# not --strict: gradflow's --strict (warnings fail) and check's `strict` already mean something else
StrictCheckpoint = Annotated[bool, typer.Option("--strict-checkpoint/--no-strict-checkpoint",
                                      help="On: a checkpoint key that is missing, unexpected or of another shape stops the run (exit 2). "
                                           "Off: load what fits, report each other key as a finding (exit 1).")]
# Precision (core.run DTYPES/AMPS): one vocabulary on every command that runs the model.
Dtype = Annotated[Optional[str], typer.Option("--dtype", metavar="float32|bfloat16|float16", show_default=False,
                                              help="Cast parameters and float inputs to this dtype (pure reduced precision).")]
Amp = Annotated[Optional[str], typer.Option("--amp", metavar="bf16|fp16", show_default=False,
                                            help="Mixed precision: float32 weights, ops under torch.autocast in this dtype (fp16 with a GradScaler where a step runs).")]
# Under torchrun (core.distributed): how each rank wraps the model.
Wrap = Annotated[str, typer.Option("--wrap", metavar="none|ddp|fsdp",
                                   help="Under torchrun: wrap the model in DistributedDataParallel or FSDP (fully_shard) on each rank.")]
Batch = Annotated[Optional[str], typer.Option("--batch", metavar="PATH:fn", help="Function returning (inputs, target); gives the inputs, so not together with -i.")]


@dataclass
class CommonOptions:
    """The CLI's own bag of shared options; lower layers get the RunSpec and RenderSpec built from it."""

    command: str
    spec: str
    args: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    device: str = "auto"
    seed: int = 0
    json: bool = False
    tb: Optional[Path] = None
    debug: bool = False
    loss: str = "auto"
    batch: Optional[str] = None
    needs_inputs: bool = True
    optimizer: Optional[dict] = None     # OptimizerSpec fields given (name, lr, momentum), for commands that step
    dtype: Optional[str] = None
    amp: Optional[str] = None
    outputs: dict = field(default_factory=dict)   # kind -> path of the files asked for (--plot, --trace, ...)
    checkpoint: Optional[Path] = None    # --checkpoint FILE
    strict_checkpoint: bool = True       # --strict-checkpoint/--no-strict-checkpoint
    wrap: str = "none"                   # --wrap none|ddp|fsdp (under torchrun)

    def run_spec(self, diagnostic=None):
        """The RunSpec; the optimizer is the diagnostic's default (its OPTIMIZER) with what was given."""
        from ..core.run import RunSpec, optimizer_spec

        optimizer = optimizer_spec(getattr(diagnostic, "OPTIMIZER", None), **(self.optimizer or {}))
        return RunSpec(self.command, self.spec, tuple(self.args), tuple(self.inputs), self.batch, self.device,
                       self.dtype, self.amp, self.seed, self.loss, optimizer, self.needs_inputs, caller="cli",
                       checkpoint=None if self.checkpoint is None else str(self.checkpoint), strict_checkpoint=self.strict_checkpoint,
                       wrap=self.wrap)

    def render_spec(self):
        from ..render import RenderSpec

        outputs = {k: str(v) for k, v in self.outputs.items() if v is not None}
        return RenderSpec(self.command, self.json, None if self.tb is None else str(self.tb), outputs)


def err(line: str) -> None:
    sys.stderr.write(line + "\n")


def progress(message: str, json_mode: bool):
    """A spinner on stderr when it is a terminal; silent otherwise (CI logs, --json)."""
    import contextlib

    if json_mode or not sys.stderr.isatty():
        return contextlib.nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(message)


def execute(opts: CommonOptions, diagnostic=None, options: Callable | None = None, *, run: Callable | None = None,
            render_extra: Callable | None = None, produce: Callable | None = None,
            precheck: Callable | None = None) -> None:
    """Check the options, load the model and inputs, run the diagnostic, render, exit with its code.

    `diagnostic` is the diagnostics module (its `run(model, inputs, opts, ctx)` and `NEEDS_VALUES`);
    `options()` builds its Options, validated before anything is loaded; `run(model, inputs, o, ctx)`
    replaces the module's run when the command needs more (live progress). `produce() -> Result` is
    for commands whose target is not one model (check, gradcheck). Every DiagError becomes
    `error:`/`hint:` lines and its exit code; anything else is a torchdiag bug (exit 4)."""
    from ..core.distributed import current

    ranks = current()
    if ranks is not None:  # under torchrun (cli/torchrun.py); returns only for rank 0 of a one-process command
        from .torchrun import under_torchrun

        under_torchrun(opts, ranks, diagnostic, options, run=run, render_extra=render_extra, precheck=precheck,
                       produce=produce)
    code = ExitCode.OK
    ctx = None
    try:
        output_dir(opts.tb, "--tb")
        spec = opts.run_spec(diagnostic)
        if ranks is None:
            from ..core.distributed import refuse_wrap

            refuse_wrap(spec)
        o = options() if options is not None else None
        if precheck is not None:
            precheck()
        with isolated(opts.json):  # the user's code runs in here
            if produce is not None:
                with progress(f"torchdiag {opts.command}: {opts.spec}", opts.json):
                    result = produce()
            else:
                with progress(f"torchdiag {opts.command}: loading {opts.spec}", opts.json):
                    from ..core.context import prepare

                    model, inputs, ctx = prepare(spec, needs_values=getattr(diagnostic, "NEEDS_VALUES", False))
                # outside the loading spinner: a command may show its own live progress
                result = (run or diagnostic.run)(model, inputs, o, ctx)
                ctx.finish(result)
            from ..render import render, write_outputs

            # files first: a failure then cannot follow a printed JSON document
            written = write_outputs(result, opts.render_spec())
            if render_extra:
                render_extra(result, written)
        to_stdout(lambda: render(result, opts.render_spec()))
        code = result.exit_code
    except DiagError as e:
        code = _diag_error(e, opts, ctx)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated)
        code = interrupt_code(e)
        _report("interrupted" if code == ExitCode.INTERRUPTED else "terminated (SIGTERM)", None, code, opts)
    except UserExit as e:
        code = ExitCode.MODEL
        _report(f"the model's own code called {e.code}",
                "torchdiag runs your module's code; keep os._exit out of import time, factories and forward", code, opts)
    except SystemExit as e:  # only the user's code calls sys.exit in here
        code = ExitCode.MODEL
        _report(f"the model's own code called sys.exit({e.code!r})",
                "torchdiag runs your module's code; keep sys.exit out of import time, factories and forward", code, opts)
    except typer.Exit:
        raise
    except Exception as e:  # a bug of ours
        code = ExitCode.INTERNAL
        _report(f"internal error in torchdiag: {one_line(e)}",
                "this is a bug in torchdiag: run again with --debug and please report the traceback", code, opts)
        if opts.debug:
            traceback.print_exc()
    except BaseException as e:  # only the user's code raises other BaseException subclasses
        code = ExitCode.MODEL
        _report(f"the model's own code raised {one_line(e)}",
                "a BaseException that is not an Exception stops any program; raise an Exception subclass", code, opts)
        if opts.debug:
            traceback.print_exc()
    raise typer.Exit(int(code))


def _diag_error(e: DiagError, opts: CommonOptions, ctx) -> ExitCode:
    """An error we can explain: named for the command line, with what ran before it (partial result)."""
    if isinstance(e, OptionError):
        e.name_for("cli")
    if ctx is not None:
        ctx.explain(e)
    partial = getattr(e, "partial", None)
    if partial is not None:  # what ran before the failure: on the console, or in the JSON document
        if ctx is not None:
            ctx.finish(partial)
        if not opts.json:
            from ..render.console import print_result

            to_stdout(lambda: print_result(partial))
    _report(e.message, e.hint, e.code, opts, partial)
    if opts.debug:
        traceback.print_exc()
    return e.code


def to_stdout(write: Callable[[], object]) -> None:
    """Run `write` (output on stdout) and flush. When the reader of stdout went away (| head, | true)
    the rest of our output and the final flush go to /dev/null, so exit keeps the command's own
    code and no BrokenPipeError or traceback follows (Rich turns a broken pipe into SystemExit(1))."""
    try:
        write()
        sys.stdout.flush()
    except (BrokenPipeError, SystemExit):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # no real file descriptor (tests capture stdout)
            pass


def _report(message: str, hint: str | None, code: ExitCode, opts: CommonOptions, partial=None) -> None:
    err(f"error: {message}")
    if hint:
        err(f"hint: {hint}")
    if opts.tb and code != ExitCode.USAGE:  # the log says what happened, and is flushed
        try:
            from ..render.tensorboard import write_error

            write_error(opts.tb, opts.command, message, hint, int(code))
        except Exception:  # never hide the real error behind a logging failure
            pass
    if opts.json:
        import json

        from ..results import error_document

        doc = error_document(opts.command, message, hint, code, partial)
        to_stdout(lambda: sys.stdout.write(json.dumps(doc) + "\n"))


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def output_file(path: Optional[Path], option: str, suffixes: tuple[str, ...] = ()) -> Optional[Path]:
    """render.output.check_file: a file the command will write, checked before any work (exit 2)."""
    from ..render.output import check_file

    return check_file(path, option, suffixes)


def output_dir(path: Optional[Path], option: str) -> Optional[Path]:
    """render.output.check_dir: a folder the command will write into, checked before any work (exit 2)."""
    from ..render.output import check_dir

    return check_dir(path, option)
