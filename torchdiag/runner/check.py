"""check: the CI gate. Runs the configured diagnostics on one or more models with thresholds.

Config: `[tool.torchdiag]` in ./pyproject.toml, or `--config FILE` (a TOML file with the same
tables, `[tool.torchdiag]` or top-level). Command-line options override the file. Unknown keys
are an error that names the key: a typo must not silently switch a check off."""
from __future__ import annotations

import dataclasses
import difflib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..commands import BY_NAME, RUN_OPTIONS, TRAINS
from ..errors import DiagError, ExitCode, Terminated, UsageError, interrupt_code
from ..results import Column, Result, Table

# the run-wide options a config takes (commands.RUN_OPTIONS, spelled with '-'), and the entry's own keys
CONFIG = {o.config_key: o.name for o in RUN_OPTIONS if o.config}
MODEL_KEYS = set(CONFIG) | {"model", "name", "check"}
CHECK_KEYS = {"max-params", "max-trainable-params", "min-trainable-params", "max-gmacs", "max-gflops", "nancheck", "gradflow",
              "overfit-batch", "lr-find", "doctor", "allow", "strict", "max-peak-memory", "data"}
OVERFIT_KEYS = {"steps", "target-ratio", "target-loss", "lr", "optimizer", "momentum", "seed"}
LR_FIND_KEYS = {"min-lr", "max-lr", "steps", "diverge", "repeats", "check-steps", "optimizer", "momentum", "seed"}   # no lr: unused
# the checks that train with settings of their own: true, false or a table of them (keys, an example)
OWN_TABLES = {"overfit-batch": (OVERFIT_KEYS, "overfit-batch = {steps = 200, target-ratio = 0.05}"),
              "lr-find": (LR_FIND_KEYS, "lr-find = {steps = 50, repeats = 2, check-steps = 10}")}
# the data table: its specs, then `data`'s Options as on its command line (pictures are not drawn in check)
DATA_OPTIONS = {"batch-size": "batch_size", "samples": "samples", "batches": "batches", "timeout": "timeout",
                "input-field": "input_field", "target-field": "target_field", "classes": "num_classes",
                "workers": "workers", "sweep": "sweep", "speed": "speed"}
DATA_KEYS = {"spec", "val", "args", "with-model"} | set(DATA_OPTIONS)
ROOT_KEYS = MODEL_KEYS | {"models"}
INTERRUPTS = {int(ExitCode.INTERRUPTED), int(ExitCode.TERMINATED)}


@dataclass
class ModelConfig:
    name: str
    spec: Any                    # core.run.RunSpec of this model (caller "config")
    check: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.spec.model


@dataclass
class CheckOutcome:
    model: str
    check: str
    passed: bool | None          # None: could not run (the model raised, or Ctrl-C)
    figure: str
    limit: str
    message: str = ""
    seconds: float = 0.0
    code: int = 0                # exit code this outcome implies (0, 1, 2, 3, 130)
    value: float | None = None   # a threshold check's measured number and its limit, in `unit` (--json: a CI job
    limit_value: float | None = None   # plots them without parsing "1,562" or "483.19 KiB", a new user's hour)
    unit: str = ""
    batch: int | None = None     # the batch a count was made at (GMACs, GFLOPs), where over 1


def _unknown(keys, allowed, where: str):
    for key in keys:
        if key not in allowed:
            raise UsageError(f"unknown key '{key}' in {where}", hint=_belongs(key, allowed))


def _belongs(key: str, allowed) -> str:
    """Where an unknown key goes: a check key (or a near miss of one) written at the top of [tool.torchdiag] belongs
    in its check table (a new user's first config put max-trainable-params there), a model setting in a check table
    at the top; else the closest known key, and the list."""
    other = CHECK_KEYS if "check" in allowed else MODEL_KEYS - {"check", "name"} if "max-params" in allowed else set()
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    near = [] if close else difflib.get_close_matches(key, sorted(other), n=1)
    meant = key if key in other else near[0] if near else None
    if meant is not None:
        table = ("a check: put it under [tool.torchdiag.check] (or an entry's own check table)" if other is CHECK_KEYS
                 else "a model setting: put it at the top of [tool.torchdiag] (or in a [[tool.torchdiag.models]] entry)")
        return ("" if meant == key else f"did you mean '{meant}'? ") + f"'{meant}' is {table}"
    return (f"did you mean '{close[0]}'? " if close else "") + f"known keys: {', '.join(sorted(allowed))}"


BOOL_KEYS = {"nancheck", "gradflow", "doctor", "strict"}


def validate_check(check: dict, where: str) -> dict:
    """Types of a check table: a typo or a wrong type must never switch a check off (or on)."""
    out = dict(check)
    for key, value in check.items():
        if key in BOOL_KEYS and not isinstance(value, bool):
            raise UsageError(f"{key} = {value!r} in {where} must be true or false")
        if key in OWN_TABLES and not isinstance(value, (bool, dict)):
            raise UsageError(f"{key} = {value!r} in {where} must be true, false or a table",
                             hint=f"e.g. {OWN_TABLES[key][1]}")
        if key == "allow":
            if isinstance(value, str):
                value = [value]  # one glob; a string is not split into characters
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise UsageError(f"allow = {value!r} in {where} must be a list of parameter globs",
                                 hint='e.g. allow = ["aux_head.*"]')
            out[key] = value
        if key in ("max-params", "max-trainable-params", "min-trainable-params"):
            out[key] = parse_count(value, key, where)
        if key in ("max-gmacs", "max-gflops"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"{key} = {value!r} in {where} must be a number of G{key[5:].upper()}",
                                 hint=f"e.g. {key} = 5.0 (the unit is already giga)")
            if not 0 < value < float("inf"):
                raise UsageError(f"{key} = {value!r} in {where} must be > 0 and finite")
            out[key] = float(value)
    return out


def parse_count(value, key: str, where: str = "") -> int:
    """30000, "25M", "1.5G", "800k" → a whole, positive number of parameters (a review: 58.9 was shown as 58, and
    0.5 accepted as a limit of 0)."""
    at = f"{key} = {value!r}" + (f" in {where}" if where else "")
    example = "write an integer or a string like \"25M\""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UsageError(f"{at} must be a number", hint=example)
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        m = re.fullmatch(r"\s*((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([kKmMgGtT]?)\s*", value)   # "1e6" too
        if not m:
            raise UsageError(f"{at} is not a number", hint=example)
        n = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    if not 0 < n < float("inf"):
        raise UsageError(f"{at} must be > 0 and finite", hint=example)
    if n != round(n):
        raise UsageError(f"{at} is not a whole number of parameters", hint=example)
    return int(round(n))


def _type_error(key, value, where, expected, example):
    return UsageError(f"{key} = {value!r} in {where} must be {expected}", hint=f"e.g. {example}")


def validate_model_entry(entry: dict, where: str) -> None:
    """Types of the model keys (model, inputs, device, args, loss, batch, seed, name, check)."""
    for key, value in entry.items():
        if key in ("model", "device", "loss", "batch", "name", "checkpoint", "dtype", "amp") and not isinstance(value, str):
            raise _type_error(key, value, where, "a string", {"model": 'model = "models/net.py:build"',
                                                              "device": 'device = "cpu"', "loss": 'loss = "auto"',
                                                              "batch": 'batch = "data.py:one_batch"',
                                                              "name": 'name = "small"',
                                                              "checkpoint": 'checkpoint = "weights.safetensors"',
                                                              "dtype": 'dtype = "bfloat16"', "amp": 'amp = "bf16"'}[key])
        if key == "checkpoint" and not value.strip():   # a review: "" ran on random weights and passed
            raise UsageError(f'checkpoint = {value!r} in {where} is an empty path',
                             hint='name the weights file (checkpoint = "weights.safetensors"), or leave the key out')
        if key == "strict-checkpoint" and not isinstance(value, bool):
            raise _type_error(key, value, where, "true or false", "strict-checkpoint = false")
        if key == "inputs" and not (isinstance(value, str) or
                                    (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            raise _type_error(key, value, where, "a list of SHAPE[:DTYPE] strings", 'inputs = ["8x3x32x32"]')
        if key == "args" and not (isinstance(value, dict) or
                                  (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            raise _type_error(key, value, where, "a table or a list of KEY=VALUE strings",
                              'args = {width = 16} or args = ["width=16"]')
        if key == "seed" and (isinstance(value, bool) or not isinstance(value, int)):
            raise _type_error(key, value, where, "an integer", "seed = 0")
        if key == "check" and not isinstance(value, dict):
            raise _type_error(key, value, where, "a table", "check = {max-params = 30000}")


def own_settings(command: str, table: dict, spec, where: str):
    """The table of a check that trains (overfit-batch, lr-find) → (Options, RunSpec): validated by that
    command's own Options (the same rules as on the command line), so a bad value is reported before any
    model loads."""

    from ..commands import get
    from ..core.run import optimizer_spec
    from ..errors import OptionError

    diagnostic = get(command).diagnostic_module()
    kw = {k.replace("-", "_"): v for k, v in table.items()}
    run_kw = {k: kw.pop(k) for k in ("optimizer", "lr", "momentum", "seed") if k in kw}
    try:
        opts = diagnostic.Options(**kw)
        optimizer = optimizer_spec(diagnostic.OPTIMIZER, name=run_kw.get("optimizer"), lr=run_kw.get("lr"),
                                   momentum=run_kw.get("momentum"))
        spec = dataclasses.replace(spec, optimizer=optimizer, seed=run_kw.get("seed", spec.seed))
    except OptionError as exc:
        exc.name_for("config")
        raise UsageError(f"{command} {exc.message} in {where}", hint=exc.hint or f"e.g. {OWN_TABLES[command][1]}") from None
    return opts, spec


@dataclass
class DataCheck:
    """`data = {spec = ..., ...}` of a check table, validated before any model loads."""

    spec: str
    val: str | None
    args: list[str]
    with_model: bool             # the entry's model as `data --model` (labels vs its output size, its step timed)
    opts: Any                    # diagnostics.data Options


def data_settings(table, where: str) -> DataCheck:
    """The data table → DataCheck: keys refused by name, types checked, `data`'s Options built (its rules)."""
    from ..diagnostics.data.options import Options
    from ..errors import OptionError

    example = 'data = {spec = "data.py:train", val = "data.py:val", samples = 2000}'
    if not isinstance(table, dict):
        raise _type_error("data", table, where, "a table", example)
    _unknown(table, DATA_KEYS, f"data in {where}")
    for key in ("spec", "val"):
        if key in table and not isinstance(table[key], str):
            raise _type_error(f"data {key}", table[key], where, "a string", example)
    if not table.get("spec"):
        raise UsageError(f"data in {where} has no spec", hint=f"e.g. {example}")
    args = table.get("args", [])
    if isinstance(args, dict):
        args = [f"{k}={v!r}" for k, v in args.items()]
    elif not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
        raise _type_error("data args", args, where, "a table or a list of KEY=VALUE strings", "args = {root = \"/data\"}")
    if not isinstance(table.get("with-model", False), bool):
        raise _type_error("data with-model", table["with-model"], where, "true or false", "with-model = true")
    kw = {field: table[key] for key, field in DATA_OPTIONS.items() if key in table}
    try:
        opts = Options(pictures=False, **kw)
    except OptionError as exc:
        raise UsageError(f"data {exc.name_for('config').message} in {where}", hint=exc.hint or f"e.g. {example}") from None
    from ..core.datasets import check_data_spec

    check_data_spec(table["spec"], f"data spec in {where}")   # refused with the config, before any model runs (a
    if table.get("val"):                                      # review: after every other check had run)
        check_data_spec(table["val"], f"data val in {where}")
    return DataCheck(table["spec"], table.get("val"), list(args), table.get("with-model", False), opts)


def parse_bytes(value, key: str) -> int:
    from ..diagnostics.memory import parse_bytes as parse_size

    try:
        return int(parse_size(str(value)))
    except DiagError:
        raise
    except Exception:
        raise UsageError(f"{key} = {value!r} is not a size", hint="write e.g. \"4GiB\" or \"512MB\"") from None


def load_config(path: Path | None) -> tuple[dict, str]:
    import tomllib

    if path is None:
        path = Path("pyproject.toml")
        if not path.is_file():
            raise UsageError("no pyproject.toml in the current directory",
                             hint="run check where [tool.torchdiag] is configured, pass --config FILE, or give MODEL_SPEC")
    elif not path.is_file():
        if path.exists():   # a folder, FIFO, socket or device: said as such, never opened
            from ..core.limits import regular_file

            regular_file(str(path), "config file")
        raise UsageError(f"config file not found: {path}")
    try:
        doc = tomllib.loads(_bounded_toml(path))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start}): TOML files must be UTF-8",
                         hint="save the file as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from exc
    table = _tool_table(doc, path)
    if table is None:
        if path.name == "pyproject.toml" or "tool" in doc:
            table = {}
        else:
            table = doc  # a dedicated file may hold the keys at top level
    return table, str(path)


def _bounded_toml(path: Path) -> str:
    """The file's text, refused before tomllib recurses or reads without end (a FIFO, a 20k-deep array)."""
    from ..core.limits import read_text, toml_depth

    text = read_text(str(path), "config file")
    try:
        toml_depth(text)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc.message}", hint=exc.hint) from None
    return text


def _tool_table(doc: dict, path: Path):
    """[tool.torchdiag], None when absent; any other shape (tool = 5, torchdiag = "x", [[tool.torchdiag]]) is refused."""
    tool = doc.get("tool")
    if tool is not None and not isinstance(tool, dict):
        raise UsageError(f"tool = {str(tool)[:40]} in {path} must be a table", hint="write [tool.torchdiag] as a table header")
    table = (tool or {}).get("torchdiag")
    if table is not None and not isinstance(table, dict):
        raise UsageError(f"[tool] torchdiag in {path} is a {type(table).__name__}, not a table",
                         hint="write [tool.torchdiag] once, as a table (several models: [[tool.torchdiag.models]])")
    return table


def models_from_config(table: dict, source: str, overrides: dict, check_overrides: dict | None = None) -> list[ModelConfig]:
    _unknown(table, ROOT_KEYS, f"[tool.torchdiag] of {source}")
    validate_model_entry(table, f"[tool.torchdiag] of {source}")
    base_check = table.get("check", {})
    entries = table.get("models")
    if entries is not None and not (isinstance(entries, list) and all(isinstance(e, dict) for e in entries)):
        raise UsageError(f"[tool.torchdiag] models must be an array of tables ([[tool.torchdiag.models]]) in {source}")
    if entries is not None and not entries:
        raise UsageError(f"[tool.torchdiag] models is empty in {source}", hint="add [[tool.torchdiag.models]] entries")
    # Everything in the file is checked first, even what the command line replaces: a typo is never hidden.
    if base_check:   # its own errors named by its own table (a sweep: they were said to be in [tool.torchdiag])
        table_name = f"the check table of [tool.torchdiag] of {source}"
        _validated_checks(dict(base_check), table_name, table_name)
    if entries is not None and table.get("model") and all(e.get("model") for e in entries) and not overrides.get("model"):
        raise UsageError(f'model = "{table["model"]}" at the top of [tool.torchdiag] in {source} is a default no entry '
                         "uses: every [[tool.torchdiag.models]] names its own model",
                         hint="move it into a [[tool.torchdiag.models]] entry of its own (the top-level model is only a "
                              "default for entries that name none)")
    file_entries = entries if entries is not None else [{k: v for k, v in table.items() if k in MODEL_KEYS}]
    file_checks = []
    for i, entry in enumerate(file_entries):
        where = f"[[tool.torchdiag.models]] #{i + 1} of {source}" if entries is not None else f"[tool.torchdiag] of {source}"
        _unknown(entry, MODEL_KEYS, where)
        validate_model_entry(entry, where)
        check = dict(base_check)
        check.update(entry.get("check", {}))
        file_checks.append((entry, where, _validated_checks(check, f"the check table of {where}", where)))
    cli_check = _validated_checks(dict(check_overrides or {}), "the command line", "the command line")
    if entries is not None and overrides.get("model"):
        # MODEL_SPEC given: check that one model, with the top-level settings
        file_checks = [({}, "the command line", _validated_checks(dict(base_check), "[tool.torchdiag.check]", source))]
    out = []
    for entry, where, check in file_checks:
        merged = {k: v for k, v in table.items() if k in MODEL_KEYS - {"check", "name"}}
        merged.update(entry)
        merged.update({k: v for k, v in overrides.items() if v not in (None, [], ())})
        check = {**check, **cli_check}
        if not merged.get("model"):
            raise UsageError(f"no model in {where}", hint='set model = "path/to/model.py:build" or give MODEL_SPEC')
        args = merged.get("args", [])
        if isinstance(args, dict):
            args = [f"{k}={v!r}" for k, v in args.items()]
        inputs = merged.get("inputs", [])
        if isinstance(inputs, str):
            inputs = [inputs]
        out.append(_model_config(entry.get("name") or merged["model"], merged, list(inputs), list(args), check, where))
    return out


def _model_config(name: str, merged: dict, inputs: list, args: list, check: dict, where: str) -> ModelConfig:
    """One model's RunSpec (validated here, named as pyproject keys) and its check table; the
    overfit-batch settings become overfit-batch's own Options now, before any model loads."""
    from ..errors import OptionError
    from .job import run_spec

    fields = {CONFIG[key]: value for key, value in merged.items() if key in CONFIG}
    fields.update(args=args, inputs=inputs, seed=int(merged.get("seed", 0)))
    try:
        spec = run_spec("check", caller="config", model=merged["model"], **fields)
    except OptionError as exc:
        raise UsageError(f"{exc.name_for('config').message} in {where}", hint=exc.hint) from None
    check = dict(check)
    for command in OWN_TABLES:
        if check.get(command, False) is not False:   # {} is "run with the defaults", never off
            own = check[command] if isinstance(check[command], dict) else {}
            check[f"_{command}"] = own_settings(command, own, spec, where)
    return ModelConfig(name, dataclasses.replace(spec, trains=_heaviest(check)), check)


def _heaviest(check: dict) -> str | None:
    """What the heaviest configured check runs on the model itself (the registry's `trains` of its command, up to
    "backward"): the model is sized for it when it loads (core.resources.room_for_model), as that command alone
    would be (a review: gradflow refused alone was run by check on weights counted alone). A check that trains a
    copy has its copy's room asked when it is made, with the optimizer of its own table (a review: sized at load
    with the check's Adam, an SGD overfit-batch was refused)."""
    on = [c for c in ("nancheck", "gradflow", "doctor") if check.get(c)]
    on += [c for c in ("overfit-batch", "lr-find") if check.get(c, False) is not False]
    on += ["memory"] if "max-peak-memory" in check else []
    heaviest = max((BY_NAME[c].trains for c in on), key=TRAINS.index, default=None) or "forward"
    return "backward" if heaviest == "step" else heaviest


def _validated_checks(check: dict, table_where: str, where: str) -> dict:
    _unknown(check, CHECK_KEYS, table_where)
    check = validate_check(check, where)
    for command, (keys, _) in OWN_TABLES.items():
        if isinstance(check.get(command), dict):
            _unknown(check[command], keys, f"{command} in {where}")
    if "max-peak-memory" in check:  # a bad size is reported before any model runs
        check["max-peak-memory"] = parse_bytes(check["max-peak-memory"], "max-peak-memory")
    if "data" in check:   # likewise the data table: its keys, types and options
        check["data"] = data_settings(check["data"], where)
    return check


def _first_error(result, allow=()) -> str:
    errors = [f for f in result.findings if f.severity == "error" and not f.accepted_by(allow)]
    if not errors:
        return ""
    f = errors[0]
    # said as findings: "(+3 more)" after a message read as more NaN or more names (a sweep)
    more = f" (and {len(errors) - 1} more error finding{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{f.code} {f.where}: {f.message}{more}"


def _said(exc: DiagError) -> str:
    return f"{exc.message} (hint: {exc.hint})" if exc.hint else exc.message


class _Interrupted(Exception):
    """Ctrl-C or SIGTERM while a check ran: that check is recorded as interrupted and check stops."""


class _Recorder:
    """Runs one check after another and records each outcome, timed."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.outcomes: list[CheckOutcome] = []

    def __call__(self, check: str, fn, limit: str = "", limit_value: float | None = None, unit: str = "",
                 batch: int | None = None) -> None:
        """fn() -> (passed, figure, message) or, for a threshold, (passed, figure, message, value in `unit`)."""
        t0 = time.perf_counter()
        value = None
        try:
            passed, figure, message, *measured = fn()
            value = measured[0] if measured else None
            code = 0 if passed else 1
        except KeyboardInterrupt as exc:  # Ctrl-C (130) or SIGTERM (143)
            self.outcomes.append(CheckOutcome(self.model_name, check, None, "interrupted", limit,
                                              "interrupted before it finished", time.perf_counter() - t0,
                                              int(interrupt_code(exc))))
            raise _Interrupted() from None
        except DiagError as exc:   # a batch the check cannot use (exit 2) errs this check, not the gate's report
            code = int(exc.code)
            passed, figure, message = None, "input error" if code == ExitCode.USAGE else "error", _said(exc)
        self.outcomes.append(CheckOutcome(self.model_name, check, passed, figure, limit, message,
                                          time.perf_counter() - t0, code, value,
                                          limit_value if value is not None else None, unit if value is not None else "",
                                          batch if value is not None else None))


def run_checks(cfg: ModelConfig) -> list[CheckOutcome]:
    """All checks configured for one model; a model that raises fails its checks with exit 3."""
    from ..core.context import prepare

    record = _Recorder(cfg.name)
    if not _configured(cfg.check):   # said before the model is built (a sweep: 10 s of a Whisper's build and probes)
        raise _nothing_configured(cfg.name)
    try:
        model, inputs, ctx = prepare(cfg.spec)
    except DiagError as exc:
        if exc.code == ExitCode.USAGE:
            raise
        record.outcomes.append(CheckOutcome(cfg.name, "load", None, "error", "", exc.message, 0.0, int(exc.code)))
        return record.outcomes
    ctx = _checkpoint_outcomes(ctx, record)
    ctx.loss()   # a loss the config names wrong (no file, no function) is a configuration error: refused before any check
    before = len(record.outcomes)
    try:
        _size_checks(cfg.check, model, inputs, ctx, record)
        _diagnostic_checks(cfg.check, model, inputs, ctx, record)
    except _Interrupted:
        return record.outcomes
    if len(record.outcomes) == before:   # only the checkpoint's own outcome: no check was configured
        raise _nothing_configured(cfg.name)
    return record.outcomes


def _configured(c: dict) -> bool:
    """Whether the config turns on a check (the keys _size_checks and _diagnostic_checks read, as they read them)."""
    present = ("max-params", "max-trainable-params", "min-trainable-params", "max-gmacs", "max-gflops",
               "max-peak-memory", "data")
    return any(k in c for k in present) or any(c.get(k) for k in ("nancheck", "gradflow", "doctor")) \
        or any(c.get(k, False) is not False for k in ("overfit-batch", "lr-find"))


def _nothing_configured(name: str) -> UsageError:
    return UsageError(f"no checks configured for {name}",
                      hint="add [tool.torchdiag.check] with e.g. max-params, max-gmacs, nancheck, gradflow, overfit-batch, "
                           "lr-find, data")


def _checkpoint_outcomes(ctx, record):
    """strict-checkpoint = false: keys that did not fit fail a `checkpoint` outcome of their own (exit 1),
    and are taken off the context so that no diagnostic's verdict carries them."""

    for report in ctx.checkpoints:
        if not report.fits:
            record.outcomes.append(CheckOutcome(record.model_name, "checkpoint", False, "does not fit", "fits the model",
                                                f"{report.path}: {report.mismatch_summary(6)}", 0.0, 1))
    return dataclasses.replace(ctx, checkpoints=[]) if ctx.checkpoints else ctx


def _size_checks(c: dict, model, inputs, ctx, record) -> None:
    """max-params, max-trainable-params, min-trainable-params, max-gmacs, max-gflops."""
    from ..diagnostics import flops
    from .local import invoke

    def count(trainable_only: bool) -> int:   # tied parameters once
        return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad or not trainable_only)

    for key, trainable_only in (("max-params", False), ("max-trainable-params", True)):
        if key in c:
            def params(limit=c[key], trainable_only=trainable_only):
                n = count(trainable_only)
                return n <= limit, f"{n:,}", "" if n <= limit else f"{n:,} parameters > limit {int(limit):,}", n
            record(key, params, f"{int(c[key]):,}", int(c[key]), "parameters")
    if "min-trainable-params" in c:   # a floor: a layer frozen by mistake (requires_grad=False) fails it
        def trainable(floor=c["min-trainable-params"]):
            n = count(True)
            return n >= floor, f"{n:,}", "" if n >= floor else f"{n:,} trainable parameters < floor {int(floor):,}", n
        record("min-trainable-params", trainable, f"{int(c['min-trainable-params']):,}", int(c["min-trainable-params"]),
               "parameters")
    cache: dict = {}
    counted, batch = _per_sample(inputs)
    at = f" at batch {batch}" if batch > 1 else ""
    for key, data_key, unit in (("max-gmacs", "forward_macs", "GMACs"), ("max-gflops", "forward_flops", "GFLOPs")):
        if key in c:
            def check_flops(limit=c[key], data_key=data_key, unit=unit):
                if "r" not in cache:
                    cache["r"] = invoke(flops, model, counted, flops.Options(depth=0), ctx)
                g = cache["r"].data[data_key] / 1e9
                shown = f"{_against(g, limit)} {unit}{at}"
                return g <= limit, shown, "" if g <= limit else f"{shown} > limit {limit:g}", g
            record(key, check_flops, f"{c[key]:g} {unit}", c[key], unit, batch if batch > 1 else None)


def _per_sample(inputs):
    """(the inputs to count operations on, their batch). A source's default inputs are widened to a batch of 2 or 3
    for the training checks (core/sources.for_training); counted there, a model's MACs were 2-3× what `flops`
    says of one sample (a sweep: resnet18 5.44 GMACs against 1.81). Those are cut to their first sample; the
    user's own inputs are counted as given, and their batch is said with the figure."""
    n = inputs.batch_size or 1
    one = inputs.first(1) if inputs.chosen and n > 1 else None
    return (one, 1) if one is not None else (inputs, n)


def _against(value: float, limit: float) -> str:
    """The value with as many significant digits (4 at least) as it takes to be seen on the right side of the
    limit: 2,424,832 MACs against 0.0024 GMACs is 0.002425, not 0.002 (a review: "0.002 > limit 0.0024")."""
    for digits in range(4, 17):
        text = f"{value:.{digits}g}"
        if (float(text) > limit) == (value > limit) and (float(text) == limit) == (value == limit):
            return text
    return repr(value)


def _own(diagnostic, ctx):
    """The model's context with the diagnostic's own default optimizer (as on its command line)."""

    optimizer = getattr(diagnostic, "OPTIMIZER", None)
    return ctx if optimizer is None else dataclasses.replace(ctx, spec=dataclasses.replace(ctx.spec, optimizer=optimizer))


def _diagnostic_checks(c: dict, model, inputs, ctx, record) -> None:
    """nancheck, gradflow, overfit-batch, doctor, max-peak-memory: each through its diagnostic."""

    from ..diagnostics import doctor, gradflow, memory, nancheck, overfit_batch
    from .local import invoke

    allow = list(c.get("allow", []))
    if c.get("nancheck"):
        def nan():
            bad = _first_error(invoke(nancheck, model, inputs, nancheck.Options(), _own(nancheck, ctx)))
            return not bad, "all finite" if not bad else bad.split(":")[0], bad
        record("nancheck", nan)
    if c.get("gradflow"):
        def grads():
            r = invoke(gradflow, model, inputs, gradflow.Options(allow=allow, strict=bool(c.get("strict", False))), ctx)
            return _gradflow_verdict(r)
        record("gradflow", grads, f"allow {allow}" if allow else "")
    if c.get("overfit-batch", False) is not False:
        opts, spec = c["_overfit-batch"]

        def overfit():
            r = invoke(overfit_batch, model, inputs, opts, dataclasses.replace(ctx, spec=spec))
            d = r.data
            if d.get("interrupted"):  # overfit-batch keeps its partial curve on Ctrl-C; check records it as such
                raise Terminated() if r.exit_code == ExitCode.TERMINATED else KeyboardInterrupt()
            figure = f"loss {d.get('initial_loss', float('nan')):.4g} → {d.get('final_loss', float('nan')):.4g}"
            if d.get("passed"):
                return True, *_passed_above(r, opts, figure)
            if d.get("memorised") and not _first_error(r):   # every sample right, the loss at its own floor
                floor = next(f for f in r.findings if f.code == "loss-floor")
                return True, figure + " (memorised; the loss at its own floor)", f"{floor.code}: {floor.message}"
            bad = _first_error(r)
            held = next((f for f in r.findings if f.code == "capacity-limited"), None)
            if held and not bad:   # the batch is beyond the model's capacity; two samples are memorised (info)
                return True, figure + " (beyond its capacity; two samples memorised)", f"{held.code}: {held.message}"
            noise = next((f for f in r.findings if f.code == "sampled-loss"), None)
            if noise and not bad:   # memorised with its random draws held fixed: a warning, failing under strict
                return not c.get("strict", False), figure + " (memorised with its draws held fixed)", \
                    f"{noise.code}: {noise.message}"
            later = next((f for f in r.findings if f.code == "not-overfit-yet"), None)
            if later and not bad:   # the budget ran out while the loss still fell: a warning, failing under strict
                ok = later.severity == "info" or not c.get("strict", False)   # info: the default optimizer fits it
                return ok, figure + " (still falling)", f"{later.code}: {later.message}"
            why = next((f for f in r.findings if f.code == "optimizer-cannot-fit"), None)   # what to change
            return False, figure, (bad or "cannot overfit") + (f"; {why.code}: {why.message}" if why else "")
        record("overfit-batch", overfit, _overfit_limit(opts))
    if c.get("lr-find", False) is not False:   # {} runs with the defaults
        _lr_find_check(c["_lr-find"], model, inputs, ctx, record)
    if c.get("doctor"):
        def doc():
            return _findings_verdict(invoke(doctor, model, inputs, doctor.Options(), _own(doctor, ctx)), allow,
                                     bool(c.get("strict", False)))
        record("doctor", doc)
    if "max-peak-memory" in c:
        from ..fmt import human_bytes

        limit = c["max-peak-memory"]

        def mem():
            peak = int(invoke(memory, model, inputs, memory.Options(), _own(memory, ctx)).data["peak_bytes"])
            shown = human_bytes(peak)
            if shown == human_bytes(limit) and peak != limit:   # "1.00 GiB > 1.00 GiB" says nothing: the bytes do
                shown += f" ({peak:,} bytes)"
            return peak <= limit, shown, "" if peak <= limit else f"peak {shown} > {human_bytes(limit)}", peak
        record("max-peak-memory", mem, human_bytes(limit), limit, "bytes")
    if "data" in c:
        _data_check(c["data"], model, ctx, record, bool(c.get("strict", False)))


def _data_check(dc: DataCheck, model, ctx, record, strict: bool) -> None:
    """`data` on the configured data (the entry's model too with with-model): an error finding fails it, and a
    warning under strict."""
    from ..core.datasets import load_data
    from ..diagnostics import data

    def run_data():   # (a spec naming no file was refused with the config: data_settings)
        train = load_data(dc.spec, dc.args, ctx.seed, option="data spec")
        val = load_data(dc.val, dc.args, ctx.seed, option="data val") if dc.val else None
        own = ctx if dc.with_model else data.context(str(ctx.device), ctx.seed, ctx.spec.loss, "config")
        r = data.run_data(train, dc.opts, own, val=val, model=model if dc.with_model else None)
        if r.data.get("interrupted"):   # run_data keeps its partial result on Ctrl-C; check records it as such
            raise Terminated() if r.exit_code == ExitCode.TERMINATED else KeyboardInterrupt()
        return _findings_verdict(r, (), strict)   # allow's globs are parameters' places, not the data's
    record("data", run_data, dc.spec + (f" + {dc.val}" if dc.val else ""))


def _gradflow_verdict(r) -> tuple[bool, str, str]:
    """(passed, figure, why not) of gradflow's run: the figure counts what failed it (errors, or warnings under
    strict) and says what allow accepted (a sweep: "0 problem(s)" beside FAIL under strict, and accepted
    parameters hidden behind "all trainable parameters get gradients")."""
    errors = [f for f in r.findings if f.severity == "error"]
    warned = [f for f in r.findings if f.severity == "warning"]
    bad = _first_error(r) or ("" if r.exit_code == 0 else
                              f"warnings fail under strict: {warned[0].code}: {warned[0].message}" if warned else "failed")
    if bad:
        return False, f"{len(errors)} error finding(s)" if errors else f"{len(warned)} warning(s)", bad
    rows = r.table("params").rows
    frozen = sum(row["numel"] for row in rows if row.get("status") == "frozen")
    accepted = sum(1 for row in rows if row.get("allowed")) + sum(
        1 for f in r.findings if f.severity == "info" and f.code in ("dead-units", "saturated") and "(accepted by" in f.message)
    quiet = any(f.code == "not-reached" for f in r.findings)
    good = f"{accepted} accepted by allow, the others get gradients" if accepted else "all trainable parameters get gradients"
    return True, (good + (f", {frozen:,} values frozen" if frozen else "")
                  + (" (some not reached by the default inputs)" if quiet else "")), ""


def _findings_verdict(r, allow, strict: bool) -> tuple[bool, str, str]:
    """(passed, the figure, why not) of a result judged by its findings: an error fails; under strict a warning
    too (a sweep: bfloat16's update-rounds-away read clean under doctor; raw 0-255 pixels read `clean` under data)."""
    n = sum(1 for f in r.findings if f.severity == "error" and not f.accepted_by(allow))
    bad = _first_error(r, allow).split(" (+")[0]
    warned = [f for f in r.findings if f.severity == "warning" and not f.accepted_by(allow)]
    accepted = sum(1 for f in r.findings if f.severity in ("error", "warning") and f.accepted_by(allow))
    if not bad and warned and strict:
        return False, f"{len(warned)} warning(s)", f"warnings fail under strict: {warned[0].code}: {warned[0].message}"
    figure = f"{len(warned)} warning(s)" if warned else f"{accepted} accepted by allow" if accepted else "clean"
    return not bad, figure if not bad else f"{n} error finding(s)", bad


# the overfit-batch findings that pass a loss above the limit, and what the check row says of each
_PASSED_ABOVE = {"made-target-out-of-range": "at the floor its output's range allows",
                 "bounded-output": "at the floor its output's range allows",
                 "other-outputs-unfitted": "memorised on one output"}


def _overfit_limit(opts) -> str:
    """Either limit passes (loop.reached); a target below 0 judges alone (a sweep: the ratio went unsaid beside a
    target-loss, and a loss under the ratio passed against "≤ 0.1")."""
    ratio = f"≤ {opts.target_ratio:g} × initial"
    if opts.target_loss is None:
        return ratio
    return f"≤ {opts.target_loss:g}" if opts.target_loss < 0 else f"{ratio} or ≤ {opts.target_loss:g}"


def _passed_above(r, opts, figure: str) -> tuple[str, str]:
    """(figure, message) of an overfit-batch PASS: one whose loss ended above both limits (the ratio's, and
    --target-loss where given: either passes) passed for a reason a finding tells, said beside the figure (a sweep:
    "loss 3.042 → 0.1828 │ ≤ 0.01 × initial │ PASS", unexplained; a review: a pass by the ratio under a
    target-loss of 1e-9 was given a range it does not have)."""
    d = r.data
    initial, final = d.get("initial_loss"), d.get("final_loss")
    if initial is None or final is None or final <= opts.target_ratio * initial or (
            opts.target_loss is not None and final <= opts.target_loss):
        return figure, ""
    why = next((f for f in r.findings if f.code in _PASSED_ABOVE and f.severity == "info"), None)
    return (figure + f" ({_PASSED_ABOVE[why.code]})", f"{why.code}: {why.message}") if why else (figure, "")


def _lr_find_check(settings, model, inputs, ctx, record) -> None:
    """lr-find: fails on an error finding (no rate trains, a non-finite loss); no suggestion is a warning."""

    from ..diagnostics import lr_find
    from .local import invoke

    opts, spec = settings

    def lrf():
        r = invoke(lr_find, model, inputs, opts, dataclasses.replace(ctx, spec=spec))
        d = r.data
        if d.get("status") == "interrupted":   # the partial curve has no verdict: recorded as interrupted
            raise Terminated() if r.exit_code == ExitCode.TERMINATED else KeyboardInterrupt()
        bad = _first_error(r)
        figure = (f"recommended lr {d['recommended']:.3g}" if d.get("recommended") is not None else
                  f"suggested lr {d['suggestion']:.3g} (not checked)" if d.get("suggestion") is not None else
                  "no suggestion")
        return not bad, figure, bad
    record("lr-find", lrf, "a rate that trains")


def run(models: list[ModelConfig], source: str) -> Result:
    result = Result("check", header={"config": source, "models": [m.name for m in models]})
    precision = [f"{m.name}: " + ", ".join(f"{k} {v}" for k, v in (("dtype", m.spec.dtype), ("amp", m.spec.amp)) if v)
                 for m in models if m.spec.dtype or m.spec.amp]
    if precision:   # a sweep: a config's dtype did apply, and nothing said so
        result.header["precision"] = precision
    outcomes: list[CheckOutcome] = []
    for cfg in models:
        outcomes.extend(run_checks(cfg))
        if outcomes and outcomes[-1].code in INTERRUPTS:
            break
    result.tables.append(_table(outcomes, multi=len(models) > 1))
    for o in outcomes:
        if o.code in INTERRUPTS:
            result.add("check-interrupted", "warning", f"{o.model}::{o.check}", o.message)
        elif o.passed is False:
            result.add("check-failed", "error", f"{o.model}::{o.check}", o.message or "failed")
        elif o.passed is None:
            result.add("check-error", "error", f"{o.model}::{o.check}", o.message)
    n_fail = sum(1 for o in outcomes if not o.passed)
    result.data.update({"passed": n_fail == 0, "failed": n_fail, "total": len(outcomes)})
    codes = {o.code for o in outcomes}
    interrupted = bool(codes & INTERRUPTS)
    result.code = (max(codes & INTERRUPTS) if interrupted else 3 if 3 in codes else
                   int(ExitCode.USAGE) if ExitCode.USAGE in codes else None)
    result.data["interrupted"] = interrupted
    result.verdict = (f"INTERRUPTED: {outcomes[-1].check} did not finish; {len(outcomes) - 1} check(s) ran before it"
                      if interrupted else f"PASS: {len(outcomes)} check(s) passed" if n_fail == 0 else
                      f"FAIL: {n_fail} of {len(outcomes)} check(s) failed")
    return result


def _status(o: CheckOutcome) -> str:
    if o.code in INTERRUPTS:
        return "INTERRUPTED"
    return "PASS" if o.passed else ("FAIL" if o.passed is False else "ERROR")


def _table(outcomes: list[CheckOutcome], multi: bool) -> Table:
    rows = [{"model": o.model, "check": o.check, "figure": o.figure, "limit": o.limit, "status": _status(o),
             "passed": bool(o.passed), "message": o.message, "seconds": round(o.seconds, 3),
             "value": o.value, "limit_value": o.limit_value, "unit": o.unit or None, "batch": o.batch,
             "_style": None if o.passed else "yellow" if o.code in INTERRUPTS else "red"}
            for o in outcomes]
    cols = ([Column("model", "model")] if multi else []) + [
        Column("check", "check"), Column("figure", "figure"), Column("limit", "limit"), Column("status", "result", "status")]
    return Table("checks", "Checks", cols, rows)
