"""Optional inputs a forward needs (issue 26): a default layout whose forward fails because it was not given one of
its optional parameters (CLAP's audio tower reads input_features=None, LXMERT raises "`visual_feats` cannot be
`None`", a Q-Former's cross-attention wants encoder_hidden_states) gets that input and is tried again, up to
MAX_ADDED inputs deep. Nothing here knows a model by name: the input is one the error names (in its message, or
as the None a module still running received), and its shape comes from the config and the layout's main input
the way hf_inputs shapes the forward's required inputs. Only tried when no default layout runs."""
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
    then received as None by a module still running (innermost first; T5's decoder gets input_ids=None for a
    missing decoder_input_ids)."""
    free = _free(tracker)
    text = str(exc)
    out = [p for p in free if re.search(rf"\b{re.escape(p)}\b", text)]
    for nones in tracker.none_inputs():
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
    """The first layout, in order, that runs with the optional inputs its error names added (ModelInputs, its
    source saying what was added), or None. `probes`: each layout's own probe()."""
    tries = [0]
    for specs, first in zip(sets, probes):
        found = _grow(tuple(specs), first.names, first.calls, loaded, device, seed, tries, [])
        if found is not None:
            return found
    return None


def _grow(specs, wanted, reached, loaded, device, seed, tries, added):
    """Depth-first: each of the first NAMES_EACH inputs the error names, in each of its shapes; a forward that
    fails naming another one, after more module calls than `reached` or in its message (the added input was read
    or checked: a wrong shape fails where the None did), goes a level deeper (MAX_ADDED levels, MAX_TRIES forwards
    in all)."""
    from . import hf_inputs
    from .inputs import blank_rank, spec_inputs

    given = {s.partition("=")[0] for s in specs if "=" in s}
    for name in [n for n in wanted if n not in given][:NAMES_EACH]:
        for spec in hf_inputs.optional_specs(name, specs, loaded.model):
            if tries[0] >= MAX_TRIES:
                return None
            tries[0] += 1
            grown = specs + (spec,)
            inputs = spec_inputs(grown, loaded, device, seed)
            got = probe(loaded.model, inputs)
            if got.out is not None and not blank_rank(got.out):
                inputs.source = loaded.input_source + (
                    f"; {', '.join(added + [name])} added: optional in the forward, which failed without "
                    f"{'them' if added else 'it'} (its error named {'them' if added else 'it'})")
                return inputs
            if got.names and (got.calls > reached or got.said) and len(added) + 1 < MAX_ADDED:
                found = _grow(grown, got.names, got.calls, loaded, device, seed, tries, added + [name])
                if found is not None:
                    return found
    return None
