"""From run.py's results to the verdicts per program and the table in bench/README.md.

The tests (stated in the README section this writes):

- reproduces: over the seeds, the buggy script's held-out metric is worse than the correct one's by an
  exact one-sided Mann-Whitney test (p <= 0.05; with 5 seeds each the smallest p is 1/252) and by a
  practical margin between the medians (accuracy: >= 0.05 absolute; MSE: buggy >= 1.25 x correct). A run
  that crashed or gave NaN counts as the worst value.
- detected: a warning or an error (info does not count). By watch: on at least half the seeds. By any
  command: watch so, or a one-shot command on the buggy script's model.
- fault type diagnosed: a warning/error code that taxonomy.py maps to one of the ground-truth types.
- localised: a warning/error names a module/parameter of meta.json's fault_layers (programs that list none
  are left out of that rate).
- first alarm step: the smallest "step N" in a watch warning/error message (or the first non-finite step),
  median over the seeds that alarmed.
- watch overhead: the in-script training seconds under watch over the plain run's: seed 0's pair from the
  timing pass (run back to back) where it ran, else the median over the seeds of runs made apart (noisier).
"""
from __future__ import annotations

import itertools
import math
import re
import statistics
from pathlib import Path

import taxonomy

ALARM = ("warning", "error")
ONESHOT = ("doctor", "overfit-batch", "nancheck", "gradflow", "data")   # the one-shot commands run per variant
BEGIN = "<!-- bugs:begin (written by bench/bugs/run.py --report) -->"
END = "<!-- bugs:end -->"
PUBLISHED = [  # Evaluation.xlsx, the 34 DeepLocalize programs (issue 32)
    ("UMLAUT (CHI'21)", "34/34", "11/34", "warned on all 117 normal models of AUTOTRAINER's set"),
    ("DeepFD (ICSE'22)", "31/34", "18/34", "—"),
    ("DeepLocalize (ICSE'21)", "27/34", "6/34", "flagged all 78 normal MNIST models"),
    ("AUTOTRAINER (ICSE'21)", "6/34", "6/34", "claims none; thresholds tuned on 100 cases"),
]


def mann_whitney_less(a: list[float], b: list[float]) -> float:
    """Exact one-sided p that a is stochastically smaller than b (midranks for ties, all splits enumerated)."""
    pooled = a + b
    order = sorted(range(len(pooled)), key=lambda i: pooled[i])
    ranks = [0.0] * len(pooled)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and pooled[order[j + 1]] == pooled[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    observed = sum(ranks[: len(a)])
    sums = [sum(ranks[k] for k in c) for c in itertools.combinations(range(len(pooled)), len(a))]
    return sum(1 for s in sums if s <= observed + 1e-9) / len(sums)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def _value(run: dict | None, metric: str, higher: bool) -> float | None:
    if run is None:
        return None
    r = run.get("result")
    v = None if not r else r.get(metric)
    if v is None or not math.isfinite(v):
        return -math.inf if higher else math.inf   # crashed or NaN: the worst value
    return float(v)


def reproduction(m: dict, runs: dict, seeds: int) -> dict:
    metric, higher = m["metric"], m["higher_is_better"]
    vals = {v: [_value(runs.get(f"{m['id']}/{v}/plain/{s}"), metric, higher) for s in range(seeds)]
            for v in ("buggy", "correct")}
    if any(x is None for xs in vals.values() for x in xs):
        return {"status": "incomplete", **vals}
    sign = 1.0 if higher else -1.0   # compare "goodness": higher is better after the sign
    bug = [sign * x for x in vals["buggy"]]
    ok = [sign * x for x in vals["correct"]]
    p = mann_whitney_less(bug, ok)
    mb, mc = statistics.median(vals["buggy"]), statistics.median(vals["correct"])
    if higher:
        margin = mc - mb >= 0.05
    else:
        margin = mb >= 1.25 * mc if math.isfinite(mb) else True
    return {"status": "reproduces" if (p <= 0.05 and margin) else "does not reproduce", "p": p,
            "median_buggy": mb, "median_correct": mc, "buggy": vals["buggy"], "correct": vals["correct"]}


def _alarms(run: dict | None) -> list[dict]:
    return [f for f in (run or {}).get("findings", []) if f["severity"] in ALARM]


def _first_step(run: dict) -> int | None:
    steps = [int(s) for f in _alarms(run) for s in re.findall(r"\bstep (\d+)", f["message"])]
    if run.get("first_non_finite_step") is not None:
        steps.append(int(run["first_non_finite_step"]))
    return min(steps) if steps else None


def _variant(m: dict, runs: dict, v: str, seeds: int) -> dict:
    watch = [runs.get(f"{m['id']}/{v}/watch/{s}") for s in range(seeds)]
    done = [w for w in watch if w is not None]
    alarmed = [w for w in done if _alarms(w)]
    codes_by_seed = [{f["code"] for f in _alarms(w)} for w in done]
    majority = {c for c in set().union(*codes_by_seed) if sum(c in cs for cs in codes_by_seed) * 2 >= len(done)} \
        if done else set()
    shots = {c: runs.get(f"{m['id']}/{v}/{c}/0") for c in ONESHOT}
    shot_codes = {c: sorted({f["code"] for f in _alarms(r)}) for c, r in shots.items() if r is not None}
    crashes = [k for k, r in [("watch", w) for w in done] + list(shots.items()) if r and r["rc"] == 4]
    alarms = [f for w in done for f in _alarms(w)] + [f for r in shots.values() for f in _alarms(r)]
    where = [w for f in alarms for w in (f.get("members") or [f["where"]])]   # a folded finding: its parameters
    layers = m.get("fault_layers") or []
    localised = (any(w == L or w.startswith(L + ".") for w in where for L in layers)) if layers else None
    first = [s for s in (_first_step(w) for w in alarmed) if s is not None]
    overhead, per_step = [], []
    for p, w in _timing_pairs(runs, m["id"], v, seeds):   # CPU seconds of the training loop (not the wall clock)
        pr, wr = (p or {}).get("result") or {}, (w or {}).get("result") or {}
        if pr.get("cpu_seconds") and wr.get("cpu_seconds") and pr.get("steps"):
            overhead.append(wr["cpu_seconds"] / pr["cpu_seconds"] - 1)
            per_step.append((wr["cpu_seconds"] - pr["cpu_seconds"]) / pr["steps"] * 1e3)
    all_codes = sorted(majority | {c for cs in shot_codes.values() for c in cs})
    return {
        "watch_runs": len(done), "watch_alarmed": len(alarmed),
        "watch_detected": bool(done) and len(alarmed) * 2 >= len(done),
        "watch_codes": sorted(majority), "oneshot_codes": shot_codes,
        "detected": (bool(done) and len(alarmed) * 2 >= len(done)) or any(shot_codes.values()),
        "codes": all_codes,
        "types": sorted({t for c in all_codes for t in taxonomy.types_of(c)}),
        "diagnosed": taxonomy.diagnosed(all_codes, m.get("ground_truth")),
        "localised": localised,
        "first_alarm_step": statistics.median(first) if first else None,
        "overhead": statistics.median(overhead) if overhead else None,
        "overhead_ms_per_step": statistics.median(per_step) if per_step else None,
        "overhead_paired": f"{m['id']}/{v}/timing/0" in runs,
        "plain_ms_per_step": _ms_per_step(runs, m["id"], v, seeds),
        "crashes": crashes,
    }


def _timing_pairs(runs: dict, pid: str, v: str, seeds: int) -> list[tuple]:
    """(plain run, watched run) pairs for the overhead: the timing pass's, made back to back under the same load,
    where it ran; else each seed's reproduction and detection runs, made apart (hours, other loads)."""
    t = runs.get(f"{pid}/{v}/timing/0")
    if t and t.get("plain") and t.get("watch"):
        return [(t["plain"], t["watch"])]
    return [(runs.get(f"{pid}/{v}/plain/{s}"), runs.get(f"{pid}/{v}/watch/{s}")) for s in range(seeds)]


def _ms_per_step(runs: dict, pid: str, v: str, seeds: int) -> float | None:
    vals = [r["result"]["cpu_seconds"] / r["result"]["steps"] * 1e3 for s in range(seeds)
            if (r := runs.get(f"{pid}/{v}/plain/{s}")) and (r.get("result") or {}).get("cpu_seconds")
            and r["result"].get("steps")]
    return statistics.median(vals) if vals else None


def learns(m: dict, rep: dict, baseline: dict | None) -> bool | None:
    """Does the correct version beat a constant predictor (baseline.py) by the margin a bug must reproduce by
    (0.05 accuracy; a constant's error ≥ 1.25 × its own)? None when either is unknown."""
    mine, const = rep.get("median_correct"), (baseline or {}).get("median")
    if mine is None or const is None or not math.isfinite(mine) or not math.isfinite(const):
        return None
    return mine - const >= 0.05 if m["higher_is_better"] else const >= 1.25 * mine


def summarise(progs: list[dict], results: dict, seeds: int, baselines: dict | None = None) -> dict:
    runs = results["runs"]
    per = {}
    for m in progs:
        rep = reproduction(m, runs, seeds)
        per[m["id"]] = {"post": m["post"], "in_34": m.get("deepfd_source") == "DeepLocalize",
                        "ground_truth": m.get("ground_truth"),
                        "learns": learns(m, rep, (baselines or {}).get(m["id"])),
                        "reproduction": rep,
                        "buggy": _variant(m, runs, "buggy", seeds),
                        "correct": _variant(m, runs, "correct", seeds)}
    return {"seeds": seeds, "programs": per, "ported": len(progs)}


def _rate(items: list[bool]) -> str:
    k, n = sum(items), len(items)
    if n == 0:
        return "—"
    lo, hi = wilson(k, n)
    return f"{k}/{n} ({lo:.0%}–{hi:.0%})"


def _measured(r: dict, v: str) -> bool:
    return bool(r[v]["watch_runs"]) and len(r[v]["oneshot_codes"]) == len(ONESHOT)


def _rates(rows: list[dict]) -> dict:
    reproducing = [r for r in rows if r["reproduction"]["status"] == "reproduces"]
    rep = [r for r in reproducing if _measured(r, "buggy")]
    correct = [r for r in rows if _measured(r, "correct")]   # every correct version, reproducing or not
    learning = [r for r in correct if r.get("learns")]          # ... that beat a constant predictor
    loc = [r for r in rep if r["buggy"]["localised"] is not None]
    seeds_b = [(r["buggy"]["watch_alarmed"], r["buggy"]["watch_runs"]) for r in rep]
    seeds_c = [(r["correct"]["watch_alarmed"], r["correct"]["watch_runs"]) for r in correct]
    oh = [r[v]["overhead"] for r in rows for v in ("buggy", "correct") if r[v]["overhead"] is not None]
    ms = [r[v]["overhead_ms_per_step"] for r in rows for v in ("buggy", "correct")
          if r[v]["overhead_ms_per_step"] is not None]
    paired = sum(r[v].get("overhead_paired", False) for r in rows for v in ("buggy", "correct")
                 if r[v]["overhead"] is not None)
    return {
        "n": len(rep), "reproducing": len(reproducing),
        "detected": _rate([r["buggy"]["detected"] for r in rep]),
        "watch_detected": _rate([r["buggy"]["watch_detected"] for r in rep]),
        "watch_runs": _rate_pairs(seeds_b),
        "diagnosed": _rate([r["buggy"]["diagnosed"] for r in rep]),
        "localised": _rate([bool(r["buggy"]["localised"]) for r in loc]),
        "false_alarms": _rate([r["correct"]["detected"] for r in correct]),
        "false_alarms_learning": _rate([r["correct"]["detected"] for r in learning]),
        "false_alarm_runs": _rate_pairs(seeds_c),
        "overhead": (f"{statistics.median(oh):+.0%} of the training loop's CPU time, "
                     f"{statistics.median(ms):.2f} ms per step (medians over {len(oh)} program variants, {paired} of them from "
                     "plain and watched runs made back to back)") if oh else "—",
    }


def _rate_pairs(pairs: list[tuple[int, int]]) -> str:
    k, n = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return _rate([True] * k + [False] * (n - k))


def headline(summary: dict) -> str:
    rows = list(summary["programs"].values())
    st = [r["reproduction"]["status"] for r in rows]
    return (f"{summary['ported']} ported; reproduces {st.count('reproduces')}, does not "
            f"{st.count('does not reproduce')}, incomplete {st.count('incomplete')}")


def _fmt(x, spec: str = ".3g") -> str:
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN/crash"
    return format(x, spec)


def table(summary: dict) -> str:
    rows = summary["programs"]
    allrows = list(rows.values())
    in34 = [r for r in allrows if r["in_34"]]
    out = [headline(summary) + f" ({summary['seeds']} seeds each).", ""]
    out += ["| tool | detected | fault type diagnosed | false alarms on healthy models |", "|---|---|---|---|"]
    out += [f"| {t} | {d} | {g} | {f} |" for t, d, g, f in PUBLISHED]
    for label, sel in (("of the 34", in34), ("all ported", allrows)):
        r = _rates(sel)
        out.append(f"| **torchdiag**, {label}: {r['reproducing']} reproduce, {r['n']} measured so far | {r['detected']} (watch alone "
                   f"{r['watch_detected']}; per run {r['watch_runs']}) | {r['diagnosed']} | {r['false_alarms']} "
                   f"of the correct versions measured (watch per run {r['false_alarm_runs']}); "
                   f"{r['false_alarms_learning']} of those that beat a constant predictor |")
    r = _rates(allrows)
    out += ["", f"Rates: k/n (95% Wilson interval). Layer localised: {r['localised']} of the reproducing "
            f"programs whose meta.json names the faulty layer. watch's overhead: {r['overhead']}.", ""]
    weak = sorted(pid for pid, x in rows.items() if x.get("learns") is False)
    if weak:
        out[-1:-1] = ["", f"Correct versions that do not beat a constant predictor on the data the script evaluates on (held out "
                      f"where it has a validation split; so_31556268 and so_34311586 score their training data) by the margin a "
                      f"bug must reproduce by (bench/bugs/baseline.py: the training set's majority class or mean; 0.05 "
                      f"accuracy, or a constant's error ≥ 1.25 × theirs): {', '.join(weak)}."]
    out += ["| program | truth | buggy / correct (median) | p | reproduces | buggy: codes (warning/error) | "
            "types | diagnosed | localised | 1st alarm step | correct: codes |", "|" + "---|" * 11]
    for pid, r in sorted(rows.items()):
        rep, b, c = r["reproduction"], r["buggy"], r["correct"]
        if not _measured(r, "buggy"):
            out.append(f"| {pid} | {', '.join(r['ground_truth'] or ['—'])} | {_fmt(rep.get('median_buggy'))} / "
                       f"{_fmt(rep.get('median_correct'))} | {_fmt(rep.get('p'), '.3f')} | {rep['status']} | "
                       "not measured yet | | | | | |")
            continue
        out.append(
            f"| {pid} | {', '.join(r['ground_truth'] or ['—'])} | {_fmt(rep.get('median_buggy'))} / "
            f"{_fmt(rep.get('median_correct'))} | {_fmt(rep.get('p'), '.3f')} | {rep['status']} | "
            f"{', '.join(b['codes']) or '—'} | {', '.join(b['types']) or '—'} | {'yes' if b['diagnosed'] else 'no'} | "
            f"{ {None: 'n/a', True: 'yes', False: 'no'}[b['localised']] } | {_fmt(b['first_alarm_step'], '.0f')} | "
            f"{', '.join(c['codes']) or '—'} |")
    crashes = [(pid, v, r[v]["crashes"]) for pid, r in rows.items() for v in ("buggy", "correct") if r[v]["crashes"]]
    if crashes:
        out += ["", "torchdiag exit 4 (internal error): " + "; ".join(f"{p} {v}: {', '.join(c)}" for p, v, c in crashes)]
    return "\n".join(out)


def write_readme(path: Path, summary: dict) -> None:
    text = path.read_text() if path.exists() else ""
    body = f"{BEGIN}\n{table(summary)}\n{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + body + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n## Training-bug benchmarks\n\n" + body + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
