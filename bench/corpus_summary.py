"""Counts of a corpus run (bench/corpus.py --json-out): per family, and per finding code with the models
it fired on — the numbers bench/README.md records.

    .venv-corpus/bin/python bench/corpus_summary.py bench/corpus-zoo-results.json"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

EXCEPTIONS = "#### Exceptions: findings kept"   # bench/README.md's table of findings true of their model


def family(r: dict) -> str:
    spec = r.get("spec") or ""
    return spec.split(":", 1)[0] if spec else r["model"].split("_", 2)[1] if r["model"].startswith("zoo_") else "other"


def summary(results: list[dict]) -> str:
    fams: dict[str, Counter] = defaultdict(Counter)
    codes: dict[tuple, list] = defaultdict(list)
    raised: dict[str, list] = defaultdict(list)
    for r in results:
        c = fams[family(r)]
        c["models"] += 1
        if r.get("build_error") or r.get("input_error"):
            c["not built"] += 1
            continue
        if r.get("timeout"):
            c["timeout"] += 1
            continue
        cmds = [x for x in r.get("commands", []) if "skipped" not in x]
        if not cmds:
            continue
        c["ran"] += 1
        if all(x.get("exit") == 0 and not x.get("errors") and not x.get("warnings") for x in cmds):
            c["clean"] += 1
        if any(x.get("errors") for x in cmds):
            c["with errors"] += 1
        if any(x.get("warnings") for x in cmds):
            c["with warnings"] += 1
        if any(x.get("exit") not in (0, None) for x in cmds):
            c["exit ≠ 0"] += 1
        if any(x.get("internal") for x in cmds):
            c["internal"] += 1
        if any(x.get("not_rechecked") for x in cmds):
            c["re-check not run"] += 1
        for x in cmds:
            for f in x.get("errors", []) + x.get("warnings", []):
                codes[(f["severity"], f["code"], x["command"])].append(r["model"])
            if x.get("raised"):
                raised[f"{x['command']} exit {x['exit']}: {x['raised'].split(':')[0]}"].append(r["model"])
    cols = ["models", "not built", "timeout", "ran", "clean", "with errors", "with warnings", "exit ≠ 0", "internal",
            "re-check not run"]
    lines = ["| family | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    total = Counter()
    for fam in sorted(fams):
        total.update(fams[fam])
        lines.append(f"| {fam} | " + " | ".join(str(fams[fam][k]) for k in cols) + " |")
    lines.append("| **all** | " + " | ".join(f"**{total[k]}**" for k in cols) + " |")
    lines += ["", "clean: every command ran with exit 0, no error and no warning. re-check not run: a command noted that "
              "a re-check on a copy could not run (out of memory under the worker's cap, a forward that failed on it), "
              "so its verdicts are the plain ones (recorded since 2026-11-30, eighteenth session).", ""]
    if codes:
        lines += ["| severity | code | command | models | which |", "|---|---|---|---:|---|"]
        for (sev, code, cmd), models in sorted(codes.items(), key=lambda kv: (kv[0][0], -len(set(kv[1])))):
            names = sorted(set(models))
            lines.append(f"| {sev} | `{code}` | {cmd} | {len(names)} | {', '.join(names[:12])}"
                         + (f" … (+{len(names) - 12})" if len(names) > 12 else "") + " |")
    if raised:
        lines += ["", "| raised | models | which |", "|---|---:|---|"]
        for what, models in sorted(raised.items(), key=lambda kv: -len(kv[1])):
            names = sorted(set(models))
            lines.append(f"| {what} | {len(names)} | {', '.join(names[:12])}" + (" …" if len(names) > 12 else "") + " |")
    return "\n".join(lines) + "\n"


def short_name(model: str) -> str:
    """A zoo row's name as the exceptions table writes it: zoo_hf_levit -> levit."""
    return re.sub(r"^zoo_(hf|timm|tv)_", "", model)


def unlisted(results: list[dict], readme: str) -> list[str]:
    """The rows with an error, a warning or an exit other than 0/1 that the README's exceptions table does not list:
    issue 26 keeps a finding on a healthy model only when it is listed there with its reason. Each finding's code must
    be on a table row that names the model (a zoo re-run: hf swiftformer's new batchnorm-batch-1 passed, the model
    being listed for another finding); a failed exit, the model named."""
    start = readme.find(EXCEPTIONS)
    if start < 0:
        return []
    end = readme.find("\n#", start + len(EXCEPTIONS))
    table = readme[start:end if end > 0 else len(readme)]
    out = []
    for r in results:
        cmds = [x for x in r.get("commands", []) if "skipped" not in x]
        codes = {f["code"] if isinstance(f, dict) else f for x in cmds for f in x.get("errors", []) + x.get("warnings", [])}
        if not codes and all(x.get("exit") in (0, 1, None) for x in cmds):
            continue
        name = re.compile(r"(?<![\w-])" + re.escape(short_name(r["model"])) + r"(?![\w-])")
        rows = [line for line in table.splitlines() if name.search(line)]
        if not rows or any(not any(code in line for line in rows) for code in codes):
            out.append(r["model"])
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: corpus_summary.py RESULTS.json   (a corpus run's --json-out, e.g. bench/corpus-zoo-results.json)",
              file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        print(f"corpus_summary.py: cannot read {argv[0]}: {e}", file=sys.stderr)
        return 2
    if not isinstance(results, list):
        print(f"corpus_summary.py: {argv[0]} is not a corpus run's result list", file=sys.stderr)
        return 2
    print(summary(results))
    readme = Path(__file__).with_name("README.md")
    if readme.exists():
        missing = unlisted(results, readme.read_text(encoding="utf-8"))
        print(f"rows with a finding or a failed exit not named in bench/README's exceptions table: {len(missing)}"
              + (f" ({', '.join(missing)})" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
