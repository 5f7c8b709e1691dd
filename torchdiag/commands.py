"""The command registry: each command declared once. Torch-free and Typer-free (`torchdiag --help` reads it).

The Typer app (cli/app.py), the Python API (api.py, torchdiag/__init__.py), the runner (runner/) and render
(render.write_outputs) all read COMMANDS; tests/test_contract.py checks that nothing keeps its own list.

Run-wide options are declared once too: RUN_OPTIONS names each one by its RunSpec field (or RenderSpec's,
for json/tb/debug) with its command-line spelling and help, its group, and whether the Python API and
`[tool.torchdiag]` take it. A command takes whole groups (GROUPS); cli/common.py builds its options from
here, api.py its keywords, runner/check.py its config keys."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunOption:
    """One run-wide option. `name` is the field of RunSpec (or of the render side: json, tb, debug)."""

    name: str
    flags: tuple[str, ...]                 # CLI spelling: ("--device", "-d")
    help: str
    default: Any = None
    type: str = "str"                      # str | int | float | bool | path | strs (repeatable) | toggle (--x/--no-x)
    metavar: str | None = None
    group: str = "model"
    python: bool = False                   # a keyword of the Python API (api.run)
    config: bool = False                   # a key of [tool.torchdiag] (check), spelled with '-'

    @property
    def config_key(self) -> str:
        return self.name.replace("_", "-")


RUN_OPTIONS: tuple[RunOption, ...] = (
    RunOption("args", ("--arg", "-a"), "Keyword argument for the factory; value parsed as a Python literal, else a "
              "string. Repeatable.", type="strs", metavar="KEY=VALUE", config=True),
    RunOption("inputs", ("--input", "-i"), "Positional input, e.g. 8x3x32x32, 2x128:int64[0,30000), 4x16:bool. "
              "Repeatable. Default: example_inputs() in the model's module, else model.example_input_array.",
              type="strs", metavar="SHAPE[:DTYPE]", group="inputs", config=True),
    RunOption("device", ("--device", "-d"), "auto|cpu|cuda|cuda:N|mps|meta (auto = cuda when available).",
              default="auto", config=True),
    RunOption("loss", ("--loss",), "auto|cross_entropy|mse|sum|PATH:fn (fn(output, target) -> scalar).",
              default="auto", group="loss", config=True),
    RunOption("batch", ("--batch",), "Function returning (inputs, target); gives the inputs, so not together with -i.",
              metavar="PATH:fn", group="batch", config=True),
    RunOption("seed", ("--seed",), "Seed for random inputs and targets.", default=0, type="int", python=True,
              config=True),
    RunOption("json", ("--json",), "Print exactly one JSON document on stdout.", default=False, type="bool",
              group="output"),
    RunOption("tb", ("--tb",), "Also write TensorBoard event files under DIR/<command>/.", type="path",
              metavar="DIR", group="output"),
    RunOption("debug", ("--debug",), "Show full tracebacks.", default=False, type="bool", group="output"),
    # weights for the model built from MODEL_SPEC (core.checkpoint): never unpickled beyond tensors
    RunOption("checkpoint", ("--checkpoint",), "Weights to load: .safetensors, *.safetensors.index.json (sharded), "
              ".pt/.pth/.bin (torch.load weights_only=True), Lightning .ckpt. Never runs code from the file.",
              type="path", metavar="FILE", config=True),
    # not --strict: gradflow's --strict (warnings fail) and check's `strict` already mean something else
    RunOption("strict_checkpoint", ("--strict-checkpoint/--no-strict-checkpoint",),
              "On: a checkpoint key that is missing, unexpected or of another shape stops the run (exit 2). "
              "Off: load what fits, report each other key as a finding (exit 1).", default=True, type="toggle",
              config=True),
    # hf:NAME (core.hub): offline by default; this opt-in fetches config.json alone, never weights
    RunOption("download", ("--download",), "For hf:NAME missing from the local Hugging Face cache: fetch its "
              "config.json alone (never weights) into that cache, to plan on random weights or --device meta. "
              "Without it nothing is downloaded. A local folder of that name wins; HF_HUB_OFFLINE refuses it.",
              metavar="config", group="hub"),
    # precision (core.run DTYPES/AMPS): one vocabulary on every command that runs the model
    RunOption("dtype", ("--dtype",), "Cast parameters and float inputs to this dtype (pure reduced precision).",
              metavar="float32|bfloat16|float16", group="precision", python=True, config=True),
    RunOption("amp", ("--amp",), "Mixed precision: float32 weights, ops under torch.autocast in this dtype (fp16 "
              "with a GradScaler where a step runs); auto: bf16 on the CPU, fp16 on CUDA; none: off.",
              metavar="bf16|fp16|auto|none", group="precision", python=True,
              config=True),
    RunOption("wrap", ("--wrap",), "Under torchrun: wrap the model in DistributedDataParallel or FSDP (fully_shard) "
              "on each rank.", default="none", metavar="none|ddp|fsdp", group="ranks"),
)
RUN = {o.name: o for o in RUN_OPTIONS}
# what each group holds, in the order its options are listed in --help
GROUPS = {g: tuple(o.name for o in RUN_OPTIONS if o.group == g) for g in dict.fromkeys(o.group for o in RUN_OPTIONS)}
RENDER_FIELDS = GROUPS["output"]            # the rest are RunSpec fields
MODEL = ("model", "hub", "inputs", "loss", "batch", "precision", "ranks", "output")   # a training command's groups


TRAINS = (None, "forward", "backward", "step")   # Command.trains, lightest first


@dataclass(frozen=True)
class Command:
    """One command, everything the layers need to know about it."""

    name: str                               # as typed: `overfit-batch`; module files use `overfit_batch`
    summary: str                            # the first paragraph of its help (the `torchdiag --help` list)
    groups: tuple[str, ...]                 # run-wide option groups it takes (GROUPS)
    diagnostic: str | None = None        # torchdiag.diagnostics.<it>: Options, run, NEEDS_VALUES, ...
    renderer: str | None = None          # torchdiag.render.<it>: WRITERS = {kind: write_kind}
    # what its argument names: model (a factory spec; the runner loads model and inputs) | callable (gradcheck's
    # TARGET) | config (check) | data (a DATA_SPEC: runner.local.run_data_specs) | script (watch's `-- python
    # train.py ...`: Job.produce() runs it; under torchrun every rank runs it and rank 0 reports).
    target: str = "model"
    per_rank: bool = False                  # under torchrun every rank runs it on its shard (runner/ranks.py)
    cross_rank: bool = False                # ... and the ranks are compared after a real step (consistency)
    python: str | None = None            # the torchdiag.<name> function, when the Python API has one
    defaults: dict = field(default_factory=dict)   # run-wide defaults of its own (gradcheck: device cpu)
    # a torch.compile'd model is run compiled (profile: the time is the compiled graph's); every other command
    # diagnoses the module it wraps, run eagerly (hooks inside a compiled graph break it or crash dynamo)
    compiled: bool = False
    # a model the Python API hands over partly on the meta device is diagnosed (doctor: device-mismatch names
    # each tensor there), not refused with exit 2 as every other command does (core/meta.refuse_meta_tensors)
    spread: bool = False
    # what it runs on the model, known before the model loads: None (a forward in eval mode), "forward" (in train
    # mode, where BatchNorm refuses one sample: core/sources gives it a default batch of 2; memory and profile choose
    # backward with --mode), "backward" (and a gradient per trainable parameter), "step" (and a copy trained with the
    # run's optimizer: the copy, its gradients, the optimizer's state). core/resources charges the memory for it.
    trains: str | None = None
    # the samples a source's default inputs take where one says nothing (embeddings: a projector of one point)
    samples: int = 1

    @property
    def module_name(self) -> str:
        return self.name.replace("-", "_")

    def options(self) -> tuple[str, ...]:
        """The run-wide options it takes, in --help order (RUN_OPTIONS')."""
        return tuple(o.name for o in RUN_OPTIONS if o.group in self.groups)

    def diagnostic_module(self):
        return importlib.import_module(f"torchdiag.diagnostics.{self.diagnostic}")

    def renderer_module(self):
        return None if self.renderer is None else importlib.import_module(f"torchdiag.render.{self.renderer}")

    def cli_module(self):
        return importlib.import_module(f"torchdiag.cli.{self.module_name}")


def _c(name, summary, groups, *, diagnostic=True, renderer=False, python=True, **kw) -> Command:
    mod = name.replace("-", "_")
    return Command(name, summary, groups, mod if diagnostic else None, mod if renderer else None,
                   python=mod if python else None, **kw)


_TRAIN = MODEL
_FORWARD = ("model", "hub", "inputs", "batch", "precision", "output")   # a batch of keyword inputs too (a sweep)
COMMANDS: tuple[Command, ...] = (
    _c("summary", "What is in this model: layers, output shapes, parameters (trainable, frozen, shared), sizes.",
       _FORWARD),
    _c("flops", "How much compute: FLOPs and MACs per module and per operator (1 MAC = 2 FLOPs).",
       ("model", "hub", "inputs", "loss", "batch", "precision", "output")),
    _c("nancheck", "Where do NaN or Inf come from? Checks, in order: model inputs, parameters and buffers, the output "
       "of every module in execution order, the loss, gradients in backward order, parameter gradients.",
       _TRAIN, per_rank=True, trains="backward"),
    _c("gradflow", "Does the gradient reach every parameter, and in what shape? One forward + backward.",
       _TRAIN, renderer=True, per_rank=True, cross_rank=True, trains="backward"),
    _c("overfit-batch", "Can this model memorise one batch? Trains a copy on one fixed batch and gives a verdict.",
       _TRAIN, renderer=True, per_rank=True, trains="step"),
    _c("lr-find", "Which learning rate? The range test, repeated over seeds, with its suggestion checked by short "
       "runs at 0.1×, 1× and 10× of it.", _TRAIN, renderer=True, per_rank=True, trains="step"),
    _c("profile", "Where the time goes: step time (mean, median, p90), throughput, top operators by self time, time "
       "per module, and a Chrome/Perfetto trace.", _TRAIN, renderer=True, per_rank=True, compiled=True,
       trains="forward"),
    _c("memory", "Where the memory goes in a training step: parameters, gradients, optimizer state, activations "
       "(saved for backward), temporaries; the peak and when it happens; per-module activation memory.",
       _TRAIN, renderer=True, per_rank=True, trains="forward"),
    _c("doctor", "Run the checklist of bugs that let a model train while quietly doing the wrong thing.",
       _TRAIN, per_rank=True, cross_rank=True, spread=True, trains="step"),
    _c("watch", "Watch your own training run (a script, or your loop in Python): non-finite values with the step and "
       "module, missing zero_grad, loss spikes and divergence, dead units, update/weight ratios; a report at the end.",
       ("output",), renderer=True, target="script"),
    _c("activations", "What each module produces: output shape, mean, std, min, max, fraction of zeros and of "
       "saturated values, for one forward pass (eval mode, no grad).", _FORWARD, renderer=True),
    _c("gradcam", "Grad-CAM: which part of the image drives a classifier's score for a class.",
       ("model", "hub", "precision", "output"), renderer=True),
    _c("attention", "Attention weights of every nn.MultiheadAttention (and of modules that return attention weights, "
       "and of F.scaled_dot_product_attention calls) for one forward pass.", ("model", "hub", "inputs", "output"),
       renderer=True),
    _c("embeddings", "Write the layer's outputs for the batch for TensorBoard's projector (DIR/embeddings/).",
       ("model", "hub", "inputs", "batch", "output"), renderer=True, samples=16),
    _c("gradcheck", "Check the gradients of your own autograd code against numerical ones, in float64.",
       ("model", "inputs", "output"), target="callable", defaults={"device": "cpu"}),
    _c("data", "What goes in and whether the loader keeps up: value ranges, NaN, labels, duplicates, train/val "
       "leakage, loader settings, throughput per num_workers, hangs.",
       ("model", "loss", "precision", "output"), renderer=True, target="data"),
    _c("check", "The CI gate: run the configured checks, print pass/fail per check, exit 1 if any fails.",
       ("model", "inputs", "output"), diagnostic=False, renderer=True, python=False, target="config",
       trains="forward"),
)
BY_NAME = {c.name: c for c in COMMANDS}
NAMES = tuple(BY_NAME)


def get(name: str) -> Command:
    return BY_NAME[name]
