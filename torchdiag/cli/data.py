"""`torchdiag data`: the data and the input pipeline (docs/data.md). Its target is a DATA_SPEC, loaded by
the runner (runner.local.run_data_specs), not a model."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common as c

EXAMPLE = """Examples:

  torchdiag data sample_models/data_digits.py:train --val sample_models/data_digits.py:val

  torchdiag data sample_models/data_digits.py:train --model sample_models/data_digits.py:model --workers 0,2

  torchdiag data mypkg.data:train_loader --arg root=/data/cifar --no-sweep --images pictures/ --plot data.png

Exit codes: 0 no error finding · 1 an error finding (NaN, labels out of range, train/val overlap, a
hang, ...) · 2 usage (a factory returning something else, a bad option) · 3 the user's code raised
(the factory, dataset[i], a worker, the model) · 130/143 interrupted (what was measured is shown)."""

DataSpec = Annotated[str, typer.Argument(metavar="DATA_SPEC", show_default=False,
                                         help="path/to/file.py:factory, dotted.module:factory or torchvision:NAME; the "
                                              "factory returns a Dataset, a DataLoader or an iterable of batches.")]
Val = Annotated[str | None, typer.Option("--val", metavar="DATA_SPEC", show_default=False,
                                            help="A validation split: its own content checks, and samples shared "
                                                 "with the training split. Its factory gets the same --arg values.")]
Model = Annotated[str | None, typer.Option("--model", metavar="MODEL_SPEC", show_default=False,
                                              help="A model: labels against its output size, a batch of one in train "
                                                   "mode, its training step timed against the loader.")]
ModelArg = Annotated[list[str] | None, typer.Option("--model-arg", metavar="KEY=VALUE", show_default=False,
                                                       help="Keyword argument for the --model factory (--arg goes to "
                                                            "the data factories). Repeatable.")]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Batch size when DATA_SPEC gives a Dataset (a "
                                                              "DataLoader keeps its own).")]
Samples = Annotated[int, typer.Option("--samples", help="Content checks read at most N samples per split (a seeded "
                                                         "random subset of a larger map-style dataset).")]
Batches = Annotated[int, typer.Option("--batches", help="Batches timed per loader configuration (after the first).")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds a batch may take before the loader is reported "
                                                           "stuck (with where each process is).")]
InputField = Annotated[str | None, typer.Option("--input-field", show_default=False,
                                                   help="The input field of a batch (image, [0], [0].pixels). "
                                                        "Default: found by convention.")]
TargetField = Annotated[str | None, typer.Option("--target-field", show_default=False,
                                                    help="The target field of a batch (label, [1]). Default: found "
                                                         "by convention.")]
Classes = Annotated[int | None, typer.Option("--classes", show_default=False,
                                                help="Classes expected. Default: the model's output size, else the "
                                                     "largest label + 1.")]
Workers = Annotated[str | None, typer.Option("--workers", metavar="0,2,4", show_default=False,
                                                help="num_workers values to sweep. Default: 0, 1, 2, 4, ... up to the "
                                                     "CPU count.")]
NoSweep = Annotated[bool, typer.Option("--no-sweep", help="Do not sweep num_workers (time the loader as configured "
                                                          "only).")]
NoSpeed = Annotated[bool, typer.Option("--no-speed", help="Content checks only: no timing, no worker checks.")]
PerClass = Annotated[int, typer.Option("--per-class", help="Sample inputs per class in the --images grid (0-64).")]
Images = Annotated[Path | None, typer.Option("--images", parser=c.nonempty_path, metavar="DIR", show_default=False,
                                                help="Write samples_<split>.png: a row of sample inputs per class.")]
Plot = Annotated[Path | None, typer.Option("--plot", parser=c.nonempty_path, metavar="FILE", show_default=False,
                                              help="Write the label histogram and per-channel value histograms "
                                                   "(.png, .svg, .pdf).")]

DETAILS = """Reads the data as training does. What goes in: per field dtype, shape, range, mean/std
(per channel for images), non-finite samples; labels per class; exact duplicates and samples
shared between --val and the training split. The loader: label order, a last batch of one,
workers repeating random augmentations, its settings; batches/s as configured and per
num_workers (with --model, the share of each training step spent waiting for data). A batch
not arriving within --timeout is reported with each process's stack. --arg goes to the data
factories (DATA_SPEC and --val), --model-arg to the --model factory; --checkpoint, --dtype and
--amp apply to --model."""

OWN = {"val": (Val, None), "model": (Model, None), "model_arg": (ModelArg, None), "batch_size": (BatchSize, 32),
       "samples": (Samples, 20000), "batches": (Batches, 20), "timeout": (Timeout, 30.0),
       "input_field": (InputField, None), "target_field": (TargetField, None), "classes": (Classes, None),
       "workers": (Workers, None), "no_sweep": (NoSweep, False), "no_speed": (NoSpeed, False),
       "per_class": (PerClass, 8), "images": (Images, None), "plot": (Plot, None)}


def run(o) -> None:
    from ..diagnostics.data.options import Options

    made = {}

    def options():   # validated before anything is loaded
        made["opts"] = Options(batch_size=o.batch_size, samples=o.samples, batches=o.batches, timeout=o.timeout,
                               input_field=o.input_field, target_field=o.target_field, num_classes=o.classes,
                               workers=o.workers, sweep=not o.no_sweep, speed=not o.no_speed, per_class=o.per_class,
                               pictures=bool(o.images or o.plot or o.tb))
        return made["opts"]

    def precheck():   # the files asked for, before anything is loaded
        from ..render.images import check_pictures
        from ..render.plots import check_plot

        check_pictures(o.images, o.tb is not None, "data pictures")
        check_plot(o.plot)

    def extra(result, written):
        if not o.json:
            for kind, what in (("images", "sample grids"), ("plot", "histograms")):
                if kind in written:
                    c.err(f"data {what}: {written[kind]}")
            if o.images and "images" not in written:   # (a sweep: "data sample grids: DIR" with nothing in it)
                c.err("data sample grids: none written: " + ("--per-class 0 asks for no samples" if o.per_class == 0
                      else "no input field is laid out as images (C×H×W, H×W×C or H×W a sample)"))

    job = c.job("data", o, outputs={"images": o.images, "plot": o.plot}, options=options, precheck=precheck)

    def produce():
        from ..runner.local import run_data_specs

        return run_data_specs(job.run_spec(), made["opts"], o.val, o.model, tuple(o.model_arg or ()))

    job.produce = produce
    c.execute(job, render_extra=extra)


def register(app) -> None:
    c.register(app, "data", run, OWN, DETAILS, EXAMPLE, target=DataSpec)
