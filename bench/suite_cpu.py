"""CPU seconds of the test suite, per file and per test (issue 30): what `make test` costs whatever the machine's
load, which wall time on a shared machine cannot say.

Each test file runs alone in its own pytest process (`-p no:xdist`, so no workers), one after the other. The cost
of a file is the user+sys CPU time of that process and every child it waited for (subprocesses, torchrun and its
ranks), from getrusage; the cost of a test is the same measured around its setup, call and teardown (a shared
module-scoped fixture is charged to the first test that uses it). A file's cost also holds its process's start and
`import torch` (~2-3 s), which an xdist worker pays once for all the files it runs.

    .venv/bin/python bench/suite_cpu.py --out build/suite-cpu.json              # every tests/test_*.py
    .venv/bin/python bench/suite_cpu.py --out x.json tests/test_readme.py       # some files
    .venv/bin/python bench/suite_cpu.py --report build/suite-cpu.json           # the table again

`--root DIR` runs another checkout's tests (e.g. `git archive` of a base commit unpacked in /tmp) with this venv,
its own torchdiag first on PYTHONPATH. Run it niced (`nice -n 10`): it is the whole suite, serially."""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class CpuPerTest:
    """pytest plugin of the child run: CPU seconds around each test's whole protocol (setup, call, teardown)."""

    def __init__(self, out: str):
        self.out, self.tests = out, {}

    def pytest_runtest_protocol(self, item, nextitem):
        self._start = _cpu()

    def pytest_runtest_logfinish(self, nodeid, location):
        self.tests[nodeid] = round(_cpu() - self._start, 3)

    def pytest_runtest_logreport(self, report):
        if report.outcome == "failed":
            self.tests.setdefault("_failed", []).append(report.nodeid)

    def pytest_sessionfinish(self, session, exitstatus):
        Path(self.out).write_text(json.dumps({"exit": int(exitstatus), "tests": self.tests}))


def collect_cpu(root: Path, paths: list[Path]) -> float:
    """CPU seconds of a pytest process that only collects `paths` (its start-up: Python, pytest, torch, the
    test modules' imports)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "--co", "-p", "no:xdist", "-p", "no:cacheprovider",
                    "--rootdir", str(root), *map(str, paths)], cwd=root, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(root)} if root != HERE.parent else None)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1)


def run_file(root: Path, path: Path, scratch: Path) -> dict:
    out = scratch / (path.stem + ".json")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    # another checkout's torchdiag first (this one's is the editable install); this file for the plugin
    ahead = [str(root), str(HERE)] if root != HERE.parent else [str(HERE)]
    env["PYTHONPATH"] = os.pathsep.join(ahead + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    code = ("import sys, pytest, suite_cpu; "
            f"sys.exit(pytest.main(sys.argv[1:], plugins=[suite_cpu.CpuPerTest({str(out)!r})]))")
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "--rootdir", str(root), str(path)], cwd=root, env=env, capture_output=True, text=True)
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic() - t0
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    doc = json.loads(out.read_text()) if out.exists() else {"exit": proc.returncode, "tests": {}}
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    return {"file": path.name, "cpu_s": round(cpu, 1), "wall_s": round(wall, 1), "exit": proc.returncode,
            "summary": tail[0] if tail else "", "tests": doc["tests"]}


def report(doc: dict, top: int = 15) -> str:
    files = sorted(doc["files"], key=lambda f: -f["cpu_s"])
    total = sum(f["cpu_s"] for f in files)
    lines = [f"total CPU {total:.0f} s over {len(files)} files", "", "| file | CPU s | tests | slowest test (CPU s) |",
             "|---|---|---|---|"]
    for f in files[:top]:
        tests = {k: v for k, v in f["tests"].items() if not k.startswith("_")}
        worst = max(tests.items(), key=lambda kv: kv[1]) if tests else ("", 0)
        lines.append(f"| {f['file']} | {f['cpu_s']:.0f} | {len(tests)} | {worst[0].split('::', 1)[-1]} ({worst[1]:.0f}) |")
    return "\n".join(lines)


def makespan(units: list[tuple[str, float]], workers: int, start: float) -> tuple[float, list[float]]:
    """Greedy list scheduling, as xdist's loadscope does it (a module goes to the first worker to run out of
    work, in queue order): the finish time of the last worker, and each worker's. `start`: a worker's own
    start-up (its `import torch` and collection), paid once per worker."""
    ends = [start] * workers
    for _, cost in units:
        i = ends.index(min(ends))
        ends[i] += cost
    return max(ends), ends


SPREAD = ("test_first_hour.py", "test_readme.py")   # tests/conftest.py SPREAD: handed out test by test


def simulate(doc: dict, workers: int = 2) -> str:
    """The wall time of the tests of `doc` on `workers` idle cores (ruff and mypy not counted), two ways: as
    `--dist loadscope` did before issue 30 (whole modules, those with the most tests first) and as it does now
    (the tests of SPREAD modules one by one; every unit by its cost, costliest first). A module's cost in a worker
    is its standalone cost less one process's start-up (`overhead_s`); each worker starts by collecting the whole
    suite (`startup_s`). CPU seconds stand for wall seconds: an idle core per worker, children included (a
    torchrun launch's two ranks share the cores, so it is optimistic there)."""
    overhead, startup = doc.get("overhead_s", 0.0), doc.get("startup_s", 0.0)
    modules, spread = [], []
    for f in doc["files"]:
        tests = {k: v for k, v in f["tests"].items() if not k.startswith("_")}
        own = max(f["cpu_s"] - overhead, 0.0)
        modules.append((f["file"], own, len(tests)))
        if f["file"] in SPREAD:
            rest = max(own - sum(tests.values()), 0.0) / max(len(tests), 1)   # collection etc., shared out
            spread += [(k, v + rest) for k, v in tests.items()]
        else:
            spread.append((f["file"], own))
    total = sum(c for _, c, _ in modules)
    lines = [f"CPU of the tests {total:.0f} s + {workers} x {startup:.1f} s start-up; perfect balance "
             f"{total / workers + startup:.0f} s; the longest unit {max(c for _, c in spread):.0f} s"]
    before = [(n, c) for n, c, _ in sorted(modules, key=lambda m: -m[2])]
    after = sorted(spread, key=lambda u: -u[1])
    for name, units in (("modules, most tests first (before)", before), ("spread, costliest first (now)", after)):
        end, ends = makespan(units, workers, startup)
        lines.append(f"{name}: {end:.0f} s (workers end at {', '.join(f'{e:.0f}' for e in ends)})")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--root", type=Path, default=HERE.parent)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--report", type=Path, help="print the table of a result file and stop")
    ap.add_argument("--costs", type=Path, help="write {file: CPU seconds} (tests/costs.json: xdist's order)")
    ap.add_argument("--simulate", action="store_true", help="with --report: the 2-worker wall time it implies")
    args = ap.parse_args()
    if args.report:
        doc = json.loads(args.report.read_text())
        print(report(doc))
        if args.simulate:
            print(simulate(doc))
        if args.costs:
            write_costs(doc, args.costs)
        return 0
    root = args.root.resolve()
    files = [f.resolve() for f in args.files] or sorted((root / "tests").glob("test_*.py"))
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"suite-cpu-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    done = []
    # a file's own start-up (what a worker does not pay again per module) and a worker's (it collects every file)
    overhead = collect_cpu(root, [root / "tests" / "test_gates.py"])
    startup = collect_cpu(root, [root / "tests"])
    print(f"start-up: a one-file process {overhead} s CPU, a worker collecting the suite {startup} s", flush=True)
    for path in files:
        r = run_file(root, path, scratch)
        done.append(r)
        print(f"{r['file']:40s} cpu {r['cpu_s']:7.1f} s  wall {r['wall_s']:7.1f} s  exit {r['exit']}  {r['summary']}",
              flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"root": str(root), "overhead_s": overhead, "startup_s": startup,
                                            "files": done}, indent=1))
    print(report({"files": done}))
    if args.costs:
        write_costs({"files": done}, args.costs)
    return 0


def write_costs(doc: dict, path: Path, least: float = 2.0) -> None:
    """Merge the files measured into `path` (the others keep their figure): {file: CPU s}, and {file::test: CPU s}
    for each test of `least` seconds or more (tests/conftest.py orders the tests of its SPREAD modules by them)."""
    costs = json.loads(path.read_text()) if path.exists() else {}
    for f in doc["files"]:
        costs = {k: v for k, v in costs.items() if k.split("::")[0] != f["file"]}
        costs[f["file"]] = f["cpu_s"]
        costs.update({f"{f['file']}::{k.split('::', 1)[1]}": round(v, 1) for k, v in f["tests"].items()
                      if not k.startswith("_") and v >= least})
    path.write_text(json.dumps(dict(sorted(costs.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
