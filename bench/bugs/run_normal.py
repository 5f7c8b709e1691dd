"""torchdiag on published NORMAL models (bench/bugs/normal/<id>/normal.py): the false-alarm rate (issue 32).

The buggy/correct pairs (run.py) measure detection; a normal model has one variant, so it lives one folder
down (run.py's glob does not see it) and this script runs it with run.py's own steps: the plain runs over
--seeds seeds (its BUGS_RESULT), `torchdiag watch` on every seed, and the one-shot commands once. Results go
to --results (keys <id>/normal/<mode>/<seed>), resumable like run.py. The summary counts, per program and
over all, the watched runs with an alarm (a finding of severity warning or error) and the one-shot
commands with one: on a normal model each is a false alarm unless its message names a real defect.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import report  # noqa: E402
import run  # noqa: E402

VARIANT = "normal"


def programs(pattern: str) -> list[dict]:
    found = []
    for meta in sorted((HERE / "normal").glob("*/meta.json")):
        m = json.loads(meta.read_text())
        if fnmatch.fnmatch(m["id"], pattern):
            m["dir"] = str(meta.parent.relative_to(run.ROOT))
            found.append(m)
    return found


def summarise(progs: list[dict], runs: dict, seeds: int) -> dict:
    per, watch_alarm, shot_alarm = {}, [], []
    for m in progs:
        w = [runs.get(f"{m['id']}/{VARIANT}/watch/{s}") for s in range(seeds)]
        w = [r for r in w if r is not None and r["rc"] in (0, 1)]
        shots = {c: runs.get(f"{m['id']}/{VARIANT}/{c}/0") for c in run.ONESHOT}
        shots = {c: r for c, r in shots.items() if r is not None and r["rc"] in (0, 1)}
        vals = [report._value(runs.get(f"{m['id']}/{VARIANT}/plain/{s}"), m["metric"], m["higher_is_better"])
                for s in range(seeds)]
        per[m["id"]] = {
            "metric": m["metric"], "values": vals,
            "watch_alarmed": sum(bool(report._alarms(r)) for r in w), "watch_done": len(w),
            "watch_codes": sorted({f["code"] for r in w for f in report._alarms(r)}),
            "oneshot_codes": {c: sorted({f["code"] for f in report._alarms(r)}) for c, r in shots.items()},
            "crashes": [k for k, r in runs.items() if k.startswith(m["id"] + "/") and r.get("rc") == 4]}
        watch_alarm += [bool(report._alarms(r)) for r in w]
        shot_alarm += [bool(report._alarms(r)) for r in shots.values()]
    return {"programs": per,
            "watch_false_alarms": [sum(watch_alarm), len(watch_alarm), report.wilson(sum(watch_alarm),
                                                                                      len(watch_alarm))],
            "oneshot_false_alarms": [sum(shot_alarm), len(shot_alarm), report.wilson(sum(shot_alarm),
                                                                                      len(shot_alarm))]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", default="*", help="glob over program ids")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--results", default=str(HERE / "results-normal.json"))
    ap.add_argument("--every", type=int, default=10, help="watch --every")
    ap.add_argument("--report", action="store_true", help="only print the summary")
    a = ap.parse_args(argv)
    path = Path(a.results)
    results = run.load(path)
    progs = programs(a.programs)
    if not a.report:
        for m in progs:
            timeout = m.get("timeout_s", 600)
            todo = [s for s in range(a.seeds) if f"{m['id']}/{VARIANT}/plain/{s}" not in results["runs"]]
            if todo:
                done = run.plain(m, VARIANT, todo, None, timeout)
                results["runs"].update({f"{m['id']}/{VARIANT}/plain/{s}": r for s, r in done.items()})
                run.save(path, results)
            jobs = [("watch", s) for s in range(a.seeds)] + [(c, 0) for c in run.ONESHOT]
            for kind, s in jobs:
                key = f"{m['id']}/{VARIANT}/{kind}/{s}"
                if key in results["runs"]:
                    continue
                r = (run.watched(m, VARIANT, s, None, timeout * 3, a.every) if kind == "watch"
                     else run.oneshot(m, VARIANT, kind, timeout))
                results["runs"][key] = r
                run.save(path, results)
                print(f"{key}: rc {r['rc']} {r['wall_s']:.1f}s", flush=True)
    summary = summarise(programs("*"), results["runs"], a.seeds)
    if not a.report:
        results["summary"] = summary
        run.save(path, results)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
