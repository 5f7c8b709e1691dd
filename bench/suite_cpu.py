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


def run_file(root: Path, path: Path, scratch: Path) -> dict:
    out = scratch / (path.stem + ".json")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--root", type=Path, default=HERE.parent)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--report", type=Path, help="print the table of a result file and stop")
    args = ap.parse_args()
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return 0
    root = args.root.resolve()
    files = [f.resolve() for f in args.files] or sorted((root / "tests").glob("test_*.py"))
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"suite-cpu-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    done = []
    for path in files:
        r = run_file(root, path, scratch)
        done.append(r)
        print(f"{r['file']:40s} cpu {r['cpu_s']:7.1f} s  wall {r['wall_s']:7.1f} s  exit {r['exit']}  {r['summary']}",
              flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"root": str(root), "files": done}, indent=1))
    print(report({"files": done}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
