"""The run contract: one torch-free description of a run, built alike by the CLI, the Python API and
`check`, and validated when it is built (before any model is loaded).

A concern that every command shares (device, precision, seed, loss rule, optimizer, inputs) is a
field here; `core.context.Context` turns it into torch objects once. A new cross-cutting option is a
field here, a line in `Context`, and the docs (docs/DEVELOPING.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import CALLERS, OptionError

OPTIMIZERS = ("adam", "adamw", "sgd")
DEFAULT_LR = {"adam": 1e-3, "adamw": 1e-3, "sgd": 1e-2}
DTYPES = ("float32", "bfloat16", "float16")
AMPS = ("bf16", "fp16", "auto")      # auto: bfloat16 on CPU, float16 on CUDA
WRAPS = ("none", "ddp", "fsdp")      # how each rank wraps the model under torchrun
DOWNLOADS = ("config",)              # what --download may fetch for hf:NAME (core.hub): config.json alone
SEED_RANGE = (0, 2**64)              # what torch.manual_seed accepts


# what people write for a dtype or an autocast precision, for the hint of a refused value
ALIASES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "bf16": "bfloat16",
           "float16": "fp16", "bfloat16": "bf16", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
           "torch.float32": "float32"}


def choice(name: str, value, choices, flag: str | None = None) -> str:
    """`value` lower-cased if it is one of `choices`, else an OptionError naming the option."""
    text = str(value).strip().lower()
    if text not in choices:
        raise OptionError(name, f"'{value}' is not one of {', '.join(choices)}", hint=_nearest(text, choices), flag=flag)
    return text


def _nearest(text: str, choices) -> str | None:
    import difflib

    alias = ALIASES.get(text)
    close = [alias] if alias in choices else difflib.get_close_matches(text, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]}?" if close else None


def number(name: str, value, *, low: float | None = None, high: float | None = None, low_open: bool = False,
           high_open: bool = False, integer: bool = False, flag: str | None = None):
    """A finite number within bounds (inclusive unless *_open), else an OptionError naming the option."""
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise OptionError(name, f"{value!r} is not {kind}", flag=flag)
    if not integer and not math.isfinite(value):   # inf is a number, just not one a run can use (a review)
        raise OptionError(name, f"{value!r} is not a finite number", flag=flag)
    def show(bound):
        return str(bound) if integer else f"{bound:g}"

    if low is not None and (value < low or (low_open and value == low)):
        raise OptionError(name, f"must be {'>' if low_open else '≥'} {show(low)}, got {value!r}", flag=flag)
    if high is not None and (value > high or (high_open and value == high)):
        raise OptionError(name, f"must be {'<' if high_open else '≤'} {show(high)}, got {value!r}", flag=flag)
    return value


def autocast_dtype(amp: str | None, device_type: str) -> str | None:
    """The dtype autocast runs in for `amp` on a device type: `auto` is float16 on CUDA, bfloat16 elsewhere."""
    if not amp:
        return None
    if amp == "auto":
        return "float16" if device_type == "cuda" else "bfloat16"
    return {"bf16": "bfloat16", "fp16": "float16"}[amp]


def flag(name: str, value, writer: str | None = None) -> bool:
    """A yes/no option; `writer` names the renderer for options that once took a path to write."""
    if not isinstance(value, bool):
        hint = f"files are written by {writer}(result, PATH) (the CLI does it for you)" if writer else None
        raise OptionError(name, f"takes True or False, not {value!r}", hint=hint)
    return value


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer of commands that take steps. One factory builds it (core.train.make_optimizer)."""

    name: str = "adam"
    lr: float | None = None          # None: DEFAULT_LR[name]
    momentum: float = 0.9            # sgd only

    def __post_init__(self):
        object.__setattr__(self, "name", choice("optimizer", self.name, OPTIMIZERS))
        if self.lr is not None:
            number("lr", self.lr, low=0, low_open=True)
        number("momentum", self.momentum, low=0, high=1, high_open=True)

    @property
    def learning_rate(self) -> float:
        return DEFAULT_LR[self.name] if self.lr is None else float(self.lr)

    @property
    def states(self) -> int:
        """Tensors of each trained parameter's size the optimizer keeps: Adam's two moments, SGD's momentum buffer."""
        return 2 if self.name in ("adam", "adamw") else 1 if self.momentum else 0

    def describe(self) -> str:
        extra = f", momentum {self.momentum:g}" if self.name == "sgd" and self.momentum else ""
        return f"{self.name} (lr {self.learning_rate:g}{extra})"


def optimizer_spec(base: OptimizerSpec | None = None, **given) -> OptimizerSpec:
    """`base` (a command's default optimizer) with the fields the caller gave (None = not given)."""
    import dataclasses

    fields = {k: v for k, v in given.items() if v is not None}
    spec = dataclasses.replace(base or OptimizerSpec(), **fields)
    if "momentum" in fields and spec.name != "sgd":   # adam's betas are not a momentum: refuse, not ignore
        raise OptionError("momentum", f"applies to sgd only, not {spec.name}",
                          hint="optimizer sgd with momentum M, or leave momentum out", others=("optimizer", "momentum"))
    return spec


@dataclass(frozen=True)
class RunSpec:
    """What one run asks for. Strings and numbers only: it can be built, checked and printed without torch."""

    command: str
    model: str = ""                          # MODEL_SPEC; "" when a Python caller passes the model itself
    args: tuple[str, ...] = ()               # factory KEY=VALUE
    inputs: tuple[str, ...] = ()             # -i SHAPE[:DTYPE]
    batch: str | None = None                 # PATH:fn returning (inputs, target)
    device: str = "auto"
    dtype: str | None = None                 # float32|bfloat16|float16: cast parameters and float inputs
    amp: str | None = None                   # bf16|fp16|auto: autocast, weights stay float32
    seed: int = 0
    loss: str = "auto"                       # auto|cross_entropy|mse|sum|PATH:fn
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    needs_inputs: bool = True
    caller: str = "cli"                      # cli|python|config: how options are named in messages
    checkpoint: str | None = None            # weights file loaded into the built model (core.checkpoint)
    strict_checkpoint: bool = True           # a checkpoint key that does not fit stops the run (else: findings)
    wrap: str = "none"                       # none|ddp|fsdp: the model's wrapper on each rank (core.distributed)
    download: str | None = None              # config: an hf:NAME not in the Hugging Face cache fetches config.json
    # what the run runs on the model where its command's registry entry does not say it all (check: its heaviest
    # configured check); None: the registry's Command.trains. core.resources charges the memory for it
    trains: str | None = None

    def __post_init__(self):
        if self.caller not in CALLERS:
            raise ValueError(f"caller must be one of {CALLERS}")
        object.__setattr__(self, "args", tuple(self.args or ()))
        object.__setattr__(self, "inputs", tuple(self.inputs or ()))
        flag("strict_checkpoint", self.strict_checkpoint)
        if self.checkpoint is not None and not isinstance(self.checkpoint, str):
            object.__setattr__(self, "checkpoint", str(self.checkpoint))   # a Path
        object.__setattr__(self, "wrap", choice("wrap", self.wrap, WRAPS))
        if self.download is not None:
            object.__setattr__(self, "download", choice("download", self.download, DOWNLOADS))
            if self.model and not self.model.startswith("hf:"):   # it would be silently ignored
                raise OptionError("download", f"fetches the config.json of a Hugging Face Hub model (hf:NAME); "
                                  f"{self.model} is not one", hint="drop --download: other specs never download")
        number("seed", self.seed, low=SEED_RANGE[0], high=SEED_RANGE[1], high_open=True, integer=True)
        if self.dtype is not None:
            object.__setattr__(self, "dtype", choice("dtype", self.dtype, DTYPES))
        if self.amp is not None:
            amp = choice("amp", self.amp, AMPS + ("none",))
            object.__setattr__(self, "amp", None if amp == "none" else amp)
        if self.amp and self.dtype not in (None, "float32"):  # autocast keeps float32 weights
            raise OptionError("amp", f"keeps float32 weights and autocasts ops; it cannot be combined with dtype {self.dtype}",
                              hint="use amp alone (mixed precision) or dtype alone (everything in that dtype)")
        if self.batch and self.inputs:  # one would be silently ignored
            raise OptionError("batch", f"{self.batch} and inputs {', '.join(self.inputs)} both give the inputs",
                              hint="the batch function returns (inputs, target): drop the inputs, or the batch")
