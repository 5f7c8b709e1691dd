"""Targets and loss for commands that run backward (DESIGN.md "Targets and loss").

auto: the model's own `loss` (dict key) or a scalar output is used as is (the first floating tensor; when the
top level holds none, the first of a tuple or list it holds, a backbone's feature maps); an (N, C) float output
gets cross-entropy against random class targets; logits shaped (N, T, V) for integer ids of shape
(N, T) that feed an embedding of V rows are a language model's: next-token cross-entropy, the ids
shifted by one as targets (`language_model`); anything else mean-squared error against a random
target of the same shape. With --batch the function's target is used. The choice is
always described, for the header and JSON.

Several outputs (auxiliary heads, tuples, dicts, HF ModelOutput without `loss`): `auto` covers every
floating-point output that carries a gradient path, not only the first, so a parameter that feeds
only an auxiliary output (Inception's AuxLogits, BERT's pooler) gets a gradient. The rule above
applies to the first output; each other output is added: a scalar as it is (a model's auxiliary
loss), an output shaped like the first with the first's rule and target (an auxiliary classifier),
anything else mean-squared error against its own random target. A named rule (cross_entropy, mse,
sum) applies to the first output only, and `describe()` names the outputs it left out. An output
whose every weight the first output's graph already reaches (an encoder-decoder's encoder states, a
key/value cache) gets no term of its own: it would train nothing new, and a random target there fights
the first output's (`_reached_through`, decided on the first call, said by `describe()`).

Of several integer inputs that could be a language model's ids (an encoder-decoder's input and decoder
ids), the logits are next-token predictions of the ones they are causal in: one probe forward per
candidate (`_causal_in`)."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

from ..errors import ModelError, UsageError, device_error, one_line
from . import seeds
from .device import widened
from .tracking import dataclass_fields

LOSS_CHOICES = "auto|cross_entropy|mse|sum|PATH:fn"
LEFT_OUT = -100     # cross_entropy's ignore_index: a next-token position the loss leaves out


def probabilities_floor(classes: int, smoothing: float = 0.0) -> float:
    """The least cross-entropy a softmax's output can reach when given to it as logits (a softmax before
    CrossEntropyLoss): log(1 + (C − 1)/e) without label smoothing. With smoothing ε the target is (1 − ε) on the class
    and ε/C on each: the loss is convex over the simplex and symmetric in the other classes, so its least value lies on
    the line from the uniform row to the one-hot one (a helper's 5-class ε = 0.1 run sat at 0.985, not 0.905)."""
    c, eps = max(int(classes), 2), min(max(float(smoothing), 0.0), 1.0)

    def loss(t: float) -> float:   # the row t on the class, (1 − t)/(C − 1) on each other
        rest = (1 - t) / (c - 1)
        lse = math.log(math.exp(t) + (c - 1) * math.exp(rest))
        return lse - ((1 - eps + eps / c) * t + eps * (c - 1) / c * rest)

    lo, hi = 1.0 / c, 1.0
    for _ in range(100):   # golden-section search on a convex function of one variable
        a, b = hi - 0.618 * (hi - lo), lo + 0.618 * (hi - lo)
        lo, hi = (lo, b) if loss(a) <= loss(b) else (a, hi)
    return min(loss(1.0), loss((lo + hi) / 2))


def primary_output(out) -> tuple[Any, str]:
    """The tensor a loss applies to, and how it was picked."""
    import torch

    if isinstance(out, torch.Tensor):
        return out, "output"
    if isinstance(out, dict) or hasattr(out, "keys"):
        if "loss" in out and isinstance(out["loss"], torch.Tensor):
            return out["loss"], "output['loss']"
        for k, v in out.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                return v, f"output['{k}']"
    if isinstance(out, (tuple, list)):
        for i, v in enumerate(out):
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                return v, f"output[{i}]"
    fields = dataclass_fields(out)   # a plain @dataclass: its fields, as a dict's (a sweep: exit 2)
    if fields is not None:
        return primary_output(dict(fields))
    nested = _one_level_down(out)
    if nested is not None:
        return nested
    raise UsageError(f"cannot pick a tensor to compute a loss from a {type(out).__name__} output",
                     hint="pass --loss PATH:fn with fn(output, target) -> scalar tensor")


def _one_level_down(out) -> tuple[Any, str] | None:
    """For an output whose top level holds no floating tensor: the first tensor of a tuple or list the top level
    holds (a backbone's `feature_maps`, MGP-STR's per-head `logits`), or of a model output it holds (InstructBLIP's
    `vision_outputs`, `qformer_outputs`, `language_model_outputs`: the parts a loss term is added for, core.loss's
    others), floating, not a scalar, carrying a gradient where one is recorded; never deeper (a cache's keys, a
    dict of debug values), else None."""
    import torch

    grad = torch.is_grad_enabled()
    items = out.items() if hasattr(out, "items") else enumerate(out) if isinstance(out, (tuple, list)) else ()
    for k, v in items:
        inner = v.items() if hasattr(v, "to_tuple") and hasattr(v, "items") else \
            enumerate(v) if isinstance(v, (tuple, list)) else ()
        for i, t in inner:
            if (isinstance(t, torch.Tensor) and t.is_floating_point() and not t.is_nested and t.dim() > 0
                    and (t.requires_grad or not grad)):
                where = f"['{i}']" if isinstance(i, str) else f"[{i}]"
                return t, (f"output['{k}']{where}" if isinstance(k, str) else f"output[{k}]{where}")
    return None


def float_outputs(out, label: str = "output", found: list | None = None, seen: set | None = None, *,
                  complex_too: bool = False) -> list:
    """(label, tensor) of every floating-point, non-nested tensor in a model output, in order
    (tuples, lists, dicts, namedtuples and HF ModelOutput, nested ones included; each tensor once); complex ones too
    with `complex_too`."""
    import torch

    found = [] if found is None else found
    seen = set() if seen is None else seen
    if isinstance(out, torch.Tensor):
        if (out.is_floating_point() or (complex_too and out.is_complex())) and not out.is_nested and id(out) not in seen:
            seen.add(id(out))
            found.append((label, out))
    elif isinstance(out, dict) or (hasattr(out, "keys") and hasattr(out, "items")):
        for k, v in out.items():
            float_outputs(v, f"{label}['{k}']", found, seen, complex_too=complex_too)
    elif isinstance(out, (tuple, list)):
        names = getattr(out, "_fields", None)
        for i, v in enumerate(out):
            float_outputs(v, f"{label}[{i}]" + (f" ({names[i]})" if names else ""), found, seen, complex_too=complex_too)
    elif dataclass_fields(out) is not None:
        for k, v in dataclass_fields(out) or []:
            float_outputs(v, f"{label}['{k}']", found, seen, complex_too=complex_too)
    return found


def gradient_outputs(out, primary) -> list:
    """The floating-point outputs other than `primary` that carry a gradient path (under no_grad,
    where that cannot be told, every floating-point output)."""
    import torch

    grad = torch.is_grad_enabled()
    return [(k, t) for k, t in float_outputs(out) if t is not primary and (t.requires_grad or not grad)]


@dataclass
class Loss:
    kind: str                     # requested: auto, cross_entropy, mse, sum, custom
    seed: int = 0
    target: Any = None            # fixed once made, so every step sees the same batch
    rows: Any = None              # under torchrun: (start, stop, n), this rank's rows of the whole batch
    custom: Any = None
    class_target: bool | None = None   # a custom loss's integer target names classes of the output (asked once)
    chosen: str = ""              # what auto resolved to, filled on first call
    picked: str = ""              # which output it applies to
    loss_values: int = 0          # the model's own loss came as this many values (not one): their mean
    made_target: bool = False     # the target was made up by torchdiag (not from --batch)
    column: bool = False          # a given (N,) target read as the (N, 1) output's column (HF's regression labels)
    extra: list = None            # auto: [(label, rule, target)] for the other outputs it covers
    left_out: list = None         # a named rule: labels of outputs with a gradient path it did not cover
    checked_classes: int = 0      # the class count a given integer target was checked against (checked once)
    lm: Any = None                # LanguageModel: the integer ids and the vocabularies they feed (auto only)
    reached_already: Any = None   # auto: labels of other outputs whose every weight the first one reaches
    with_path: Any = None         # auto: labels of the other outputs with a gradient path, from a call with grad on
    terms: Any = None             # auto with other outputs covered: [(label, term detached)] of the last call
    fills: Any = None             # () -> core.fills.Fills of the run's forward (Context.fills), or None
    loss_of: Any = None           # auto: the output the model's own loss beside it is a loss of ("" none; _own_loss)
    below_zero: Any = None        # auto: labels of scalar outputs below 0 at the first call, left out (_below_zero)
    both_layouts: bool = False    # a given class target that fits dimension 1 and the last alike (classes_last)
    own_label: str = ""           # ... and that loss's label
    fill_masks: Any = None        # label -> the fill positions a made-up term leaves out, or None (decided once)
    fill_notes: Any = None        # label -> what the header says of them ("" when they changed nothing)

    def describe(self) -> str:
        if self.chosen == "model":
            text = f"the model's own loss ({self.picked})" if self.picked == "output['loss']" else \
                f"the scalar output itself ({self.picked})"
            if self.loss_of:
                text = (f"the model's own loss ({self.picked}: a cross-entropy of {self.loss_of} against hard "
                        "targets, as its gradient shows)")
            if self.loss_values:
                text = f"the mean of the model's own loss ({self.picked}, {self.loss_values} values)"
        else:
            target = " against random class targets" if self.chosen == "cross_entropy" and self.made_target else \
                " against a random target" if self.chosen == "mse" and self.made_target else \
                " against the given target" if self.chosen in ("cross_entropy", "mse") and self.target is not None \
                else ""
            text = f"{self.chosen or self.kind} on {self.picked or 'output'}{target}"
            if self.chosen == "mse" and self.made_target:
                text += self._fills_said(self.picked)
            if self.chosen == "mse" and self.column:
                text += f" (its {tuple(self.target.shape)[:-1]} values as the output's one column)"
            if self.chosen == "cross_entropy" and self.made_target:
                text += self._fills_said(self.picked)
            if self.chosen == "cross_entropy" and self.both_layouts:
                text += (" (its shape fits the classes on dimension 1 and on the last alike: dimension 1 taken, "
                         "torch's layout; a --loss PATH:fn of your own for the other)")
            if self.chosen == "token_cross_entropy":
                text = (f"cross_entropy on {self.picked} against the given target, a class per position along the "
                        "logits' last dimension")
            if self.chosen == "next_token":
                text = (f"next-token cross_entropy on {self.picked} against {self.lm.name} shifted by one "
                        f"(a language model: {self.lm.name} feeds an embedding of {self.lm.vocab} rows, the logits' "
                        "last dimension" + ("; on meta by the ids' shape alone: a real device reads their range and "
                                            "asks the model whether it is causal" if self.lm.unread else "")
                        + ")") + self._fills_said(self.picked)
            if self.chosen == "own_token":
                text = (f"cross_entropy on {self.picked} against {self.lm.name} at the same positions (a "
                        f"bidirectional model over {self.lm.name}, which feeds an embedding of {self.lm.vocab} rows, "
                        "the logits' last dimension: a change to its last id moves the logits of earlier positions, "
                        "so they are no next-token predictions; a masked LM's objective with nothing masked, or give "
                        "labels of your own with --batch)") + self._fills_said(self.picked)
        for label, rule, _ in self.extra or ():
            text += f" + {label} itself" if rule == "model" else \
                f" + {self.chosen} on {label} against the same target" + self._moved_said(label) if rule == "same" else \
                f" + mse on {label} against a random target" + self._fills_said(label)
        if self.left_out:
            text += (f"; left out: {', '.join(self.left_out)} (--loss auto covers every output, or give "
                     "--loss PATH:fn)")
        if self.below_zero and self.chosen != "model":
            text += (f"; not added: {', '.join(sorted(self.below_zero))} (a scalar below 0 at the start: no loss to "
                     "minimise as it is; --loss PATH:fn adds it with its sign)")
        if self.reached_already and self.chosen != "model":
            text += (f"; not added: {', '.join(sorted(self.reached_already))} (every weight behind it already "
                     f"reaches {self.picked})")
        return text

    def _fills_said(self, label: str) -> str:
        return (self.fill_notes or {}).get(label, "")

    def _moved_said(self, label: str) -> str:
        """A same-target term's fills note: the targets its own fills moved make it not quite the same (a review)."""
        said = self._fills_said(label)
        return f" (but for {said[2:]}" if said.startswith(" (") and "targets moved off" in said else said

    def _note_fills(self, label: str, y, mask, counted, said: str) -> None:
        """The header's words on output `label`'s fills: `said` with the count of `counted` and the values the model
        writes there (one read, once per output); nothing when the count is 0 (a review: "kept off 32" where every
        class was banned and no target could move)."""
        import torch

        yd = widened(y.detach())   # float32 on mps (no float64 there)
        lo, hi = yd.masked_fill(~mask, math.inf).amin(), yd.masked_fill(~mask, -math.inf).amax()
        n, lo, hi = torch.stack([counted.sum().to(yd.dtype), lo, hi]).tolist()
        values = f"{lo:g}" if lo == hi else f"{lo:g} to {hi:g}"
        note = said.format(n=f"{int(n):,}", values=values) if n else ""
        self.fill_notes = {**(self.fill_notes or {}), label: note}

    def _unfit(self, label: str, y):
        """The positions of output `y` no weight can fit (core/fills.py: its ±inf fills, its finite constants as
        extreme as one), or None: one read (does `y` hold a value that extreme?), the fills' forward only when it
        does, and one more read that they are `y`'s own (a mask drawn at random each forward is not). A ±inf elsewhere
        stays in, and makes the loss non-finite."""
        from .fills import as_extreme_as_a_fill

        if self.fills is None or not _has_values(y):
            return None
        special = as_extreme_as_a_fill(y)
        if not bool(special.any()):
            return None
        mask = self.fills().unfit(label, y)
        if mask is None or bool((mask & ~special).any()):   # its fills elsewhere: not this forward's
            return None
        return mask

    @property
    def covered(self) -> list[str]:
        """The outputs the loss was computed from (filled on call)."""
        return [self.picked] + [label for label, _, _ in self.extra or ()] if self.picked else []

    def __call__(self, out):
        if self.custom is not None:
            self.chosen, self.picked = self.custom_name, "output"
            try:
                value = self.custom(out, self.target)
            except TypeError as exc:   # one that cannot take (output, target) is a usage error, as a factory's is
                _refuse_signature(self.custom, self.custom_name, exc)
                raise ModelError(f"loss function {self.custom_name} raised {one_line(exc)}") from exc
            except Exception as exc:
                raise ModelError(f"loss function {self.custom_name} raised {one_line(exc)}") from exc
            return _scalar(value, self.custom_name)
        y, self.picked = primary_output(out)
        kind = self.kind
        if kind == "auto":
            y = self._own_loss(out, y)
            kind = self._auto(y)
        self.chosen = kind
        value = self._primary(kind, y)
        if self.kind != "auto" or kind == "model" and (self.picked == "output['loss']" or self.loss_of):
            if self.kind != "auto":
                self.left_out = [k for k, _ in gradient_outputs(out, y)] or None
            return value
        return self._cover_rest(out, y, kind, value)

    def _own_loss(self, out, y):
        """auto: `y`, or the model's own loss when an output beside it is one: a cross-entropy of `y` against hard
        targets, told by its gradient on `y` (_hard_target_ce; nanoGPT's `(logits, loss)` given its targets was judged
        on its loss plus a made-up next-token loss, twice what it trains on). Decided on the first call with grad on
        (one backward through the loss alone), kept for every step; a call under no_grad before it decides nothing."""
        import torch

        if self.loss_of is None and torch.is_grad_enabled():
            self.loss_of = ""
            if isinstance(y, torch.Tensor) and y.requires_grad and y.dim() >= 2:
                mine = [(k, t) for k, t in gradient_outputs(out, y) if t.dim() == 0 and t.requires_grad]
                if len(mine) == 1 and _hard_target_ce(mine[0][1], y):
                    self.loss_of, self.own_label = self.picked, mine[0][0]
        found = dict(float_outputs(out)).get(self.own_label) if self.loss_of else None
        if found is None:
            return y
        self.picked = self.own_label
        return found

    def _cover_rest(self, out, y, kind, value):
        """auto: add the other outputs with a gradient path (see the module docstring)."""
        import torch
        import torch.nn.functional as F

        known = {label: (rule, t) for label, rule, t in self.extra or ()}
        extra, terms = [], [(self.picked, value.detach())]
        others = gradient_outputs(out, y)
        if torch.is_grad_enabled():
            self.with_path = {label for label, _ in others}
        elif self.with_path is not None:   # no_grad cannot tell a path: the same loss as the calls with grad
            others = [(label, t) for label, t in others if label in self.with_path]
        if self.reached_already is None:   # decided on the first call, kept for every step
            self.reached_already = _reached_through(y, [(label, t) for label, t in others if t.dim()])
            self.below_zero = _below_zero([(label, t) for label, t in others if t.dim() == 0])
        for k, (label, t) in enumerate(others, start=1):
            if label in self.reached_already or label in (self.below_zero or ()):
                continue
            if t.dim() == 0:
                rule, target = "model", None
                term = t.float()
            elif kind in ("cross_entropy", "mse") and tuple(t.shape) == tuple(y.shape):
                rule, target = "same", known.get(label, (None, None))[1]
                if target is None:   # a made-up class target moved off this output's own fills (an aux head's ban)
                    g = torch.Generator().manual_seed(seeds.output_target(self.seed, k))
                    target = self._off_fills(t, self.target, g, label) if kind == "cross_entropy" and \
                        self.made_target else self.target
                term = (F.cross_entropy(t.float(), target.to(t.device)) if kind == "cross_entropy" else
                        F.mse_loss(self._fitted(label, t.float(), target.to(t.device).float()) if self.made_target
                                   else t.float(), target.to(t.device).float()))
            else:
                rule, target = "mse", known.get(label, (None, None))[1]
                if target is None or tuple(target.shape) != tuple(t.shape):
                    g = torch.Generator().manual_seed(seeds.output_target(self.seed, k))
                    target = self._random(torch.randn, t.shape, g).to(t.device, torch.float32)
                term = F.mse_loss(self._fitted(label, t.float(), target.to(t.device)), target.to(t.device))
            value = value + term
            terms.append((label, term.detach()))
            extra.append((label, rule, target))
        self.extra = extra or None
        self.terms = terms if extra else None   # each term, for a run that judges the first output alone
        return value

    def _primary(self, kind, y):
        import torch
        import torch.nn.functional as F

        if kind == "model":
            if self.picked == "output['loss']" and isinstance(y, torch.Tensor) and y.numel() > 1 and y.is_floating_point():
                self.loss_values = y.numel()   # a loss per sample or per term (DAC): their mean, as reduction does
                return y.float().mean()
            return _scalar(y, self.picked)
        if kind in ("next_token", "own_token"):
            if self.lm.targets is None or self.lm.targets.device != y.device:
                self.lm.targets = self._next_targets(y)
            return F.cross_entropy(y[:, :y.shape[1] - self.lm.shift].float().reshape(-1, y.shape[-1]),
                                   self.lm.targets.reshape(-1), ignore_index=LEFT_OUT)
        if kind == "sum":
            return y.float().sum()
        if kind == "cross_entropy" and self.target is not None and classes_last(y, self.target):
            kind = self.chosen = "token_cross_entropy"
        if kind == "token_cross_entropy":   # (N, T, V) logits, (N, T) ids: the classes on the last dimension
            shape, y = tuple(y.shape), y.movedim(-1, 1)
            if self.checked_classes != y.shape[1] and _check_classes(self.target, y, shape):
                self.checked_classes = y.shape[1]
            return _checked(F.cross_entropy, y.float(), self.target.to(y.device), "cross_entropy")
        if kind == "cross_entropy":
            if y.dim() < 2 or y.shape[1] < 2:
                # a sweep: on a causal LM the model's own scalar loss came first, and "got shape ()" did not say so
                own = (f"the model returned its own loss first ({self.picked}, a scalar), which cross_entropy takes "
                       "as the output; " if self.picked == "output['loss']" else "")
                raise UsageError(f"{own}cross_entropy needs an (N, C) output with C ≥ 2 classes; got shape "
                                 f"{tuple(y.shape)}", hint="--loss auto uses the model's own loss (a language model "
                                 "without one: next-token cross_entropy); or --loss mse or sum, or a --loss PATH:fn "
                                 "of your own")
            if self.target is None:
                g = torch.Generator().manual_seed(self.seed)
                shape = (y.shape[0],) + tuple(y.shape[2:])
                self.target = self._random(lambda s, generator: torch.randint(0, y.shape[1], s, generator=generator),
                                           shape, g).to(y.device)
                self.made_target, self.checked_classes = True, y.shape[1]   # in range as drawn: no check to read
                self.target = self._off_fills(y, self.target, g)
            elif not self.target.is_floating_point() and self.checked_classes != y.shape[1]:
                self.both_layouts = classes_last(y, self.target, either=True)
                if _check_classes(self.target, y):   # once: on CUDA a bad index is a device assert
                    self.checked_classes = y.shape[1]
            return _checked(F.cross_entropy, y.float(), self.target.to(y.device), "cross_entropy")
        if kind == "mse":
            if self.target is None:
                g = torch.Generator().manual_seed(self.seed)
                self.target = self._random(torch.randn, y.shape, g).to(y.device, y.dtype)
                self.made_target = True
            if not self.made_target and tuple(self.target.shape) + (1,) == tuple(y.shape):
                # one value per sample against one output column: torch's mse_loss would broadcast it to N x N
                self.target, self.column = self.target.unsqueeze(-1), True
            if self.target.shape != y.shape:
                raise UsageError(f"mse: target shape {tuple(self.target.shape)} differs from output shape {tuple(y.shape)}",
                                 hint=_float_classes_hint(self.target, y))
            y = self._fitted(self.picked, y.float(), self.target.to(y.device).float()) if self.made_target else y
            return _checked(F.mse_loss, y.float(), self.target.to(y.device).float(), "mse")
        raise UsageError(f"unknown loss '{self.kind}'", hint=f"choose {LOSS_CHOICES}")

    def _fitted(self, label: str, y, target):
        """`y` with the ±inf values the model writes as constants (core/fills.py: Grounding DINO's -inf padding)
        replaced by the made-up target there: no target can be fitted to a constant, and one such value made the
        whole loss inf and every gradient NaN. Only the positions of a forward in which fills made every non-finite
        value are left out; any other ±inf or NaN (an overflow, at any step) stays in and makes the loss
        non-finite, as it should."""
        import torch

        if self.fill_masks is None:
            self.fill_masks = {}
        if label not in self.fill_masks:   # once per output: one read, and the fills' forward only when needed
            self.fill_masks[label] = mask = self._unfit(label, y)
            if mask is not None:
                self._note_fills(label, y, mask, mask, " ({n} values left out: constants the model writes, {values})")
        mask = self.fill_masks[label]
        if mask is None or mask.shape != y.shape or mask.device != y.device:
            return y
        return torch.where(mask, target.to(y.dtype), y)

    def _fill_mask(self, y, label: str | None = None):
        """The positions of output `y` (default: the picked one) no weight can fit (`_unfit`), or None. Kept for the
        header."""
        label = label or self.picked
        mask = self._unfit(label, y)
        if mask is not None:
            self.fill_masks = {**(self.fill_masks or {}), label: mask}
        return mask

    def _next_targets(self, y):
        """The ids shifted by one (by none for a bidirectional model's), with the positions whose target id is a -inf
        logit the model writes as a constant (a vocabulary mask that bans padding or special tokens) left out: the
        model says it never predicts them. Every position banned, or a -inf the model computed: all kept (the loss is
        inf)."""
        shift = self.lm.shift
        targets = self.lm.ids[:, shift:].to(y.device)
        mask = self._fill_mask(y)
        if mask is None:
            return targets
        hit = mask[:, :mask.shape[1] - shift].gather(2, targets.unsqueeze(2)).squeeze(2)
        self.lm.left_out = hit
        if bool(hit.all()):
            return targets
        self._note_fills(self.picked, y, mask, hit, "; {n} positions left out: their " + ("next " if shift else "")
                         + "id is a logit the model writes as a constant ({values})")
        return targets.masked_fill(hit, LEFT_OUT)

    def _off_fills(self, y, target, g, label: str | None = None):
        """A made-up class target moved off the classes whose logit is a -inf the model writes as a constant (a
        registered mask that bans classes, core/fills.py): no target can be fitted there, and one such target made
        the loss inf and every gradient NaN. Only fills move it (one read, at the target's making); a -inf the
        model computed (an overflow) keeps its target and makes the loss non-finite, as it should. A row whose
        every class is a fill keeps its target."""
        import torch

        mask = self._fill_mask(y, label)
        if mask is None:
            return target
        hit = mask.gather(1, target.unsqueeze(1)).squeeze(1) & ~mask.all(1)
        scores = self._random(torch.rand, y.shape, g).to(y.device).masked_fill(mask, -1.0)
        self._note_fills(label or self.picked, y, mask, hit, " ({n} made-up targets moved off logits the model writes as a "
                         "constant, {values})")
        return torch.where(hit, scores.argmax(1), target)

    def _random(self, draw, shape, g):
        """draw(shape, generator=g); under torchrun (self.rows) drawn for the whole batch and cut to this
        rank's rows, so the ranks together train on the targets a single process would."""
        shape = tuple(shape)
        if self.rows is not None and shape and shape[0] == self.rows[1] - self.rows[0]:
            start, stop, n = self.rows
            return draw((n,) + shape[1:], generator=g)[start:stop]
        return draw(shape, generator=g)

    def auto_kind(self, y, picked: str) -> str:
        """What `--loss auto` chooses for the output `y` (labelled `picked`), before any call."""
        saved, self.picked = self.picked, picked
        try:
            return self._auto(y)
        finally:
            self.picked = saved

    def _auto(self, y) -> str:
        if y.dim() == 0 or self.picked == "output['loss']":
            return "model"
        if self.target is not None:
            t = self.target
            # integer targets are class indices unless they have the output's own shape (counts)
            if not t.is_floating_point() and y.dim() >= 2 and tuple(t.shape) != tuple(y.shape):
                return "token_cross_entropy" if classes_last(y, t) else "cross_entropy"
            return "mse"
        if y.dim() == 2 and y.is_floating_point() and y.shape[1] > 1:
            return "cross_entropy"
        if self.lm is not None and self.lm.fits(y):
            return "next_token" if self.lm.shift else "own_token"
        return "mse"


@dataclass
class LanguageModel:
    """Integer ids (N, T) that feed an nn.Embedding of `vocab` rows: logits (N, T, vocab) are next-token
    predictions of them (a causal language model's output), judged by shapes and by what the ids feed; or, where
    the logits of earlier positions move with the last id (a bidirectional model: a masked LM), predictions of the
    ids at their own positions (`shift` 0)."""

    name: str
    ids: Any
    vocabs: tuple          # the sizes of the embeddings every id indexes into
    vocab: int = 0         # the one the logits match (set by fits)
    targets: Any = None    # the ids shifted by `shift`, LEFT_OUT where that id is a -inf the model writes (once)
    left_out: Any = None   # where they are (for the header), or None
    shift: int = 1         # 1: next-token targets; 0: each position's own id (_bidirectional)
    unread: bool = False   # on meta: taken by the ids' shape alone (no values to range, no probe forward)
    others: tuple = ()     # ... with the further integer (N, T) inputs, (name, ids): fits() takes the first that fits

    def fits(self, y) -> bool:
        if not (y.dim() == 3 and y.is_floating_point() and y.shape[2] in self.vocabs and y.shape[1] > 1):
            return False
        for name, ids in ((self.name, self.ids),) + self.others:   # (others: on meta, a seq2seq's target ids)
            if tuple(y.shape[:2]) == tuple(ids.shape):
                self.name, self.ids, self.vocab, self.others = name, ids, int(y.shape[2]), ()
                return True
        return False


def language_model(model, inputs) -> LanguageModel | None:
    """The integer (N, T) input whose values all index into an nn.Embedding of the model: found by its
    shape, its value range and the embeddings' sizes (one host read of the range). When several qualify
    (an encoder-decoder's input and decoder ids), the one the logits are next-token predictions of is
    found by behaviour (`_causal_in`); else the first."""
    import torch

    vocabs = sorted({m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)})
    if not vocabs:
        return None
    found = []
    for name, t in inputs.tensors():
        if t.dim() != 2 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.numel() == 0:
            continue
        if t.device.type == "meta":   # no values to range or probe: by shape (a sweep: memory --device meta
            # estimated an mse step against a logits-sized target for a language model the CPU ran with cross-entropy,
            # +53% activations); fits() takes the first such input the logits match
            found.append(LanguageModel(name, t, tuple(vocabs), unread=True))
            continue
        lo, hi = torch.stack([t.min(), t.max()]).tolist()
        fed = tuple(v for v in vocabs if lo >= 0 and hi < v)
        if fed:
            found.append(LanguageModel(name, t, fed))
    if found and found[0].unread:
        found[0].others = tuple((lm.name, lm.ids) for lm in found[1:])
        return found[0]
    if len(found) > 1:
        # an attention mask and segment ids fit an embedding too (a review: a padded first sample's mask was taken for
        # the ids): the candidates with the most distinct values first, as ids have (one read each). Not whether a
        # candidate reaches an nn.Embedding as it is: ids offset, transposed or read through F.embedding do not (a
        # review of that version)
        found.sort(key=lambda lm: -int(torch.unique(lm.ids).numel()))
        causal = _causal_in(model, inputs, found)
        if causal is not None:
            return causal
    for lm in found[:3]:
        if _bidirectional(model, inputs, lm):
            lm.shift = 0
            return lm
    return found[0] if found else None


BIDIRECTIONAL_PROBE = 16   # positions of the first sample the bidirectional probe runs on (two eval forwards)


def _bidirectional(model, inputs, lm: LanguageModel) -> bool:
    """Whether a change to the last id moves the logits of earlier positions: a model that reads the whole sequence
    (a masked LM: BERT, RoFormer, ConvBert) whose logits are not next-token predictions, where a next-token target
    sits in its own input (a sweep: a ConvBert MLM "learned" next tokens to 1% of the start in 14 steps, a copy).
    Two eval-mode forwards under no_grad, leaving no trace, on the samples cut to BIDIRECTIONAL_PROBE positions (every
    input laid out as the ids cut alike), else on the inputs as given (a model of fixed length refuses the cut); False
    where unsure (the model raised, its logits do not fit, the last ids moved nothing)."""
    import torch

    from .guard import leave_no_trace
    from .index_guard import guarded

    n, t = lm.ids.shape
    length = min(t, BIDIRECTIONAL_PROBE)
    short_ids = lm.ids[:, :length]

    def cut(x):   # every sample: the first one's last position may be padding, which moves nothing (a review)
        if x is lm.ids:
            return short_ids
        return x[:, :length] if x.dim() >= 2 and tuple(x.shape[:2]) == (n, t) else x

    tries = [(inputs.map(cut), short_ids)] if 2 <= length < t else []
    try:
        with leave_no_trace(model, buffers=True), torch.no_grad(), guarded(model):
            model.eval()
            for ins, ids in [*tries, (inputs, lm.ids)]:
                moved = _earlier_moved(model, ins, ids, lm)
                if moved != "raised":   # one forward of the cut that ran is the answer (a classifier's: False)
                    return moved is True
    except Exception:   # the real run reports the model's own errors, with their module
        return False
    return False


@contextlib.contextmanager
def _attributes_kept(model):
    """Every module's plain attributes put back after the probe (leave_no_trace keeps buffers, flags and RNG): a
    recurrent LM that keeps `self.hidden = h.detach()` between calls kept the probe's batch-1 state, and the
    command's first forward failed (a review); a counter or a list a forward appends to is put back too, and an
    attribute the probe's forwards made is removed. Tensors are put back by reference (a write in place stays)."""
    import torch

    kinds = (torch.Tensor, int, float, bool, list, dict, tuple, type(None))
    saved = []
    for m in model.modules():
        attrs = vars(m)
        saved.append((m, {k: (v, list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else None)
                          for k, v in attrs.items() if not k.startswith("_") and isinstance(v, kinds)},
                      set(attrs)))
    try:
        yield
    finally:
        for m, kept, names in saved:
            attrs = vars(m)
            for k in [k for k in attrs if k not in names and not k.startswith("_")]:
                del attrs[k]
            for k, (v, contents) in kept.items():
                if isinstance(v, list) and contents is not None:
                    v[:] = contents
                elif isinstance(v, dict) and contents is not None:
                    v.clear()
                    v.update(contents)
                attrs[k] = v


def _probe_logits(model, ins):
    """The (N, T, V) float output of one probe forward, else None. Each forward from the same state: the same draws
    (an eval forward that stays random, F.dropout left at its default training=True, moved every position: a review)
    and the model's attributes as they were (a recurrent LM's kept hidden state, which a first forward advanced)."""
    import torch

    torch.manual_seed(0)
    with _attributes_kept(model):
        y, _ = primary_output(ins.call(model))
    return y if isinstance(y, torch.Tensor) and y.dim() == 3 and y.is_floating_point() else None


def _earlier_moved(model, ins, ids, lm: LanguageModel) -> bool | str | None:
    """One base forward and one with the last id changed: did the logits before the last position move ("raised": a
    forward raised; None: the logits do not fit the ids, or nothing moved at all)."""
    import torch

    def logits(x):
        y = _probe_logits(model, x)
        return y if y is not None and tuple(y.shape[:2]) == tuple(ids.shape) and y.shape[2] in lm.vocabs else None

    try:
        base = logits(ins)
        if base is None or base.shape[1] < 2:
            return None
        changed = ids.clone()
        changed[:, -1] = (changed[:, -1] + 1) % min(lm.vocabs)
        after = logits(ins.map(lambda x: changed if x is ids else x))
    except Exception:   # noqa: BLE001 - a fixed-length model refusing the cut: the inputs as given next
        return "raised"
    if after is None or after.shape != base.shape or torch.equal(after, base):
        return None
    return not torch.equal(after[:, :-1], base[:, :-1])


def _causal_in(model, inputs, found: list) -> LanguageModel | None:
    """Of ids of the same shape, the ones whose last position changes the logits' last position only (a
    causal model's next-token predictions of them: an encoder-decoder's decoder ids, not its encoder's).
    One eval-mode forward per candidate plus one, under no_grad, leaving no trace; None when no candidate
    is causal or the model raised (the caller keeps the first)."""
    import torch

    from .guard import leave_no_trace
    from .index_guard import guarded

    try:
        with leave_no_trace(model, buffers=True), torch.no_grad(), guarded(model):
            model.eval()
            base = _probe_logits(model, inputs)
            for lm in found:
                if base is None or not lm.fits(base) or base.shape[1] < 2:
                    continue
                changed = lm.ids.clone()
                changed[:, -1] = (changed[:, -1] + 1) % min(lm.vocabs)
                after = _probe_logits(model, inputs.map(lambda t, lm=lm, changed=changed: changed if t is lm.ids else t))
                if after is not None and after.shape == base.shape and torch.equal(after[:, :-1], base[:, :-1]) \
                        and not torch.equal(after[:, -1], base[:, -1]):
                    return lm
    except Exception:   # the real run reports the model's own errors, with their module
        return None
    return None


def _below_zero(scalars: list) -> set:
    """Labels of the scalar outputs below 0 (one read): no loss bounded below by 0, and one the model's own training
    may subtract (pytorch-tabnet's sparsity term, -0.8 at the start, `loss - lambda_sparse * M_loss`: added as is, the
    made-up sum went below 0 and overfit-batch refused its own loss, exit 2)."""
    import torch

    if not scalars or not _has_values(*[t for _, t in scalars]):
        return set()
    values = torch.stack([t.detach().float().reshape(()) for _, t in scalars]).tolist()
    return {label for (label, _), v in zip(scalars, values) if v < 0}


def _hard_target_ce(scalar, y) -> bool:
    """`scalar` is a cross-entropy of y's softmax against hard targets (a mean over positions, ignored ones aside): its
    gradient on y is (softmax - one-hot) / M, so in every row the gradient over the probability is one constant for
    every class but one (the target's; told where its probability is above 1e-6). An entropy, a KL to a teacher or a prior, a z-loss, label smoothing: not (a review: an
    entropy regulariser beside the logits was taken for the model's loss, and a --batch target thrown away)."""
    import torch

    try:
        (g,) = torch.autograd.grad(scalar, y, retain_graph=True, allow_unused=True)
    except RuntimeError:
        return False
    if g is None:
        return False
    # the gradient's own rounding: bfloat16 autocast put it 3.5e-3 off (softmax - one-hot) / M (a review)
    tol = max(1e-3, 16 * torch.finfo(g.dtype).eps, 16 * torch.finfo(y.dtype).eps)
    for dim in sorted({1, y.dim() - 1}):
        rows = widened(g.detach()).movedim(dim, -1).reshape(-1, y.shape[dim])
        p = torch.softmax(widened(y.detach()).movedim(dim, -1).reshape(-1, y.shape[dim]), -1)
        live = rows.abs().amax(1) > 0
        if not bool(live.any()):
            continue
        rows, p = rows[live], p[live]
        ratio = torch.where(p > 1e-6, rows / p, torch.nan)
        scale = ratio.nanmedian(1, keepdim=True).values
        off = ((ratio - scale).abs() > tol * scale.abs()) & (p > 1e-6)
        count = off.sum(1)   # (0 in every row: a z-loss, the same ratio for every class)
        if bool((scale > 0).all()) and bool((count <= 1).all()) and float((count == 1).float().mean()) >= 0.5:
            return True
    return False


def _weights(t) -> set | None:
    """ids of the leaf tensors (parameters, weights made in forward) t's autograd graph reaches; None
    when t has no graph to walk."""
    if t.grad_fn is None:
        return {id(t)} if t.requires_grad else None
    seen, leaves, stack = set(), set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        var = getattr(fn, "variable", None)   # AccumulateGrad: a leaf
        if var is not None:
            leaves.add(id(var))
        stack.extend(f for f, _ in fn.next_functions)
    return leaves


# autograd nodes of ops that take a part of a tensor, or view it whole, computing nothing (_base)
_PARTS = ("Split", "SplitWithSizes", "Select", "Slice", "Unbind", "Narrow", "Index", "AsStrided")
_VIEWS = ("Squeeze", "Unsqueeze", "View", "UnsafeView", "Transpose", "Permute", "Reshape", "ReshapeAlias", "Expand",
          "Clone", "Alias", "T")


def _base(t) -> tuple[tuple | None, bool]:
    """((id of the node, which of its outputs) of the tensor `t` is a part or view of, past the ops that only cut or
    view; None without a graph), and whether a cut was among them (a Linear on a 3-D input ends in a view of its
    matmul: no part)."""
    fn, nr, cut = t.grad_fn, t.output_nr, False
    while fn is not None and fn.next_functions and fn.next_functions[0][0] is not None:
        kind = type(fn).__name__.rstrip("0123456789").removesuffix("Backward")
        if kind not in _PARTS and kind not in _VIEWS:
            break
        cut = cut or kind in _PARTS
        fn, nr = fn.next_functions[0]
    return (None if fn is None else (id(fn), nr)), cut


def _reached_through(y, others: list) -> set:
    """Labels of the non-scalar outputs whose every weight the primary output's graph reaches as well (an
    encoder-decoder's encoder states, a cache of keys and values): adding a loss on them trains nothing the
    primary does not, and a random target there fights the primary's. An auxiliary head with weights of its
    own is kept, and so is another piece of the tensor the primary is a piece of (a sweep: ALBERT's QA head, one
    Linear(hidden, 2) split into start and end logits, never trained its end row). Nothing is dropped when a graph
    cannot be walked."""
    primary = _weights(y)
    if not primary:
        return set()
    base, piece = _base(y)   # (only where y is a part itself: a view or slice of the whole primary adds nothing, a review)
    out = set()
    for label, t in others:
        mine = _weights(t)
        other, cut = _base(t)   # another part (a review: the whole tensor beside its slice contradicts its target)
        if mine and mine <= primary and not (piece and cut and base is not None and other == base):
            out.add(label)
    return out


def classes_last(y, target, either: bool = False) -> bool:
    """Integer targets shaped as the output without its last dimension (a language model's (N, T) next ids against
    (N, T, V) logits), and not as torch's class-on-dimension-1 layout (N, d1, ...) would have them: class indices
    along the last dimension (a new user's GPT batch was refused, "Expected target size [8, 65], got [8, 32]").
    `either`: shaped for both layouts (T == V), which torch's reads (said in the rule: a review's GPT of 32 tokens
    and context 32 memorised classes along its time axis)."""
    last = (not target.is_floating_point() and y.dim() >= 3 and y.is_floating_point()
            and tuple(target.shape) == tuple(y.shape[:-1]))
    torch_layout = tuple(target.shape) == (y.shape[0], *y.shape[2:])
    return last and torch_layout if either else last and not torch_layout


def _float_classes_hint(target, y) -> str:
    """A float target of whole numbers in [0, C), shaped as the output without its class dimension (N, H, W against
    N, C, H, W): class ids stored as floats, which the auto loss reads as a regression (a sweep's segmentation mask
    forgot its .long())."""
    import torch

    if y.dim() < 2 or target.shape != (y.shape[0], *y.shape[2:]) or not target.is_floating_point():
        return ""
    t = target.detach()
    if not bool(torch.isfinite(t).all()) or not bool((t == t.round()).all()) or float(t.min()) < 0 \
            or float(t.max()) >= y.shape[1]:
        return ""
    return (f"the target holds whole numbers in [0, {y.shape[1]}) as floats: class ids for the output's {y.shape[1]} "
            "classes? make it integer (target.long()): the auto loss then takes cross_entropy")


def _has_values(*ts) -> bool:
    """Values that can be read: not meta, not fake (memory's estimate, flops on --device meta)."""
    from torch._subclasses.fake_tensor import is_fake

    return not any(is_fake(t) or t.device.type == "meta" for t in ts)


def _check_classes(target, y, shown: tuple | None = None) -> bool:
    """Class indices within [0, C) (ignore_index -100 aside), read back with one host sync. Not on values that cannot
    be read (memory's estimate on fake tensors: a sweep's UNet was said to "read tensor values" for this check)."""
    import torch

    if not _has_values(target, y):
        return False

    keep = target != -100
    lo = torch.where(keep, target, torch.iinfo(target.dtype).max).min()
    hi = torch.where(keep, target, -1).max()
    lo, hi = torch.stack([lo, hi]).tolist()
    if hi < 0:   # every entry ignored
        return True
    if lo < 0 or hi >= y.shape[1]:
        wrong = keep & ((target < 0) | (target >= y.shape[1]))
        raise UsageError(f"cross_entropy: the target holds class {lo if lo < 0 else hi}, outside [0, {y.shape[1]}) "
                         f"for an output of shape {shown or tuple(y.shape)}",
                         hint=target_range_hint(lo, hi, y.shape[1], target[wrong].unique().tolist(),
                                                bool((keep & ~wrong).any())))
    return True


def target_range_hint(lo: int, hi: int, classes: int, outside: list[int], others: bool) -> str:
    """What a target outside [0, C) most likely is: 1-based labels (1…C, none 0: a sweep saw C called an ignore
    label), an ignore label (one value beside targets inside), negative ids, or a head too small (a review: negatives
    were told to give the last layer fewer outputs than it has)."""
    if lo >= 1 and hi == classes:
        return (f"labels look 1-based (the largest is {hi}, one past the last class, and none is 0): subtract 1; or, "
                f"if 0 is a class too (absent from this batch), give the last layer {hi + 1} outputs")
    ignore = ignore_label_hint(outside, others)
    if ignore:
        return ignore
    wider = f"give the last layer {hi + 1} outputs" if hi >= classes else ""
    if lo < 0:
        return (f"class ids run from 0: negative targets ({lo}) are no class (map ones that mark unlabelled samples to "
                "-100, cross_entropy's default ignore_index)" + (f"; and {wider}" if wider else ""))
    return f"make labels 0…{classes - 1}, or {wider}"


def ignore_label_hint(outside: list[int], others: bool) -> str:
    """A single value outside [0, C) beside targets inside it is an ignore label (VOC's and Cityscapes' 255, -1),
    not a class (a sweep: 255 was told to give the model 256 outputs): the loss's ignore_index, or -100."""
    if len(outside) != 1 or not others:
        return ""
    v = outside[0]
    return (f"{v} looks like an ignore label (VOC and Cityscapes mark unlabelled pixels 255): give a loss with "
            f"ignore_index={v} (--loss PATH:fn), or map {v} to -100, cross_entropy's default ignore_index")


def _checked(fn, y, target, name):
    """The loss itself; a target that does not fit the output is a usage error, not a crash."""
    try:
        return fn(y, target)
    except (RuntimeError, IndexError, ValueError) as exc:
        gpu = device_error(exc, "the loss")   # the forward's kernel failure surfacing here: not the target's
        if gpu is not None:
            raise gpu from exc
        raise UsageError(f"{name}: the target does not fit the output (output {tuple(y.shape)} {y.dtype}, target "
                         f"{tuple(target.shape)} {target.dtype}): {one_line(exc)}",
                         hint="cross_entropy wants class indices in [0, C) of shape (N, ...) or probabilities of the "
                              "output's shape; mse wants the output's shape") from None


def _scalar(value, what):
    import torch

    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise UsageError(f"{what} did not give a scalar tensor (got {type(value).__name__})")
    return value.reshape(())


def _refuse_signature(fn, name: str, exc: Exception) -> None:
    """Exit 2 where `fn` cannot be called as fn(output, target) (its signature says so); else nothing: the TypeError
    was raised inside it (the user's code, exit 3)."""
    import inspect

    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise UsageError(f"loss function {name} cannot be called as fn(output, target): {one_line(exc)}",
                         hint="--loss PATH:fn names a function of two arguments, the output and the target") from exc
    except ValueError:   # no signature to read (a builtin): the call's own error stands
        return


def resolve_loss(text: str, loaded, batch_target, seed: int) -> Loss:
    text = (text or "auto").strip()
    if ":" in text:
        from .loading import find_factory, import_module, split_spec

        where, name = split_spec(text)
        module = loaded.module if where in ("", ".") else import_module(where, "loss file")
        loss = Loss("custom", seed, batch_target, custom=find_factory(module, name, where))
        loss.custom_name = f"{name}()"
        return loss
    name = text.lower().replace("-", "_")
    if name not in ("auto", "cross_entropy", "mse", "sum"):
        raise UsageError(f"unknown loss '{text}'", hint=f"choose {LOSS_CHOICES}")
    return Loss(name, seed, batch_target)


def load_batch(spec: str, device, seed: int):
    """`--batch PATH:fn`: fn() returns (inputs, target); inputs a tensor, tuple or dict."""
    import torch

    from .inputs import ModelInputs, _normalise
    from .loading import find_factory, import_module, split_spec
    from .train import user_call

    where, name = split_spec(spec)
    fn = find_factory(import_module(where, "batch file"), name, where)
    value = user_call(seed, fn, f"batch function {name}()")
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise UsageError(f"batch function {name}() must return (inputs, target); got {type(value).__name__}")
    raw_inputs, target = value
    args, kwargs = _normalise(raw_inputs, f"{name}()")
    inputs = ModelInputs(args, kwargs, f"--batch {spec}").refuse_empty().to(device)
    if isinstance(target, torch.Tensor):
        target = target.to(device)
    return inputs, target
