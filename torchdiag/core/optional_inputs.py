"""Optional inputs a forward needs (issue 26): a default layout whose forward fails because it was not given one of
its optional parameters (CLAP's audio tower reads input_features=None, LXMERT raises "`visual_feats` cannot be
`None`", a Q-Former's cross-attention wants encoder_hidden_states) gets that input and is tried again, up to
MAX_ADDED inputs deep. Nothing here knows a model by name: the input is one the error names (in its message, or
as the None the module that raised received, or was handed on to it), and its shape comes from the config and the
layout's main input the way hf_inputs shapes the forward's required inputs. Only tried when a default layout does
not run: of several layouts, when none of the forwards the search makes anyway runs (core.inputs._first_that_runs);
of one, when its probe forward fails (core.inputs._with_optional: one traceless forward at input resolution, only
for a forward that takes optional inputs the layout leaves out). Probes cast their float inputs to --dtype as the
command's are (the model is cast before its inputs are resolved).

One input is added to every layout before any gets a second (a length another layout has is not worked around
by an input the model would derive itself: XMOD's position ids), and an input counts as the missing one only when
the error names it or the module that raised received it as None (or a None handed on to it): a None the model
handled (it derived the value and went on into its sub-modules with it) is not what failed."""
from __future__ import annotations

import re
from typing import Any, NamedTuple

from ..errors import one_line, out_of_memory

OUT_OF_MEMORY: list[str] = []   # the probes since the last clear() that ran out of memory (their messages)
MAX_ADDED = 3      # optional inputs added to one layout at most
MAX_TRIES = 48     # probe forwards at most, over all layouts
NAMES_EACH = 2     # of the inputs one error names, the first this many are tried


class Probe(NamedTuple):
    out: Any            # the output, None when the forward raised
    names: list[str]    # the optional inputs its error names (named())
    calls: int          # module calls before it raised
    said: bool          # its message names one of them: a check on the inputs before it passed
    width: tuple | None = None   # (input, width) an nn.Linear handed that input reads instead (core.input_width)
    error: str = ""     # its error's message (core.error_sizes reads the sizes it asks for)


def probe(model, inputs, dtype: str | None = None) -> Probe:
    """One traceless forward, and what its error says about optional inputs. `dtype`: --dtype, the model already
    cast to it (core.context.prepare casts the model before the inputs are resolved, their float tensors after):
    the forward gets its float inputs cast as the command's will be (core.precision.cast_inputs)."""
    import warnings

    from .inputs import traceless
    from .precision import cast_inputs
    from .tracking import ModuleTracker

    tracker = ModuleTracker(model, record_shapes=False)
    cast = cast_inputs(inputs, dtype)
    try:
        with tracker, warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a wrong layout's warnings are not the user's
            return Probe(traceless(model, cast), [], len(tracker.calls), False)
    except Exception as exc:   # noqa: BLE001 - any failure means: not this layout
        from .input_width import refused

        names, text = named(tracker, exc), _text(exc)
        if out_of_memory(exc) or "can't allocate memory" in text:   # the layout may be right and too large
            OUT_OF_MEMORY.append(one_line(exc))
        return Probe(None, names, len(tracker.calls), any(re.search(rf"\b{n}\b", text) for n in names),
                     refused(tracker, cast, exc), text)


def _text(exc) -> str:
    """The error's message, or "" when str() of it raises (a review: a model's own exception class)."""
    try:
        return str(exc)
    except Exception:   # noqa: BLE001 - its message is only a hint here
        return ""


def named(tracker, exc) -> list[str]:
    """The forward's optional tensor inputs, not given, that the error points at: named in its message first,
    then received as None by the module that raised or handed on to it (ModuleTracker.failing_nones: T5's decoder
    gets input_ids=None for a missing decoder_input_ids; a Q-Former's cross-attention hands its None
    encoder_hidden_states to its key projection). A None a module replaced before its sub-module failed is one it
    handled: RoBERTa's embeddings make their position ids when given none, and fail in the position embedding,
    for a sequence longer than it has positions."""
    free = _free(tracker)
    text = _text(exc)
    out = [p for p in free if re.search(rf"\b{re.escape(p)}\b", text)]
    nones = tracker.failing_nones()
    out += [p for p in free if any(p == k or p.endswith("_" + k) for k in nones)]
    out += _none_on_line(exc, free, tracker.model if nones else None)
    return list(dict.fromkeys(out))


def _none_on_line(exc, free: list[str], root=None) -> list[str]:
    """The inputs in `free` that a forward's line where it failed reads while they are None: the innermost module
    forward's (Idefics' own `image_attention_mask.size(-1)`), and (`root`: the module that raised got a None under
    its own parameter's name, nn.Linear's `input`) the root forward's line that called it (Decision Transformer's
    `self.embed_action(actions)`)."""
    import linecache

    import torch

    frames = []
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        own = tb.tb_frame.f_locals.get("self")
        if tb.tb_frame.f_code.co_name == "forward" and isinstance(own, torch.nn.Module):
            frames.append((tb.tb_frame, tb.tb_lineno, own))
        tb = tb.tb_next
    chosen = frames[-1:] + [f for f in frames if root is not None and f[2] is root]
    out = []
    for frame, lineno, _ in chosen:
        words = set(re.findall(r"\b\w+\b", linecache.getline(frame.f_code.co_filename, lineno)))
        out += [p for p in free if p in words and p in frame.f_locals and frame.f_locals[p] is None]
    return out


def _free(tracker) -> list[str]:
    """The root forward's optional parameters the call did not give that can hold a tensor (not a cache or a flag),
    embeddings left out: they replace an input the forward reads itself."""
    from .inputs import forward_parameters

    if tracker.root_given is None:
        return []
    n_args, given = tracker.root_given
    params = forward_parameters(tracker.model)[n_args:]
    return [p.name for p in params if p.name not in given and p.default is None and not p.name.endswith("embeds")
            and (p.annotation is p.empty or "Tensor" in str(p.annotation))]


def needs_probe(model, inputs) -> bool:
    """The forward takes optional tensor inputs the default does not give (a plain `forward(x)` is not probed)."""
    from .inputs import forward_parameters

    params = forward_parameters(model)[len(inputs.args):]
    return any(p.name not in inputs.kwargs and p.default is None for p in params)


def completed(sets, probes: list[Probe], loaded, device, seed: int, dtype: str | None = None, prepare=None,
              furthest: list | None = None):
    """The first layout that runs with the optional inputs its errors name added (ModelInputs, its source saying
    what was added), or None. `probes`: each layout's own probe(). Breadth first: one input added to each layout,
    in their order, before any layout gets a second, so that a layout another one fixes (a shorter sequence) is not
    worked around by more inputs. Each of the first NAMES_EACH inputs an error names is tried in each of its shapes
    (hf_inputs.optional_specs); a forward that then fails naming another one, after more module calls than before
    or in its message (the added input was read or checked: a wrong shape fails where the None did), gets that
    one at the next level (MAX_ADDED levels, MAX_TRIES forwards in all). `prepare`: what the probe forward is given
    instead of a layout (its labels added, as the command will call the model). An added input an nn.Linear refuses
    at its width is tried once more at that width (core.input_width: Decision Transformer's actions, its returns).
    `furthest`: a list that gets (specs, probe) of the grown layouts that were read and failed, for
    core.error_sizes (an added input that fixes the layout but for a size its error asks for: Voxtral Realtime's
    audio frames set how many token ids it reads)."""
    from ..errors import UsageError
    from . import hf_inputs
    from .inputs import blank_rank, spec_inputs

    tries = 0
    # (the layout's specs with the inputs added so far, what its last error named, its module calls, the names
    # added, the layout's index)
    level: list[tuple[tuple[str, ...], list[str], int, list[str], int]] = [
        (tuple(specs), p.names, p.calls, [], k) for k, (specs, p) in enumerate(zip(sets, probes)) if p.names]
    while level:
        deeper = []
        for specs, wanted, reached, added, k in level:
            given = {s.partition("=")[0] for s in specs if "=" in s}
            for name in [n for n in wanted if n not in given][:NAMES_EACH]:
                for spec in hf_inputs.optional_specs(name, specs, loaded.model):
                    if tries >= MAX_TRIES:
                        return None
                    tries += 1
                    grown = specs + (spec,)
                    try:
                        inputs = spec_inputs(grown, loaded, device, seed)
                    except UsageError:   # a shape too large to allocate (hf_inputs.make): not this one
                        continue
                    got = probe(loaded.model, prepare(inputs) if prepare else inputs, dtype)
                    wide = _at_width(spec, got)
                    if wide and tries < MAX_TRIES:   # a Linear read it at another width: that width, one probe more
                        tries += 1
                        grown = specs + (wide,)
                        inputs = spec_inputs(grown, loaded, device, seed)
                        got = probe(loaded.model, prepare(inputs) if prepare else inputs, dtype)
                    if got.out is not None and not blank_rank(got.out):
                        inputs, grown = _marking_some(grown, inputs, loaded, device, seed, prepare)
                        which = f"; layout {k + 1} of {len(sets)}," if len(sets) > 1 else ";"
                        inputs.source = loaded.input_source + (
                            f"{which} {', '.join(added + [name])} added: optional in the forward, which failed without "
                            f"{'them' if added else 'it'} (its error named {'them' if added else 'it'})")
                        inputs.notes += [f"{s.partition('=')[0]}: 0, 1, 2, … along each sequence (positions, as the "
                                         "model derives them)" for s in grown[-len(added) - 1:] if "~arange=0" in s]
                        return inputs
                    if furthest is not None and (got.calls > reached or _asks_a_size(got, grown)):
                        furthest.append((grown, got))
                    if got.names and (got.calls > reached or got.said):   # this shape was read: the next level
                        if len(added) + 1 < MAX_ADDED:
                            deeper.append((grown, got.names, got.calls, added + [name], k))
                        break
        level = deeper
    return None


def _marking_some(grown: tuple, inputs, loaded, device, seed: int, prepare):
    """(inputs, specs) with an added mask of all ones marking only the first half of each row instead, where that
    runs and the loss then reaches more parameters (one forward and backward each, on the model's own tensors left
    as they were): every token marked global in Longformer's global_attention_mask leaves its local attention's
    query, key and value without a gradient, which a healthy model's real input (a question's tokens) never does."""

    from .hf_inputs import split
    from .inputs import spec_inputs

    name, body, fill = split(grown[-1])
    if fill != "ones" or "mask" not in (name or "") or device.type == "meta" or _padding_sense(name or "") \
            or not getattr(loaded, "trains", False):   # (a command that runs no backward: no gradient to miss)
        return inputs, grown
    half = grown[:-1] + (f"{name}={body}~half",)
    other = spec_inputs(half, loaded, device, seed)
    call = prepare or (lambda x: x)
    ones_reach = _reached(loaded.model, call(inputs))
    half_reach = _reached(loaded.model, call(other))
    if ones_reach is None or half_reach is None or half_reach <= ones_reach:
        return inputs, grown
    other.notes.append(f"{name}: ones on the first half of each row (all ones left {half_reach - ones_reach} "
                       "parameter(s) without a gradient)")
    return other, half


def _padding_sense(name: str) -> bool:
    """A mask whose ones mean "a real position, attend to it" by transformers' convention (attention_mask,
    decoder_attention_mask, a padding mask): all ones is the input without padding, whatever the gradients say (a
    review: a model whose padded positions take a learned pad vector reached it only with half the batch padded)."""
    return name in ("attention_mask", "decoder_attention_mask") or "padding" in name


def _reached(model, inputs) -> int | None:
    """How many parameters get a non-zero gradient from the mean of each floating output, None when that forward or
    backward fails. No trace on the model (core.inputs.no_trace); no .grad is written."""
    import torch

    from .inputs import no_trace
    from .reach import floats

    params = [p for p in model.parameters() if p.requires_grad]
    try:
        with no_trace(model), torch.enable_grad():
            outs = [t for t in floats(inputs.call(model)) if t.requires_grad and t.numel()]
            if not outs or not params:
                return None
            grads = torch.autograd.grad(sum(t.float().mean() for t in outs), params, allow_unused=True)
        return sum(1 for g in grads if g is not None and bool(g.any()))
    except Exception:   # noqa: BLE001 - a variant that does not train is not taken
        return None


def _asks_a_size(got: Probe, specs) -> bool:
    """Its error asks for a size of the layout (core.error_sizes): the added input was read, where it failed no later
    than without it (Kosmos-2: the image positions marked in a mask as long as the ids, 16, for 64 embeddings)."""
    from . import error_sizes

    return got.out is None and bool(error_sizes.asked(got.error, error_sizes.sizes_of(specs)))


def _at_width(spec: str, got: Probe) -> str | None:
    """`spec` with its last dimension the width an nn.Linear handed that input reads (Probe.width), None when the
    probe failed otherwise."""
    from . import hf_inputs

    name, body, fill = hf_inputs.split(spec)
    if got.out is not None or not got.width or got.width[0] != name:
        return None
    dims, _, dtype = body.partition(":")
    shape = dims.split("x")
    if len(shape) < 2 or not dtype.startswith("float"):
        return None
    return f"{name}={'x'.join(shape[:-1] + [str(got.width[1])])}:{dtype}" + (f"~{fill}" if fill else "")
