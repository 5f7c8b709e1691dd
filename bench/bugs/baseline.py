"""What a constant predictor scores on each program's held-out data (issue 32), to tell the correct versions that
learn their task from those that do not: a false alarm on a correct version that scores no better than a constant
says little about the tool.

For every program and seed, the correct script's `main()` runs up to its `harness.fit` call, which is replaced by
one that scores a constant with the harness's own metric and stops: the training set's majority per output
(binary), its most frequent class (categorical, sparse) or its mean (regression, divided by the script's y_scale
squared as fit does) on the validation set fit would evaluate. No training runs: seconds in all.

    python bench/bugs/baseline.py        # writes bench/bugs/baselines.json
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402

OUT = HERE / "baselines.json"


class _Scored(Exception):
    def __init__(self, value: float):
        self.value = value


def constant_score(x, y, *, task: str, x_val=None, y_val=None, y_scale: float = 1.0, **_) -> float:
    """The harness's metric of the best constant the training targets suggest, on the validation targets."""
    import numpy as np
    import torch

    y = torch.as_tensor(np.asarray(y), dtype=torch.float32)
    y_val = y if y_val is None else torch.as_tensor(np.asarray(y_val), dtype=torch.float32)
    if task == "binary":
        const = (y.reshape(len(y), -1).mean(0) > 0.5).float().reshape(y.shape[1:])
    elif task == "categorical":
        const = torch.nn.functional.one_hot(y.argmax(-1).mode().values, y.shape[-1]).float()
    elif task == "sparse":
        k = int(y.long().view(-1).mode().values)
        const = torch.nn.functional.one_hot(torch.tensor(k), int(y.max()) + 1).float()
    else:
        const = y.mean(0)
    p = const.expand(len(y_val), *const.shape) if task != "sparse" else const.expand(len(y_val), -1)
    score = harness._metric(task, p, y_val)
    return score["acc"] if "acc" in score else score["mse"] / y_scale ** 2


def _fake_fit(model, loss_name, opt, x, y, **kw):
    raise _Scored(constant_score(x, y, **kw))


def score(program: Path, seed: int) -> float | None:
    spec = importlib.util.spec_from_file_location(f"bl_{program.name}_{seed}", program / "correct.py")
    mod = importlib.util.module_from_spec(spec)
    real, argv = harness.fit, sys.argv
    harness.fit, sys.argv = _fake_fit, [str(program / "correct.py"), "--seed", str(seed)]
    try:
        spec.loader.exec_module(mod)
        mod.main()
    except _Scored as got:
        return got.value
    finally:
        harness.fit, sys.argv = real, argv
    return None   # the script trains without harness.fit


def main() -> int:
    out = {}
    for meta in sorted(HERE.glob("*/meta.json")):
        m = json.loads(meta.read_text())
        seeds = [score(meta.parent, s) for s in range(5)]
        got = [s for s in seeds if s is not None]
        out[m["id"]] = {"metric": m["metric"], "higher_is_better": m["higher_is_better"], "seeds": seeds,
                        "median": statistics.median(got) if got else None}
        print(m["id"], out[m["id"]]["median"], file=sys.stderr)
    tmp = OUT.with_name(OUT.name + ".tmp")   # the old file stays until the new one is whole
    tmp.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
