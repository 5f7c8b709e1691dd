"""Findings on parameters, grouped under the highest module whose parameters share the problem,
and the verdict."""
from __future__ import annotations

from ...core import repeats
from ...core.module_paths import ancestors, owner
from ...core.unreached import ROUTED_HINT
from .options import BY_DESIGN, STATUS_ORDER, STATUS_SEVERITY


def groups(rows, model, key) -> list[tuple[str, list[dict]]]:
    """Group flagged parameters under the highest module all of whose parameters share `key`."""
    keyed = {r["name"]: key(r) for r in rows}
    by_name = {r["name"]: r for r in rows}
    module_names = {n: [pn for pn, _ in m.named_parameters(prefix=n)] for n, m in model.named_modules()}
    used: set[str] = set()
    out = []
    for r in rows:
        k = keyed[r["name"]]
        if k is None or r["name"] in used:
            continue
        best = None
        for a in ancestors(owner(r["name"])):
            members = module_names.get(a, [])
            if members and all(keyed.get(m) == k for m in members):
                best = a
            else:
                break
        if best is None:
            members, where = [r["name"]], r["name"]
        else:
            members, where = module_names[best], best or "(root)"
        used.update(members)
        out.append((where, [by_name[m] for m in members]))
    return out


NAMES_LISTED = 6   # parameter names a finding lists in full
MAX_STOPS = 2      # distinct places a zero gradient stops, said in one finding (the rest counted)


def _names(members) -> str:
    """Every name when they fit, else the ones that differ only in their block written once (core/repeats.py)."""
    names = [m["name"] for m in members]
    return ", ".join(names) if len(names) <= NAMES_LISTED else repeats.compact(names, NAMES_LISTED)


def param_findings(result, rows, model, opts, allow_name: str = "--allow") -> None:
    names = [r["name"] for r in rows]
    for e in _entries(rows, model):
        status, members, where = e.members[0]["status"], e.members, e.where or "(root)"
        n = len(members)
        if e.folded:     # the same finding block after block: said once, on their container
            what = f"{n} parameter tensors, {repeats.describe(e, model)}"
            msg, hint = _message(status, what, where, members, opts, allow_name, repeats.pattern(e, names), 1,
                                 example=members[0]["name"])
        else:
            what = (f"{n} parameter tensor{'s' if n > 1 else ''} ({_names(members)})"
                    if n > 1 or where != members[0]["name"] else "the parameter")
            msg, hint = _message(status, what, where, members, opts, allow_name)
        result.add(status, STATUS_SEVERITY[status], where, msg, hint,
                   members=[m["name"] for m in members] if e.folded else None)
    design_findings(result, rows, model)
    allowed = [r for r in rows if r["allowed"]]
    if allowed:
        result.add("allowed", "info", "", f"{len(allowed)} flagged parameter(s) accepted by {allow_name}: "
                   + ", ".join(f"{r['name']} ({r['status']})" for r in allowed[:8]) + (" …" if len(allowed) > 8 else ""))


def _key(r):
    if r["status"] in ("ok", *BY_DESIGN) or r["allowed"]:
        return None
    return (r["status"], r.get("reason"), r.get("why"), r.get("rechecked"))


def _alike(r):
    """Block after block: the same verdict and kind of cause (the cause's text names each block's own)."""
    k = _key(r)
    return k and (k[0], k[1], k[3], (r.get("stop") or {}).get("hint"))


def _entries(rows, model) -> list[repeats.Entry]:
    """The flagged parameters grouped under the highest module whose parameters all share the finding; inside
    the blocks of a stack, a parameter flagged alike in ≥ 2 blocks is one entry on the stack (core/repeats.py).
    In the rows' order."""
    order = {r["name"]: i for i, r in enumerate(rows)}
    named = repeats.named_blocks(model)
    inside = [r for where, ms in groups(rows, model, _key) if repeats.split(where, 0, named) for r in ms]
    folds = [e for e in repeats.fold([repeats.Entry(_alike(r), r["name"], [r]) for r in inside], model) if e.folded]
    folded = {m["name"] for e in folds for m in e.members}
    entries = folds + [repeats.Entry(_key(ms[0]), where, ms)
                       for where, ms in groups([r for r in rows if r["name"] not in folded], model, _key)]
    return sorted(entries, key=lambda e: order[e.members[0]["name"]])


def _message(status, what, where, members, opts, allow_name, allow: str | None = None,
             max_stops: int = MAX_STOPS, example: str | None = None) -> tuple[str, str | None]:
    """The finding's message and hint; `example`: a folded finding (core/repeats.py), whose cause is said for
    its first parameter, and `allow` its --allow pattern (None when no glob holds just its parameters)."""
    from ...core.unreached import REENTRANT, REENTRANT_HINT
    from ...fmt import number

    first = members[0]
    if status == "no-grad":
        reason, why = first["reason"], first["why"]
        why = f"as {example}: {why}" if example else why
        if reason == "unused":
            pattern = (allow if example else f"{where}.*" if where != first["name"] else where)
            accept = (f"{allow_name} '{pattern}' accepts it as intentional" if pattern else
                      f"{allow_name} with their names accepts them as intentional")
            return f"{what}: requires grad but got none — {reason}: {why}", f"remove the module or freeze it; {accept}"
        hint = {"dropped": "use the branch's output where it belongs (or remove the module), or freeze it",
                "discarded": "use that output (a forgotten skip, aux loss or router loss?), build the component "
                             f"without it, or freeze it; {allow_name} accepts it as intentional",
                "left-out": "give a --loss that covers that output (--loss auto covers every output), or freeze it"
                }.get(reason, REENTRANT_HINT if REENTRANT in why else
                      "remove the .detach()/torch.no_grad() if this branch should learn, or freeze it")
        return f"{what}: requires grad but got none — {reason}: {why}", hint
    if status == "not-reached":
        from ...core.unreached import NOT_REACHED_HINT

        return (f"{what}: got no gradient, {first['why']} with the default inputs torchdiag chose; not judged",
                NOT_REACHED_HINT)
    if status == "frozen":
        total = sum(m["numel"] for m in members)
        return f"{what} frozen (requires_grad=False): {total:,} values not trained", None
    if status == "zero-grad":
        steps = first.get("rechecked")
        rounding = f"; {first['rounding_fact']}" if first.get("rounding_fact") else ""
        again = (f" (still, after a short training run on a copy: {steps} optimizer steps{rounding})" if steps else
                 f" (not re-checked by a short training run, which tells a zero-initialised layer or gate from a "
                 f"break: {first['unchecked']})" if first.get("unchecked") else "")
        stops = _stops(members)
        if len(stops) == 1 and len(stops[0][1]) == len(members):
            return f"{what}: gradient is exactly zero everywhere{again}; {stops[0][0]['why']}", stops[0][0]["hint"]
        if stops:   # the group's parameters stop in different places: each said with the ones it holds for
            said = "; ".join(f"{_names([{'name': n} for n in names])}: {stop['why']}" for stop, names in stops[:max_stops])
            said += (f"; and {len(stops) - max_stops} more place(s) (each parameter's in --json 'params', key 'stop')"
                     if len(stops) > max_stops else "")
            return f"{what}: gradient is exactly zero everywhere{again}. {said}", stops[0][0]["hint"]
        return (f"{what}: gradient is exactly zero everywhere{again}",
                "a zero-derivative op (round, sign, argmax, comparison) or dead units sit between it and the loss")
    if status == "non-finite-grad":
        nan = sum(m["nan"] for m in members)
        inf = sum(m["inf"] for m in members)
        return (f"{what}: gradient holds {nan:,} NaN and {inf:,} Inf value(s)",
                "run `torchdiag nancheck` to find the op that first produces them")
    if status == "exploding-grad":
        worst = max(members, key=lambda m: m["grad_norm"] or 0)
        steps = first.get("rechecked")
        fact = first.get("recheck_fact")
        again = (f"; not a transient of the starting point: after a short training run on a copy, {fact}" if fact
                 else f"; still large after a short training run on a copy ({steps} optimizer steps)" if steps else "")
        again += f"; {first['acting_fact']}" if first.get("acting_fact") else ""
        return (f"{what}: grad norm up to {number(worst['grad_norm'])} (grad/weight "
                f"{number(worst['grad_weight_ratio'])}); thresholds: norm > {opts.exploding:g} or ratio > {opts.exploding_ratio:g}{again}",
                "check initialisation scale, normalisation layers, learning rate; clip gradients")
    # vanishing
    def ratio(m):
        return m["grad_weight_ratio"] if m["grad_weight_ratio"] is not None else m["grad_norm"]

    r = ratio(min(members, key=lambda m: ratio(m) or 0))
    steps = first.get("rechecked")
    again = (f"; still, after a short training run on a copy ({steps} optimizer steps)" if steps else
             f"; not re-checked by a short training run: {first['unchecked']}" if first.get("unchecked") else "")
    again += f"; {first['longer_fact']}" if first.get("longer_fact") else ""
    return (f"{what}: grad/weight ratio down to {number(r)} (threshold {opts.vanishing:g}){again}",
            "saturating activations, depth without residuals/normalisation, or tiny initialisation")


def _stops(members) -> list[tuple[dict, list[str]]]:
    """The distinct places where the members' zero gradients stop (core/stops.py), each with its parameters."""
    out: dict[str, tuple[dict, list[str]]] = {}
    for m in members:
        stop = m.get("stop")
        if stop is not None:
            out.setdefault(stop["why"], (stop, []))[1].append(m["name"])
    return list(out.values())


DESIGN_TITLES = {
    "zero-init": "get exactly zero gradients at initialisation, by design",
    "invariant": "get only rounding noise as gradient, by design: the loss does not depend on them",
    "by-design-init": "get small gradients at initialisation, by design: a few real training steps lift them (a "
                      "gate on their path, a zero or tiny multiplicative parameter, opens; or their path does)",
    "tiny-by-construction": "have a huge grad/weight ratio only because their value is tiny by construction",
    "scale-invariant": "have large gradients only because a normalisation follows (scale-invariant)",
    "skipped-at-random": "got no gradient only because the judged pass skipped them at random",
    "routed-by-input": "got no gradient only because the batch routed no input to them",
    "closed-on-batch": "get a gradient of zeros only on this batch",
    "adaptive-step": "get small gradients, but the run's optimizer steps them like the rest of the model",
    "bounded-step": "have a large grad/weight ratio, but the run's optimizer steps them no further than the rest of "
                    "the model",
    "transient-grad": "have large gradients only at the starting point: a few real optimizer steps bring them to the "
                      "level of the rest of the model",
    "small-weight": "have a large grad/weight ratio only because their weight is near zero, while a few real "
                    "optimizer steps lower the loss",
    "small-term": "have a large grad/weight ratio only because their part in their module's output is small: read "
                  "there, the ratio is within --exploding-ratio",
    "small-normalised": "have a large grad/weight ratio only because their weight is small behind what divides by its "
                        "size: at the model's typical size their gradient falls and the ratio is within "
                        "--exploding-ratio",
    "cancelled": "get small gradients, by design: something after their module takes back their change to its output",
    "loss-scale": "have large gradients because torchdiag's made-up MSE reads an output of a large scale: with that "
                  "output at unit scale they are within the thresholds",
}


def design_findings(result, rows, model=None) -> None:
    """One info finding per cause of a "by design at initialisation" verdict (the zero-initialised
    module, the layer scale, or the kind), naming the parameters and why; the same cause in each block of a
    stack is one finding (core/repeats.py)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        d = r.get("design")
        if d:
            cause = r["reason"] if d["kind"] in ("zero-init", "by-design-init") else None
            groups.setdefault((d["kind"], cause), []).append(r)
    entries = []
    for (kind, cause), members in groups.items():
        where = cause or (members[0]["name"] if len(members) == 1 else _common(members))
        # a gate found (a layer scale, a zero-initialised norm) or none (the cause is the parameter itself):
        # folded by the gate's place, or the parameter's, and never the one kind with the other
        gate = cause is not None and cause not in {m["name"] for m in members}
        entries.append(repeats.Entry((kind, cause is None, gate), where, members))
    for e in repeats.fold(entries, model):
        members, (kind, general, gate) = e.members, e.key
        n = len(members)
        if e.folded:     # the same cause in each block (its own layer scale, its own zero-initialised norm)
            what = f"{n} parameter tensors ({_names(members)})"
            why = (f"as {members[0]['name']}: {members[0]['design']['why']}; the same {repeats.describe(e, model)}"
                   + (" (each block's own gate)" if gate else ""))
        else:
            what = (f"{n} parameter tensor{'s' if n > 1 else ''} ({_names(members)})"
                    if n > 1 or e.where != members[0]["name"] else "the parameter")
            # a closed-on-batch's own count, where every member has the same
            alike = kind == "closed-on-batch" and len({m["design"]["why"] for m in members}) == 1
            why = members[0]["design"]["why"] if n == 1 or not general or alike else _why(kind, None)
        why += _underflow(kind, members, model)
        # every parameter a finding over several covers, folded or not (a sweep: "(root)" over 63 tensors, "… (+45
        # more)", and JSON could not say which)
        result.add(kind, "info", e.where or "(root)", f"{what} {_title(kind, n, members)}: {why}",
                   HINTS.get(kind, ""), members=[m["name"] for m in members] if e.folded or n > 1 else None)


HINTS = {"routed-by-input": ROUTED_HINT}


def _underflow(kind: str, members: list[dict], model) -> str:
    """Said of exactly-zero gradients on float16 weights: there a gradient under the smallest subnormal is 0, so a
    layer scale's 1e-8 gradients read as zeros (a sweep: timm convnext_atto under --dtype float16, whose float32
    gradients are ~1e-8); the verdict stands, what training does is the same."""
    from ...core.precision import facts

    params = dict(model.named_parameters()) if kind == "zero-init" and model is not None else {}
    dtypes = {str(params[m["name"]].dtype).replace("torch.", "") for m in members if m["name"] in params}
    if dtypes != {"float16"}:
        return ""
    return (f"; in float16 a gradient under {facts('float16').smallest_subnormal:.2g} is 0, so some of these may be "
            "small rather than zero (`torchdiag nancheck` counts grad-underflow)")


def _title(kind: str, n: int, members: list[dict]) -> str:
    """DESIGN_TITLES[kind], agreeing with one parameter ("gets", "has", "its"); a routed one says whether its
    gradient was none, all zeros (a dense mixture's routing weight of 0), or some of each."""
    title = DESIGN_TITLES[kind]
    if kind == "routed-by-input":
        zeros = sum(m.get("grad_norm") is not None for m in members)
        got = {0: "got no gradient", n: "got a gradient of zeros"}.get(zeros, "got no gradient, or one of zeros")
        title = title.replace("got no gradient", got)
    verb, _, rest = title.partition(" ")
    singular = rest.replace('their ', 'its ').replace(' them', ' it')
    return f"{ {'get': 'gets', 'have': 'has'}.get(verb, verb)} {singular}" if n == 1 else title


def _why(kind, cause) -> str:
    return {"invariant": "shifting them (random values, float64 copy) leaves the loss unchanged (a following batch-statistics "
                         "normalisation or softmax cancels it)",
            "tiny-by-construction": "judged by the gradient itself (its norm, and the largest change one plain "
                                    "gradient step at the run's learning rate makes), not by grad/weight",
            "scale-invariant": "each feeds a batch-statistics normalisation, so its gradient is orthogonal to it and "
                               "grows as 1/|w|: a step grows |w| and the ratio corrects itself, so neither its norm nor "
                               "grad/weight makes it exploding",
            "adaptive-step": "in a short training run on a copy each moved, per element, at least a quarter of the "
                             "median step of the other parameters that moved: an adaptive optimizer's step does not "
                             "scale with the gradient while it is well above eps (with plain SGD they would not "
                             "learn: --optimizer sgd judges that)",
            "bounded-step": "their gradient's norm is within --exploding and, relative to its weight, each moved at "
                            "most 4x the median relative step of the other parameters that moved (and under a tenth of "
                            "its norm a step) in a short training run on a copy: the optimizer's step is bounded",
            "transient-grad": "in a short training run on a copy each gradient's norm came back within --exploding, "
                              "falling at least 10x further than the loss did, in a run whose loss stayed finite and "
                              "went below its start: a property of the "
                              "initial values, which the first steps leave (judged with the re-check's optimizer: "
                              "--optimizer sgd takes steps that scale with the gradient)",
            "small-weight": "their gradient's norm is within --exploding, and in a short training run on a copy the "
                            "loss fell while the optimizer moved each, per element, at most 4x the median step of the "
                            "other parameters that moved, or their grad/weight at least halved as the weight grew",
            "small-term": "each moved alone against its gradient by 1% of its norm (on a copy) moves the output of the "
                          "module that holds it by so little that grad/weight times that relative move is within "
                          "--exploding-ratio: a small part of that output, such as a bias beside the values it is "
                          "added to",
            "small-normalised": "each scaled alone to the model's typical per-element RMS (on a copy) has a gradient at "
                                "least the square root of that scale smaller, and grad/weight there within "
                                "--exploding-ratio: a gradient that grows as the weight shrinks",
            "cancelled": "each moved along its gradient (on a copy) changes its module's output by terms (dL/d output "
                         "× change) that are large and sum to under a thousandth of what random signs leave: the "
                         "loss reads what it changes and something after the module takes the change back (a "
                         "normalisation dividing out the scale it sets)",
            "loss-scale": "the loss is torchdiag's own MSE against a made-up target, and with the output it reads "
                          "divided by its RMS (between 1 and 30) each gradient is within --exploding and "
                          "--exploding-ratio; Adam's step does not depend on the gradient's scale, plain SGD needs a "
                          "learning rate that RMS squared smaller (judge it with the real loss: --batch, --loss)",
            "skipped-at-random": "the forward draws at random which layers run in train mode (LayerDrop-like); "
                                 "another draw of the RNG, on a copy, gives them a gradient",
            "routed-by-input": "the forward routes each input to some of its parts (an MoE router); fresh inputs of "
                               "the batch's kind, on a copy, give them a gradient: a larger batch reaches them",
            "closed-on-batch": "after a short training run on a copy, fresh inputs of their kind give each a "
                               "gradient (as often as a unit open for a quarter of samples would): a unit on their path (a ReLU, a gate) is shut "
                               "for every sample of this batch; judge them on more data (--batch, a larger -b)"}.get(kind, "")


def _common(members) -> str:
    return repeats.common_path([m["name"] for m in members]) or "(root)"


def status_counts(rows) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def _ok_by_design(rows) -> str:
    """The ok rows judged by how they are built (tiny by construction), which the verdict counts among its "judged by
    how they are built" (a sweep: "ok 159" beside "41 judged", the 18 tiny ones in neither)."""
    n = sum(1 for r in rows if r["status"] == "ok" and r.get("design"))
    return f" ({n} of the ok ones judged by how they are built: info)" if n else ""


def verdict(result, rows, opts, loss_value: float, strict_name: str = "--strict") -> None:
    """Summary lines, the verdict, and whether warnings fail (strict)."""
    counts = status_counts(rows)
    errors = [f for f in result.findings if f.severity == "error"]
    warnings = [f for f in result.findings if f.severity == "warning"]
    trainable = sum(1 for r in rows if r["requires_grad"])
    # a gradient came back: not a parameter the pass skipped at random or routed no input to (info, yet not reached)
    reached = sum(1 for r in rows if r["requires_grad"] and r["grad_norm"] is not None)
    result.summary += [
        ("Loss", f"{loss_value:.6g} ({result.header['loss']})"),
        ("Trainable parameters reached", f"{reached} of {trainable} tensors"),
        ("Status", ", ".join(f"{k} {counts[k]}" for k in STATUS_ORDER if counts.get(k)) + _ok_by_design(rows)),
    ]
    if opts.strict:
        result.failed = bool(errors or warnings)
    if errors or (opts.strict and warnings):
        bad = errors + (warnings if opts.strict else [])
        result.verdict = f"FAIL: {len(bad)} problem(s): " + ", ".join(sorted({f.code for f in bad}))
    elif warnings:
        result.verdict = (f"PASS with {len(warnings)} warning(s): " + ", ".join(sorted({f.code for f in warnings}))
                          + f" ({strict_name} makes warnings fail)")
    elif counts.get("not-reached"):
        result.verdict = (f"PASS: gradients reach every trainable parameter the inputs ran, with healthy magnitudes "
                          f"({counts['not-reached']} not reached by the default inputs: not judged)")
    else:
        result.verdict = "PASS: gradients reach every trainable parameter with healthy magnitudes"
    designed = sum(1 for r in rows if r.get("design"))
    if counts.get("closed-on-batch") and not result.verdict.startswith("FAIL"):   # zero here: not "healthy" (a review)
        result.verdict += (f"; {counts['closed-on-batch']} get a gradient of zeros on this batch alone "
                           "(closed-on-batch: judge them on more data)")
    if designed and not result.verdict.startswith("FAIL"):
        result.verdict += (f" ({designed} parameter tensor(s) judged by how they are built or by the step the "
                           "optimizer takes: see the info findings)")
