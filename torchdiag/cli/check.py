"""`torchdiag check`: the configured diagnostics as one CI gate with thresholds, JUnit and exit codes."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..commands import get
from . import common as c

EXAMPLE = """Examples:

  torchdiag check                      # reads [tool.torchdiag] from ./pyproject.toml

  torchdiag check --config ci/torchdiag.toml --junit reports/torchdiag.xml

  torchdiag check sample_models/cnn.py:build -i 8x3x32x32 --max-params 30000 --nancheck --gradflow"""


DETAILS = """Config (TOML; pyproject.toml's [tool.torchdiag], or --config FILE):

\b
  [tool.torchdiag]          the model: model, inputs, device, args, loss,
                            batch, seed, dtype, amp, checkpoint,
                            strict-checkpoint
  [tool.torchdiag.check]    the checks and limits: max-params,
                            max-trainable-params, min-trainable-params,
                            max-gmacs, max-gflops, max-peak-memory,
                            nancheck, gradflow, doctor, overfit-batch,
                            lr-find, data, allow, strict
  [[tool.torchdiag.models]] several models, each with the model keys, its
                            own check table, and a `name` telling
                            entries of one spec apart

No check runs unless configured (here or in the file). Options given here override the file. With
GITHUB_ACTIONS=true, failed checks are also printed as GitHub annotations."""


def register(app) -> None:
    @app.command("check", epilog=EXAMPLE, help=f"{get('check').summary}\n\n{DETAILS}")
    def check(spec: Annotated[str | None, typer.Argument(metavar="[MODEL_SPEC]", show_default=False,
                                                             help="Overrides the config's model.")] = None,
              config: Annotated[Path | None, typer.Option("--config", parser=c.nonempty_path, metavar="FILE", help="TOML file with [tool.torchdiag] tables (default: ./pyproject.toml).")] = None,
              arg: c.Args = None, input: c.Inputs = None, checkpoint: c.Checkpoint = None,
              device: Annotated[str | None, typer.Option("--device", "-d", help="Overrides the config's device.")] = None,
              max_params: Annotated[str | None, typer.Option("--max-params", help="Limit on parameters, e.g. 25M.")] = None,
              max_gmacs: Annotated[float | None, typer.Option("--max-gmacs", help="Limit on forward GMACs.")] = None,
              nancheck: Annotated[bool | None, typer.Option("--nancheck/--no-nancheck", help="Run nancheck.")] = None,
              gradflow: Annotated[bool | None, typer.Option("--gradflow/--no-gradflow", help="Run gradflow.")] = None,
              overfit_batch: Annotated[bool | None, typer.Option("--overfit-batch/--no-overfit-batch", help="Run overfit-batch.")] = None,
              lr_find: Annotated[bool | None, typer.Option("--lr-find/--no-lr-find", help="Run lr-find.")] = None,
              doctor: Annotated[bool | None, typer.Option("--doctor/--no-doctor", help="Run doctor.")] = None,
              allow: Annotated[list[str] | None, typer.Option("--allow", metavar="GLOB", help="Parameter globs gradflow accepts. Repeatable.")] = None,
              junit: Annotated[Path | None, typer.Option("--junit", parser=c.nonempty_path, metavar="FILE.xml", help="Write a JUnit report (one testcase per check).")] = None,
              json: c.Json = False, tb: c.Tb = None, debug: c.Debug = False) -> None:
        fields = {"model": spec or "", "args": arg, "inputs": input, "device": device or "auto", "json": json,
                  "tb": tb, "debug": debug}

        def produce():
            from ..runner import check as orchestrate

            overrides = {"model": spec, "inputs": input, "device": device, "args": arg,
                         "checkpoint": None if checkpoint is None else str(checkpoint)}
            check_over = {k: v for k, v in {"max-params": max_params, "max-gmacs": max_gmacs, "nancheck": nancheck,
                                            "gradflow": gradflow, "overfit-batch": overfit_batch, "lr-find": lr_find,
                                            "doctor": doctor,
                                            "allow": allow}.items() if v is not None}
            if spec and config is None and not Path("pyproject.toml").is_file():
                table, source = {}, "command line"
            else:
                table, source = orchestrate.load_config(config)
            models = orchestrate.models_from_config(table, source, overrides, check_over)
            return orchestrate.run(models, source)

        def extras(result, written):
            if "junit" in written and not json:
                c.err(f"JUnit report: {written['junit']}")
            if c.env_flag("GITHUB_ACTIONS"):
                from ..render.ci import github_annotations

                stream = sys.stderr if json else sys.stdout
                for line in github_annotations(result):
                    stream.write(line + "\n")

        from ..runner.job import Job

        job = Job(get("check"), fields, {"junit": junit}, produce=produce, precheck=lambda: junit_path(junit),
                  progress=lambda message: c.progress(message, json), working=c.still_running)
        c.execute(job, render_extra=extras)


def junit_path(path: Path | None) -> Path | None:
    """--junit FILE.xml checked before any work; its folder is created (a fresh CI checkout has no reports/)."""
    from ..errors import UsageError

    if path is not None and Path(path).suffix.lower() == ".xml" and not Path(path).parent.exists():
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--junit {path}: cannot create folder {Path(path).parent}: {exc.strerror or exc}") from None
    return c.output_file(path, "--junit", (".xml",))  # the usual checks and one-line errors
