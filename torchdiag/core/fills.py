"""Are a forward's ±inf values written as constants (a mask filled with -inf) or computed (an overflow, a
division by zero, log(0))?

A model may return ±inf on purpose: Grounding DINO pads its class logits' text axis to `max_text_len` with
`torch.full(..., -inf)` and `masked_fill(mask, -inf)`, and marks invalid box proposals with +inf. Such a value
is a constant the code wrote, whatever the weights are: no target can be fitted there, and a made-up loss term
over it is +inf (every gradient NaN), an artefact of torchdiag's loss. An overflow is the model's fault. The
two are told apart by what each op did, not by the values (a gradient path does not tell: a fill plus a weighted
value has one; nor does float64: casts and divisions overflow there too): one forward under a dispatch mode compares,
per op, the non-finite values of its output with those its floating inputs held before it ran.

- an op that makes ±inf its inputs did not hand it, by position where every input broadcasts to the output
  (elementwise ops, in-place writes), and makes no NaN: a fill when the call passes ±inf as a number
  (`masked_fill(m, -inf)`, `full(shape, -inf)`, `scalar_tensor(-inf)`); computed otherwise (a cast to float16 of
  1e9, `x / 0`, `exp(1000)`), also where its input held fills elsewhere (a review: a cast after the mask);
- an op that makes NaN where its inputs held none (`-inf - -inf`, a softmax over a row masked throughout, 0 × inf)
  computed it;
- an op that only copies (`cat`, `gather`, `repeat`, `flip`, `topk`, `index_put` without accumulating, `scatter`
  without reducing: SELECTIONS) passes ±inf on, however often it copies them, and makes only what a ±inf number it
  is given writes (padding); an op that neither maps its output onto its inputs by position nor only copies (a
  matmul, a reduction: `amax` or `logsumexp` over a row that is all fills, an empty set such as a sample of only
  padding) computed every non-finite value it outputs; one that adds a product to a bias (`baddbmm`, `addmm`)
  passes the bias's on, by position, where the product's factors hold none (nn.MultiheadAttention's mask);
- a 0-dim ±inf tensor given to an op is a number (`masked_fill(m, torch.tensor(-inf))`);
- a buffer that is an additive mask (every non-finite value -inf, every other ≤ 0) is a constant the model holds:
  an add or a where that puts it onto an output writes fills where it is -inf; any other parameter or buffer
  holding a non-finite value, or a tensor neither made in the forward nor the model's state (an unregistered
  attribute, an input) without a mask's pattern, is alien: what an op outputs non-finite where one is non-finite it
  computed; such a tensor with the pattern is passed on, neither a fill nor a fault;
- a view makes nothing (its schema returns `Tensor(a)`; an in-place op, `Tensor(a!)`, is judged: a review's
  `x[:, :2] /= x[:, 2:]`); an uninitialised allocation (`empty_like`) makes nothing: its contents are whatever the
  memory held.

A finite value as extreme as a fill (`torch.finfo(dtype).min`, -1e9) is judged the same way, per op: written where
an op given that number as a number, or its negation, writes it (`masked_fill`, `full`, `where`, a 0-dim tensor holding
it, `-1e9 * ban`), or where a buffer or a frozen parameter of the model holds it (a logit bias, a (1,)-shaped `neg`);
computed anywhere else (`x + 1.7e9` rounds to it; nan_to_num clips an overflow to it; a sum reaches it). Only when no op computed one, nor wrote one over a ±inf the forward computed, are an output's
positions holding a number an op wrote (as bfloat16 may round it; either sign: a cost matrix's padding is +1e9), or
one a buffer holds below 0 (a bias buffer bans by pushing a value down; +1.7e9 added forces it), unchanged, every
one, under shaken (trained) weights, its constants (`Fills.constants`); in an output an add reached after pushing a
value up to such a number where another input held a value (`pushed`: an offset, however written), only those below 0;
an output that is one such constant throughout bans nothing, and has none.

The forward runs in the judged pass's mode (a fault may be eval's only). Fills at positions drawn at random differ
from the judged pass's: the loss then stays non-finite and nancheck keeps its error.

`only_fills`: every non-finite value of the forward came from fills. Only then does the auto loss leave an
output's ±inf positions of that forward out of a made-up target's term (core/loss.py), and nancheck call the
output's ±inf by design. Cost: one forward with a few reductions per op, only when a made-up term or a module's
output is non-finite; values are read back once."""
from __future__ import annotations

import cmath
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelError

# a finite output value this far from 0 that no weight moves is a fill: a made-up target there is unfit, and on
# finfo(float32).min the loss overflows. Not lower: a healthy 64-layer residual MLP's logits reach 1.5e6, and each
# such output would cost the fills' two forwards
EXTREME = 1e9
# and as bfloat16 rounds it (-1e9 is -998,244,352 there): a review's -1e9 ban written in bfloat16 passed unseen
EXTREME_ROUNDED = EXTREME * (1 - 2 ** -8)


def as_extreme_as_a_fill(t):
    """Positions of `t` as extreme as a fill: ±inf, ±finfo(dtype).max (`torch.finfo(dtype).min`, as Hugging Face
    models write it), float16's -65504 in any dtype (written in float16, then cast up: a review's logits), or
    |value| ≥ EXTREME (as bfloat16 rounds it)."""
    import torch

    a = t.detach().abs()
    if t.is_complex():
        return a >= EXTREME_ROUNDED
    return (a >= EXTREME_ROUNDED) | (a == torch.finfo(t.dtype).max) | (a == F16_MAX)


F16_MAX = 65504.0


def _extreme_number(v) -> bool:
    """A Python number as extreme as a fill: |v| ≥ EXTREME (as bfloat16 rounds it), or float16's finfo.max (-65504
    is its finfo.min)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
        (abs(v) >= EXTREME_ROUNDED or abs(v) == F16_MAX)


UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                           "empty_permuted"})


@dataclass
class Fills:
    made: dict[str, int] = field(default_factory=dict)       # op -> ±inf values it wrote as a constant
    computed: dict[str, int] = field(default_factory=dict)   # op -> non-finite values it computed
    masks: dict[str, Any] = field(default_factory=dict)      # output label -> its ±inf positions (on its device)
    failed: str | None = None                                # why the forward could not be asked
    mask_buffers: set = field(default_factory=set)           # buffers holding an additive mask (-inf, else ≤ 0)
    constants: dict[str, Any] = field(default_factory=dict)  # output label -> its finite EXTREME positions the
                                                             # shaken weights left unchanged (a finfo.min fill)
    numbers: tuple = ()                                      # the finite extreme numbers ops wrote as fills,
                                                             # when no op computed one
    held: int = 0                                            # the ±inf the forward's outputs held, when fills
                                                             # made every one and nothing from outside reached them

    @property
    def only_fills(self) -> bool:
        return self.failed is None and not self.computed and bool(self.made)

    @property
    def written(self) -> int:
        return sum(self.made.values())

    def bound(self, root: bool) -> int:
        """The most ±inf a module's outputs may hold as fills: what the ops wrote; for the model's own outputs, as
        many as the traced forward's outputs held where nothing from outside the forward reached them (a ban vector
        written once, `ban[eos] = -inf`, then added to every row of the logits). A submodule's are not those (a
        review)."""
        return max(self.written, self.held) if root else self.written

    @property
    def sources(self) -> set[str]:
        """The mask buffers whose -inf an op carried onto an output as fills (rows `add of <buffer>`)."""
        return {k.split(" of ", 1)[1] for k in self.made if " of " in k} if self.only_fills else set()

    @property
    def harmless(self) -> set[str]:
        """Buffers whose ±inf did no harm in a forward whose every non-finite value is a fill: the mask buffers (one
        the forward computed with would have made a computed value), carried to an output or not used."""
        return self.sources | self.mask_buffers if self.only_fills else set()

    def mask(self, label: str, like) -> Any | None:
        """Output `label`'s ±inf positions when fills alone made every non-finite value of the forward and the
        output has `like`'s shape and device; else None."""
        m = self.masks.get(label) if self.only_fills else None
        return m if m is not None and m.shape == like.shape and m.device == like.device else None

    def unfit(self, label: str, like) -> Any | None:
        """Output `label`'s positions no weight can fit, for a made-up target to stay off: its ±inf fills (`mask`)
        and its finite constants as extreme as a fill (`torch.finfo(dtype).min`, -1e9 written over banned classes)
        that did not move when the weights did. None when there are none, or they do not match `like`."""
        inf, const = self.mask(label, like), self.constants.get(label)
        if const is None or const.shape != like.shape or const.device != like.device:
            return inf
        return const if inf is None else inf | const

    def describe(self) -> str:
        ops = ", ".join(f"{op} ({n:,} value{'s' if n != 1 else ''})"
                        for op, n in sorted(self.made.items(), key=lambda kv: -kv[1]))
        return f"written by {ops}"


def _op(func) -> str:
    return str(getattr(func, "overloadpacket", func)).replace("aten.", "")


# ops that only copy elements to other places, with no arithmetic: a non-finite value in their output is one of their
# inputs', however many times they copy it (`repeat`, a `gather` that picks one twice); they make only what a ±inf
# number they are given writes (`constant_pad_nd(x, pad, -inf)`). `index_put` without accumulating and `scatter`
# without reducing write values in.
# Reductions are not here (amax or logsumexp over a row that is all fills is an empty set, not a fill: a sample of
# only padding); topk and sort return some of their input's values, reordered
SELECTIONS = frozenset({"cat", "stack", "gather", "index", "index_select", "take", "clone", "repeat", "flip", "roll",
                        "constant_pad_nd", "sort", "topk", "masked_select", "narrow_copy", "_unsafe_index",
                        "contiguous", "permute_copy", "transpose_copy", "unbind_copy", "split_copy", "slice_copy",
                        "select_copy", "expand_copy", "alias_copy", "view_copy", "index_put", "index_put_",
                        "_index_put_impl_", "embedding", "_unsafe_view", "scatter", "scatter_"})


def _selects(name: str, args, kwargs) -> bool:
    """A copy: in SELECTIONS, and not an index_put that accumulates or a scatter that reduces."""
    if name.startswith(("index_put", "_index_put")):
        return not kwargs.get("accumulate", args[3] if len(args) > 3 else False)
    return name in SELECTIONS and not (name.startswith("scatter") and kwargs.get("reduce"))


def _is_view(func) -> bool:
    """The op returns a view of an input without writing it (its schema's `Tensor(a)`, not `Tensor(a!)`)."""
    try:
        alias = func._schema.returns[0].alias_info
    except (AttributeError, IndexError):
        return False
    return alias is not None and not alias.is_write


def _mode(state: dict | None = None):
    """`state`: id(tensor) -> (name, kind) for the model's parameters and buffers that hold non-finite values before
    the forward (`_state`). Kind "mask": a buffer that is an additive mask (every non-finite value -inf, every other
    ≤ 0: a vocabulary mask, a causal mask); "alien": any other (an overflowed statistic, a corrupted weight). A tensor
    an op reads that no op of the forward made and that is not the model's named state (an input, an unregistered
    attribute) is "outside": passed on where it has a mask's pattern, alien where it does not. An add or a where
    (CARRIERS) that puts a mask buffer onto its output by broadcasting writes fills where it is -inf and the output
    too; any other non-finite value an op outputs where an alien is non-finite (or anywhere, if the op does not map
    it by position and it holds one) it computed: a fill elsewhere excuses nothing
    (reviews: a hand-written normaliser's +inf mean, a frozen BatchNorm's beside a mask, an unregistered +inf
    attribute beside a causal mask). A view or a copy of one alone (`mask[None]`, `mask.to(dtype)`) is the same
    kind, under the same name; one that writes new values (`F.pad(x, value=-inf)`) is judged as any op."""
    import weakref

    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    known = {k: (None, name, kind) for k, (name, kind) in (state or {}).items()}   # id -> (weakref or None, ...)
    produced: dict = {}   # id -> weakref of every tensor an op of the forward returned

    def entry(t) -> tuple | None:
        e = known.get(id(t))
        return e[1:] if e is not None and (e[0] is None or e[0]() is t) else None

    def outside(t) -> bool:
        """Neither made by the forward nor the model's named state: a plain tensor attribute, a closure's, an
        input (a review: a +inf in an unregistered attribute beside a causal mask passed as a fill)."""
        p = produced.get(id(t))
        return entry(t) is None and (p is None or p() is not t)

    def extreme(t):   # finite values as extreme as a fill (finfo.min, -1e9)
        return torch.isfinite(t) & as_extreme_as_a_fill(t)

    def floats(tree) -> list:   # float8 aside: no isfinite of its own (a review: an fp8 weight the forward
        return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and (t.is_floating_point() or  # casts
                                                                                  t.is_complex()) and t.numel()
                and t.dtype.itemsize > 1]   # stopped the trace); its cast's output is traced as any op's

    def split(name: str, o, given, first) -> tuple[list, list]:
        """(the inputs read by position, the others the op computes with): all of them where every one broadcasts
        to o's shape (an elementwise op, an in-place write); the bias of an op that adds a product to it (baddbmm,
        addmm: a review's nn.MultiheadAttention adds its -inf mask to q·kᵀ with baddbmm); none elsewhere (a
        matmul, a reduction)."""
        if _maps([g[0] for g in given], [o]):
            return given, []
        if name in BIASED and given and given[0][0] is first and _maps([first], [o]):
            return given[:1], given[1:]
        return [], given

    def by_position(counts, pos, rest, o, flag: int):
        """`counts(pos)`: what o holds that the positional inputs do not hand it by position; all it holds where an
        input it computes with holds a value flagged `flag` (a matmul over -inf computed what it outputs)."""
        judged = counts(pos)
        if not rest or not pos:
            return judged
        tainted = torch.stack([g[flag].any().to(o.device) for g in rest]).any()
        return tuple(torch.where(tainted, a, b) for a, b in zip(counts([]), judged))

    def new_values(name: str, o, given, first, view: bool, selects: bool, number: bool):
        """(non-finite, NaN) values of output `o` its inputs did not hand it, on the device: by position (`split`);
        a view makes none; a selection what it copies beyond its inputs' count, when a ±inf number wrote it
        (padding)."""
        bad, nan = ~torch.isfinite(o), torch.isnan(o)
        if view:   # a view of an input makes nothing (an in-place op writes, and is judged: x[:, :2] /= x[:, 2:])
            return bad.sum() * 0, nan.sum() * 0
        if selects:
            had_bad = sum((g[1].sum() for g in given), bad.sum() * 0)
            return (bad.sum() - had_bad).clamp(min=0) * number, nan.sum() * 0

        def counts(pos):
            b, n = bad, nan
            for g in pos:
                b = b & ~g[1].to(o.device).expand(o.shape)
                n = n & ~g[2].to(o.device).expand(o.shape)
            return b.sum(), n.sum()

        return by_position(counts, *split(name, o, given, first), o, 1)

    def new_extremes(name: str, o, given, first, view: bool, selects: bool, numbers: list):
        """(written, computed, over) finite values of output `o` as extreme as a fill that its inputs did not hand it:
        written where the op was given that value as a number (its sign aside) and writes it (`masked_fill(m,
        finfo.min)`, `full(shape, -1e9)`, `where(m, -1e9, y)`, `-1e9 * ban`), computed anywhere else (a sum, an
        overflow nan_to_num clipped, `x + 1.7e9`: an offset rounds to its number, and is no fill); `over`, those
        written where an input was non-finite (`nan_to_num(x, neginf=-1e9)`: a fill only if that ±inf was one). A
        selection makes only what a number it is given writes (padding): a mask it repeats is still the one
        written. A review: fills judged by their values alone passed a top-k filter, nan_to_num's clipped overflow,
        and a prediction absorbed by an epoch offset."""
        ext = extreme(o)
        zero = ext.sum() * 0
        if view:
            return zero, zero, zero, zero
        if selects:
            new = (ext.sum() - sum((g[3].sum() for g in given), zero)).clamp(min=0)
            return (new, zero, zero, zero) if numbers else (zero, zero, zero, zero)
        if o.is_complex():
            return zero, ext.sum(), zero, zero

        absorbed = _absorbed(name, o, ext, given, first)

        def counts(pos):
            e, over = ext, torch.zeros_like(ext)
            for g in pos:
                e = e & ~g[3].to(o.device).expand(o.shape)
                over = over | g[1].to(o.device).expand(o.shape)
            if not numbers or name in OFFSETS:
                return zero, e.sum(), zero, absorbed
            hit = e & _written(o, numbers)
            return hit.sum(), (e & ~hit).sum(), (hit & over).sum(), absorbed

        return by_position(counts, *split(name, o, given, first), o, 3)

    def _absorbed(name: str, o, ext, given, first):
        """Extreme values above 0 in the output of an op that adds what its inputs hold, where one input holds such a
        value and another an ordinary non-zero one: the prediction rounds away (`y + off`, `off` holding +1.7e9
        however it was written). By position for an add (`C * valid + (1 - valid) * 1e9` is zero under its padding:
        a review), by tensor for an add that scatters (index_add_, scatter_add). A ban pushes down; a value pushed up
        so is an offset (reviews: a timestamp's de-normalising offset written by `where` was left out)."""
        zero = ext.sum() * 0
        if name in SCATTER_ADDS and len(given) >= 2:
            up = torch.stack([g[3].any().to(o.device) for g in given]).any()
            held = torch.stack([((g[0] != 0) & ~g[3] & ~g[1]).any().to(o.device) for g in given]).any()
            return (ext & (o > 0)).sum() * (up & held)
        pos = split(name, o, given, first)[0]
        if name not in OFFSETS or len(pos) < 2:
            return zero
        shape = o.shape
        handed = torch.stack([g[3].to(o.device).expand(shape) for g in pos]).any(0)
        held = torch.stack([((g[0] != 0) & ~g[3] & ~g[1]).to(o.device).expand(shape) for g in pos]).any(0)
        return (ext & handed & held & (o > 0)).sum()

    class Origins(TorchDispatchMode):
        """Per op call: (op, passes ±inf as a number, the non-finite values it made, the NaN it made), counts on
        the device."""

        def __init__(self):
            super().__init__()
            self.rows: list = []
            # id -> (weakref, a device bool): an add pushed a value up to an extreme number on the way to the tensor
            self.pushed: dict = {}
            # (op, finite extremes it wrote, those it computed, those it wrote over a non-finite input, those above 0
            # it added onto a value, its numbers)
            self.extremes: list = []
            # storage (data pointer) -> (a weak reference to it, a device bool: every ±inf in it was written by an op
            # of this forward from inputs that were finite or such storages themselves) (`held`; reviews: a log(0)
            # prior kept as a plain attribute, read from numpy, through a view taken before it was written, unread)
            self.clean: dict = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = _op(func)
            if name in UNINITIALISED:
                return func(*args, **kwargs)
            # before it runs: an in-place op overwrites its input. A 0-dim ±inf tensor is a number given as a tensor
            # (`masked_fill(m, torch.tensor(-inf))`): a constant, not a value the op passes on
            inputs = floats((args, kwargs))
            scalars = [(t, t.item()) for t in inputs if t.dim() == 0]   # one read each
            constant = [t for t, v in scalars if cmath.isinf(v)]
            numbered = [t for t, v in scalars if cmath.isinf(v) or _extreme_number(v)]
            numbers = [v for v in [*tree_leaves((args, kwargs)), *(v for _, v in scalars)] if _extreme_number(v)]
            literal = name in LITERALS   # torch.tensor([-inf, ...]) in the forward: a constant the code writes
            for t in inputs:   # what it reads from outside the forward is judged as the model's alien state
                if outside(t) and not literal and not any(t is c for c in constant):
                    known[id(t)] = (weakref.ref(t), "a tensor from outside the forward", "outside")
            marked = [(t, entry(t)) for t in inputs if entry(t)]   # the model's non-finite state, or views of it
            given = [(t, ~torch.isfinite(t), torch.isnan(t), extreme(t)) for t in inputs
                     if not any(t is c for c in numbered) and not literal]
            number = literal or bool(constant) or any(isinstance(a, float) and math.isinf(a)
                                                      for a in tree_leaves((args, kwargs)))
            out = func(*args, **kwargs)
            selects, view = _selects(name, args, kwargs), _is_view(func)
            outs = floats(out)
            for o in outs:
                produced[id(o)] = weakref.ref(o)
            alone = len(inputs) == 1 and (view or name in COPIES) and not number   # F.pad(-inf) writes new values
            if marked and alone:   # a view or copy of it alone: the same (mask[None], mask.to(x.dtype)); judged where
                for o in outs:     # it is read
                    known[id(o)] = (weakref.ref(o), *marked[0][1])
            elif marked and outs:
                self._judge(name, marked, outs, args[0] if args else None, inputs)
            # the rest as any op's, the state's non-finite values handed over like any input's (a cast that
            # overflows one more value, exp of the mask, a division by it: computed)
            first = args[0] if args else None
            made = [new_values(name, o, given, first, view, selects, number) for o in outs]
            if made:
                self.rows.append((name, number, sum(m[0] for m in made), sum(m[1] for m in made)))
            if literal:   # torch.tensor([-1e9, 0.]) in the forward: the values it holds are the numbers it writes
                numbers = [v for o in outs for v in o[extreme(o)].unique().tolist()]
            ext = [new_extremes(name, o, given, first, view, selects, numbers) for o in outs]
            if ext:
                self.extremes.append((name, *(sum(e[k] for e in ext) for k in range(4)), numbers))
            self._push_on(name, inputs, outs, ext)
            self._clean_on(name, given, outs, args, literal)
            return out

        def _clean_on(self, name, given, outs, args, literal) -> None:
            """Is every ±inf in the op's outputs a fill this forward wrote: each input (a number given as a tensor
            aside, `given` is judged before the op ran) finite or clean itself. A literal's (torch.tensor, from_numpy)
            ±inf are not known to be fills here, nor those of an output reinterpreting another dtype's bits (an int
            buffer viewed as float32: a fourth review) or cast from float8. A write the mode does not see (through
            tensor.numpy(), under a disabled dispatch) leaves the flag as it was: not caught. An output on an input's storage (a view,
            an in-place or out= write) keeps what that storage was (and-ed): a finite slice says nothing of the rest."""
            targets = list(outs) or (floats(args) if name.endswith("_") else [])   # _foreach_add_ returns None
            if not targets:
                return
            dev = targets[0].device
            flags = [(~g[1].any()).to(dev) | self.is_clean(g[0]).to(dev) for g in given]
            tensors = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
            eights = [t for t in tensors if t.is_floating_point() and t.dtype.itemsize == 1 and t.numel()]
            flags += [torch.isfinite(t.float()).all().to(dev) for t in eights]
            # another dtype's bits on the same storage (float32 viewed as float16: a fifth review) are no fill
            if literal or any(_storage(o) == _storage(t) and t.dtype != o.dtype for o in outs for t in tensors):
                flags += [torch.isfinite(o).all().to(dev) for o in outs]
            flag = torch.stack(flags).all() if flags else torch.ones((), dtype=torch.bool, device=dev)
            aliased = {_storage(t) for t in floats(args)}
            for t in targets:
                if not _storage(t):
                    continue
                old = self.is_clean(t) if _storage(t) in aliased else None
                now = flag if old is None else old.to(dev) & flag
                self.clean[_storage(t)] = (StorageWeakRef(t.untyped_storage()), now)

        def is_clean(self, t):
            """The clean flag of t's storage (a device bool), False where none was kept or the storage it was kept for
            is gone (a review: a pointer freed and reused by memory no op made inherited it)."""
            entry = self.clean.get(_storage(t))
            if entry is None or entry[0].expired():
                return torch.zeros((), dtype=torch.bool, device=t.device)
            return entry[1]

        def _push_on(self, name, inputs, outs, ext) -> None:
            """Carry `pushed` from the inputs to the outputs (by tensor, on the device): an output reached by an add
            that pushed a value up to an extreme number takes only values below 0 as fills (a review: one such add
            anywhere put another output's +1e9 padding back into the loss)."""
            flags = [e[1] for e in (self.pushed.get(id(t)) for t in inputs) if e is not None and e[0]() is not None]
            if name in ACCUMULATES and ext:
                flags.append(sum(e[3] for e in ext) > 0)
            if not flags or not outs:
                return
            flag = torch.stack([f.to(outs[0].device) for f in flags]).any() if len(flags) > 1 else flags[0]
            for o in outs:
                self.pushed[id(o)] = (weakref.ref(o), flag)
                base = o._base   # a write into a view (`y[..., 0] += off`, `y[..., 0] = y[..., 0] + off`) is the
                if base is not None:   # base's too (a review: the flag stayed on the column view)
                    had = self.pushed.get(id(base))
                    mine = flag if had is None or had[0]() is not base else had[1].to(flag.device) | flag
                    self.pushed[id(base)] = (weakref.ref(base), mine)

        def _judge(self, name, marked, outs, first, inputs) -> None:
            """An op reading the model's non-finite state or a tensor from outside: an add or a where that puts a
            mask buffer onto its output by broadcasting writes fills where the mask is -inf (a row `<op> of
            <name>`); what it outputs non-finite where an alien (a parameter or buffer of another pattern) or a
            tensor from outside of another pattern is non-finite (anywhere, if the op does not map it by position
            and it holds one) it computed. A tensor from outside with a mask's pattern is passed on, neither a fill
            nor a fault (an attention-mask input; a log-probability cache that underflowed passes as before)."""
            named = [e for _, e in marked if e[1] == "mask"] or [e for _, e in marked]
            label = f"{name} of {named[0][0]}"
            ts = [t for t, _ in marked]
            # the bias of an op that adds a product to it (nn.MultiheadAttention's baddbmm of its attn_mask buffer)
            # is carried by position when the product's factors are finite (a review: a causal buffer was computed)
            # (a finite weight the product reads, F.linear(h, W, mask)'s W.t(), is marked too: from outside)
            biased = name in BIASED and any(t is first for t in ts) and _maps([first], outs)
            carrier = (name in CARRIERS and _maps(ts, outs)) or biased
            no = torch.tensor(False, device=outs[0].device)
            factors = [t for t in inputs if t is not first] if biased else []
            finite = torch.stack([torch.isfinite(t).all().to(no.device) for t in factors]).all() if factors else ~no
            fill_ok = [(no | (carrier and kind == "mask")) & finite for _, (_, kind) in marked]
            passed = [_additive(t).to(no.device) if kind == "outside" else no for t, (_, kind) in marked]
            fills, alien = [], []
            for o in outs:
                bad = ~torch.isfinite(o)
                if biased or _maps(ts, [o]):   # by position (the bias alone, of a product: the factors are finite
                    at = [k for k, t in enumerate(ts) if not biased or t is first]   # or `finite` vetoed it)
                    mine = torch.stack([(torch.isinf(ts[k]) & fill_ok[k]).expand(o.shape) for k in at]).any(0)
                    theirs = torch.stack([(~torch.isfinite(ts[k]) & ~fill_ok[k] & ~passed[k]).expand(o.shape)
                                          for k in at]).any(0)
                else:   # not by position: a finite weight beside a concatenated fill vetoes nothing (a review)
                    mine = torch.zeros_like(bad)
                    theirs = torch.stack([(~torch.isfinite(t)).any() & ~p for t, p in zip(ts, passed)]).any()
                fills.append(mine & torch.isinf(o))
                alien.append(theirs & bad & ~(mine & torch.isinf(o)))
            if carrier:
                self.rows.append((label, True, sum(f.sum() for f in fills), fills[0].sum() * 0))
            self.rows.append((label, False, sum(a.sum() for a in alien), alien[0].sum() * 0))

    return Origins()


# ops that put an additive mask onto their output by position, unchanged: an add, a where; and those that copy one
# tensor alone (its view, a cast). Anything else that reads a mask computes with it (a product, exp, a division)
CARRIERS = frozenset({"add", "add_", "where"})
# ops that add a product to their first input (the bias): they read it by position, what it holds passed on
BIASED = frozenset({"addmm", "baddbmm", "addbmm", "addmv", "addr"})
# ops that offset their input by a number: `x + 1.7e9` rounds to 1.7e9 where |x| is small, a computed value
OFFSETS = frozenset({"add", "add_", "sub", "sub_", "rsub"})
# ops that add what one input holds into another at places an index says (not by position); with OFFSETS, the ops
# whose output an extreme value above 0 in one input pushes up (`pushed`). Not addcmul, lerp or a Linear's bias: a
# padded cost written `addcmul(pad * 1e9, score, valid)` or `baddbmm(norms.masked_fill(pad, 1e9), a, b)` cannot be
# told from an offset given so (a review), and is left a fill
SCATTER_ADDS = frozenset({"index_add", "index_add_", "scatter_add", "scatter_add_", "index_put", "index_put_",
                          "_index_put_impl_", "scatter_reduce", "scatter_reduce_"})
ACCUMULATES = OFFSETS | SCATTER_ADDS
COPIES = SELECTIONS | {"_to_copy", "to", "expand", "detach", "alias"}
LITERALS = frozenset({"lift_fresh", "lift_fresh_copy"})   # a tensor made from Python data: its values are the code's


def _additive(t):
    """A device bool: `t` has an additive mask's pattern, every non-finite value -inf and every other ≤ 0 (a causal
    mask; also a log-probability that underflowed, which is why an input's pattern makes no fill: a review)."""
    import torch

    return torch.where(torch.isfinite(t), t <= 0, t == float("-inf")).all()


def _maps(kept, outs) -> bool:
    """Every tensor of `kept` broadcasts onto every output's shape: the op works by position (an add, a where)."""
    import torch

    try:
        return bool(outs) and all(torch.broadcast_shapes(t.shape, o.shape) == o.shape for t in kept for o in outs)
    except RuntimeError:
        return False


def _state(model) -> dict:
    """id -> (name, "mask" or "alien") for the model's parameters and buffers holding non-finite values (read back
    once): a buffer whose every non-finite value is -inf and every other ≤ 0 is an additive mask; anything else is
    alien. Tensors a dense read cannot scan (meta, sparse) are left out; inputs are judged where the forward reads
    them (`_mode`)."""
    import torch

    named = [(n, t, False) for n, t in model.named_parameters()] + [(n, t, True) for n, t in model.named_buffers()]
    named = [(n, t, b) for n, t, b in named if t.is_floating_point() and t.numel() and t.layout == torch.strided
             and t.device.type != "meta"]
    if not named:
        return {}
    home = named[0][1].device

    def flags(t):
        bad = (~torch.isfinite(t)).any()
        return torch.stack([bad, bad & _additive(t)]).to(home)

    def scanned(t):   # float8 has no isfinite: its float32 copy (a review's fp8 buffer ended the tracing)
        try:
            return flags(t)
        except (RuntimeError, NotImplementedError):
            return flags(t.float())

    with torch.no_grad():
        read = torch.stack([scanned(t.detach()) for _, t, _ in named]).tolist()
    return {id(t): (n, "mask" if is_buffer and mask else "alien") for (n, t, is_buffer), (bad, mask) in zip(named, read)
            if bad}


def _read_counts(rows) -> list:
    """Each tuple of 0-dim count tensors as a list of ints, read back once per device."""
    import torch

    by_device: dict = {}
    for k, row in enumerate(rows):
        home = row[0].device
        by_device.setdefault(home, []).append((k, torch.stack([c.to(home) for c in row]).to(torch.int64)))
    values: list = [None] * len(rows)
    for items in by_device.values():
        for (k, _), v in zip(items, torch.stack([r for _, r in items]).tolist()):
            values[k] = v
    return values


def classify(rows) -> tuple[dict[str, int], dict[str, int]]:
    """(made, computed) from the mode's rows, read back once per device: an op that made ±inf and no NaN, given ±inf
    as a number, wrote fills; any other op that made a non-finite value computed it."""
    if not rows:
        return {}, {}
    made: dict[str, int] = {}
    computed: dict[str, int] = {}
    for (name, number, _, _), (bad, nan) in zip(rows, _read_counts([(bad, nan) for _, _, bad, nan in rows])):
        if bad and number and not nan:
            made[name] = made.get(name, 0) + bad
        elif bad or nan:
            computed[name] = computed.get(name, 0) + max(bad, nan)
    return made, computed


def written_numbers(rows, held: tuple = (), computed_inf: bool = False) -> tuple[tuple, tuple]:
    """(the finite numbers as extreme as a fill that the mode's ops wrote: `masked_fill(m, finfo.min)`, `full`; those
    only the model's buffers hold: a logit bias of -1e9 on banned classes), read back once; both () when an op
    computed a value that extreme (its provenance is then unknown: a prediction an offset absorbed, an overflow
    nan_to_num clipped, a top-k filter's kth value), or when one was written over a ±inf the forward computed
    (nan_to_num(x, neginf=-1e9) clipping an overflow)."""
    counts = _read_counts([row[1:5] for row in rows]) if rows else []
    if any(c or (over and computed_inf) for _, c, over, _ in counts):
        return (), ()
    ops = {v for row, (w, _, _, _) in zip(rows, counts) if w for v in row[5]}
    return tuple(sorted(ops)), tuple(sorted(set(held) - ops))


def _storage(t) -> int:
    """The data pointer of a tensor's storage (0 where it has none: empty, sparse, a tensor subclass without one)."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:   # noqa: BLE001 - a layout without a plain storage: not tracked
        return 0


def _held(mode, outputs) -> int:
    """The ±inf the forward's outputs hold, read back once per device: what fills broadcast onto them (a ban vector
    written once, `ban[eos] = -inf`, then added to every row). 0 where an output is not clean (Origins.clean: a ±inf
    not written by this forward's ops may be among them; only what the ops wrote counts then)."""
    import torch

    tensors = [t for _, t in outputs]
    if not tensors:
        return 0
    rows = _read_counts([(torch.isinf(t).sum(), mode.is_clean(t).to(t.device)) for t in tensors])
    return sum(n for n, _ in rows) if all(clean for _, clean in rows) else 0


def _pushed(mode, outputs) -> dict[str, bool]:
    """label -> whether an add pushed a value up to an extreme number on the way to that output, read back once."""
    flags = [(label, e[1]) for label, t in outputs
             if (e := mode.pushed.get(id(t))) is not None and e[0]() is t]
    return {label: bool(v[0]) for (label, _), v in zip(flags, _read_counts([(f,) for _, f in flags]))} if flags else {}


def _held_numbers(model) -> tuple:
    """The finite values as extreme as a fill that the model's floating buffers and frozen parameters hold, read back
    once a tensor, gathered as Python floats."""
    import torch

    def held(t) -> list:   # as Python floats, one read a tensor as before (mps has no float64 to gather them in)
        try:
            return t[torch.isfinite(t) & as_extreme_as_a_fill(t)].unique().tolist()
        except (RuntimeError, NotImplementedError):   # float8 has no isfinite (a review: an fp8 weight copy ended
            return held(t.float()) if t.dtype != torch.float32 else []   # the trace)

    frozen = [p for p in model.parameters() if not p.requires_grad]   # a frozen logit bias is a buffer (a review)
    found = {v for t in [*model.buffers(), *frozen] if t.is_floating_point() and t.numel()
             and t.layout == torch.strided and t.device.type != "meta" for v in held(t.detach())}
    return tuple(sorted(found))


def ask(model, inputs, ctx, training: bool = True) -> Fills:
    """One forward of `model` under the dispatch mode: what made its non-finite values, and each output's ±inf
    positions. In place, in the judged pass's mode (`training`), under no_grad, seeded and autocast as the run;
    buffers, flags and the RNG put back."""
    import torch

    from .guard import leave_no_trace
    from .loss import float_outputs
    from .tracking import run_forward

    if ctx.wrapper is not None or ctx.pass_wrapper is not None:   # a plain forward of one rank's (sharded) model
        return Fills(failed="not asked under torchrun")               # would wait for the others' collectives
    try:
        state = _state(model)
        mode = _mode(state)
        with leave_no_trace(model), torch.no_grad(), ctx.seeded():
            model.train(training)   # the judged pass's mode (flags put back): a fault may be one mode's
            with ctx.autocast(), mode:   # a nullcontext without --amp
                out = run_forward(model, inputs, phase="forward (where its ±inf come from)")
            made, computed = classify(mode.rows)
            most = _held(mode, float_outputs(out)) if made and not computed else 0   # one read, only when asked
            ops, held = written_numbers(mode.extremes, _held_numbers(model), bool(computed))
            pushed = _pushed(mode, float_outputs(out)) if ops else {}
            outs = {label: t.detach() for label, t in float_outputs(out)}
            masks = {label: torch.isinf(t) for label, t in outs.items()}
            extreme = {label: _unfit_numbers(t, ops, held, not pushed.get(label)) for label, t in outs.items()} \
                if ops or held else {}
            moved, constants = _moved_by_weights(model, inputs, ctx, masks, outs, extreme)
    except ModelError as exc:
        return Fills(failed=exc.message)
    except Exception as exc:   # noqa: BLE001 - a second opinion only: without it, ±inf count as computed
        return Fills(failed=f"{type(exc).__name__}: {exc}")
    buffers = {n for n, _ in model.named_buffers()}
    masks = {label: m for label, m in masks.items() if label not in moved}
    return Fills(made, computed, masks, mask_buffers={n for n, kind in state.values() if kind == "mask" and n in buffers},
                 constants=constants, numbers=tuple(sorted({*ops, *held})), held=most)


def _written(t, numbers):
    """Positions of output `t` holding one of the extreme numbers the forward's ops wrote, or its negation (a sign
    flip: `y - 1e9 * ban`, `(ok - 1) * 1e9`), also as a lower precision rounds it (a review: -1e9 written in
    bfloat16, the logits then cast to float32 as Hugging Face language models do)."""
    import torch

    if t.is_complex():
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    exact = torch.tensor([abs(v) for v in numbers], dtype=torch.float64)
    held = torch.cat([exact.to(dt).to(t.dtype) for dt in (t.dtype, torch.bfloat16, torch.float16)])
    held = held[torch.isfinite(held)].to(t.device)
    return (t.abs().unsqueeze(-1) == held).any(-1)


def _unfit_numbers(t, ops, held, up: bool):
    """Positions of output `t` holding a number an op wrote (either sign: a ban's -1e9, a cost matrix's +1e9 over its
    padding), or one only a buffer holds, below 0: a bias buffer added bans by pushing a value down; +1.7e9 added
    forces its position, and is what the model outputs (a review: an offset held in a buffer was left out; the
    rule then asked every number to be below 0, and a cost matrix's +1e9 padding made the loss 2e17). Where an add
    pushed a value up to such a number (`up` False: an offset, however written), only values below 0 count."""
    below = t < 0 if not t.is_complex() else t.new_ones(t.shape, dtype=bool)
    hit = _written(t, ops) if ops else t.new_zeros(t.shape, dtype=bool)
    if not up:
        hit = hit & below
    return hit | (_written(t, held) & below) if held else hit


def _moved_by_weights(model, inputs, ctx, masks: dict, outs: dict, extreme: dict) -> tuple[set[str], dict]:
    """(the outputs whose ±inf positions move when the weights do, label -> the EXTREME finite positions that keep
    their value). A mask computed from the values it masks (a top-k filter over the logits, sampling code left in the
    forward) is no class a model bans, and a made-up target moved off it would hide that a real label there makes
    the loss inf (a review). A finite value as extreme as a fill that no weight changes (`torch.finfo(dtype).min` or
    -1e9 written over banned classes) is a constant the code wrote: no target can be fitted there, and one made-up
    target on finfo.min makes the loss inf. One more forward, with every trainable floating parameter scaled elementwise
    by 1 + 0.5·N(0, 1) (torch.func.functional_call: the model's own are not touched, at the cost of a copy of its
    floating parameters for that forward); asked only when an output holds ±inf or an EXTREME value. A ban by a
    buffer or by the input stays where it was."""
    import torch
    from torch.func import functional_call

    from .loss import float_outputs

    if not any(bool(m.any()) for m in (*masks.values(), *extreme.values())):
        return set(), {}
    g = torch.Generator().manual_seed(0)
    # a frozen parameter trains no more than a buffer; a model frozen whole (an inference copy) is shaken whole
    trained = any(p.requires_grad for p in model.parameters() if p.is_floating_point())
    params = {n: p * (1 + 0.5 * torch.randn(p.shape, generator=g)).to(p.device, p.dtype)
              if p.is_floating_point() and (p.requires_grad or not trained) else p
              for n, p in model.named_parameters()}

    class Shaken:   # inputs.call(model) calls it as the model, on the shaken weights
        def __call__(self, *args, **kwargs):
            return functional_call(model, params, args, kwargs)

    try:
        with ctx.seeded(), ctx.autocast():
            shaken = dict(float_outputs(inputs.call(Shaken())))
    except Exception:   # noqa: BLE001 - the shaken weights' forward failed: nothing is told, the first one's stand
        return set(), {}
    same = {label: shaken[label].shape == t.shape for label, t in outs.items() if label in shaken}
    moved = {label for label, m in masks.items() if not same.get(label) or not torch.equal(torch.isinf(shaken[label]), m)}
    # a constant is where it was and what it was, every one of them: a set that moves is computed (a top-k filter).
    # An output that is a constant throughout bans nothing, it is broken (a review: a prediction an offset held in a
    # tensor absorbed, a clamp with the wrong bound)
    constants = {label: m for label, m in extreme.items() if same.get(label) and bool(m.any()) and not bool(m.all())
                 and torch.equal(m & (shaken[label] == outs[label]), m)
                 and torch.equal(torch.isfinite(shaken[label]) & as_extreme_as_a_fill(shaken[label]),
                                 torch.isfinite(outs[label]) & as_extreme_as_a_fill(outs[label]))}
    return moved, constants
