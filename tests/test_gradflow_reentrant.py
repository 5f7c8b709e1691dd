"""gradflow's no-grad on a reentrant checkpoint none of whose inputs needs a gradient (fifty-third session): torch
runs the function under no_grad and never recomputes it, so its parameters get none. The finding said "ran under
torch.no_grad()" and hinted at removing a no_grad the user never wrote; it names the checkpoint and the fix."""
from __future__ import annotations

import pytest

MODEL = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))

    def forward(self, x):   # x is the raw input: nothing before the checkpoint needs a gradient
        return checkpoint(self.mlp, x, use_reentrant=self.reentrant)


class Net(nn.Module):
    def __init__(self, reentrant=True):
        super().__init__()
        self.encoder = Block(reentrant)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.encoder(x))


def reentrant():
    return Net(True)


def plain():
    return Net(False)


def user_no_grad():
    net = Net(False)
    net.encoder.forward = lambda x: _no_grad(net.encoder.mlp, x)
    return net


class Inside(nn.Module):
    """A reentrant checkpoint whose input needs a gradient (the stem's output), around a function with a no_grad of
    the user's inside: the checkpoint recomputes it in backward, and the cut is that no_grad (a review)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(16, 16)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def block(self, h):
        h = self.a(h)
        with torch.no_grad():
            g = self.b(h)
        return h + g

    def forward(self, x):
        return self.head(checkpoint(self.block, self.stem(x), use_reentrant=True))


def inside():
    return Inside()


def _no_grad(f, x):
    with torch.no_grad():
        return f(x)
'''


@pytest.fixture
def spec(tmp_path):
    f = tmp_path / "ckpt.py"
    f.write_text(MODEL)
    return lambda name: f"{f}:{name}"


def test_a_reentrant_checkpoint_without_grad_inputs_is_named_with_its_fix(cli, spec):
    r = cli("gradflow", spec("reentrant"), "-i", "8x16", "--json")
    assert r.code == 1, r.stderr
    (f,) = [f for f in r.json["findings"] if f["code"] == "no-grad"]
    assert "inside a reentrant checkpoint" in f["message"] and "encoder.mlp" in f["message"], f["message"]
    assert "use_reentrant=False" in f["hint"] and "no_grad()" not in f["hint"]


def test_the_same_block_non_reentrant_trains_and_a_users_no_grad_keeps_its_words(cli, spec):
    assert cli("gradflow", spec("plain"), "-i", "8x16").code == 0
    r = cli("gradflow", spec("user_no_grad"), "-i", "8x16", "--json")
    (f,) = [f for f in r.json["findings"] if f["code"] == "no-grad"]
    assert "reentrant" not in f["message"] and "no_grad" in f["message"] + f["hint"], f["message"]


def test_a_users_no_grad_inside_a_checkpoint_whose_input_needs_a_gradient_is_the_users(cli, spec):
    r = cli("gradflow", spec("inside"), "-i", "8x16", "--json")
    (f,) = [f for f in r.json["findings"] if f["code"] == "no-grad"]
    assert "b.weight" in f["message"] and "reentrant" not in f["message"] + f["hint"], f["message"]


HF = '''
import torch
from transformers import BertConfig, BertForSequenceClassification


def build():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=64, num_labels=3)
    m = BertForSequenceClassification(cfg)
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.bert.embeddings.requires_grad_(False)
    m.enable_input_require_grads()   # the embeddings' output marked, so checkpointing reaches past them
    return m
'''


@pytest.mark.parametrize("command", ["gradflow", "doctor"])
def test_an_embeddings_output_marked_to_require_grad_is_no_local_weight(cli, tmp_path, command):
    """A review: Hugging Face BERT with gradient checkpointing and frozen embeddings; enable_input_require_grads makes
    the embeddings' 4x16x32 output a leaf that needs a gradient, and both commands called it a weight made in forward
    (local-weight, an error)."""
    pytest.importorskip("transformers")
    f = tmp_path / "hf_ckpt.py"
    f.write_text(HF)
    r = cli(command, f"{f}:build", "-i", "4x16:int64[0,100)", "--json")
    assert "local-weight" not in [x["code"] for x in r.json["findings"]], r.json["findings"]
    assert r.code == 0, [(x["code"], x["message"]) for x in r.json["findings"] if x["severity"] != "info"]


HF_REENTRANT = HF.replace('{"use_reentrant": False}', '{"use_reentrant": True}').replace(
    "    m.bert.embeddings.requires_grad_(False)\n    m.enable_input_require_grads()   # the embeddings' output marked, so "
    "checkpointing reaches past them\n", "")


def test_softmax_invariant_key_biases_under_a_reentrant_checkpoint_are_invariant_not_vanishing(cli, tmp_path):
    """A review: BERT's key biases (a softmax cancels any shift of them: their gradient is rounding) are `invariant`
    (info) plainly, and were `vanishing-grad` with gradient checkpointing on: the re-check's first call of each module
    was the checkpoint's no-grad forward, not the recompute the backward differentiates."""
    pytest.importorskip("transformers")
    assert "enable_input_require_grads" not in HF_REENTRANT and '"use_reentrant": True' in HF_REENTRANT
    f = tmp_path / "hf_reentrant.py"
    f.write_text(HF_REENTRANT)
    r = cli("gradflow", f"{f}:build", "-i", "4x16:int64[0,100)", "--json")
    codes = {x["code"]: x for x in r.json["findings"]}
    assert "vanishing-grad" not in codes and r.code == 0, [(x["code"], x["message"]) for x in r.json["findings"]]
    assert "key.bias" in codes["invariant"]["message"]


NESTED = '''
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x):   # the key bias shifts every score of a row alike: the softmax cancels it
        a = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) / math.sqrt(32), -1)
        return x + a @ self.v(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(16, 32), nn.Linear(32, 5)
        self.layers = nn.ModuleList(Attn() for _ in range(2))

    def _all(self, h):
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=True)
        return h

    def forward(self, x):   # checkpoints inside a checkpoint: the inner ones' inputs need no gradient there
        return self.out(checkpoint(self._all, self.inp(x), use_reentrant=True).mean(1))


def build():
    torch.manual_seed(0)
    return Net()
'''


def test_nested_reentrant_checkpoints_keep_invariant_key_biases_invariant(cli, tmp_path):
    """A review: under an outer reentrant checkpoint the inner ones' inputs need no gradient in the no-grad forward, so
    only the innermost checkpoint was looked at and layers.1's key bias was `vanishing-grad`; every enclosing
    checkpoint is read now."""
    f = tmp_path / "nested.py"
    f.write_text(NESTED)
    r = cli("gradflow", f"{f}:build", "-i", "4x6x16", "--json")
    codes = {x["code"]: x for x in r.json["findings"]}
    assert r.code == 0 and "vanishing-grad" not in codes, [(x["code"], x["message"]) for x in r.json["findings"]]
    assert "layers.0.k.bias" in codes["invariant"]["message"] and "layers.1.k.bias" in codes["invariant"]["message"]


UNBATCHED = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(64, 64)

    def forward(self, x):
        w = torch.randn(64, 10, requires_grad=True)   # the bug: a weight made in forward
        return self.l(x) @ w


def build():
    return Net()
'''


@pytest.mark.parametrize("command", ["gradflow", "doctor"])
def test_a_weight_made_in_forward_beside_one_unbatched_vector_is_still_found(cli, tmp_path, command):
    """A review: an input of one dimension (64,) is the start of the 64x10 weight's shape, and was read as a row per
    input position (an activation): local-weight was lost."""
    f = tmp_path / "unbatched.py"
    f.write_text(UNBATCHED)
    r = cli(command, f"{f}:build", "-i", "64", "--json")
    assert "local-weight" in [x["code"] for x in r.json["findings"]] and r.code == 1
