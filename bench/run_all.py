"""Run every bench/bench_*.py in turn (each prints its own ratios)."""
import runpy
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here))
for path in sorted(here.glob("bench_*.py")):
    print(f"=== {path.name}")
    runpy.run_path(str(path), run_name="__main__")
