"""What a loss did, read from its autograd graph before its backward runs: the nodes nearest the loss say which
ops made it, whether it came from `nn.CrossEntropyLoss`, `F.cross_entropy` or a hand-written log_softmax and nll.
Shapes and op kinds only: no value is read, so no device sync. Nothing is patched (a patched torch.nn.functional broke
TorchScript and pickling in a review)."""
from __future__ import annotations

import math
from typing import Any

NEAR = 64   # nodes looked at, nearest the loss first: a loss's own ops are within a few of it
ELEMENTWISE = {"MseLossBackward0": "mse_loss", "SmoothL1LossBackward0": "smooth_l1_loss",
               "HuberLossBackward0": "huber_loss"}


def loss_faults(fn) -> list[tuple]:
    """[("probs", loss, classes, logits[, smoothing]) | ("broadcast", loss, input shape, target shape, both) |
    ("dim", loss, size normalised over, classes, batch) | ("sigmoid", loss) | ("classes", C) | ("dropout", loss,
    share zeroed or NaN, its mask's mean exactly 1) | ("nll", input, target, ignore_index) | ("minimised", loss) |
    ("target", target, ignore_index) | ("ctc", targets, target lengths, blank)]
    found near `fn`:
    - the loss is one of torch's losses (a quantity to minimise) times a constant, plus a constant: its name and the
      constant's sign (-1: `-F.cross_entropy(...)`), for a run that climbs it;
    - the loss is a cross-entropy itself, its mean (nll_loss at the root): its class count, for a plateau's chance
      level;
    - log_softmax (cross_entropy's first op) or nll_loss applied straight to a softmax's output;
    - nll_loss given a log_softmax over a dimension of another size than its classes' (log_softmax(logits, dim=0)
      on (N, C): each sample's log-probabilities normalised over the batch; a sweep's run fell to 3.23, above
      chance, and passed);
    - ctc_loss's targets, their lengths and its blank index (a blank among the labels: engine._look_at_ctc);
    - nll_loss's targets (cross_entropy's too), for the engine to hold against the ids the model looked up (labels
      not shifted: engine._look_at_labels, with looked_up);
    - nll_loss given values no log_softmax made: its input, for the engine to judge (raw logits through F.nll_loss
      or a loss module called with keywords, which no forward hook sees);
    - binary_cross_entropy_with_logits given a sigmoid's output (a sigmoid ending the model: the loss applies its
      own, so its floor is far above 0; a sweep: 0.54 against 0.11, passed);
    - an elementwise loss whose input was grown by broadcasting against a target grown too ((N, 1) against (N,));
    - a loss whose input a dropout made (_dropped): it judges values zeroed at random (a sweep: Dropout(0.5) after
      the head, the logits half zeros in training, cross-entropy 0.742 against 0.503 in eval: nothing said)."""
    found: list[tuple] = []
    seen: set[int] = set()
    parents: dict[int, object] = {}
    queue = [fn]
    while queue and len(seen) < NEAR:
        node = queue.pop(0)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        kind = type(node).__name__
        first = node.next_functions[0][0] if node.next_functions else None
        source = _through_shapes(first)
        # a mean over the samples (reduction 1): a sum's level grows with the batch (a review: 222 read as chance)
        if node is fn and kind.startswith("NllLoss") and getattr(node, "_saved_reduction", 0) == 1 \
                and _class_size(node) > 1:
            found.append(("classes", _class_size(node)))
        if node is fn:   # the loss is one of torch's own, at most scaled, shifted or negated
            inner, sign = _signed_loss(fn)
            if type(inner).__name__ in LOSS_INPUTS and type(inner).__name__ != "LogSoftmaxBackward0":
                found.append(("minimised", LOSS_INPUTS[type(inner).__name__], sign))
        if kind == "LogSoftmaxBackward0" and _softmax(source):
            found.append(("probs", "cross_entropy", _classes(source), True, _smoothing(node, parents, _classes(source))))
        elif kind.startswith("NllLoss") and _softmax(source):
            found.append(("probs", "nll_loss", _classes(source), False))
        elif kind.startswith("NllLoss") and type(source).__name__ == "LogSoftmaxBackward0":
            over, classes = _classes(source), _class_size(node)
            if over and classes and over != classes:   # cross_entropy's own log_softmax is over its classes
                found.append(("dim", "nll_loss", over, classes, int(node._saved_self.shape[0])))
        elif kind.startswith("NllLoss"):   # its input made otherwise: values the engine looks at (raw logits?)
            found.append(("nll", node._saved_self, node._saved_target, _signed(int(node._saved_ignore_index))))
        elif kind == "BinaryCrossEntropyWithLogitsBackward0" and type(source).__name__ == "SigmoidBackward0":
            found.append(("sigmoid", "binary_cross_entropy_with_logits"))
        elif kind in ELEMENTWISE and type(first).__name__ == "ExpandBackward0":
            grown = _broadcast(node, first)
            if grown is not None:
                found.append(("broadcast", ELEMENTWISE[kind], *grown))
        if kind == "CtcLossBackward0" and getattr(node, "_saved_targets", None) is not None:   # a blank among labels?
            found.append(("ctc", node._saved_targets, tuple(node._saved_target_lengths), int(node._saved_blank)))
        if kind.startswith("NllLoss") and getattr(node, "_saved_target", None) is not None:   # labels that are the
            found.append(("target", node._saved_target, _signed(int(node._saved_ignore_index))))   # model's inputs?
        if kind in LOSS_INPUTS and (node is fn or kind != "LogSoftmaxBackward0"
                                    or type(_up_through_shapes(node, parents)).__name__.startswith("NllLoss")):
            dropped = _dropped(source, judge_masks=kind not in ELEMENTWISE)
            if (dropped is None or dropped[1]) and type(source).__name__ == "MulBackward0":
                # a label mask (per row, or made to average 1): what it masks, too (a review: a dropout under one)
                below = next((f for f, _ in source.next_functions if f is not None), None)   # (mask on either side)
                under = _dropped(_through_shapes(below), judge_masks=kind not in ELEMENTWISE) if below is not None \
                    else None
                dropped = under if under is not None else dropped
            if dropped is not None:
                found.append(("dropout", LOSS_INPUTS[kind], *dropped))
        for f, _ in node.next_functions:
            parents.setdefault(id(f), node)
            queue.append(f)
    return found


SHIFTS = {"AddBackward0": 1, "SubBackward0": -1}   # a + alpha*b, a - alpha*b: b's sign (alpha is saved)


WHOLE = 20_000   # nodes walked at most for the ids embeddings looked up (a small transformer's graph: a few thousand)


def looked_up(fn) -> list:
    """The index tensors the embeddings on the graph under `fn` looked up (EmbeddingBackward's saved indices, the
    ids the model read; F.embedding and nn.Embedding alike): the labels-are-inputs look (engine._look_at_labels). A
    frozen embedding leaves no node, and is not seen."""
    found: list = []
    seen: set[int] = set()
    queue = [fn]
    while queue and len(seen) < WHOLE:
        node = queue.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if type(node).__name__ == "EmbeddingBackward0":
            ids = getattr(node, "_saved_indices", None)
            if ids is not None:
                found.append(ids)
        queue.extend(f for f, _ in node.next_functions)
    return found


def _signed_loss(fn, depth: int = 8) -> tuple[object, int]:
    """(the node under `fn` past ops with one operand that carries a gradient: a negation, a constant's product or
    quotient, a constant added or subtracted; the sign those ops give it): `3 - ce` is ce's with -1, `ce / 4` +1."""
    sign, node = 1, fn
    for _ in range(depth):
        kind = type(node).__name__
        nexts = [f for f, _ in getattr(node, "next_functions", ())]
        live = [i for i, f in enumerate(nexts) if f is not None]
        if kind == "NegBackward0" or kind == "RsubBackward1":
            sign, node = -sign, nexts[0]
        elif kind in ("AddBackward1", "SubBackward1") and live == [0]:
            node = nexts[0]
        elif kind in SHIFTS and len(live) == 1:
            alpha = float(getattr(node, "_saved_alpha", 1))
            sign *= 1 if live == [0] else SHIFTS[kind] * (1 if alpha >= 0 else -1)
            node = nexts[live[0]]
        elif kind in ("MulBackward0", "DivBackward0") and len(live) == 1 and (kind == "MulBackward0" or live == [0]):
            const: Any = getattr(node, "_saved_other" if live == [0] else "_saved_self", None)
            # a Python number, written in the code: autograd keeps it as a CPU scalar of float64 or int64 (reading it
            # is no device sync). A tensor is not followed: its sign may be the data's (REINFORCE's advantage)
            one = isinstance(const, (int, float)) or (
                hasattr(const, "numel") and const.numel() == 1 and const.dim() == 0 and const.device.type == "cpu"
                and str(const.dtype) in ("torch.float64", "torch.int64"))
            value = float(const) if one else None
            if not value:
                break
            sign, node = sign * (1 if value > 0 else -1), nexts[live[0]]
        else:
            break
    return node, sign


def _smoothing(log_softmax, parents: dict, classes: int) -> float | None:
    """cross_entropy's label smoothing ε, read from the graph it builds (mean reduction): (1 − ε) × nll_loss + ε/C ×
    the sum over classes, two constant products added. 0.0 where nll_loss is not so weighted; None when unsure; NaN
    under class weights."""
    nll = parents.get(id(log_softmax))
    if not type(nll).__name__.startswith("NllLoss"):
        return None
    if getattr(nll, "_saved_weight", None) is not None:
        return math.nan   # class weights: the floor depends on them (report._probabilities names no number)
    mul = parents.get(id(nll))
    add = parents.get(id(mul))
    if add is None or type(mul).__name__ != "MulBackward1" or type(add).__name__ != "AddBackward0":
        return 0.0
    other = [f for f, _ in add.next_functions if f is not mul]
    keep, share = getattr(mul, "_saved_other", None), getattr(other[0], "_saved_other", None) if other else None
    if not (isinstance(keep, float) and isinstance(share, float) and classes and 0 <= keep < 1
            and math.isclose(share, (1 - keep) / classes, rel_tol=1e-6)):
        return 0.0   # a weighted sum of losses of the user's own (0.5 × cross_entropy + …)
    return 1 - keep


LOSS_INPUTS = {"LogSoftmaxBackward0": "cross_entropy", "NllLossBackward0": "nll_loss", "NllLoss2DBackward0": "nll_loss",
               "BinaryCrossEntropyWithLogitsBackward0": "binary_cross_entropy_with_logits",
               "BinaryCrossEntropyBackward0": "binary_cross_entropy", **ELEMENTWISE}


def _up_through_shapes(node, parents: dict):
    """The node that reads `node`'s values, past reshapes, views and casts (cross_entropy on (N, C, T) puts a view
    between its log_softmax and nll_loss: a review's token tagger was not looked at)."""
    up = parents.get(id(node))
    for _ in range(8):
        if type(up).__name__ not in SHAPES:
            return up
        up = parents.get(id(up))
    return up


def _dropped(node, judge_masks: bool = True) -> tuple[float, bool] | None:
    """(the share a dropout zeroed, whether its mask averages exactly 1), where `node` made its values by one: torch's
    fused kernel (an accelerator's), or, on the CPU, a product with a mask of 0 and one value c > 1 (1 / (1 - p), the
    inverted scale: a 0/1 padding mask has no scale) that no gradient flows to, of the product's own shape: a dropout
    draws each value; a label mask is per sample or per token, broadcast over the values (a review: per-row masks of
    many forms, `valid / 0.9`, square-root weights, hard examples kept, read as dropouts). Not of one value per
    sample (a one-output head: a dropout's mask and a label mask are alike there, so a dropout on it is not seen; doctor
    sees it). A mask made to average 1 (`valid / valid.mean()`) looks the same at one look; a dropout's keeps a
    binomial count, so its mean is exactly 1 at a few looks at most (report: said unless every look's was). The mask is
    read on the CPU only (no wait there); None otherwise. Not seen: a channel dropout (Dropout2d's mask is broadcast
    over positions). `judge_masks` False (a regression loss: mse, smooth_l1, huber): only the fused kernel; a label mask
    there is as often elementwise and scaled (`valid / 0.9` both sides: a fifth review), a product no value tells from
    a dropout's (doctor sees a dropout there, from its train and eval outputs)."""
    kind = type(node).__name__
    if kind in ("NativeDropoutBackward0", "FusedDropoutBackward0"):
        p, scale = getattr(node, "_saved_p", None), getattr(node, "_saved_scale", None)
        share = p if isinstance(p, float) and 0 < p < 1 else \
            1 - 1 / scale if isinstance(scale, float) and scale > 1 else math.nan
        return share, False
    if kind != "MulBackward0" or not judge_masks:
        return None
    import torch

    saved = [getattr(node, "_saved_self", None), getattr(node, "_saved_other", None)]
    masks = [t for t in saved if isinstance(t, torch.Tensor)]
    if len(masks) != 1:   # one side saved: the mask the other side's gradient needs (x * mask or mask * x)
        return None
    mask = masks[0]
    size = _product_size(node)
    if mask.requires_grad or mask.device.type != "cpu" or not mask.is_floating_point() or mask.numel() < 2 \
            or size is None or mask.numel() != math.prod(size) or math.prod(size) == size[0]:
        return None   # (one value per sample: a dropout's mask and a per-sample label mask are the same shape)
    values = torch.unique(mask)
    if values.numel() != 2 or float(values[0]) != 0.0 or not float(values[1]) > 1.0:
        return None
    return float((mask == 0).float().mean()), abs(float(mask.double().mean()) - 1.0) < 1e-6


def _product_size(node) -> tuple | None:
    """The shape of the product a MulBackward0 made (not saved by it; its gradient's metadata is), or None."""
    try:
        size = tuple(int(d) for d in node._input_metadata[0].shape)
    except Exception:   # noqa: BLE001 - no metadata to read: not judged
        return None
    return size or None


SHAPES = {"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "TransposeBackward0", "TransposeBackward1",
          "PermuteBackward0", "ToCopyBackward0", "CloneBackward0", "SqueezeBackward0", "SqueezeBackward1",
          "UnsqueezeBackward0", "SliceBackward0", "SelectBackward0"}   # values moved or cast, not computed


def _through_shapes(node):
    """The node that computed the values `node` only reshapes, transposes or casts (a language model's
    softmax(-1).view(-1, V) into cross_entropy: a review)."""
    for _ in range(8):
        if type(node).__name__ not in SHAPES or not node.next_functions:
            return node
        node = node.next_functions[0][0]
    return node


def _softmax(node) -> bool:
    return type(node).__name__ == "SoftmaxBackward0"


def _signed(n: int) -> int:
    """A saved integer autograd keeps unsigned (softmax(-1)'s dim, nll_loss's ignore_index -100) as it was given."""
    return n - 2 ** 64 if n >= 2 ** 63 else n


def _classes(node) -> int:
    """The softmax's own dimension's size: its saved dim is unsigned (softmax(-1) saves 2**64 - 1: a review's
    IndexError stopped watch)."""
    shape, dim = node._saved_result.shape, _signed(int(node._saved_dim))
    return int(shape[dim]) if shape and -len(shape) <= dim < len(shape) else 0


def _class_size(nll) -> int:
    """nll_loss's number of classes: its input's dimension 1 ((N, C), (N, C, d1, ...)), or 0 of an unbatched (C,)."""
    shape = nll._saved_self.shape
    return int(shape[1] if len(shape) >= 2 else shape[0]) if len(shape) else 0


def _broadcast(node, expand):
    """(input, target, broadcast) shapes of an elementwise loss whose input was expanded, when both sides grew: a
    per-feature or scalar target grows alone and is no finding. The target's own shape: its expanded view's
    dimensions of stride 0 were added or grown by the broadcast."""
    both = tuple(node._saved_self.shape)
    x = tuple(expand._saved_self_sym_sizes)
    target = node._saved_target
    y = tuple(s if st else 1 for s, st in zip(target.shape, target.stride()))
    while len(y) > 1 and y[0] == 1 and target.stride()[0] == 0:   # dimensions the broadcast put in front
        y, target = y[1:], target[0]
    # both sides alike were grown by the caller (x.expand, y.expand): the loss broadcast nothing (a review)
    if x == y or math.prod(both) <= max(math.prod(x), math.prod(y)):
        return None
    # the first dimension kept on both sides pairs each sample with its own target: the growth is within a sample
    # (a Chamfer loss's points against points, expanded by the caller; a review), not across the batch
    ax, ay = (1,) * (len(both) - len(x)) + x, (1,) * (len(both) - len(y)) + y
    if len(both) > 1 and ax[0] == ay[0] == both[0] > 1:
        return None
    return x, y, both


REACH_LIMIT = 20_000   # autograd nodes walked before giving up (and answering yes: the warning stands)


def fed_by(tensors, wanted: set[int], clean: dict | None = None) -> bool:
    """Whether a gradient flowing back from `tensors` reaches a parameter whose id() is in `wanted` (an AccumulateGrad
    node of one on their graph). A walk of the graph the forward built so far: no value is read. `clean`: the ids of
    nodes known not to reach one (a walk that found none adds what it saw), so the modules of one forward walk each
    node once between them; it holds the nodes themselves (a freed node's id is reused by the next graph's). A graph
    larger than REACH_LIMIT answers True, so a finding that needs False is kept."""
    clean = {} if clean is None else clean
    if any(t.requires_grad and t.grad_fn is None and id(t) in wanted for t in tensors):
        return True   # a trained parameter itself
    queue = [t.grad_fn for t in tensors if getattr(t, "grad_fn", None) is not None]
    seen: dict = {}
    while queue:
        node = queue.pop()
        if node is None or id(node) in seen or id(node) in clean:
            continue
        seen[id(node)] = node
        if len(seen) > REACH_LIMIT:
            return True
        var = getattr(node, "variable", None)
        if var is not None and id(var) in wanted:
            return True
        queue.extend(f for f, _ in node.next_functions)
    clean.update(seen)
    return False
