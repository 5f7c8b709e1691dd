"""Sizes a model's own error asks for, when none of a source's default layouts runs (core.inputs._first_that_runs).

A forward that refuses a made-up input often says the size it wanted: "The size of tensor a (80) must match the size
of tensor b (560)", torch.cat's "Expected size 128 but got size 50 for tensor number 1 in the list", "must be a
multiple of `n_window * 2` (100)", "expected input[1, 128, 160] to have 1 channels, but got 128 channels", "Input
height (224) doesn't match model (336)". Each gives (old, new): a size of the layout
after its batch dimension, and the one to try instead. Which dimensions hold it is not said, so the variants are
the sets of its positions: each alone, then all, then the sets between (a feature map's height and width change
together; a spectrogram's frame count in its features and in their mask together, not its mel bins). Each is one
probe forward: at most PER_SIZE per size asked for, TRIES in all, ROUNDS errors deep. Nothing here knows a model:
only what its error says."""
from __future__ import annotations

import itertools
import math
import re

ROUNDS = 3          # errors followed one after another, each asking for a size
TRIES = 24          # probe forwards at most, over all layouts (making a variant's ids may run one more each)
MAX_POSITIONS = 4   # positions of one size changed at most (2^4 - 1 sets)
PER_SIZE = 15       # variants probed per (layout, size) asked for
MAX_GROWTH = 16     # a size asked for is at most this many times the one it replaces (a misread number: no 10 GB input)

_PAIRS = [re.compile(r"size of tensor a \((\d{1,9})\) must match the size of tensor b \((\d{1,9})\)"
                     r"(?! at non-singleton dimension 0\b)"),   # dimension 0: the batch, never resized
          re.compile(r"\((\d{1,9})\) doesn'?t match model \((\d{1,9})\)"),
          # torch.cat of tensors that differ outside the joined dimension: "Sizes of tensors must match except in
          # dimension 1. Expected size 128 but got size 50 for tensor number 1 in the list." (a codec joins its
          # spectrogram's frames to its waveform's)
          re.compile(r"Expected size (\d{1,9}) but got size (\d{1,9}) for tensor number")]
# "Input image size (1792*448) doesn't match model (896*448)": (height, width) given and wanted
_SIDES = re.compile(r"\((\d{1,9})\*(\d{1,9})\) doesn'?t match model \((\d{1,9})\*(\d{1,9})\)")
_CHANNELS = re.compile(r"to have (\d{1,9}) channels, but got (\d{1,9}) channels")
# a masked assignment `x[mask] = values` whose mask selects another count of rows than the values hold: "value tensor
# of shape [128, 32] cannot be broadcast to indexing result of shape [32, 32]" (Kosmos-2 puts its 64 image
# embeddings at the positions image_embeds_position_mask marks: with every position marked, the sequence is 64 long)
_MASKED = re.compile(r"value tensor of shape \[(\d{1,9})(?:, \d{1,9})*\] cannot be broadcast to indexing result of "
                     r"shape \[(\d{1,9})")
# "a multiple of `n_window * 2` (100)": the value of the named expression; "a multiple of 1920": the number itself
_MULTIPLE = [re.compile(r"(?:multiple of|divisible by) `[^`]{1,40}` \((\d{1,9})\)"),
             re.compile(r"(?:multiple of|divisible by) (\d{1,9})\b")]


def asked(text: str, sizes: set[int]) -> list[tuple[int, int]]:
    """(old, new) pairs the error text asks for, `old` among the layout's `sizes` (after the batch dimension)."""
    out: list[tuple[int, int]] = []
    for pattern in _PAIRS:
        for m in pattern.finditer(text):
            a, b = int(m.group(1)), int(m.group(2))
            out += [(a, b)] if a in sizes else []
            out += [(b, a)] if b in sizes and a not in sizes else []
    for m in _CHANNELS.finditer(text):
        want, got = int(m.group(1)), int(m.group(2))
        out += [(got, want)] if got in sizes else []
    for m in _MASKED.finditer(text):   # the rows selected (a product of the mask's sizes) scaled to the values'
        a, b = int(m.group(2)), int(m.group(1))
        out += [(a, b)] if a in sizes else _scaled(a, b, sizes)
    for m in _SIDES.finditer(text):
        for a, b in ((int(m.group(1)), int(m.group(3))), (int(m.group(2)), int(m.group(4)))):
            out += [(a, b)] if a in sizes else _scaled(a, b, sizes)
    found = _MULTIPLE[0].search(text) or _MULTIPLE[1].search(text)
    n = int(found.group(1)) if found else 0
    if n > 1:
        out += [(v, math.ceil(v / n) * n) for v in sorted(sizes) if v % n]
    return [p for p in dict.fromkeys(out) if p[0] != p[1] and 0 < p[1] <= MAX_GROWTH * max(p[0], 1)]


def _scaled(seen: int, wanted: int, sizes: set[int]) -> list[tuple[int, int]]:
    """A size the model saw that is no size of the layout but a multiple of one (SegGPT stacks its prompt above the
    image: 1792 rows from 896): that size scaled as the model wants it (896 → 448 for 896 wanted), the largest
    such size first (the fewest copies of it)."""
    return [(v, wanted * v // seen) for v in sorted(sizes, reverse=True)
            if seen != v and seen % v == 0 and (wanted * v) % seen == 0 and wanted * v // seen > 0]


def sizes_of(specs) -> set[int]:
    return {int(d) for i, j, d in _positions(_parsed(specs))}


def variants(specs, old: int, new: int) -> list[tuple[frozenset, tuple[str, ...]]]:
    """(positions, `specs` with `old` set to `new` there) for each set of the positions holding `old` (after the
    batch dimension): each one alone, then all of them, then the sets between, smallest first."""
    parsed = _parsed(specs)
    where = [(i, j) for i, j, d in _positions(parsed) if d == old]
    if not where or len(where) > MAX_POSITIONS:
        return []
    sets = [frozenset(c) for k in range(1, len(where) + 1) for c in itertools.combinations(where, k)]
    ordered = [x for x in sets if len(x) == 1] + [frozenset(where)] + [x for x in sets if 1 < len(x) < len(where)]
    return [(x, tuple(_with(parsed, x, new))) for x in dict.fromkeys(ordered)][:PER_SIZE]


def masks_of(specs, old: int) -> frozenset:
    """The positions holding `old` in the specs named as masks (a frame count a mask repeats: it changes with it)."""
    parsed = _parsed(specs)
    return frozenset((i, j) for i, j, d in _positions(parsed) if d == old and "mask" in parsed[i][0])


def with_positions(specs, chosen: frozenset, new: int) -> tuple[str, ...]:
    return tuple(_with(_parsed(specs), chosen, new))


def _positions(parsed):
    """(spec, dimension, size) of every size a variant may change: after the batch dimension, and not the last
    dimension of a spec whose fill fixes it (`~each=` rows, `~boxes`)."""
    for i, (_, tail, dims) in enumerate(parsed):
        fixed = "~each=" in tail or "~boxes" in tail
        for j, d in enumerate(dims):
            if j and d.isdigit() and not (fixed and j == len(dims) - 1):
                yield i, j, int(d)


def _parsed(specs):
    """(prefix 'name=' or '', the rest after the shape ':dtype~fill', the shape's dimensions) per spec."""
    out = []
    for s in specs:
        name, eq, rest = s.partition("=") if "=" in s else ("", "", s)
        shape, colon, tail = rest.partition(":")
        out.append((name + eq, colon + tail, shape.split("x")))
    return out


def _with(parsed, chosen: frozenset, new: int):
    for i, (prefix, tail, dims) in enumerate(parsed):
        yield prefix + "x".join(str(new) if (i, j) in chosen else d for j, d in enumerate(dims)) + tail


def resized(sets, probes, loaded, device, seed: int, dtype: str | None, last_resort: list | None = None):
    """The first layout that runs once given the sizes its own errors ask for, following up to ROUNDS errors in turn:
    when no variant of a round runs, the one whose forward got furthest with another error starts the next (FunASR's
    encoder asks for 560 features per frame, then for 127 frames). ModelInputs, its source saying which sizes
    changed; None when none runs. `probes`: each layout's own (optional_inputs.probe). A variant that runs and gives
    nothing (every float output all zeros, or NaN: core.inputs.blank_rank) is a last resort, as an unresized layout
    that does so is: taken, and said, when no variant gives more (Xcodec2 at random initialisation: its quantizer
    rounds every latent to the zero level, and the audio decoded from them is all zeros). With `last_resort` given,
    that one is appended there and None returned: the caller tries its other ways first."""
    tries, blanks, blank = [0], list[tuple](), None
    for i, first in enumerate(probes):
        specs, prev, steps = tuple(sets[i]), first, list[str]()
        for _ in range(ROUNDS):
            ran, nxt = _round(specs, prev, loaded, device, seed, dtype, tries, blanks)
            for rank, inputs, step in blanks:   # the first of the lowest rank: all zeros before NaN
                if blank is None or rank < blank[0]:
                    blank = (rank, inputs, i, steps + [step])
            blanks.clear()
            if ran is not None:
                inputs, step = ran
                inputs.source = loaded.input_source + (
                    f"; layout {i + 1} of {len(sets)} with {', '.join(steps + [step])}: the size the model's own "
                    "error asked for (no layout ran as made)")
                return inputs
            if nxt is None:
                break
            specs, prev = nxt[0], nxt[1]
            steps = steps + [nxt[2]]
    if blank is None:
        return None
    rank, inputs, i, steps = blank
    inputs.source = loaded.input_source + (
        f"; layout {i + 1} of {len(sets)} with {', '.join(steps)}: the size the model's own error asked for (no "
        f"layout ran as made; the only ones that ran gave an output of {'all zeros' if rank == 1 else 'NaN'})")
    if last_resort is not None:
        last_resort.append(inputs)
        return None
    return inputs


def _round(specs, prev, loaded, device, seed: int, dtype: str | None, tries: list, blanks: list | None = None):
    """((inputs, 'old → new') of the first variant that runs, None) or (None, (specs, probe, step) of the variant
    that got furthest with another error, or None). A variant that runs while a mask still holds the old size is
    tried with the mask changed too, and taken that way when it runs (a frame count in features and mask).
    `blanks` gets (blank_rank, inputs, 'old → new') of each variant that ran and gave nothing."""
    from .inputs import blank_rank

    best = None
    for old, new in asked(prev.error, sizes_of(specs)):
        for chosen, grown in variants(specs, old, new):
            if tries[0] >= TRIES:
                return None, best
            tries[0] += 1
            inputs, got = _probe(grown, loaded, device, seed, dtype)
            if got is None:
                continue
            if got.out is not None and not blank_rank(got.out):
                masks = masks_of(specs, old) - chosen
                if masks and tries[0] < TRIES:
                    tries[0] += 1
                    both, again = _probe(with_positions(specs, chosen | masks, new), loaded, device, seed, dtype)
                    if again is not None and again.out is not None and not blank_rank(again.out):
                        inputs = both
                return (inputs, f"{old} → {new}"), None
            if got.out is not None and blanks is not None:
                blanks.append((blank_rank(got.out), inputs, f"{old} → {new}"))
            if got.out is None and got.error != prev.error and got.calls >= prev.calls \
                    and (best is None or got.calls > best[1].calls):
                best = (grown, got, f"{old} → {new}")
    return None, best


def _probe(specs, loaded, device, seed: int, dtype: str | None):
    """(inputs, probe) of one candidate layout, labels as the command gives them; (None, None) when its inputs
    cannot be made (a size a fill cannot take, one too large to allocate)."""
    from .inputs import spec_inputs, with_labels
    from .optional_inputs import probe

    try:
        inputs = spec_inputs(specs, loaded, device, seed)
    except Exception:   # noqa: BLE001 - a variant that cannot be made is one that does not run
        return None, None
    return inputs, probe(loaded.model, with_labels(inputs, loaded), dtype)
