"""Why a trainable parameter got no gradient, worked out from the recorded forward, not guessed:
its module never ran (unused), ran but none of its outputs reached the loss (detached: `.detach()`,
an integer output, `torch.no_grad()`), or ran and reached the loss without using it."""
from __future__ import annotations

from dataclasses import dataclass

from .module_paths import ancestors, label, owner


def why(name, rec, reach: set[int], modules) -> tuple[str, str]:
    """('unused' | 'detached', explanation) for a trainable parameter that got no gradient."""
    mod = owner(name)
    ran = rec.order
    cut = _cut(_ran(mod, rec), rec, reach) if mod not in ran else None
    if cut is not None and _graph_cut(cut, rec):   # never called, inside a module whose graph was cut (MHA's out_proj)
        return "detached", _detached(cut, rec)
    if mod not in ran:
        # the highest ancestor that never ran either (an unused submodule, not just its leaf)
        top = mod
        for a in ancestors(mod)[1:]:
            if a in ran or a == "":
                break
            if _callable(modules[a]):   # a ModuleList never runs by itself: passed over, not named
                top = a
        return "unused", f"module {label(top)} ({type(modules[top]).__name__}) never ran in forward" + _skipped(
            top, ran, modules)
    cut = _cut(mod, rec, reach)
    if cut is not None:
        return "detached", _detached(cut, rec)
    kind = rec.types.get(mod) or type(modules[mod]).__name__
    return "unused", (f"module {label(mod)} ({kind}) ran and reached the loss, but this parameter "
                      "was not used (or was detached) in its forward")


def _skipped(top: str, ran, modules) -> str:
    """An entry of a container whose siblings of its class ran: either the forward chose among them by the input
    (an MoE's router gave it no token in this batch) or a loop skipped it; both are said."""
    parent = owner(top)
    if top == "" or parent not in modules or _callable(modules[parent]):
        return ""
    kind = type(modules[top])
    ran_too = [n for n, m in modules[parent].named_children() if type(m) is kind
               and (f"{parent}.{n}" if parent else n) in ran]
    if not ran_too:
        return ""
    return (f", while {len(ran_too)} other {kind.__name__} of {label(parent)} ran: a forward that picks among them "
            "by the input (an MoE router) may send it nothing in a small batch; a loop that stops early never calls it")


def _callable(module) -> bool:
    """A module with a forward of its own: a container (ModuleList, ModuleDict) is never called, so its not running
    says nothing (a sweep: experts 2, 6 and 7 of an MoE that got no token were "experts (ModuleList) never ran")."""
    from torch import nn

    return type(module).forward is not nn.Module.forward


def cut_of(name: str, rec, reach: set[int]) -> str | None:
    """The module whose outputs, all with an autograd graph, never reached the loss (None: another reason)."""
    mod = _ran(owner(name), rec)
    if mod is None:
        return None
    cut = _cut(mod, rec, reach)
    return cut if cut is not None and _graph_cut(cut, rec) else None


def _graph_cut(cut: str, rec) -> bool:
    """The cut module returned tensors with an autograd graph, with grad enabled: a child it used without calling
    it would be in that graph, cut with it. (Outputs without a graph, or a dataclass torchdiag cannot look
    into, say nothing about a child that never ran: it keeps its own `unused`.)"""
    nodes = rec.nodes.get(cut, [])
    return bool(nodes) and any(n is not None for n in nodes) and rec.grad_enabled.get(cut, True)


def _ran(mod: str, rec) -> str | None:
    """`mod` when it ran, else its nearest ancestor below the root that ran: a module can use a child's
    parameters without calling it (nn.MultiheadAttention reads out_proj.weight in its functional forward)."""
    for a in ancestors(mod):
        if a in rec.order and a != "":
            return a
    return None


def _cut(mod: str | None, rec, reach: set[int]) -> str | None:
    """The highest ancestor of `mod` that ran and none of whose outputs reached the loss."""
    if mod is None:
        return None
    cut = None
    for a in ancestors(mod):
        if a not in rec.order:
            continue          # containers (ModuleList) are never called themselves
        if any(n is not None and id(n) in reach for n in rec.nodes.get(a, [])):
            break
        cut = a
    return cut


def _detached(cut: str, rec) -> str:
    nodes = rec.nodes.get(cut, [])
    ckind = rec.types.get(cut, "")
    if not nodes:
        return (f"module {label(cut)} ({ckind}) ran but returned no floating-point tensor "
                "(argmax, a cast to int, a comparison): no gradient flows through an integer output")
    if all(n is None for n in nodes):
        inside = _reentrant_inside(cut, rec)
        if inside is not None:
            return (f"module {label(inside)} ran inside {REENTRANT} (torch.utils.checkpoint with use_reentrant=True) "
                    "none of whose inputs needs a gradient: its forward runs under no_grad and its recompute in "
                    "backward never comes" + ("" if inside == cut else f", so module {label(cut)} ({ckind}) "
                                              "returned no autograd graph"))
        if not rec.grad_enabled.get(cut, True):
            return f"module {label(cut)} ({ckind}) ran under torch.no_grad()"
        return (f"module {label(cut)} ({ckind}) ran but its output carried no autograd graph "
                "(detached or computed under no_grad inside its forward)")
    return (f"module {label(cut)} ({ckind}) ran but its output never reached the loss "
            "(.detach(), a cast to int, or a non-differentiable op after it)")


REENTRANT = "a reentrant checkpoint"
REENTRANT_HINT = ("pass use_reentrant=False to torch.utils.checkpoint (the form torch recommends), or let an input "
                  "of the checkpointed function require a gradient")


def _reentrant_inside(cut: str, rec) -> str | None:
    """The highest module at or inside `cut` that ran with grad off inside a reentrant checkpoint (recording.py)."""
    inside = [n for n in getattr(rec, "reentrant", ()) if cut == "" or n == cut or n.startswith(cut + ".")]
    return min(inside, key=lambda n: (n.count("."), rec.order.get(n, 0))) if inside else None


# A trainable parameter that gets no gradient is one cause with one code and one severity in every
# command that sees it (doctor, gradflow, overfit-batch): an error, ranked before what it causes.
NO_GRAD = "no-grad"
NO_GRAD_SEVERITY = "error"
NO_GRAD_HINT = ("connect them to the loss (a .detach(), torch.no_grad() or an unused module cuts them off), or "
                "freeze them with requires_grad_(False); `torchdiag gradflow` says which and why")


def top_module(names: list[str], model) -> str:
    """The highest module all of whose trainable parameters are among `names` (containing the first
    name), or the first name itself: where gradflow groups the same parameters."""
    missing = set(names)
    trainable = {n: [pn for pn, p in m.named_parameters(prefix=n) if p.requires_grad]
                 for n, m in model.named_modules()}
    best = None
    for a in ancestors(owner(names[0])):
        members = trainable.get(a, [])
        if members and all(m in missing for m in members):
            best = a
        else:
            break
    return names[0] if best is None else label(best)


def no_grad_message(names: list[str], total: int, limit: int = 6) -> str:
    shown = ", ".join(names[:limit]) + (f" … (+{len(names) - limit} more)" if len(names) > limit else "")
    return f"{len(names)} of {total} trainable parameter tensor(s) got no gradient from the loss: {shown}"


# A parameter unused with inputs torchdiag chose itself (a source's default: a text-only batch leaves a
# vision-language model's vision tower, or a decoder's cross-attention, never run; ViT-MIM's mask_token is read
# only with bool_masked_pos) says nothing about the model: info, with how to judge it. With the user's own inputs
# the same fact stays the no-grad error. A module that ran but whose output never reached the loss (detached) is
# the model's own doing, whatever the input: it stays no-grad.
NOT_REACHED = "not-reached"
NOT_REACHED_HINT = ("to judge them, give inputs that run these modules: --batch FILE.py:FN returning (inputs, target) "
                    "with the model's full inputs (e.g. pixel_values beside image tokens), or -i")


def discarded_why(cut: str, rec) -> str:
    return (f"module {label(cut)} ({rec.types.get(cut, '')}) ran and a module holding it returned what it "
            "computed, but the caller threw that away (never in the model's output, no op carried its gradient on): "
            "no loss on the model's outputs can train it (a base model's pooler a task head never reads, or a "
            "returned skip, aux output or router logits the caller forgot)")


def dropped_why(cut: str, rec) -> str:
    return (f"module {label(cut)} ({rec.types.get(cut, '')}) ran, but its output and all computed from it died "
            f"inside {label(owner(cut))}'s forward: never returned, no op carried its gradient on (a branch computed "
            "and not used, such as a missing `x = x + branch(x)`, or a value kept only on an attribute)")


def left_out_why(cut: str, rec) -> str:
    return (f"module {label(cut)} ({rec.types.get(cut, '')}) ran and its output is in the model's output, but the "
            "loss does not use that output (a named --loss, or the model's own loss, leaves it out)")


def fates(model, inputs, names: list[str], rec, reach: set[int], ctx, rng=None,
          train: bool = True) -> dict[str, tuple[str, str]]:
    """{name: (fate, cut module)} for the parameters in `names` cut off at a module whose output never reached the
    loss: 'discarded' (a component returned it, its caller threw it away), 'dropped' (it died inside the forward
    that holds it), 'left-out' (in the model's output, not in the loss) or 'cut' (an op used it without a
    gradient: .detach(), no_grad, a cast). One extra forward (core/discarded.py) in the judged pass's mode, only
    when such a module exists."""
    cuts = {n: c for n in names if (c := cut_of(n, rec, reach)) is not None}
    if not cuts:
        return {}
    from .discarded import fates as follow

    found = follow(model, inputs, set(cuts.values()), ctx, rng, train)
    return {n: (found[c], c) for n, c in cuts.items() if c in found}


def unused(name: str, rec, reach: set[int], modules) -> bool:
    """No gradient because the forward did not use it (its module never ran, or ran without it), not cut off."""
    return why(name, rec, reach, modules)[0] == "unused"


def not_reached(model, inputs, names: list[str], ctx) -> list[str]:
    """Of `names` (trainable, no gradient), those the forward did not use, when the inputs are a source's
    default; [] for the user's own inputs. One recorded pass on the model (left as it was), only when there is
    something to split."""
    if not names or not getattr(inputs, "chosen", False):
        return []
    from .recording import record_pass

    pas = record_pass(model, inputs, None, ctx)
    modules = dict(model.named_modules())
    return [n for n in names if unused(n, pas.rec, pas.reach, modules)]


def by_top_module(names: list[str], model) -> list[list[str]]:
    """`names` in groups, one per highest module all of whose trainable parameters are among them (top_module),
    in the order of their first name: one finding per unreached module, where each names its own module."""
    groups, left = [], list(names)
    while left:
        top = top_module(left, model)
        prefix = "" if top == "(root)" else top + "."
        group = [n for n in left if n == top or n.startswith(prefix)] or left[:1]
        groups.append(group)
        left = [n for n in left if n not in set(group)]
    return groups


def made_up_padding(stop, inputs) -> bool:
    """The zero gradient stops at an embedding lookup of nothing but its padding index, and those ids are one of
    the inputs torchdiag made up itself (a source's default): a fact of those ids, not of the model. Ids the
    forward makes (zeros filled in for an id input it was not given, ids times 0) or the user's ids: no."""
    from .inputs import same_data

    ids = getattr(stop, "ids", None)
    if stop.padding() is None or ids is None or not getattr(inputs, "chosen", False):
        return False
    return any(same_data(ids, t) for _, t in inputs.tensors())


def padding_why(stop) -> str:
    """A zero gradient that is a fact of made-up ids (core/stops.Stop.padding): the table's padding row."""
    return f"every id the lookup gets is its padding index ({stop.padding()})"


def not_reached_message(names: list[str], inputs, limit: int = 6) -> str:
    shown = ", ".join(names[:limit]) + (f" … (+{len(names) - limit} more)" if len(names) > limit else "")
    return (f"{len(names)} trainable parameter tensor(s) got no gradient because the forward did not use them with "
            f"the default inputs torchdiag chose ({inputs.source}): {shown}; not judged")


def in_a_stack(names: list[str], model, reached: set[str]) -> list[str]:
    """Of `names` (parameters whose module the judged pass never ran), those inside an entry of a ModuleList,
    ModuleDict or Sequential another entry of which, of the same class, holds a parameter in `reached`: what
    LayerDrop skips is a layer of a stack whose siblings ran. A branch the default inputs never feed (an image
    tower under text ids) is no such entry, and is not drawn again (a review: three more passes on a copy, for
    nothing)."""
    import torch.nn as nn

    modules = dict(model.named_modules())
    out = []
    for name in names:
        for path in ancestors(owner(name))[:-1]:
            parent, mod = modules.get(owner(path)), modules.get(path)
            if not isinstance(parent, (nn.ModuleList, nn.ModuleDict, nn.Sequential)) or mod is None:
                continue
            prefix = owner(path) + "." if owner(path) else ""
            alike = [f"{prefix}{c}" for c, m in parent.named_children() if type(m) is type(mod) and f"{prefix}{c}" != path]
            if any(any(f"{c}.{n}" in reached for n, _ in modules[c].named_parameters()) for c in alike) or (
                    alike and _holder_ran(modules, owner(path), reached)):
                out.append(name)
                break
    return out


def _holder_ran(modules: dict, stack: str, reached: set[str]) -> bool:
    """No entry of a stack of repeated layers ran, but the module holding it did (a parameter of its own outside
    the stack was reached): LayerDrop skipped every layer (wav2vec2's 2 at 0.1 each, 1 draw in 100: a sweep, "never
    ran with the default inputs"). A tower the inputs never feed has its holder unreached too. Not asked of a stack
    the root holds: there a model that ran says nothing of the stack, and an unused one would cost the draws and
    doctor's fresh samples for nothing (a review)."""
    holder = owner(stack)
    if not stack or not holder:
        return False
    mod = modules.get(holder)
    inside = stack + "."
    return mod is not None and any(n in reached and not n.startswith(inside)
                                   for n, _ in mod.named_parameters(prefix=holder))


RANDOM_DRAWS = 3    # further seeded passes for parameters the judged pass gave no gradient
SKIPPED_AT_RANDOM = ("the forward draws at random which layers run in train mode (LayerDrop-like), and the judged "
                     "pass skipped them; another draw of the RNG gives them a gradient")


def reached_by_other_draws(work, inputs, names: list[str], ctx) -> tuple[set[str], int]:
    """Of `names` (no gradient in the judged pass), those another draw of the RNG reaches: the forward itself
    chose at random to skip them (LayerDrop: `if self.training and torch.rand([]) < layerdrop: skip the layer`),
    which stochastic depth off (modules only) cannot switch off. Up to RANDOM_DRAWS more seeded passes on `work`,
    a copy in train mode: (reached, draws made)."""
    from . import seeds, train
    from .tracking import run_forward

    params = dict(work.named_parameters())
    reached: set[str] = set()
    draws = 0
    for k in range(1, RANDOM_DRAWS + 1):
        draws = k
        work.zero_grad(set_to_none=True)
        with train.seeded(seeds.other_draw(ctx.seed, k)):
            train.backward(ctx.loss()(run_forward(work, inputs, phase="forward (another random draw, on a copy)")))
        reached |= {n for n in names if n in params and params[n].grad is not None}
        if len(reached) == len(names):
            break
    return reached, draws


ROUTED_SAMPLES = 128  # fresh samples an input-routed parameter is asked about (an expert 3% of inputs pick: 98%)
ROUTED_BY_INPUT = ("the forward routes each input to some of its parts (an MoE router picking experts per sample), "
                   "and this batch sent none to them; other inputs of the same kind give them a gradient")


ROUTED_HINT = "a batch large enough for every expert to be picked gives each a gradient"


def routed_message(names: list[str], runs: int, zeros: bool = False) -> str:
    """The routed-by-input finding's message, one for every command that says it (`zeros`: some got a gradient of
    zeros, a dense mixture multiplying an unpicked expert's output by a routing weight of 0)."""
    shown = ", ".join(sorted(names)[:6]) + (" …" if len(names) > 6 else "")
    return (f"{len(names)} parameter tensor(s) ({shown}) got no gradient{' (or one of zeros)' if zeros else ''} only "
            f"because the batch routed no input to them: {ROUTED_BY_INPUT} ({runs} fresh batch(es) on a copy)")


@dataclass
class Fresh:
    """What fresh inputs reached (reached_by_other_inputs)."""
    reached: set[str]          # of the names asked, those a fresh batch gave a finite gradient (not all zeros)
    runs: int                  # fresh batches run
    revived: list[str]         # saturated parameters (dead units' weights) a fresh batch gave a gradient too
    refused: int = 0           # fresh batches the forward refused (reaching nothing)

    def said(self) -> str:
        """Why nothing counts as routed when a saturation came back, and how many batches the forward refused, for a
        note ("" when neither)."""
        out = [f"the forward refused {self.refused} of the {self.runs} fresh batches"] if self.refused else []
        if self.revived:
            out.append(f"the fresh inputs that reached them also gave a gradient to {', '.join(sorted(self.revived)[:4])}"
                       ", zero on the batch by a saturation (dead units): a gate closed on the batch, not a router's "
                       "choice, so the verdicts stand")
        return "; ".join(out)


def reached_by_other_inputs(work, inputs, names: list[str], ctx, ran: set[str], nonzero: bool = False,
                            saturated: list[str] | tuple = ()) -> Fresh:
    """Of `names` (no gradient, and no other draw of the RNG reaching them), those that fresh inputs of the batch's
    kind reach with a finite gradient (core/fresh.resampled_batches: new combinations of the batch's own values), up
    to ROUTED_SAMPLES samples, one seeded pass per fresh batch on `work`, a copy in train mode, stopping once all are
    reached: a forward that routes by its input (a top-k router) leaves an expert without a gradient when a small
    batch picks none of it. Only an entry of a stack (ModuleList, ModuleDict, Sequential) another entry of which, of
    the same class, holds a parameter in `ran` (a gradient in the judged pass) is asked: what a router chooses among
    is its siblings; a module no input runs is not asked 128 samples for nothing. `nonzero`: reached means a gradient
    not all zeros, for `names` whose gradient was all zeros (a dense mixture: every expert runs, an unpicked one's
    output times a routing weight of 0). `saturated`: parameters whose zero gradient is a saturation (a dead ReLU
    gate); when a fresh batch gives one of them a gradient, what it reached was closed by that gate, not routed
    (a review: a ReLU gate shut on the batch was zero-grad while the branch it scales was routed-by-input), and
    nothing is reached. One read-back per fresh batch."""
    from ..errors import ModelError
    from .fresh import resampled_batches

    names = in_a_stack(names, work, ran)
    if not names:
        return Fresh(set(), 0, [])
    vocab = one_table(work, inputs)
    try:
        return _ask(work, resampled_batches(inputs, ctx.seed, ROUTED_SAMPLES, vocab), names, ctx, nonzero, saturated)
    except ModelError:
        if not vocab:
            raise
    # a forward that refuses some token of its table (an image placeholder id with no image): the batch's own ids
    return _ask(work, resampled_batches(inputs, ctx.seed, ROUTED_SAMPLES), names, ctx, nonzero, saturated)


OPEN_BATCHES = 8   # fresh batches a zero gradient of the batch alone is asked about (open_elsewhere)
OPEN_SAMPLES = 0.25   # the share of samples that opens it where it counts: a unit shut for 3 inputs in 4 is not dead
OPEN_BATCH = 8        # the largest batch asked: past it a batch opens a unit almost whatever its share


def open_often(opened: int, runs: int, batch: int) -> bool:
    """Do `opened` of `runs` fresh batches of `batch` samples open it as often as OPEN_SAMPLES of samples opening it
    would (1 - 0.75^n of the batches)? A batch opens it when any one sample does, so batches tell the share only while
    they are small (a review: at batch 64 a unit open for 5% of samples opens 96% of batches): none past OPEN_BATCH,
    where a batch shut for all its samples is itself a sign the unit is rarely open."""
    return runs > 0 and 0 < batch <= OPEN_BATCH and opened >= runs * (1.0 - (1.0 - OPEN_SAMPLES) ** batch)


def open_elsewhere(work, inputs, names: list[str], ctx) -> tuple[dict[str, int], int]:
    """For each of `names` (a gradient all zeros on the batch), how many of OPEN_BATCHES fresh batches of the inputs'
    kind (core/fresh.resampled_batches) give it a finite gradient not all zeros on `work`, and how many batches ran
    (0: the batch cannot be resampled, one sample or all alike; or it is not torchdiag's own: mixing the entries of a
    user's batch makes inputs their data never has, a review's one-hot DNA mixed into counts that opened a layer shut
    for every real sequence). One seeded pass and one read-back per batch."""
    if not inputs.made_up:
        return dict.fromkeys(names, 0), 0
    from ..errors import ModelError
    from .fresh import resampled_batches

    batches = resampled_batches(inputs, ctx.seed, OPEN_BATCHES * (inputs.batch_size or 1), one_table(work, inputs))
    counts = dict.fromkeys(names, 0)
    runs = refused = 0
    for batch in batches[:OPEN_BATCHES]:
        try:
            got = _ask(work, [batch], names, ctx, True, ())
        except ModelError:   # a batch the forward refuses reaches nothing; the first ones all refused: raised
            refused += 1
            if refused == REFUSED_FIRST and not runs:
                raise
            continue
        runs += 1
        for n in got.reached:
            counts[n] += 1
    return counts, runs


def closed_on_batch(work, inputs, names: list[str], ctx, steps: int) -> tuple[list[str], dict[str, int], int]:
    """Of `names` (a gradient all zeros on the batch, still after the short run), those the batch alone shut: `work`, a
    training copy of the model as it started, takes the short run's `steps` steps on the batch (its zero-initialised
    gates open), then fresh batches ask (open_elsewhere, open_often). (those, in `names`' order; the counts; the fresh
    batches run). gradflow's and doctor's closed-on-batch."""
    from .gates import train_steps

    train_steps(work, inputs, ctx, steps)
    # the premise, on the trained copy: the batch itself still gives zeros (SAM's vision rel_pos, behind weights
    # drawn at 1e-10, underflow to 0 on every batch at first and give ~1e-31 on this batch and fresh ones alike after
    # the run: no unit shut for this batch, and doctor called it one)
    names = [n for n in names if n not in _ask(work, [inputs], names, ctx, True, ()).reached]
    if not names:
        return [], {}, 0
    counts, runs = open_elsewhere(work, inputs, names, ctx)
    return [n for n in names if open_often(counts[n], runs, inputs.batch_size or 1)], counts, runs


REFUSED_FIRST = 3   # fresh batches the forward refuses, all of the first ones, before the re-check gives up


def _ask(work, batches: list, names: list[str], ctx, nonzero: bool, saturated) -> Fresh:
    """reached_by_other_inputs on these fresh batches, one seeded pass each, stopping once all are reached. A batch the
    forward refuses reaches nothing and the next is tried (a token the model reserves drawn among the table's rows);
    when the first REFUSED_FIRST are all refused, the forward refuses fresh batches as such (rows mixed across samples
    of a series) and its error is raised."""
    from ..errors import ModelError
    from . import train
    from .tracking import run_forward

    params = dict(work.named_parameters())
    watch = [n for n in saturated if n in params]
    reached: set[str] = set()
    runs = refused = 0
    for batch in batches:
        runs += 1
        work.zero_grad(set_to_none=True)
        try:
            with ctx.seeded():
                train.backward(ctx.loss()(run_forward(work, batch, phase="forward (fresh inputs, on a copy)")))
        except ModelError:
            refused += 1
            if refused == runs >= REFUSED_FIRST or refused == len(batches):
                raise
            continue
        got = _got(params, [n for n in names if n not in reached] + watch, True if watch else nonzero)
        if got & set(watch):
            return Fresh(set(), runs, sorted(got & set(watch)), refused)
        reached |= got
        if len(reached) == len(names):
            break
    return Fresh(reached, runs, [], refused)


def one_table(model, inputs) -> dict[str, int]:
    """name -> the rows its ids can reach, for the integer inputs of two or more dimensions that the forward looks up
    whole in one table, an nn.Embedding or a one-hot matmul (token ids: one vocabulary at every position), found by
    one traceless forward that stops at the lookups (core/inputs.embedding_consumers); a column looked up alone (a
    tabular category, whose table may be smaller than another column's ids) is not."""
    if getattr(inputs, "chosen", False) or inputs.samples is not None:   # made up, or a list of samples: not drawn
        return {}
    from .inputs import embedding_consumers

    n = inputs.batch_size
    wanted = [k for k, t in inputs.tensors() if _ids(t) and t.dim() >= 2 and t.shape[0] == n and t.numel()]
    found = embedding_consumers(model, inputs, wanted, whole=True) if wanted and n and n > 1 else {}
    return {k: rows for k, (_, rows) in found.items()}


def _ids(t) -> bool:
    """An integer tensor (not bool, not nested) that could index a table."""
    import torch

    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.is_nested)


def _got(params: dict, names: list[str], nonzero: bool) -> set[str]:
    """Of `names`, those with a finite gradient (`nonzero`: one not all zeros), read back once: a NaN batch's NaN
    gradient reaches nothing."""
    got = [n for n in names if n in params and params[n].grad is not None]
    if not got:
        return set()
    from .readback import read_back

    def ok(g):
        g = g.detach()
        return g.isfinite().all() & g.ne(0).any() if nonzero else g.isfinite().all()

    return {n for n, yes in zip(got, read_back([ok(params[n].grad) for n in got])) if yes}


def never_ran(model, inputs, names: list[str], ctx, rng=None) -> list[str]:
    """Of `names` (no gradient), those whose module the forward never ran or ran without them ("unused"), not cut
    off after running ("detached"): one recorded pass on the model, left as it was, from `rng` (the judged forward's
    global RNG state: its own draws, so a random cut is seen where it cut; a test run alone drew no cut there and
    called the detached encoder unused). What another random draw may reach (LayerDrop); a random `.detach()` is a
    cut, and stays one."""
    if not names:
        return []
    import contextlib

    from .recording import record_pass, rng_state

    with rng_state(rng) if rng is not None else contextlib.nullcontext():
        pas = record_pass(model, inputs, None, ctx)
    modules = dict(model.named_modules())
    return [n for n in names if unused(n, pas.rec, pas.reach, modules)]
