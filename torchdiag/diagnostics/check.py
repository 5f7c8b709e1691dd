"""check: the CI gate. Runs the configured diagnostics on one or more models with thresholds.

Config: `[tool.torchdiag]` in ./pyproject.toml, or `--config FILE` (a TOML file with the same
tables, `[tool.torchdiag]` or top-level). Command-line options override the file. Unknown keys
are an error that names the key: a typo must not silently switch a check off."""
from __future__ import annotations

import difflib
import fnmatch
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DiagError, ExitCode, UsageError, one_line
from ..results import Column, Result, Table

MODEL_KEYS = {"model", "inputs", "device", "args", "loss", "batch", "seed", "name", "check"}
CHECK_KEYS = {"max-params", "max-trainable-params", "max-gmacs", "max-gflops", "nancheck", "gradflow",
              "overfit-batch", "doctor", "allow", "strict", "max-peak-memory"}
OVERFIT_KEYS = {"steps", "target-ratio", "target-loss", "lr", "optimizer", "seed"}
ROOT_KEYS = MODEL_KEYS | {"models"}


@dataclass
class ModelConfig:
    name: str
    model: str
    inputs: list[str] = field(default_factory=list)
    device: str = "auto"
    args: list[str] = field(default_factory=list)
    loss: str = "auto"
    batch: str | None = None
    seed: int = 0
    check: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckOutcome:
    model: str
    check: str
    passed: bool | None          # None: could not run (the model raised)
    figure: str
    limit: str
    message: str = ""
    seconds: float = 0.0
    code: int = 0                # exit code this outcome implies (0, 1, 3)


def _unknown(keys, allowed, where: str):
    for key in keys:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            raise UsageError(f"unknown key '{key}' in {where}",
                             hint=(f"did you mean '{close[0]}'? " if close else "") +
                                  f"known keys: {', '.join(sorted(allowed))}")


BOOL_KEYS = {"nancheck", "gradflow", "doctor", "strict"}


def validate_check(check: dict, where: str) -> dict:
    """Types of a check table: a typo or a wrong type must never switch a check off (or on)."""
    out = dict(check)
    for key, value in check.items():
        if key in BOOL_KEYS and not isinstance(value, bool):
            raise UsageError(f"{key} = {value!r} in {where} must be true or false")
        if key == "overfit-batch" and not isinstance(value, (bool, dict)):
            raise UsageError(f"overfit-batch = {value!r} in {where} must be true, false or a table",
                             hint="e.g. overfit-batch = {steps = 200, target-ratio = 0.05}")
        if key == "allow":
            if isinstance(value, str):
                value = [value]  # one glob; a string is not split into characters
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise UsageError(f"allow = {value!r} in {where} must be a list of parameter globs",
                                 hint='e.g. allow = ["aux_head.*"]')
            out[key] = value
        if key in ("max-params", "max-trainable-params"):
            out[key] = parse_count(value, key)
        if key in ("max-gmacs", "max-gflops"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"{key} = {value!r} in {where} must be a number of G{key[5:].upper()}",
                                 hint=f"e.g. {key} = 5.0 (the unit is already giga)")
            if not 0 < value < float("inf"):
                raise UsageError(f"{key} = {value!r} in {where} must be > 0 and finite")
            out[key] = float(value)
    return out


def parse_count(value, key: str) -> float:
    """30000, "25M", "1.5G", "800k" → a positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UsageError(f"{key} must be a number, got {value!r}", hint="write an integer or a string like \"25M\"")
    if isinstance(value, (int, float)):
        if not 0 < value < float("inf"):
            raise UsageError(f"{key} = {value!r} must be > 0 and finite")
        return float(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtT]?)\s*", value)
    if not m:
        raise UsageError(f"{key} = {value!r} is not a number", hint="write an integer or a string like \"25M\"")
    n = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    if n <= 0:
        raise UsageError(f"{key} = {value!r} must be > 0")
    return n


def _type_error(key, value, where, expected, example):
    return UsageError(f"{key} = {value!r} in {where} must be {expected}", hint=f"e.g. {example}")


def validate_model_entry(entry: dict, where: str) -> None:
    """Types of the model keys (model, inputs, device, args, loss, batch, seed, name, check)."""
    for key, value in entry.items():
        if key in ("model", "device", "loss", "batch", "name") and not isinstance(value, str):
            raise _type_error(key, value, where, "a string", {"model": 'model = "models/net.py:build"',
                                                              "device": 'device = "cpu"', "loss": 'loss = "auto"',
                                                              "batch": 'batch = "data.py:one_batch"',
                                                              "name": 'name = "small"'}[key])
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


def validate_overfit(ov: dict, where: str) -> None:
    for key, value in ov.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key in ("steps", "seed") and (isinstance(value, bool) or not isinstance(value, int) or
                                         (key == "steps" and value < 1) or value < 0):
            raise _type_error(f"overfit-batch {key}", value, where, "a positive integer" if key == "steps"
                              else "an integer ≥ 0", "overfit-batch = {steps = 200}")
        if key in ("target-ratio", "target-loss", "lr") and value is not None and (not number or not value >= 0 or
                                                                                  (key != "target-loss" and value == 0)):
            raise _type_error(f"overfit-batch {key}", value, where,
                              "a number ≥ 0" if key == "target-loss" else "a number > 0",
                              "overfit-batch = {target-ratio = 0.05}")
        if key == "optimizer" and value not in ("adam", "adamw", "sgd"):
            raise _type_error("overfit-batch optimizer", value, where, "adam, adamw or sgd", 'overfit-batch = {optimizer = "sgd"}')


def parse_bytes(value, key: str) -> int:
    from .memory import parse_bytes as parse_size

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
        raise UsageError(f"config file not found: {path}")
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from exc
    table = doc.get("tool", {}).get("torchdiag")
    if table is None:
        if path.name == "pyproject.toml" or "tool" in doc:
            table = {}
        else:
            table = doc  # a dedicated file may hold the keys at top level
    return table, str(path)


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
        out.append(ModelConfig(name=entry.get("name") or merged["model"], model=merged["model"],
                               inputs=list(inputs), device=merged.get("device", "auto"), args=list(args),
                               loss=merged.get("loss", "auto"), batch=merged.get("batch"),
                               seed=int(merged.get("seed", 0)), check=check))
    return out


def _validated_checks(check: dict, table_where: str, where: str) -> dict:
    _unknown(check, CHECK_KEYS, table_where)
    check = validate_check(check, where)
    ov = check.get("overfit-batch")
    if isinstance(ov, dict):
        _unknown(ov, OVERFIT_KEYS, f"overfit-batch in {where}")
        validate_overfit(ov, where)
    if "max-peak-memory" in check:
        parse_bytes(check["max-peak-memory"], "max-peak-memory")  # a bad size is reported before any model runs
    return check


def _prepare(cfg: ModelConfig):
    from ..cli.common import CommonOptions
    from ..core.target import prepare

    opts = CommonOptions("check", cfg.model, cfg.args, cfg.inputs, cfg.device, cfg.seed, loss=cfg.loss, batch=cfg.batch)
    return prepare(opts)


def _first_error(result) -> str:
    errors = [f for f in result.findings if f.severity == "error"]
    if not errors:
        return ""
    f = errors[0]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{f.code} {f.where}: {f.message}{more}"


def run_checks(cfg: ModelConfig) -> list[CheckOutcome]:
    """All checks configured for one model; a model that raises fails its checks with exit 3."""
    c = cfg.check
    outcomes: list[CheckOutcome] = []

    def record(check, fn, limit=""):
        t0 = time.perf_counter()
        try:
            passed, figure, message = fn()
            code = 0 if passed else 1
        except DiagError as exc:
            if exc.code == ExitCode.USAGE:
                raise
            passed, figure, message, code = None, "error", exc.message, int(exc.code)
        outcomes.append(CheckOutcome(cfg.name, check, passed, figure, limit, message, time.perf_counter() - t0, code))

    try:
        target = _prepare(cfg)
    except DiagError as exc:
        if exc.code == ExitCode.USAGE:
            raise
        outcomes.append(CheckOutcome(cfg.name, "load", None, "error", "", exc.message, 0.0, int(exc.code)))
        return outcomes
    model, inputs = target.model, target.inputs
    allow = list(c.get("allow", []))

    for key, trainable_only in (("max-params", False), ("max-trainable-params", True)):
        if key in c:
            limit = c[key]

            def params(limit=limit, trainable_only=trainable_only):
                ps = {id(p): p for p in model.parameters()}.values()
                n = sum(p.numel() for p in ps if p.requires_grad or not trainable_only)
                return n <= limit, f"{n:,}", "" if n <= limit else f"{n:,} parameters > limit {int(limit):,}"
            record(key, params, f"{int(limit):,}")

    if "max-gmacs" in c or "max-gflops" in c:
        from . import flops

        def compute():
            r = flops.run(model, inputs, flops.Options(depth=0))
            return r.data["forward_macs"], r.data["forward_flops"]
        cache: dict = {}
        for key, idx, unit in (("max-gmacs", 0, "GMACs"), ("max-gflops", 1, "GFLOPs")):
            if key in c:
                limit = c[key]

                def check_flops(limit=limit, idx=idx, unit=unit):
                    if "v" not in cache:
                        cache["v"] = compute()
                    g = cache["v"][idx] / 1e9
                    return g <= limit, f"{g:.3f} {unit}", "" if g <= limit else f"{g:.3f} {unit} > limit {limit:g}"
                record(key, check_flops, f"{limit:g} {unit}")

    if c.get("nancheck"):
        from . import nancheck

        def nan():
            r = nancheck.run(model, inputs, nancheck.Options(loss=target.loss(), seed=cfg.seed))
            bad = _first_error(r)
            return not bad, "all finite" if not bad else bad.split(":")[0], bad
        record("nancheck", nan)

    if c.get("gradflow"):
        from . import gradflow

        def grads():
            r = gradflow.run(model, inputs, gradflow.Options(loss=target.loss(), allow=allow,
                                                             strict=bool(c.get("strict", False))))
            bad = _first_error(r) or ("" if r.exit_code == 0 else "warnings fail under strict")
            n = len([f for f in r.findings if f.severity == "error"])
            return not bad, ("all parameters get gradients" if not bad else f"{n} problem(s)"), bad
        record("gradflow", grads, f"allow {allow}" if allow else "")

    if c.get("overfit-batch"):
        from . import overfit_batch

        ov = c["overfit-batch"] if isinstance(c["overfit-batch"], dict) else {}
        kw = {k.replace("-", "_"): v for k, v in ov.items()}
        kw.setdefault("seed", cfg.seed)

        def overfit():
            r = overfit_batch.run(model, inputs, overfit_batch.Options(loss=target.loss(), **kw))
            d = r.data
            figure = f"loss {d.get('initial_loss', float('nan')):.4g} → {d.get('final_loss', float('nan')):.4g}"
            return bool(d.get("passed")), figure, "" if d.get("passed") else (_first_error(r) or "cannot overfit")
        limit = f"≤ {ov.get('target-ratio', overfit_batch.Options.target_ratio)} × initial"
        if "target-loss" in ov:
            limit = f"≤ {ov['target-loss']}"
        record("overfit-batch", overfit, limit)

    if c.get("doctor"):
        from . import doctor

        def doc():
            r = doctor.run(model, inputs, doctor.Options(loss=target.loss(), factory=target.loaded.factory_fn,
                                                         kwargs=target.loaded.kwargs,
                                                         batch_target=target.batch_target, seed=cfg.seed))
            errs = [f for f in r.findings if f.severity == "error" and not any(fnmatch.fnmatch(f.where, a) for a in allow)]
            bad = "" if not errs else f"{errs[0].code} {errs[0].where}: {errs[0].message}"
            return not errs, "clean" if not errs else f"{len(errs)} error finding(s)", bad
        record("doctor", doc)

    if "max-peak-memory" in c:
        from . import memory

        limit = parse_bytes(c["max-peak-memory"], "max-peak-memory")

        def mem():
            from ..render.fmt import human_bytes

            r = memory.run(model, inputs, memory.Options(loss=target.loss), device=target.device)
            peak = int(r.data["peak_bytes"])
            return peak <= limit, human_bytes(peak), "" if peak <= limit else f"peak {human_bytes(peak)} > {human_bytes(limit)}"
        from ..render.fmt import human_bytes
        record("max-peak-memory", mem, human_bytes(limit))

    if len(outcomes) == 0:
        raise UsageError(f"no checks configured for {cfg.name}",
                         hint="add [tool.torchdiag.check] with e.g. max-params, max-gmacs, nancheck, gradflow, overfit-batch")
    return outcomes


def run(models: list[ModelConfig], source: str) -> Result:
    result = Result("check", header={"config": source, "models": [m.name for m in models]})
    outcomes: list[CheckOutcome] = []
    for cfg in models:
        outcomes.extend(run_checks(cfg))
    rows = []
    for o in outcomes:
        status = "PASS" if o.passed else ("FAIL" if o.passed is False else "ERROR")
        rows.append({"model": o.model, "check": o.check, "figure": o.figure, "limit": o.limit, "status": status,
                     "passed": bool(o.passed), "message": o.message, "seconds": round(o.seconds, 3),
                     "_style": None if o.passed else "red"})
        if o.passed is False:
            result.add(f"check-failed", "error", f"{o.model}::{o.check}", o.message or "failed")
        elif o.passed is None:
            result.add("check-error", "error", f"{o.model}::{o.check}", o.message)
    multi = len(models) > 1
    cols = ([Column("model", "model")] if multi else []) + [
        Column("check", "check"), Column("figure", "figure"), Column("limit", "limit"), Column("status", "result")]
    result.tables.append(Table("checks", "Checks", cols, rows))
    n_fail = sum(1 for o in outcomes if not o.passed)
    result.data.update({"passed": n_fail == 0, "failed": n_fail, "total": len(outcomes)})
    codes = [o.code for o in outcomes]
    if 3 in codes:
        result.code = 3
    result.verdict = (f"PASS: {len(outcomes)} check(s) passed" if n_fail == 0 else
                      f"FAIL: {n_fail} of {len(outcomes)} check(s) failed")
    return result
