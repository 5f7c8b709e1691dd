"""The fast slice of the corpus (bench/corpus.py, issue 14): plain-torch models built like real ones
(BERT's embedding layout and dict output, T5's decoder contract, Inception's auxiliary head) through
summary, flops, nancheck, gradflow and doctor at batch 2 on CPU. A healthy model gets no error, no
warning and no internal error; the default inputs and the automatic loss are the ones a user gets.
The full corpus (torchvision, timm, Hugging Face) runs in bench/ with .venv-corpus."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import corpus  # noqa: E402
from corpus_models import plain_entries  # noqa: E402

ENTRIES = {e.name: e for e in plain_entries()}


@pytest.fixture(scope="module")
def runs():
    return {name: corpus.run_model(e, corpus.COMMANDS, max_params=0) for name, e in ENTRIES.items()}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_healthy_model_passes_every_command(runs, name):
    r = runs[name]
    assert [c["command"] for c in r["commands"]] == list(corpus.COMMANDS)
    for c in r["commands"]:
        assert not c.get("internal"), (c["command"], c.get("raised"))
        assert not c.get("raised"), (c["command"], c["raised"])
        assert c["errors"] == [], (c["command"], c["errors"])
        assert c["warnings"] == [], (c["command"], c["warnings"])   # issue 26: no false warning either
        assert c["exit"] == 0, c


def test_inputs_are_the_ones_a_user_gets(runs):
    bert = runs["pt_bert_like"]["input_notes"]
    assert bert == ["input_ids: integer values in [0, 1000) (the nn.Embedding that consumes it: word_embeddings)",
                    "attention_mask: all ones (attend to every position)"]
    seq2seq = runs["pt_seq2seq_like"]
    assert seq2seq["input_kwargs"] == ["decoder_input_ids"]   # without them the forward raises (exit 3)


def test_the_auxiliary_head_is_in_the_loss(runs):
    grad = {c["command"]: c for c in runs["pt_aux_classifier"]["commands"]}["gradflow"]
    assert grad["loss"] == ("cross_entropy on output[0] against random class targets"
                            " + cross_entropy on output[1] against the same target")   # as the header shows it
    assert not any(f["code"] in ("no-grad", "param-not-updated") for f in grad["errors"] + grad["warnings"])


def test_zero_init_residual_is_not_an_error():
    from corpus_models import Entry

    from support import load_module

    # timm's zero_init_last: the last BatchNorm scale of every residual branch starts at 0 (healthy)
    zero_init_residual = load_module("by_design.py").ZeroInitResidual
    r = corpus.run_model(Entry("zero_init_residual", "plain", zero_init_residual, ["2x3x8x8"]), ["gradflow", "doctor"], 0)
    for c in r["commands"]:
        assert c["errors"] == [] and c["warnings"] == [] and c["exit"] == 0, c


def test_dead_units_by_chance_are_not_a_warning(runs):
    # bench/corpus-findings.md item 6: aux.1 (32 ReLU units on pooled features) had 17 units 0 for both
    # samples of the batch; re-judged on 16 fresh, different samples they are alive (info, not a warning)
    grad = {c["command"]: c for c in runs["pt_aux_classifier"]["commands"]}["gradflow"]
    assert [f["where"] for f in grad["info"] if f["code"] == "dead-units"] == ["aux.1"]
    assert "by chance" in next(f["message"] for f in grad["info"] if f["code"] == "dead-units")
    assert not any(f["code"] == "dead-units" for f in grad["warnings"]), grad["warnings"]
    assert {c["command"]: c["warnings"] for c in runs["pt_aux_classifier"]["commands"]} == {c: [] for c in corpus.COMMANDS}


def test_a_re_check_that_could_not_run_is_recorded_in_the_row():
    """A zoo row whose re-check on a copy failed keeps the plain verdicts; the row must say so (ALIGN's float64
    invariance copy ran out of a worker's 14 GiB cap and its 7 cancelled biases came back as vanishing-grad).
    Here the copy cannot be made at all: the model holds a lock, which deepcopy refuses."""
    import threading

    import torch

    from support import load_module

    model = load_module("broken_grad_vanishing.py").build()
    model.lock = threading.Lock()
    from torchdiag.core.inputs import ModelInputs

    rec = corpus.run_command("gradflow", model, ModelInputs((torch.randn(8, 16),)))
    assert rec["exit"] == 0 and {w["code"] for w in rec["warnings"]} == {"vanishing-grad"}, rec
    assert any("not re-checked" in n for n in rec["not_rechecked"]), rec
    assert "(a re-check did not run)" in corpus.cell(rec)


@pytest.mark.parametrize("note, skipped", [
    ("cancelled gradients not re-checked on a copy: the loss on the torch.float32 copy is inf", True),
    ("cancelled parameters re-checked in float32 (the float64 copy failed: mat1 and mat2 must have the same dtype)",
     False),   # the float32 fallback ran (DAB-DETR's float32 tensor made in forward)
    ("two of the batch's samples on a fresh copy, to tell capacity from a fault, failed: out of memory", True),
    ("6 flagged finding(s) re-checked on a copy: 3 optimizer steps on the same batch", False),
])
def test_which_notes_say_a_re_check_did_not_run(note, skipped):
    assert bool(corpus.SKIPPED.search(note)) is skipped
