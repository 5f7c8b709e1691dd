"""Corpus run (issue 14): public architectures with random init through summary, flops, nancheck,
gradflow and doctor at batch 2 (3 with BatchNorm) on CPU, recording per model and command the exit code, the error-level
findings (code, where, message), the warnings and internal errors. Writes a markdown table (and JSON).

    .venv-corpus/bin/python bench/corpus.py                       # everything (see bench/README.md)
    .venv-corpus/bin/python bench/corpus.py --fast                 # the small slice
    .venv-corpus/bin/python bench/corpus.py --models tv_resnet50,timm_convnext_tiny --commands gradflow,doctor
    .venv-corpus/bin/python bench/corpus.py --list

Each model runs in its own subprocess (a crash or a timeout is recorded, not fatal). Budget: models with
more than --max-params parameters run summary and flops only (the backward commands would take minutes
each on 2 cores); --timeout bounds one model. Exit code of the run: 0 when no healthy model got an
error-level finding or an internal error, else 1."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

COMMANDS = ("summary", "flops", "nancheck", "gradflow", "doctor")
BACKWARD = {"nancheck", "gradflow", "doctor"}


def make_inputs(entry, model, device: str = "cpu", seed: int = 0):
    """The entry's -i specs through torchdiag's own default-input rules, on `device`."""
    import torch

    from torchdiag.core.inputs import resolve_inputs

    loaded = SimpleNamespace(model=model, module=None)
    return resolve_inputs(list(entry.inputs), loaded, torch.device(device), seed)


def load_spec(entry, device: str, training: bool = True):
    """A source entry (timm:NAME, torchvision:NAME, hf:FOLDER) loaded as the CLI loads it, with the
    default inputs a user gets (a training command's batch; `training=False`: an eval command's): (model, inputs)."""
    import torch

    from torchdiag.core.inputs import resolve_inputs
    from torchdiag.core.loading import load_model

    loaded = load_model(entry.spec, list(entry.args), torch.device(device), 0)
    try:   # the batch a training command gets by default (core/sources.py, issue 26)
        from torchdiag.core.sources import for_training
    except ImportError:
        for_training = None
    if for_training is not None and device != "meta" and training:
        for_training(loaded)
    return loaded.model, resolve_inputs([], loaded, torch.device(device), 0)


def build_model(entry, device: str):
    """The entry's model; on meta through torchdiag's own builder (as `--device meta` does)."""
    if device != "meta":
        return entry.factory()
    from torchdiag.core.meta import build_on_meta

    return build_on_meta(lambda: entry.factory(), {})[0]


def call(command: str, model, inputs):
    """One diagnostic through the Python API (the auto loss, seed 0)."""
    import torchdiag.api

    return torchdiag.api.run(command, model, inputs)


# notes of a re-check that could not run (a copy out of memory, a forward that failed on it); the float32 fallback of
# the invariance re-check did run
SKIPPED = re.compile(r"not re-checked|was not looked for|could not be gathered|^(?!cancelled parameters re-checked in "
                     r"float32).*failed:")


def run_command(command: str, model, inputs) -> dict:
    from torchdiag.errors import DiagError

    t0 = time.perf_counter()
    rec: dict = {"command": command}
    try:
        result = call(command, model, inputs)
        rec["exit"] = int(result.exit_code)
        rec["errors"] = [f.to_dict() for f in result.findings if f.severity == "error"]
        rec["warnings"] = [f.to_dict() for f in result.findings if f.severity == "warning"]
        rec["info"] = [f.to_dict() for f in result.findings if f.severity == "info"]
        loss = (getattr(result, "header", None) or {}).get("loss")
        if loss:
            rec["loss"] = loss
        skipped = [n[:300] for n in result.notes if SKIPPED.search(n)]
        if skipped:   # a re-check that could not run leaves plain verdicts: the row says so
            rec["not_rechecked"] = skipped
    except DiagError as exc:
        rec["exit"] = int(exc.code)
        rec["raised"] = f"{type(exc).__name__}: {exc.message}"
        if int(exc.code) == 4:
            rec["internal"] = traceback.format_exc(limit=-4)
    except Exception as exc:   # noqa: BLE001 - an exception escaping the API is an internal error
        rec["exit"] = 4
        rec["raised"] = f"{type(exc).__name__}: {exc}"
        rec["internal"] = traceback.format_exc(limit=-4)
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


def run_model(entry, commands, max_params: int, device: str = "cpu") -> dict:
    import torch

    torch.manual_seed(0)
    out = {"model": entry.name, "family": entry.family, "why": entry.why, "inputs": entry.inputs,
           "device": device, "started": time.strftime("%H:%M:%S"), "commands": []}
    t0 = time.perf_counter()
    if entry.spec:
        out["spec"] = entry.spec
        try:
            model, inputs = load_spec(entry, device)
        except Exception as exc:  # noqa: BLE001 - a DiagError here is the tool's one line: recorded
            out["build_error"] = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
            return out
        out["params"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        out["inputs"] = inputs.describe() if hasattr(inputs, "describe") else ""
    else:
        try:
            model = build_model(entry, device)
        except Exception as exc:  # noqa: BLE001
            out["build_error"] = f"{type(exc).__name__}: {exc}"
            return out
        out["params"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        try:
            inputs = make_inputs(entry, model, device)
        except Exception as exc:  # noqa: BLE001
            out["input_error"] = f"{type(exc).__name__}: {exc}"
            return out
    out["build_seconds"] = round(time.perf_counter() - t0, 2)
    out["input_notes"] = inputs.notes
    out["input_kwargs"] = sorted(inputs.kwargs)
    for command in commands:
        if command in BACKWARD and max_params and out["params"] > max_params:
            out["commands"].append({"command": command, "skipped": f"over the size budget ({max_params:,} params)"})
            continue
        out["commands"].append(run_command(command, model, inputs))
    return out


# ---------------------------------------------------------------------------------------- driver

def cell(rec: dict) -> str:
    if "skipped" in rec:
        return "skip"
    if rec.get("timeout"):
        return "timeout"
    text = str(rec["exit"])
    errs = _counts(rec.get("errors", []))
    warns = _counts(rec.get("warnings", []))
    if rec.get("raised"):
        text += " " + rec["raised"].split(":")[0]
    if errs:
        text += " E: " + errs
    if warns:
        text += " W: " + warns
    if rec.get("not_rechecked"):
        text += " (a re-check did not run)"
    return text


def _counts(findings: list[dict]) -> str:
    counts: dict[str, int] = {}
    for f in findings:
        counts[f["code"]] = counts.get(f["code"], 0) + 1
    return ", ".join(f"{k}×{v}" if v > 1 else k for k, v in counts.items())


def markdown(results: list[dict], commands) -> str:
    lines = ["| model | params | " + " | ".join(commands) + " |", "|---|---:|" + "---|" * len(commands)]
    for r in results:
        by = {c["command"]: c for c in r.get("commands", [])}
        if r.get("build_error") or r.get("input_error") or r.get("timeout"):
            what = r.get("build_error") or r.get("input_error") or f"timeout after {r['timeout']} s"
            lines.append(f"| {r['model']} | | {what[:120]} |" + " |" * (len(commands) - 1))
            continue
        cells = [cell(by[c]) if c in by else "" for c in commands]
        lines.append(f"| {r['model']} | {r.get('params', 0) / 1e6:.1f} M | " + " | ".join(cells) + " |")
    n_err = sum(1 for r in results for c in r.get("commands", []) if c.get("errors"))
    n_int = sum(1 for r in results for c in r.get("commands", []) if c.get("internal"))
    n_warn = sum(1 for r in results for c in r.get("commands", []) if c.get("warnings"))
    lines += ["", f"{len(results)} models; runs with error-level findings: {n_err}; with warnings: {n_warn}; "
              f"internal errors: {n_int}. Cell: exit code, E: error codes, W: warning codes (×count)."]
    details = []
    for r in results:
        for c in r.get("commands", []):
            for f in c.get("errors", []) + c.get("warnings", []) + (
                    [{"severity": "raised", "code": "", "where": "", "message": c["raised"]}] if c.get("raised") else []):
                details.append(f"- {r['model']} {c['command']}: {f['severity']} `{f['code']}` {f['where']}: "
                               f"{f['message'][:200]}")
    if details:
        lines += ["", "<details><summary>every finding</summary>", "", *details, "", "</details>"]
    return "\n".join(lines) + "\n"


def _cap_memory(gb: str | None) -> None:
    """A worker's address space capped at `gb` GiB (CORPUS_MAX_GB): a model too large for the machine fails as
    one row (out of memory) instead of the kernel's OOM killer taking whatever else runs (EdgeTAM's doctor at
    1024x1024 passed 22 GB RSS on the 24 GiB machine)."""
    if gb:
        import resource

        cap = int(float(gb) * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def isolated(chunk, commands, args) -> list[dict]:
    """run_model on each entry of `chunk` in one worker process (one start-up for all of them). A crash
    or a timeout is a row, not the end of the run: after one, the models without a result run again
    one per worker, so the row names the model that crashed or hung."""
    cmd = [sys.executable, __file__, "--worker", ",".join(e.name for e in chunk), "--commands", ",".join(commands),
           "--max-params", str(args.max_params), "--device", args.device]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout * len(chunk))
        out, failure = p.stdout, None if p.returncode == 0 else f"worker died (exit {p.returncode}): {p.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired as exc:
        out, failure = exc.stdout or "", "timeout"
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
    got = {r["model"]: r for r in (json.loads(t.split("\n", 1)[0]) for t in out.split("@@RESULT@@")[1:])}
    missing = [e for e in chunk if e.name not in got]
    if missing and len(chunk) > 1:
        for e in missing:
            got[e.name] = isolated([e], commands, args)[0]
    elif missing:
        got[chunk[0].name] = ({"model": chunk[0].name, "timeout": args.timeout} if failure == "timeout"
                              else {"model": chunk[0].name, "build_error": failure or "worker gave no result"})
    return [got[e.name] for e in chunk]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated names (see --list); a name ending in * is a prefix")
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--fast", action="store_true", help="only the small slice (a few tiny models)")
    ap.add_argument("--max-params", type=int, default=150_000_000,
                    help="models above this run summary and flops only (0: no limit)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per model")
    ap.add_argument("--out", default=str(HERE / "corpus-results.md"))
    ap.add_argument("--json-out", default=str(HERE / "corpus-results.json"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "meta"),
                    help="meta: build without weights (summary and flops only, seconds per model)")
    ap.add_argument("--stop-after", type=float, default=0,
                    help="start no new model after this many seconds (0: no limit); the rest are listed as not run")
    ap.add_argument("--chunk", type=int, default=1,
                    help="models per worker process (one start-up for several; a crash re-runs them one by one)")
    ap.add_argument("--in-process", action="store_true",
                    help="run every model in this process (no isolation; saves the per-model start-up, for --device meta)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the results already in --json-out and run only the models without one")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    bad = set(commands) - set(COMMANDS)
    if bad:
        ap.error(f"unknown command(s) {sorted(bad)}; choose from {', '.join(COMMANDS)}")
    if args.device == "meta" and set(commands) & BACKWARD:
        ap.error("--device meta counts without values: use it with --commands summary,flops")

    from corpus_models import entries

    if args.worker:   # the models named, in this process; one JSON line each on stdout
        import torch

        torch.set_num_threads(int(os.environ.get("CORPUS_THREADS", "2")))
        _cap_memory(os.environ.get("CORPUS_MAX_GB"))
        for name in args.worker.split(","):
            entry = next(e for e in entries(name) if e.name == name)
            print("\n@@RESULT@@" + json.dumps(run_model(entry, commands, args.max_params, args.device)), flush=True)
        return 0
    chosen = entries()
    if args.fast:
        chosen = [e for e in chosen if "fast" in e.tags]
    if args.models:
        wanted = [w.strip() for w in args.models.split(",") if w.strip()]
        # in the order asked for (a family pattern: its models in list order)
        chosen = [e for w in wanted for e in chosen if e.name == w or (w.endswith("*") and e.name.startswith(w[:-1]))]
        chosen = list({e.name: e for e in chosen}.values())
        missing = [w for w in wanted if not w.endswith("*") and w not in {e.name for e in chosen}]
        if missing:
            ap.error(f"unknown model(s) {missing} (or their package is not installed); see --list")
    if args.list:
        for e in chosen:
            print(f"{e.name:40s} {e.family:12s} {' '.join(e.inputs):16s} {e.why}")
        return 0
    if args.in_process:
        import torch

        torch.set_num_threads(int(os.environ.get("CORPUS_THREADS", "2")))
    results, start = [], time.perf_counter()
    if args.resume and Path(args.json_out).exists():
        results = json.loads(Path(args.json_out).read_text())
        done = {r["model"] for r in results}
        chosen = [e for e in chosen if e.name not in done]
        print(f"resuming: {len(done)} results kept, {len(chosen)} models to run", file=sys.stderr, flush=True)
    step = max(args.chunk, 1)
    for i in range(0, len(chosen), step):
        chunk, t0 = chosen[i:i + step], time.perf_counter()
        if args.stop_after and t0 - start > args.stop_after:
            print(f"not run (--stop-after {args.stop_after:g} s): {', '.join(x.name for x in chosen[i:])}",
                  file=sys.stderr)
            break
        got = ([run_model(e, commands, args.max_params, args.device) for e in chunk] if args.in_process
               else isolated(chunk, commands, args))
        for r in got:
            results.append(r)
            print(f"[{len(results)}] {r['model']}: {time.perf_counter() - t0:.0f} s  "
                  + "  ".join(f"{c['command']}={cell(c)}" for c in r.get("commands", [])), file=sys.stderr, flush=True)
        Path(args.json_out).write_text(json.dumps(results, indent=1))
        Path(args.out).write_text(markdown(results, commands))
    bad = [r for r in results if r.get("timeout") or r.get("build_error")
           or any(c.get("errors") or c.get("internal") for c in r.get("commands", []))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
