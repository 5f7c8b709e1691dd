"""nondeterministic-eval: two eval forwards on the same input differ. Per-call fingerprints, compared call by
call in the order the calls start and end, name where the randomness enters: the first module that turns
equal inputs into different outputs, else the module running when a call first gets different inputs (a
forward that draws torch.randn itself, as a GAN vocoder's noise)."""
from __future__ import annotations

from ...core.device import wide_float
from ...core.random_ops import SAMPLING_OPS
from ...core.tracking import ForwardHooks, run_forward
from .checklist import Checklist
from .shared import dense, max_diff, name, scale, tensors

RANDOM_EVAL_HINT = ("randomness in eval: use self.training to gate it (F.dropout(x, p, training=self.training)), "
                    "no torch.rand/randn in forward outside training")
STATE_HINT = ("no random op ran: a state the forward keeps changed the output (a cache, a counter, a buffer it "
              "writes); keep eval forwards from writing it, or reset it before evaluating")
SAMPLING_HINT = ("if the model samples by design, validate with a fixed seed or with the mean in eval; if the noise is "
                 "meant for training only, gate it with self.training")
# the random ops are read by core/random_ops.py: a distribution's samples may be the model's design, uniform numbers and
# coin flips (masks, stochastic depth) left on in eval are the classic bug (a review: a DropPath was told "by design")


WEIGHTS = 1021      # a fixed ±1 pattern this long, repeated along a tensor: its weighted sum sees an order
# On the CPU the sums are read at once as floats: 0-dim tensors kept per call, between float64 copies of whole
# activations, fragment glibc's heap until nothing freed is reused (timm convmixer_768_32: 14 GB RSS in one eval
# forward, 0.9 GB read at once). Pieces of this many elements (8 MiB in float64; the pattern's length times a
# power of two, so each piece starts where the pattern does) bound the copies: 3.4 s a forward instead of 5.7 s.
CPU_PIECE = WEIGHTS * 1024


def _fingerprint(obj) -> list:
    """Per tensor, kept on the device (read back only when a culprit is searched): the sum, the sum of |x| and the
    sum of x times a fixed ±1 pattern along its elements, over its finite values, and the count of the others.
    The pattern's sum tells a permutation or a flip apart (ViLT draws the order of its patches) by ~sqrt(n) |x|, far
    above the tolerance's 1e-6 x sum |x|; an inf elsewhere in the tensor does not hide a change. Float64 copies,
    one piece at a time on the CPU, where they are read at once (no host sync to save) as floats."""
    import torch

    vals: list = []
    for _, t in tensors(obj):
        if t.numel() == 0:
            continue
        x = dense(t.detach()).flatten()
        if x.device.type != "cpu":
            vals += _piece_sums(x)
            continue
        # through numpy: a view of CPU memory, not a device read (core/syncs.py counts none)
        sums = [torch.stack(_piece_sums(x[i:i + CPU_PIECE])).numpy().tolist() for i in range(0, x.numel(), CPU_PIECE)]
        vals += [sum(column) for column in zip(*sums)]   # not math.fsum: it raises on inf - inf and on overflow
    return vals


def _piece_sums(x) -> list:

    x = x.to(wide_float(x.device))   # float32 on mps, which has no float64
    bad = ~x.isfinite()
    x = x.masked_fill(bad, 0.0)
    return [x.sum(), x.abs().sum(), _pattern_sum(x), bad.sum().to(x.dtype)]


_PATTERNS: dict = {}


def _pattern_sum(x):
    import torch

    w = _PATTERNS.get((x.device, x.dtype))
    if w is None:   # ±1 made on the host, exact in any float
        w = torch.ones(WEIGHTS, dtype=x.dtype)
        w[torch.randperm(WEIGHTS, generator=torch.Generator().manual_seed(0))[:WEIGHTS // 2]] = -1
        w = _PATTERNS[(x.device, x.dtype)] = w.to(x.device)
    whole = x.numel() // WEIGHTS * WEIGHTS
    head = (x[:whole].view(-1, WEIGHTS) @ w).sum() if whole else x.new_zeros(())
    return head + x[whole:] @ w[:x.numel() - whole]


def _read(runs) -> list:
    """Both runs' events with their fingerprints as floats: one host read per device."""
    from ...core.readback import read_back

    flat = [v for run in runs for (_, _, _, fp) in run for v in fp]
    values, out, i = read_back(flat), [], 0
    for run in runs:
        rows = []
        for kind, n, t, fp in run:
            rows.append((kind, n, t, values[i:i + len(fp)]))
            i += len(fp)
        out.append(rows)
    return out


def _same_fp(a: list[float], b: list[float]) -> bool:
    if len(a) != len(b):
        return False
    for i in range(0, len(a), 4):
        tol = max(abs(a[i + 1]), abs(b[i + 1])) * 1e-6 + 1e-12
        if a[i + 3] != b[i + 3] or any(abs(a[j] - b[j]) > tol for j in range(i, i + 3)):
            return False
    return True


class CallRecorder(ForwardHooks):
    """("start", module, type, input fingerprint) and ("end", module, type, output fingerprint), in order."""
    pre_kwargs = True

    def __init__(self, model):
        super().__init__(model)
        self.events: list[tuple[str, str, str, list]] = []

    def _pre(self, mod, args, kwargs):
        self.events.append(("start", self.names.get(id(mod), "?"), type(mod).__name__, _fingerprint((args, kwargs))))

    def _post(self, mod, args, output):
        self.events.append(("end", self.names.get(id(mod), "?"), type(mod).__name__, _fingerprint(output)))


def _culprit(one, two) -> tuple[str, str]:
    """(module, type) where the two runs part: the first call to end with a different output from the same
    input; else, when a call starts with different inputs (or the calls themselves differ), the module running
    then, which made them in its own forward."""
    running: list[tuple[str, str]] = []
    for (kind, n1, t1, f1), (kind2, n2, _t2, f2) in zip(one, two):
        if n1 != n2 or kind != kind2 or (kind == "start" and not _same_fp(f1, f2)):
            return running[-1] if running else (n1, t1)
        if kind == "start":
            running.append((n1, t1))
            continue
        running.pop() if running else None
        if not _same_fp(f1, f2):
            return n1, t1
    return "", ""


def check_determinism(work, inputs, ck: Checklist) -> None:
    work.eval()
    outs, _ = _forwards(work, inputs, record=False)
    diff = max_diff(outs[0], outs[1])
    if diff == 0.0:
        ck.row("determinism", "ok", "two eval runs are bit-identical")
        return
    if _close(diff, outs[0]):
        ck.row("determinism", "ok", f"two eval forwards agree to {diff:.1e} (floating-point reduction order)")
        return
    parted, raised = _where_they_part(work, inputs)
    culprit, kind = parted or ("", "")
    what = "different outputs" + (f" (max abs difference {diff:.4g})" if diff not in (None, float("inf")) else "")
    kind = f" ({kind})" if kind else ""   # a review: "(root) (?)"
    message = (f"in eval mode the same input gives {what}; " + (
        f"{name(culprit)}{kind} is where they part: the first module whose output changes while its input does "
        "not, or whose own forward hands its calls different inputs" if parted is not None else
        f"a further eval forward raised ({raised}), so where they part was not located" if raised else
        f"the {2 * RECORDED_PAIRS} forwards after them agreed pair by pair, so where they part was not caught: the "
        "output changes now and then, or settled after the model's first calls (a cache, a count its forward keeps)"))
    try:
        drawn = _random_ops(work, inputs)
    except Exception:   # noqa: BLE001 - the finding stands without its kind of randomness (a review: a model raising
        drawn = set()    # from its 5th call on lost it here)
    sampling = bool(drawn) and drawn <= SAMPLING_OPS
    if sampling:   # a sampling model (a VAE) is not failed for it; a mask left on, or a state that moves, is
        message += (f"; the forward draws samples in eval ({', '.join(sorted(drawn))}): by design in a VAE's "
                     "reparameterisation or a masked autoencoder, a bug where the noise is meant for training")
    # no random op in a look at its forward, and no module named: a state its forward keeps, not randomness (a review:
    # the randomness hint beside a cache that had changed the output)
    hint = SAMPLING_HINT if sampling else STATE_HINT if not drawn and parted is None and not raised else RANDOM_EVAL_HINT
    ck.find("determinism", "nondeterministic-eval", "warning" if sampling else "error", name(culprit), message, hint,
            verdict=f"eval output changes between two runs: {name(culprit)}")


RECORDED_PAIRS = 3   # fingerprinted pairs of forwards at most, to catch where two outputs part


def _where_they_part(work, inputs) -> tuple[tuple[str, str] | None, str]:
    """((module, type) where two eval forwards part, or None, what a further forward raised, or ""), from every call
    fingerprinted (20x a plain forward on a big model, a perf review: paid only once two plain forwards differed),
    pair by pair until a pair differs (a second review: a model off on every 4th call was said to have settled). A
    forward that raises ends the search and is said: the finding stands unlocated (a third review: a model raising
    on its 5th call lost the determinism error it had shown)."""
    from ...errors import one_line

    for _ in range(RECORDED_PAIRS):
        try:
            outs, runs = _forwards(work, inputs, record=True)
        except Exception as exc:   # noqa: BLE001
            return None, one_line(exc)
        if not _close(max_diff(outs[0], outs[1]), outs[0]):
            return _culprit(*_read(runs)), ""
    return None, ""


def _forwards(work, inputs, record: bool) -> tuple[list, list]:
    """Two eval forwards on the same input: (their outputs, each one's CallRecorder events when `record`)."""
    import contextlib

    import torch

    outs, runs = [], []
    for _ in range(2):
        rec = CallRecorder(work) if record else None
        with torch.no_grad(), rec or contextlib.nullcontext():
            outs.append(run_forward(work, inputs, phase="forward (eval mode, determinism check)"))
        runs.append(rec.events if rec is not None else [])
    return outs, runs


def _close(diff, out) -> bool:
    """Equal, or apart by no more than floating-point reduction order (1e-6 of the output's scale)."""
    return diff is not None and diff <= 1e-6 * scale(out) + 1e-9


def _random_ops(work, inputs) -> set[str]:
    """The random ops a third eval forward calls: what kind of randomness the model has."""
    import torch

    from ...core.random_ops import drawn

    with torch.no_grad(), drawn() as ops:
        run_forward(work, inputs, phase="forward (eval mode, determinism check)")
    return ops
