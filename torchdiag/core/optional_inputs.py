"""Optional inputs a forward needs (issue 26): a default layout whose forward fails because it was not given one of
its optional parameters (CLAP's audio tower reads input_features=None, LXMERT raises "`visual_feats` cannot be
`None`", a Q-Former's cross-attention wants encoder_hidden_states) gets that input and is tried again, up to
MAX_ADDED inputs deep. Nothing here knows a model by name: the input is one the error names (in its message, or
as the None the module that raised received, or was handed on to it), and its shape comes from the config and the
layout's main input the way hf_inputs shapes the forward's required inputs. Only tried when no default layout runs: of several
layouts, when none of the forwards the search makes anyway runs (core.inputs._first_that_runs); of one, when the
command's own first forward fails (FirstForward, Wanting, run_completing): a layout that runs costs no forward more.

One input is added to every layout before any gets a second (a length another layout has is not worked around
by an input the model would derive itself: XMOD's position ids), and an input counts as the missing one only when
the error names it or the module that raised received it as None (or a None handed on to it): a None the model
handled (it derived the value and went on into its sub-modules with it) is not what failed."""
from __future__ import annotations

import re
from typing import Any, NamedTuple

MAX_ADDED = 3      # optional inputs added to one layout at most
MAX_TRIES = 48     # probe forwards at most, over all layouts
NAMES_EACH = 2     # of the inputs one error names, the first this many are tried


class Probe(NamedTuple):
    out: Any            # the output, None when the forward raised
    names: list[str]    # the optional inputs its error names (named())
    calls: int          # module calls before it raised
    said: bool          # its message names one of them: a check on the inputs before it passed


def probe(model, inputs) -> Probe:
    """One traceless forward, and what its error says about optional inputs."""
    import warnings

    from .inputs import traceless
    from .tracking import ModuleTracker

    tracker = ModuleTracker(model, record_shapes=False)
    try:
        with tracker, warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a wrong layout's warnings are not the user's
            return Probe(traceless(model, inputs), [], len(tracker.calls), False)
    except Exception as exc:   # noqa: BLE001 - any failure means: not this layout
        names = named(tracker, exc)
        return Probe(None, names, len(tracker.calls), any(re.search(rf"\b{n}\b", str(exc)) for n in names))


def named(tracker, exc) -> list[str]:
    """The forward's optional tensor inputs, not given, that the error points at: named in its message first,
    then received as None by the module that raised or handed on to it (ModuleTracker.failing_nones: T5's decoder
    gets input_ids=None for a missing decoder_input_ids; a Q-Former's cross-attention hands its None
    encoder_hidden_states to its key projection). A None a module replaced before its sub-module failed is one it
    handled: RoBERTa's embeddings make their position ids when given none, and fail in the position embedding,
    for a sequence longer than it has positions."""
    free = _free(tracker)
    text = str(exc)
    out = [p for p in free if re.search(rf"\b{re.escape(p)}\b", text)]
    nones = tracker.failing_nones()
    out += [p for p in free if any(p == k or p.endswith("_" + k) for k in nones)]
    return list(dict.fromkeys(out))


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


def completed(sets, probes: list[Probe], loaded, device, seed: int):
    """The first layout that runs with the optional inputs its errors name added (ModelInputs, its source saying
    what was added), or None. `probes`: each layout's own probe(). Breadth first: one input added to each layout,
    in their order, before any layout gets a second, so that a layout another one fixes (a shorter sequence) is not
    worked around by more inputs. Each of the first NAMES_EACH inputs an error names is tried in each of its shapes
    (hf_inputs.optional_specs); a forward that then fails naming another one, after more module calls than before
    or in its message (the added input was read or checked: a wrong shape fails where the None did), gets that
    one at the next level (MAX_ADDED levels, MAX_TRIES forwards in all)."""
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
                    inputs = spec_inputs(grown, loaded, device, seed)
                    got = probe(loaded.model, inputs)
                    if got.out is not None and not blank_rank(got.out):
                        which = f"; layout {k + 1} of {len(sets)}," if len(sets) > 1 else ";"
                        inputs.source = loaded.input_source + (
                            f"{which} {', '.join(added + [name])} added: optional in the forward, which failed without "
                            f"{'them' if added else 'it'} (its error named {'them' if added else 'it'})")
                        return inputs
                    if got.names and (got.calls > reached or got.said):   # this shape was read: the next level
                        if len(added) + 1 < MAX_ADDED:
                            deeper.append((grown, got.names, got.calls, added + [name], k))
                        break
        level = deeper
    return None


class Wanting(BaseException):
    """A command's first forward on a default layout failed naming an optional input: run_completing ends the
    command (a BaseException: the diagnostic's own handlers let it through) and runs it again, on the layout with
    the input added when one runs."""

    def __init__(self, first: FirstForward):
        super().__init__("the default inputs need an optional input")
        self.first = first


class FirstForward:
    """On a source's one default layout (core.inputs.source_inputs, ModelInputs.check): its first forward on
    values, the command's own, runs under a ModuleTracker (hooks, no forward more) and, should it fail naming an
    optional input the forward was not given while run_completing waits for that, raises Wanting."""

    def __init__(self, loaded, device, seed: int, finish):
        self.loaded, self.device, self.seed, self.finish = loaded, device, seed, finish
        self.armed = True

    def call(self, inputs, model):
        from .tracking import ModuleTracker

        if not _on_values(inputs, model):   # doctor's meta check, memory's estimate: the real forward comes later
            return model(*inputs.args, **inputs.kwargs)
        self.armed = False   # once: the forwards after it (and the command run again) are plain
        if not _waiting[0]:
            return model(*inputs.args, **inputs.kwargs)
        tracker = ModuleTracker(model, record_shapes=False)
        try:
            with tracker:
                return model(*inputs.args, **inputs.kwargs)
        except Exception as exc:
            if named(tracker, exc):
                raise Wanting(self) from exc
            raise

    def completed(self):
        """The layout with the inputs it needs (its source's finish applied), or None: its forward runs here after
        all (the command's first forward failed for its own reasons), or nothing added makes it run."""
        loaded, device, seed = self.loaded, self.device, self.seed
        specs = tuple(loaded.default_inputs)
        from .inputs import spec_inputs

        first = probe(loaded.model, spec_inputs(specs, loaded, device, seed))
        if first.out is not None or not first.names:
            return None
        grown = completed([specs], [first], loaded, device, seed)
        return None if grown is None else self.finish(grown)


_waiting = [False]


def _on_values(inputs, model) -> bool:
    """A forward on values: no fake-tensor (or other dispatch) mode active, no input or first parameter on meta
    or fake."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _get_current_dispatch_mode() is not None:
        return False
    first = next(iter(model.parameters()), None)
    held = [t for _, t in inputs.tensors()] + ([first] if first is not None else [])
    return not any(t.device.type == "meta" or isinstance(t, FakeTensor) for t in held)


def run_completing(run, model, inputs, refresh):
    """`run(model, inputs)`; when its first forward fails for want of an optional input (Wanting), `run` once more
    on the layout with the input added (`refresh(inputs)` first: the header and what the context learned from the
    inputs), or on the same layout when none runs (the diagnostic then reports the failure as its own)."""
    _waiting[0] = True
    try:
        return run(model, inputs)
    except Wanting as wanting:
        first = wanting.first
    finally:
        _waiting[0] = False
    grown = first.completed()
    if grown is not None:
        inputs = refresh(grown)
    return run(model, inputs)
