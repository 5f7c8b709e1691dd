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
    assert repeats.describe(g, model) == "in 3 of the 5 modules of l (weight in 0–1; bias in 0, 3)"


def test_pattern_covers_what_the_fold_holds_and_nothing_beside_it():
    held = [f"b.{i}.spare.{p}" for i in range(3) for p in ("weight", "bias")]
    (f,) = repeats.fold([entry("a", n) for n in held])
    others = ["b.0.used.weight", "head.weight"]
    pat = repeats.pattern(f, held + others)
    assert pat == "b.*.spare.*"
    assert all(fnmatch.fnmatchcase(n, pat) for n in f.members)
    assert not any(fnmatch.fnmatchcase(n, pat) for n in others)
    # a glob that would also hold a parameter the finding does not cover (block 3's spare, flagged otherwise or
    # not at all) is not offered; nor one over every block's everything
    assert repeats.pattern(f, held + others + ["b.3.spare.weight"]) is None
    (g,) = repeats.fold([entry("a", n) for n in ("b.0.x.w", "b.1.x.w", "b.0.y.w", "b.1.y.w")])
    assert repeats.pattern(g, ["b.0.x.w", "b.1.x.w", "b.0.y.w", "b.1.y.w"]) is None


def test_only_indices_as_torch_writes_them_fold():
    # ModuleDict keys that are digits of another kind, or carry a leading zero, are names
    assert repeats.split("d.01.w") is None and repeats.split("d.².w") is None
    assert [e.folded for e in repeats.fold([entry("a", "d.01.w"), entry("a", "d.1.w")])] == [False, False]
    assert repeats.compact([f"d.{k}.w" for k in ("01", "1", "²", "³", "2", "3", "4")]) \
        == "d.01.w, d.{1–4}.w, d.².w, d.³.w"


def test_nested_stacks_fold_at_the_inner_index_what_the_outer_does_not():
    es = [entry("a", f"stages.0.blocks.{j}.conv.w") for j in range(3)] + [entry("a", "stages.1.blocks.0.conv.w")]
    out = repeats.fold(es)
    assert [(e.where, e.places) for e in out] == [("stages", [("blocks.0.conv.w", ["0", "1"])]),
                                                 ("stages.0.blocks", [("conv.w", ["1", "2"])])]


def test_long_runs_of_blocks_are_cut_and_counted():
    assert repeats.ranges([str(i) for i in range(0, 40, 2)], limit=3) == "0, 2, 4, … (+17 more)"


def test_compact_writes_names_that_differ_only_in_their_block_once():
    names = [f"enc.layer.{i}.k.bias" for i in range(24)] + ["head.weight", "enc.layer.3.q.weight"]
    assert repeats.compact(names) == "enc.layer.{0–23}.k.bias, head.weight, enc.layer.3.q.weight"
    assert repeats.compact([f"x{i}" for i in range(8)], limit=3) == "x0, x1, x2 … (+5 more)"
    # what is left out is counted in names, not in the items written
    names = [f"s.{i}.a.{j}.w" for i in range(3) for j in range(4)] + ["x", "y"]
    assert repeats.compact(names, limit=2) == "s.{0–2}.a.0.w, s.{0–2}.a.1.w … (+8 more)"


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


class ZeroGradOps(nn.Module):
    """Each block's `lin` behind a zero-derivative op: round in blocks 0 and 2, sign in 1 and 3."""

    def __init__(self, ops=("round", "sign", "round", "sign")):
        super().__init__()
        self.ops = ops
        self.blocks = nn.ModuleList(nn.ModuleDict({"lin": nn.Linear(4, 4), "ok": nn.Linear(4, 4)}) for _ in ops)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for op, b in zip(self.ops, self.blocks):
            x = x + getattr(torch, op)(b["lin"](x)) + torch.tanh(b["ok"](x))
        return self.head(x)


def test_a_fold_keeps_different_causes_apart():
    torch.manual_seed(0)
    res = run("gradflow", ZeroGradOps(), torch.randn(4, 4))
    zero = [f for f in res.findings if f.code == "zero-grad"]
    assert [(f.where, sorted(f.members)) for f in zero] == [
        ("blocks", ["blocks.0.lin.bias", "blocks.0.lin.weight", "blocks.2.lin.bias", "blocks.2.lin.weight"]),
        ("blocks", ["blocks.1.lin.bias", "blocks.1.lin.weight", "blocks.3.lin.bias", "blocks.3.lin.weight"])]
    assert "`round` op" in zero[0].message and "`round` op" in zero[0].hint
    assert "`sign` op" in zero[1].message and "`sign` op" in zero[1].hint


class ResetNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.norm = nn.Linear(4, 4), nn.LayerNorm(4)

    def forward(self, x):
        with torch.no_grad():
            self.norm.weight.fill_(1.0)      # the forward writes the parameter back: no step changes it
        return x + self.lin(self.norm(x))


def test_an_allow_glob_accepts_a_folded_finding_when_it_holds_every_parameter_it_covers():
    torch.manual_seed(0)
    model = nn.Sequential(*[ResetNorm() for _ in range(4)], nn.Linear(4, 2))
    res = run("doctor", model, torch.randn(4, 4))
    (f,) = [f for f in res.findings if f.code == "param-not-updated"]
    assert f.where == "(root)" and f.members == [f"{i}.norm.weight" for i in range(4)]
    assert f.message.startswith("4 parameters, in 4 of the 5 modules of (root) (0–3), at norm.weight: as 0.norm.weight")
    assert f.accepted_by(["*.norm.weight"]) and not f.accepted_by(["0.norm.*"])
    assert f.to_dict()["members"] == f.members


def test_design_findings_fold_a_gate_per_block_apart_from_what_resolves_by_itself():
    from torchdiag.diagnostics.gradflow.findings import design_findings
    from torchdiag.results import Result

    def row(name, reason, why):
        return {"name": name, "reason": reason, "design": {"kind": "zero-init", "why": why}}

    rows = [row(f"blocks.{i}.conv.weight", f"blocks.{i}.bn", f"the gate is blocks.{i}.bn.weight") for i in range(3)]
    rows += [row(f"blocks.{i}.conv.bias", f"blocks.{i}.conv.bias", "it resolves by itself") for i in range(2)]
    res = Result("gradflow")
    design_findings(res, rows)
    gated, itself = res.findings
    assert gated.members == [f"blocks.{i}.conv.weight" for i in range(3)] and "(each block's own gate)" in gated.message
    assert itself.members == ["blocks.0.conv.bias", "blocks.1.conv.bias"] and "gate)" not in itself.message
    assert "as blocks.0.conv.bias: it resolves by itself" in itself.message


def test_the_figure_shades_the_parameters_a_folded_warning_covers_not_their_neighbours():
    from torchdiag.render.gradflow import flagged_layers
    from torchdiag.results import Result, Table

    res = Result("gradflow")
    res.add("vanishing-grad", "warning", "blocks", "…", members=["blocks.0.tiny.weight", "blocks.1.tiny.weight"])
    res.tables.append(Table("layers", "", [], [{"layer": f"blocks.{i}.{m}", "status": s} for i in range(2)
                                              for m, s in (("conv", "zero-init"), ("tiny", "vanishing-grad"))]))
    assert flagged_layers(res) == {"blocks.0.tiny", "blocks.1.tiny"}


def test_doctors_no_grad_is_accepted_only_by_globs_that_hold_every_parameter_it_names():
    torch.manual_seed(0)
    model = SpareInEachBlock()
    (f,) = [f for f in run("doctor", model, torch.randn(4, 4)).findings if f.code == "no-grad"]
    assert sorted(f.members) == sorted(f"blocks.{i}.spare.{p}" for i in range(8) for p in ("weight", "bias"))
    assert not f.accepted_by(["blocks.0.spare.*"]) and f.accepted_by(["blocks.*.spare.*"])


def test_the_blocks_counted_are_those_holding_parameters():
    """A sweep: a huge-init finding said "in 6 of the 12 modules of body", the 12 counting the ReLUs between them."""
    body = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(4, 4), nn.ReLU())])
    model = nn.Module()
    model.body = body
    assert repeats._block_count(model, "body") == 6


class Bottleneck(nn.Module):
    """A residual block whose last norm starts at zero (timm's zero-init-last)."""

    def __init__(self, width=4):
        super().__init__()
        self.conv1, self.conv2 = nn.Linear(width, width), nn.Linear(width, width)
        self.bn = nn.LayerNorm(width)
        nn.init.zeros_(self.bn.weight)

    def forward(self, x):
        return x + self.bn(self.conv2(torch.relu(self.conv1(x))))


class Stage(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        for j in range(1, blocks + 1):
            self.add_module(f"b{j}", Bottleneck())

    def forward(self, x):
        for b in self.children():
            x = b(x)
        return x


def numbered_stack(stages=(2, 3)):
    """timm RegNet's layout: stages s1, s2 … of blocks b1, b2 …, named, not a ModuleList."""
    model = nn.Sequential()
    for i, n in enumerate(stages, 1):
        model.add_module(f"s{i}", Stage(n))
    model.add_module("head", nn.Linear(4, 2))
    return model


def test_numbered_blocks_count_where_a_path_has_no_index():
    model = numbered_stack((2, 3))
    named = repeats.named_blocks(model)
    # each block's conv1 and conv2 are layers, not blocks
    assert named == {"s1", "s2"} | {f"s{i}.b{j}" for i, n in ((1, 2), (2, 3)) for j in range(1, n + 1)}
    assert repeats.split("s2.b3.bn.weight", 1, named) == ("s2", "b3", "bn.weight")
    assert repeats.split("s2.b3.bn.weight") is None            # without the model: no index
    assert repeats.split("s2.b3", 1, named) is None            # a whole block is no place in it
    # an index in the path wins: numbered names beside it are names
    assert repeats.split("s2.b3.layers.0.w", 0, named | {"s2.b3.layers"}) == ("s2.b3.layers", "0", "w")
    # one prefix over two classes, or a run of one, is not a stack
    mixed = nn.Module()
    mixed.b1, mixed.b2, mixed.c1 = nn.Sequential(nn.Linear(2, 2)), Bottleneck(), Bottleneck()
    assert repeats.named_blocks(mixed) == frozenset()
    assert repeats.ranges(["b7", "b1", "b2", "b3", "b5"]) == "b1–b3, b5, b7"


def test_doctor_folds_each_numbered_blocks_zero_init_over_the_stage():
    """timm regnetx_002: 13 zero-init lines, one per named block (s4.b1 … s4.b7), were 2 folded ones."""
    torch.manual_seed(0)
    model = numbered_stack((2, 5))
    res = run("doctor", model, torch.randn(8, 4))
    zero = [f for f in res.findings if f.code == "zero-init"]
    assert len(zero) == 2, [f.message for f in zero]
    assert "in 2 modules of (root) (s1–s2), at b1.bn, b2.bn" in zero[0].message + zero[1].message
    assert "in 3 of the 5 modules of s2 (b3–b5), at bn" in zero[0].message + zero[1].message
