"""The tests' helpers, one home: paths, sample models, the in-process CLI result, torchrun launches, and children
started with signal dispositions of their own (`spawn`). Test modules import from here (`from support import ...`),
never from one another; conftest.py keeps the fixtures and the collection hook."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"

HANG_GUARD = 600   # seconds: only so a hang fails the suite instead of blocking it; never asserted on
ENDS_WITHIN = 120  # seconds a child gets to end once it has been signalled (it has started: seconds, not half an hour)


def sample(name: str) -> str:
    """'cnn.py:build' → absolute MODEL_SPEC."""
    return f"{SAMPLES}/{name}"


# command -> arguments for a fast run on a small sample model (used by several test files)
FAST_RUNS = {
    "summary": [sample("cnn.py:build")],
    "flops": [sample("cnn.py:build"), "--backward"],
    "nancheck": [sample("mlp.py:build")],
    "gradflow": [sample("mlp.py:build")],
    "overfit-batch": [sample("mlp.py:build"), "--steps", "30"],
    "profile": [sample("mlp.py:build"), "--active", "2", "--warmup", "1", "--wait", "0"],
    "memory": [sample("mlp.py:build")],
    "doctor": [sample("mlp.py:build")],
    "activations": [sample("cnn.py:build")],
    "attention": [sample("vit.py:build")],
    "data": [sample("data_digits.py:train"), "--samples", "200", "--no-sweep", "--batches", "2"],
    "lr-find": [sample("mlp.py:build"), "--steps", "20", "--repeats", "1", "--check-steps", "3"],
}


def one_error_line(r) -> None:
    """A usage or model error: exactly one `error:` line on stderr, no traceback anywhere."""
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout


class CliResult:
    def __init__(self, code, stdout, stderr):
        self.code, self.stdout, self.stderr = code, stdout, stderr

    @property
    def json(self):
        return json.loads(self.stdout)


def load_module(name: str):
    """A sample model file as a module (its classes and factories)."""
    from torchdiag.core.loading import import_module

    return import_module(str(SAMPLES / name))


def load(name: str, *arg_pairs, device="cpu", inputs=None):
    """(model, ModelInputs) for a sample model, as the CLI would build them."""
    import torch

    from torchdiag.core.inputs import resolve_inputs
    from torchdiag.core.loading import load_model

    dev = torch.device(device)
    loaded = load_model(sample(name), list(arg_pairs), dev)
    return loaded.model, resolve_inputs(inputs or [], loaded, dev, seed=0)


def assert_readme_picture(doc: str, made) -> None:
    """docs/images/<doc> is what the code draws now (docs/images/regenerate.sh rebuilds them).
    Same size, and the same picture once each 8x8 block is averaged: anti-aliasing, font rendering and a line
    moved by a pixel or two (another matplotlib/freetype, or another CPU's float kernels, which shift a curve
    where a run diverges) stay below it: at most 1% of blocks off by more than 40 levels, a mean block
    difference under 2 levels. A stale picture fails both: lr_find.png against the same command with --seed 1
    (other weights) is 7.7% of blocks and 5.9 levels; against an AVX-512 machine's run, 0.4% and 0.87."""
    import numpy as np
    from PIL import Image

    a = np.asarray(Image.open(ROOT / "docs" / "images" / doc).convert("RGB")).astype(np.float64)
    b = np.asarray(Image.open(made).convert("RGB")).astype(np.float64)
    stale = f"docs/images/{doc} is stale: run sh docs/images/regenerate.sh"
    assert a.shape == b.shape, stale

    def blocks(x, k=8):
        h, w, c = x.shape
        return x[: h - h % k, : w - w % k].reshape(h // k, k, w // k, k, c).mean(axis=(1, 3))

    diff = np.abs(blocks(a) - blocks(b))
    assert (diff.max(axis=2) > 40).mean() <= 0.01 and diff.mean() < 2.0, stale


# ---- children ----------------------------------------------------------------------------------------------------

def _default_signals() -> None:
    """In the child, before exec: SIGINT and SIGTERM back to their defaults. A shell started in the background
    (`cmd &`, some CI runners) ignores SIGINT, children inherit that, and Python then installs no
    KeyboardInterrupt handler: a Ctrl-C test would wait for the child's whole run instead of its interruption."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def spawn(args, **kw) -> subprocess.Popen:
    """subprocess.Popen(args, **kw) whose child starts with default SIGINT/SIGTERM dispositions, whatever this
    process inherited. Every test that interrupts a child starts it here."""
    return subprocess.Popen(args, preexec_fn=_default_signals, **kw)  # the test starts no threads: preexec_fn is safe


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen | None = None, guard: float = HANG_GUARD) -> bool:
    """Poll `ready()` (a marker file the child writes once it is where the test wants it) until it holds, the child
    has ended, or the hang guard passes; returns ready(). Follows the child's progress, no fixed deadline."""
    end = time.monotonic() + guard
    while not ready() and (proc is None or proc.poll() is None) and time.monotonic() < end:
        time.sleep(0.05)
    return ready()


# ---- torchrun ----------------------------------------------------------------------------------------------------

def torchrun_args(*target, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """`torch.distributed.run --standalone --nproc_per_node 2 TARGET...` (a script and its arguments, or `-m`
    torchdiag ...), output captured: --standalone picks a free port, so launches from parallel test workers do not
    collide; the timeout only turns a hang into a failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *map(str, target)]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(cmd, cwd=cwd or ROOT, capture_output=True, text=True, timeout=HANG_GUARD, env=full_env)


def torchrun(*args, env: dict | None = None, device: str = "cpu", cwd=None) -> tuple[int, Any, str]:
    """`torchrun --standalone --nproc_per_node 2 -m torchdiag ARGS --device cpu --json`: (returncode, doc, stderr)."""
    r = torchrun_args("-m", "torchdiag", *args, "--device", device, "--json", env=env, cwd=cwd)
    return r.returncode, json.loads(r.stdout), r.stderr


def launched_fixtures(*names: str) -> list:
    """Module-scoped fixtures, one per name, each the `launched` fixture's result for that name (the runs of one
    `torchrun_many` launch): `healthy, nan_rank = launched_fixtures("healthy", "nan_rank")`."""
    import pytest

    def make(name):
        @pytest.fixture(scope="module", name=name)
        def pick(launched):
            return launched[name]
        return pick
    return [make(n) for n in names]


class Started:
    """A `torchrun` launch running in the background (`torchrun_started`); `result()` waits for it."""

    def __init__(self, args, env: dict | None):
        import tempfile

        self.folder = Path(tempfile.mkdtemp(prefix="torchrun-started-"))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "torchdiag", *map(str, args), "--device", "cpu", "--json"]
        with open(self.folder / "out", "w") as out, open(self.folder / "err", "w") as err:   # files: a pipe could fill
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True,
                                         env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})

    def result(self) -> tuple[int, Any, str]:
        """As `torchrun` returns: (returncode, doc, stderr)."""
        code = self.proc.wait(timeout=HANG_GUARD)
        return code, json.loads((self.folder / "out").read_text()), (self.folder / "err").read_text()


def torchrun_started(*args, env: dict | None = None) -> Started:
    """`torchrun` started and not waited for: for a launch that spends its time waiting out a collective timeout
    (a rank fails while its peer waits), so the module's other launches run meanwhile instead of a core idling."""
    return Started(args, env)


def torchrun_many(runs: dict[str, list], env: dict | None = None, cwd=None) -> dict[str, tuple[int, Any, str]]:
    """Several `torchdiag ARGS --device cpu --json` commands in one launch of 2 ranks: each rank starts once (one
    `import torch` a rank, not one a command), joins the default gloo group as a user's program would, and runs
    the commands in turn through the command line in-process (torchdiag borrows the group it finds:
    core.distributed.session). Per name: (the worst exit code over the ranks, rank 0's JSON document, every
    rank's stderr). Only for commands every rank ends normally: a run where a rank fails, hangs or is signalled
    gets a launch of its own (`torchrun`), so the launch's own exit code is the one tested."""
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="torchrun-many-"))
    plan = {"out": str(out), "runs": {name: [*map(str, args), "--device", "cpu", "--json"] for name, args in runs.items()}}
    (out / "plan.json").write_text(json.dumps(plan))
    r = torchrun_args(__file__, "--ranks-batch", out / "plan.json", env=env, cwd=cwd)
    results = {}
    for name in runs:
        ranks = [out / f"{name}.{rank}.json" for rank in (0, 1)]
        assert r.returncode == 0 and all(f.exists() for f in ranks), f"the launch of {name} failed:\n{r.stderr[-3000:]}"
        got = [json.loads(f.read_text()) for f in ranks]
        results[name] = (max(g["code"] for g in got), json.loads(got[0]["stdout"]), "".join(g["stderr"] for g in got))
    return results


def _ranks_batch(plan_file: str) -> None:
    """One rank of `torchrun_many`: the plan's commands in turn, each rank's result to OUT/NAME.RANK.json."""
    import torch.distributed as dist
    from typer.testing import CliRunner

    from torchdiag.cli.app import app

    plan = json.loads(Path(plan_file).read_text())
    dist.init_process_group("gloo")
    try:
        for name, args in plan["runs"].items():
            r = CliRunner().invoke(app, args, catch_exceptions=False)
            record = {"code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr}
            Path(plan["out"], f"{name}.{dist.get_rank()}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


def by_code(doc, code):
    """The findings of a JSON report with this code."""
    return [f for f in doc["findings"] if f["code"] == code]


# ---- a pretend GPU (tests/test_gpu_assumptions.py) ---------------------------------------------------------------

# the tests that failed or skipped on a GPU machine before issue 16 was fixed: discovery must find them all
KNOWN_DEVICE_DEPENDENT = {
    "test_activations.py::test_bad_input_bad_layer_and_cuda_exit_2",
    "test_attention.py::test_usage_errors",
    "test_embeddings.py::test_usage_errors",
    "test_gradcam.py::test_usage_errors",
    "test_gradcheck.py::test_usage_errors_exit_2",
    "test_memory.py::test_json_keys",
    "test_profile.py::test_cli_table_output",
    # these skipped themselves where a GPU exists (the CPU-only message went untested there)
    "test_memory.py::test_bad_input_exit_2",
    "test_profile.py::test_cuda_request_without_cuda_exit_2",
    "test_doctor.py::test_cuda_on_cpu_only_machine_is_exit_2",
    "test_gradflow.py::test_meta_and_cuda_devices_are_usage_errors",
    "test_loading.py::test_errors_are_one_line_with_exit_code",
    "test_nancheck.py::test_cuda_on_cpu_only_machine_is_a_clear_exit_2",
    "test_overfit_batch.py::test_cuda_on_cpu_only_machine_is_exit_2",
}
PRETEND_GPU = "pretend-gpu"   # the id suffix of a test's second run, with a pretend GPU present
# the check that the second run does claim a GPU (test_gpu_assumptions.py is not searched, so it is named here)
PRETEND_GPU_SELF_CHECK = "test_gpu_assumptions.py::test_the_second_run_has_a_pretend_gpu"


class fake_gpu:
    """Context manager: torch.cuda.is_available() -> True, torch.cuda.device_count() -> 1."""

    def __enter__(self):
        import torch

        self.saved = torch.cuda.is_available, torch.cuda.device_count
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1
        return self

    def __exit__(self, *exc):
        import torch

        torch.cuda.is_available, torch.cuda.device_count = self.saved
        return False


def _constants(node) -> list:
    import ast

    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _pins_a_device(func) -> bool:
    import ast
    import re

    if any(s == "cuda" or re.fullmatch(r"cuda:\d+", s) for s in _constants(func)):
        return True
    for node in ast.walk(func):  # "--device", "cpu" side by side in a call or a list of arguments
        seq = getattr(node, "elts", None) or (node.args if isinstance(node, ast.Call) else None) or []
        values = [n.value if isinstance(n, ast.Constant) else None for n in seq]
        if any(a == "--device" and b == "cpu" for a, b in zip(values, values[1:])):
            return True
    return False


def _marked_cuda(func) -> bool:
    import ast

    return any(ast.unparse(d.func if isinstance(d, ast.Call) else d).endswith("mark.cuda") for d in func.decorator_list)


def device_dependent_tests() -> list[str]:
    """'file::function' of every test function (not marked cuda) of tests/test_*.py that runs the CLI in-process
    (the `cli` fixture) and whose code or parametrisation holds "cuda"/"cuda:N" or the pair "--device", "cpu"."""
    import ast

    found = []
    for path in sorted(Path(__file__).resolve().parent.glob("test_*.py")):
        if path.name == "test_gpu_assumptions.py":
            continue
        for func in ast.parse(path.read_text()).body:
            if (isinstance(func, ast.FunctionDef) and func.name.startswith("test_")
                    and "cli" in [a.arg for a in func.args.args] and not _marked_cuda(func) and _pins_a_device(func)):
                found.append(f"{path.name}::{func.name}")
    return found


def pretend_gpu_selection() -> set[str]:
    """The tests that run a second time with a pretend GPU present."""
    return KNOWN_DEVICE_DEPENDENT | set(device_dependent_tests()) | {PRETEND_GPU_SELF_CHECK}


GPU_HINT = ("this run claims one CUDA device (torch.cuda.is_available() -> True, device_count() -> 1): a test of "
            "the CPU-only message simulates a CPU-only machine (monkeypatch torch.cuda.is_available to False), "
            "a test of CPU output pins --device cpu")


def pretend_gpu_report(report):
    """A report of a second run: says what the run pretends; a skip (the test relied on CUDA being absent) is
    its failure."""
    report.sections.append((PRETEND_GPU, GPU_HINT))
    if report.skipped:
        report.outcome, report.longrepr = "failed", f"skipped with a (pretend) GPU present: {report.longrepr}"
    return report


if __name__ == "__main__" and sys.argv[1:2] == ["--ranks-batch"]:
    _ranks_batch(sys.argv[2])
