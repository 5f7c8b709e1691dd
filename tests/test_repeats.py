"""Findings repeated block after block, said once (core/repeats.py), and gradflow's use of it."""
import fnmatch

import torch
from torch import nn

from torchdiag.api import run
from torchdiag.core import repeats


def test_split_at_the_first_index():
    assert repeats.split("enc.layer.3.attn.q.weight") == ("enc.layer", "3", "attn.q.weight")
    assert repeats.split("stages.0.blocks.1.conv") == ("stages", "0", "blocks.1.conv")
    assert repeats.split("0.weight") == ("", "0", "weight")
    assert repeats.split("head.weight") is None


def entry(key, where):
    return repeats.Entry(key, where, [where])


def test_fold_joins_one_key_on_one_place_of_several_blocks_only():
    es = [entry("a", "l.0.q.w"), entry("a", "l.1.q.w"), entry("a", "l.1.k.w"), entry("b", "l.2.q.w"),
          entry("a", "head.w"), entry("a", "l.2.k.w"), entry("a", "m.0.q.w")]
    out = repeats.fold(es)
    assert [e.where for e in out] == ["l", "l.2.q.w", "head.w", "m.0.q.w"]   # in the order they first stood
    (f,) = [e for e in out if e.folded]
    assert f.members == ["l.0.q.w", "l.1.q.w", "l.1.k.w", "l.2.k.w"]         # key b and the single m.0 stay apart
    assert f.places == [("q.w", ["0", "1"]), ("k.w", ["1", "2"])] and f.blocks == ["0", "1", "2"]


def test_describe_counts_the_container_blocks_and_says_each_place():
    model = nn.Module()
    model.l = nn.ModuleList(nn.Linear(2, 2) for _ in range(5))
    (f,) = repeats.fold([entry("a", f"l.{i}.weight") for i in (0, 1, 2, 4)])
    assert repeats.describe(f, model) == "in 4 of the 5 modules of l (0–2, 4), at weight"
    (g,) = repeats.fold([entry("a", n) for n in ("l.0.weight", "l.1.weight", "l.0.bias", "l.3.bias")])
    assert repeats.describe(g, model) == "in 3 of the 5 modules of l (weight in 0–1, bias in 0, 3)"


def test_pattern_covers_what_the_fold_holds_and_nothing_beside_it():
    (f,) = repeats.fold([entry("a", f"b.{i}.spare.{p}") for i in range(3) for p in ("weight", "bias")])
    pat = repeats.pattern(f)
    assert pat == "b.*.spare.*"
    assert all(fnmatch.fnmatchcase(n, pat) for n in f.members)
    assert not fnmatch.fnmatchcase("b.0.used.weight", pat)


def test_compact_writes_names_that_differ_only_in_their_block_once():
    names = [f"enc.layer.{i}.k.bias" for i in range(24)] + ["head.weight", "enc.layer.3.q.weight"]
    assert repeats.compact(names) == "enc.layer.{0–23}.k.bias, head.weight, enc.layer.3.q.weight"
    assert repeats.compact([f"x{i}" for i in range(8)], limit=3) == "x0, x1, x2 … (+5)"


class SpareInEachBlock(nn.Module):
    """Eight blocks, each with a Linear its forward never calls: the same no-grad in every block."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleDict({"used": nn.Linear(4, 4), "spare": nn.Linear(4, 4)})
                                    for _ in range(8))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b["used"](x)) + x
        return self.head(x)


def test_gradflow_says_a_repeated_no_grad_once_with_an_allow_pattern_that_works():
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    res = run("gradflow", SpareInEachBlock(), x)
    (f,) = [f for f in res.findings if f.severity == "error"]
    assert f.code == "no-grad" and f.where == "blocks"
    assert f.message.startswith("16 parameter tensors, in 8 of the 8 modules of blocks (0–7), at spare.weight, spare.bias")
    assert "allow 'blocks.*.spare.*' accepts it" in f.hint
    allowed = run("gradflow", SpareInEachBlock(), x, allow=["blocks.*.spare.*"])
    assert allowed.exit_code == 0 and not [f for f in allowed.findings if f.severity == "error"]
