"""Run one ported script for several seeds in one process (`python seeds.py buggy.py 0 1 2 3 4`).

Starting Python and importing torch costs seconds on a loaded machine; the plain (unwatched) runs of the
reproduction only need each seed's BUGS_RESULT line, so they share one process. Each seed runs the
script as `__main__` with its own argv, as `python buggy.py --seed s` would; a seed that raises prints
`BUGS_ERROR {seed, error}` and the next one runs.
"""
from __future__ import annotations

import json
import runpy
import sys
import traceback
from pathlib import Path


def main() -> int:
    script, seeds = sys.argv[1], sys.argv[2:]
    extra = []
    if "--" in seeds:
        i = seeds.index("--")
        seeds, extra = seeds[:i], seeds[i + 1:]
    sys.path.insert(0, str(Path(script).resolve().parent))
    for s in seeds:
        sys.argv = [script, "--seed", s, *extra]
        print(f"BUGS_SEED {s}", flush=True)
        try:
            runpy.run_path(script, run_name="__main__")
        except BaseException as e:  # noqa: BLE001 - one seed's failure is recorded, the others still run
            if isinstance(e, KeyboardInterrupt):
                raise
            print("BUGS_ERROR " + json.dumps({"seed": int(s), "error": f"{type(e).__name__}: {e}",
                                             "trace": traceback.format_exc()[-600:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
