"""core/spec_check.py: a missing model file or factory is refused before torch is imported, and only when
the file's top level certainly does not bind the name (read with ast, never run)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from torchdiag.core.spec_check import precheck, top_level_names
from torchdiag.errors import UsageError


def write(tmp_path, text: str, name: str = "m.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_missing_file_and_a_misspelt_factory_are_refused_with_the_loaders_words(tmp_path):
    path = write(tmp_path, """
        import torch
        def build(): return torch.nn.Linear(2, 2)
        class Net(torch.nn.Module): pass
    """)
    with pytest.raises(UsageError, match="model file not found") as e:
        precheck(f"{tmp_path}/nope.py:build")
    with pytest.raises(UsageError, match="has no factory named 'biuld'") as e:
        precheck(f"{path}:biuld")
    assert e.value.hint == "did you mean build?"


def test_a_module_the_file_imports_is_no_factory_to_suggest(tmp_path):
    """A sweep: `models.py:nosuch` was answered "did you mean torch, noisy?": torch is the module the file imports.
    A name imported from a module (a factory) is still suggested."""
    path = write(tmp_path, """
        import torch
        import torch.nn as nn
        from helpers import noisy_builder
        SEED = 0
        def noisy(): return nn.Linear(2, 2)
    """)
    with pytest.raises(UsageError, match="has no factory named 'nosuch'") as e:
        precheck(f"{path}:nosuch")
    assert "torch" not in e.value.hint and "nn" not in e.value.hint.split() and "noisy" in e.value.hint
    with pytest.raises(UsageError, match="has no factory named 'model'") as e:   # a review: SEED offered too
        precheck(f"{path}:model")
    assert e.value.hint == "callables there: noisy, noisy_builder", e.value.hint
    # a second review: literals of every form are left out, and a name bound to a literal and then to a function
    # (build = None, then def build) is still offered
    path = write(tmp_path, """
        SEED: int = 0
        A, B = 0, 1
        NEG = -1
        CFG = {"width": 8}
        build = None
        def build(): return None
    """, "m2.py")
    with pytest.raises(UsageError) as e:
        precheck(f"{path}:buidl")
    assert e.value.hint == "did you mean build?", e.value.hint
    with pytest.raises(UsageError) as e:
        precheck(f"{path}:model")
    assert e.value.hint == "callables there: build", e.value.hint


@pytest.mark.parametrize("body", [
    "def build(): pass",
    "class build: pass",
    "build = lambda: None",
    "from os import path as build",
    "import build",
    "if True:\n    def build(): pass\nelse:\n    build = None",
    "try:\n    from fast import build\nexcept ImportError:\n    def build(): pass",
    "for build in [1]: pass",
    "with open(__file__) as build: pass",
])
def test_every_way_the_top_level_binds_a_name_is_seen(tmp_path, body):
    precheck(f"{write(tmp_path, body)}:build")   # does not raise


@pytest.mark.parametrize("body", [
    "from os.path import *",
    "def __getattr__(name): return lambda: None",
    "globals()['build'] = lambda: None",
    "exec('def build(): pass')",
    "def (:",
])
def test_a_file_that_can_bind_names_unseen_is_left_to_the_import(tmp_path, body):
    path = write(tmp_path, body)
    precheck(f"{path}:build")
    assert top_level_names(path) is None


def test_what_is_not_a_file_spec_is_left_to_the_loader(tmp_path):
    for spec in ("torchvision:resnet18", "timm:nope", f"hf:{tmp_path}", "hf:./not-there", "os.path:join", "no_colon",
                 "pkg.mod:build", f"{tmp_path}:build"):   # a folder: the loader says it is one
        precheck(spec)   # (an hf: Hub name is checked against the cache here: tests/test_hub.py)
@pytest.mark.slow
@pytest.mark.subprocess
def test_the_cli_answers_a_misspelt_factory_without_importing_torch(tmp_path):
    """One process, `-X importtime`: the error comes out and torch was never imported."""
    path = write(tmp_path, "def build(): pass")
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "torchdiag", "summary", f"{path}:biuld"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "has no factory named 'biuld'" in r.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    assert "torch" not in imported and "numpy" not in imported
