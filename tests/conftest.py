"""Shared test helpers: run the CLI in-process, load sample models, check models are untouched."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


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


@pytest.fixture
def cli():
    """cli('summary', spec, '-i', ...) → CliResult(code, stdout, stderr), in-process."""
    from typer.testing import CliRunner

    from torchdiag.cli.app import app

    runner = CliRunner()

    def run(*args):
        r = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
        return CliResult(r.exit_code, r.stdout, r.stderr)

    return run


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


@pytest.fixture
def untouched():
    """with untouched(model): ... asserts the model and global state are as they were."""
    import contextlib

    from torchdiag.core.guard import differences, fingerprint

    @contextlib.contextmanager
    def check(model):
        before = fingerprint(model)
        yield
        changed = differences(before, fingerprint(model))
        assert not changed, f"diagnostic changed the model or global state: {changed}"

    return check


def assert_readme_picture(doc: str, made) -> None:
    """docs/images/<doc> is what the code draws now (docs/images/regenerate.sh rebuilds them).
    Same size, and the same picture up to anti-aliasing and font rendering, which change with the
    matplotlib/freetype a fresh install brings: at most 0.5% of pixels off by more than 40 levels and
    a mean difference under 2 levels. A stale picture (other weights, layout or colours) fails both."""
    import numpy as np
    from PIL import Image

    a = np.asarray(Image.open(ROOT / "docs" / "images" / doc).convert("RGB")).astype(np.int16)
    b = np.asarray(Image.open(made).convert("RGB")).astype(np.int16)
    stale = f"docs/images/{doc} is stale: run sh docs/images/regenerate.sh"
    assert a.shape == b.shape, stale
    diff = np.abs(a - b)
    assert (diff.max(axis=2) > 40).mean() <= 0.005 and diff.mean() < 2.0, stale
