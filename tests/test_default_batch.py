"""Defaults never break a healthy model (issue 26): a source model's default batch is 2 for the commands
that run train mode (BatchNorm after global pooling refuses one sample there), 1 for the others; the
user's own inputs are never changed."""
from __future__ import annotations


def test_batched_specs_and_the_users_own_inputs():
    from types import SimpleNamespace

    from torchdiag.core import sources

    assert sources.batched(("1x3x224x224", "1x128:int64", "3x8", "1"), 2) == ("2x3x224x224", "2x128:int64", "3x8", "1")
    loaded = SimpleNamespace(default_inputs=("1x3x32x32",), input_source="timm:x default", module=None)
    sources.for_training(loaded)
    assert loaded.default_inputs == ("2x3x32x32",) and loaded.input_source.endswith("more than one sample")
    own = SimpleNamespace(default_inputs=(), input_source="", module=SimpleNamespace(example_inputs=lambda: 1))
    sources.for_training(own)      # a user's example_inputs are the user's: never changed
    assert own.default_inputs == () and own.input_source == ""
    assert [c for c in ("summary", "flops", "gradflow", "doctor", "nancheck") if sources.trains(c)] == \
        ["gradflow", "doctor", "nancheck"]


def test_the_training_commands_are_the_registrys():
    # core cannot import the registry; this keeps core's list and the registry's training commands one list
    from torchdiag.commands import COMMANDS, MODEL
    from torchdiag.core.sources import TRAINING_COMMANDS

    assert set(TRAINING_COMMANDS) == {c.name for c in COMMANDS if c.groups == MODEL} | {"check"}
