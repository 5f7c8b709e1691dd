"""Run the ported training-bug benchmarks and torchdiag on them (issue 32). Resumable; `make bugs`.

For each program in bench/bugs/<id>/ (buggy.py, correct.py, meta.json):

1. reproduction: buggy.py and correct.py, plain, over --seeds seeds; their last line `BUGS_RESULT {json}`
   gives the held-out metric (meta.json "metric": acc, higher is better; mse, lower is better).
2. detection: `torchdiag watch --json -- python <variant>.py --seed s` on both variants and every seed
   (the same training, so its in-script seconds against the plain run's give watch's overhead), and once
   per variant the one-shot commands a user would try on the script's model (`<variant>.py:model`, with
   the script's own batch and loss: `--batch <variant>.py:batch --loss <variant>.py:loss`): doctor,
   overfit-batch, nancheck (with optimizer steps), gradflow; and `data` on the script's own training and
   validation data (bench/bugs/dataspec.py) with its model.
3. timing: seed 0 plain and watched back to back (the order alternating from one variant to the next), so
   that watch's overhead compares two runs made under the same load; the detection runs' pairs, made hours
   apart, are the fallback.

Every result is stored in the JSON file (--results) as soon as it exists, keyed by program/variant/mode/seed;
a second run skips what is there. `--report` writes the table into bench/README.md from whatever is done.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import report  # noqa: E402

TAG = "BUGS_RESULT"
ONESHOT = report.ONESHOT


def programs(pattern: str) -> list[dict]:
    found = []
    for meta in sorted(HERE.glob("*/meta.json")):
        m = json.loads(meta.read_text())
        if any(fnmatch.fnmatch(m["id"], p) for p in pattern.split(",")):
            m["dir"] = str(meta.parent.relative_to(ROOT))
            found.append(m)
    return found


def load(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"runs": {}}


def save(path: Path, results: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "200"
    return env


def _result_line(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith(TAG + " "):
            return json.loads(line[len(TAG) + 1:])
    return None


def _run(cmd: list[str], timeout: float) -> tuple[int, str, str, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, out, err, time.perf_counter() - t0


def _findings(doc: dict) -> list[dict]:
    keep = ("code", "severity", "where", "message")
    # a finding folded over a stack's blocks names its parameters in `members` (core/repeats.py)
    return [{k: f.get(k, "") for k in keep} | ({"members": f["members"]} if f.get("members") else {})
            for f in doc.get("findings", [])]


def _json_doc(stdout: str) -> dict | None:
    try:
        return json.loads(stdout)
    except ValueError:
        return None


def plain(m: dict, variant: str, seeds: list[int], epochs: int | None, timeout: float) -> dict[int, dict]:
    """The unwatched runs of one variant, every seed in one process (bench/bugs/seeds.py)."""
    cmd = [sys.executable, str(HERE / "seeds.py"), f"{m['dir']}/{variant}.py", *map(str, seeds)]
    if epochs is not None:
        cmd += ["--", "--epochs", str(epochs)]
    rc, out, err, wall = _run(cmd, timeout * len(seeds))
    chunks: dict[int, list[str]] = {}
    cur = None
    for line in out.splitlines():
        if line.startswith("BUGS_SEED "):
            cur = int(line.split()[1])
            chunks[cur] = []
        elif cur is not None:
            chunks[cur].append(line)
    runs = {}
    for s in seeds:
        text = "\n".join(chunks.get(s, []))
        res = _result_line(text)
        errs = [json.loads(x[len("BUGS_ERROR "):]) for x in chunks.get(s, []) if x.startswith("BUGS_ERROR ")]
        runs[s] = {"rc": 0 if res else (rc or 3), "wall_s": round(wall / len(seeds), 3), "result": res,
                   "stderr_tail": (errs[0]["error"] if errs else err[-800:]) if not res else ""}
    return runs


def watched(m: dict, variant: str, seed: int, epochs: int | None, timeout: float, every: int) -> dict:
    cmd = [sys.executable, "-m", "torchdiag", "watch", "--json", "--every", str(every), "--",
           "python", f"{m['dir']}/{variant}.py", "--seed", str(seed)]
    if epochs is not None:
        cmd += ["--epochs", str(epochs)]
    rc, out, err, wall = _run(cmd, timeout)
    doc = _json_doc(out) or {}
    return {"rc": rc, "wall_s": round(wall, 3), "result": _result_line(err), "findings": _findings(doc),
            "steps": doc.get("steps"), "first_non_finite_step": doc.get("first_non_finite_step"),
            "stderr_tail": err[-800:] if rc not in (0, 1) else ""}


def timed(m: dict, variant: str, epochs: int | None, timeout: float, every: int, watch_first: bool) -> dict:
    """One plain and one watched run of seed 0, back to back: the overhead pair (report.py prefers it)."""
    order = ("watch", "plain") if watch_first else ("plain", "watch")
    out: dict = {"order": list(order)}
    t0 = time.time()
    for kind in order:
        r = watched(m, variant, 0, epochs, timeout * 3, every) if kind == "watch" \
            else plain(m, variant, [0], epochs, timeout)[0]
        out[kind] = {"rc": r["rc"], "result": r["result"]}
    out["rc"], out["wall_s"] = out["plain"]["rc"], round(time.time() - t0, 3)
    return out


def _data_command(spec: str) -> list[str]:
    """`data` on the data the script trains and validates on, with its model (content checks: no loader timing,
    which on a shared machine would measure the machine)."""
    data = str((HERE / "dataspec.py").relative_to(ROOT))
    rc, out, err, _ = _run([sys.executable, data, spec], 600)
    if rc != 0:
        raise RuntimeError(f"{data} {spec}: {err[-800:]}")
    val = ["--val", f"{data}:val"] if out.strip() == "True" else []   # a script with no split validates on its training data
    return [sys.executable, "-m", "torchdiag", "data", f"{data}:train", *val, "--arg", f"script={spec}",
            "--model", f"{spec}:model", "--no-speed", "--json", "--device", "cpu", "--seed", "0"]


def oneshot(m: dict, variant: str, command: str, timeout: float) -> dict:
    spec = f"{m['dir']}/{variant}.py"
    cmd = [sys.executable, "-m", "torchdiag", command, f"{spec}:model", "--batch", f"{spec}:batch",
           "--loss", f"{spec}:loss", "--json", "--device", "cpu", "--seed", "0"]
    if command == "data":
        cmd = _data_command(spec)
    extra = m.get("oneshot_args", {}).get(variant, {})
    opt = extra.get("optimizer")
    if command in ("overfit-batch", "nancheck") and opt:   # the script's optimizer (sgd: its momentum; no nesterov)
        cmd += ["--optimizer", opt["name"], "--lr", str(opt["lr"])]
        cmd += ["--momentum", str(opt["momentum"])] if "momentum" in opt else []
    if command == "nancheck":
        cmd += ["--steps", "50"]
    rc, out, err, wall = _run(cmd, timeout)
    doc = _json_doc(out) or {}
    return {"rc": rc, "wall_s": round(wall, 3), "findings": _findings(doc), "cmd": cmd[3:],
            "stderr_tail": err[-800:] if rc not in (0, 1) else ""}


def tasks(progs: list[dict], seeds: int, watch: bool, shots: bool, passes: str = "plain,detect,seeds,timing",
          commands: tuple[str, ...] = ONESHOT):
    """(program, key, kind, variant, seed or command), in passes so that a partial run is useful: every
    program's reproduction first, then watch on seed 0 and the one-shot commands, then watch on the other
    seeds, then the timing pairs."""
    if "plain" in passes:
        for m in progs:
            for v in ("buggy", "correct"):
                yield m, f"{m['id']}/{v}/plain", "plain", v, list(range(seeds))
    for m in progs if "detect" in passes else []:
        for v in ("buggy", "correct"):
            if watch:
                yield m, f"{m['id']}/{v}/watch/0", "watch", v, 0
            if shots:
                for c in commands:
                    yield m, f"{m['id']}/{v}/{c}/0", "oneshot", v, c
    if watch and "seeds" in passes:
        for m in progs:
            for s in range(1, seeds):
                for v in ("buggy", "correct"):
                    yield m, f"{m['id']}/{v}/watch/{s}", "watch", v, s
    if watch and "timing" in passes:
        for i, (m, v) in enumerate((m, v) for m in progs for v in ("buggy", "correct")):
            yield m, f"{m['id']}/{v}/timing/0", "timing", v, i % 2 == 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="*", help="globs over program ids, comma-separated")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=None, help="override every script's epochs (tests)")
    ap.add_argument("--results", default=str(HERE / "results.json"))
    ap.add_argument("--timeout", type=float, default=None, help="seconds per run (default: meta's)")
    ap.add_argument("--every", type=int, default=10, help="watch --every")
    ap.add_argument("--no-watch", action="store_true")
    ap.add_argument("--no-oneshot", action="store_true")
    ap.add_argument("--oneshot", default=",".join(ONESHOT), help="which one-shot commands, comma-separated (tests: fewer)")
    ap.add_argument("--passes", default="plain,detect,seeds,timing",
                    help="which passes: plain (reproduction), detect (watch seed 0 + one-shots), seeds (watch, other seeds),"
                    " timing (seed 0 plain and watched back to back, for the overhead);"
                    " two workers on different passes may share one results file")
    ap.add_argument("--shard", default="0/1", help="k/n: this worker runs every n-th task from the k-th (parallel workers)")
    ap.add_argument("--report", action="store_true", help="only write the table from the results")
    ap.add_argument("--readme", default=str(ROOT / "bench" / "README.md"), help="'' to skip the README")
    a = ap.parse_args(argv)
    if a.seeds < 1:   # the summary's medians need one seed at least (--seeds 1 runs seed 0 only)
        ap.error("--seeds must be 1 or more")
    path = Path(a.results)
    results = load(path)
    progs = programs(a.programs)
    k, n = (int(x) for x in a.shard.split("/"))
    if not a.report:
        todo = list(tasks(progs, a.seeds, not a.no_watch, not a.no_oneshot, a.passes, tuple(a.oneshot.split(","))))
        for m, key, kind, v, arg in todo[k::n]:
            timeout = a.timeout or m.get("timeout_s", 600)
            if kind == "plain":
                todo = [s for s in arg if f"{key}/{s}" not in results["runs"]]
                if todo:
                    done = plain(m, v, todo, a.epochs, timeout)
                    results = load(path)
                    results["runs"].update({f"{key}/{s}": r for s, r in done.items()})
                    save(path, results)
                    print(f"{key} seeds {todo}: " + ", ".join(f"rc {r['rc']}" for r in done.values()), flush=True)
                continue
            if key in results["runs"]:
                continue
            if kind == "watch":
                r = watched(m, v, arg, a.epochs, timeout * 3, a.every)
            elif kind == "timing":
                r = timed(m, v, a.epochs, timeout, a.every, arg)
            else:
                r = oneshot(m, v, arg, timeout)
            results = load(path)      # another writer (a --report) may have saved meanwhile
            results["runs"][key] = r
            save(path, results)
            print(f"{key}: rc {r['rc']} {r['wall_s']:.1f}s", flush=True)
    base = HERE / "baselines.json"
    summary = report.summarise(programs("*"), results, a.seeds, json.loads(base.read_text()) if base.exists() else None)
    if not a.report:          # --report only reads (a running `make bugs` owns the file)
        results = load(path)
        results["summary"] = summary
        save(path, results)
    if a.readme:
        report.write_readme(Path(a.readme), summary)
    print(report.headline(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
