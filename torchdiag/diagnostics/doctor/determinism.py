"""nondeterministic-eval: two eval forwards on the same input differ. Per-call fingerprints name the
first module that turns equal inputs into different outputs."""
from __future__ import annotations

from ...core.tracking import ForwardHooks, run_forward
from .checklist import Checklist
from .shared import max_diff, name, scale, tensors

RANDOM_EVAL_HINT = ("randomness in eval: use self.training to gate it (F.dropout(x, p, training=self.training)), "
                    "no torch.rand/randn in forward outside training")


def _fingerprint(obj) -> list:
    """(sum, sum |x|) per tensor, kept on the device: read back only when a culprit is searched."""
    import torch

    vals = []
    for _, t in tensors(obj):
        if t.numel() == 0 or t.dtype == torch.bool:
            continue
        x = t.detach().double()
        vals += [x.nansum(), x.abs().nansum()]
    return vals


def _read(runs) -> list:
    """Both runs' call records with their fingerprints as floats: one host read per device."""
    from ...core.readback import read_back

    flat = [v for run in runs for (_, _, fin, fout) in run for v in (*fin, *fout)]
    values, out, i = read_back(flat), [], 0
    for run in runs:
        rows = []
        for n, t, fin, fout in run:
            a, b = values[i:i + len(fin)], values[i + len(fin):i + len(fin) + len(fout)]
            i += len(fin) + len(fout)
            rows.append((n, t, a, b))
        out.append(rows)
    return out


def _same_fp(a: list[float], b: list[float]) -> bool:
    if len(a) != len(b):
        return False
    for i in range(0, len(a), 2):
        s1, s2, m1, m2 = a[i], b[i], a[i + 1], b[i + 1]
        tol = max(abs(m1), abs(m2)) * 1e-6 + 1e-12
        if abs(s1 - s2) > tol or abs(m1 - m2) > tol:
            return False
    return True


class CallRecorder(ForwardHooks):
    pre_kwargs = True

    def __init__(self, model):
        super().__init__(model)
        self.done: list[tuple[str, str, list, list]] = []   # completion order
        self._stack: list = []

    def _pre(self, mod, args, kwargs):
        self._stack.append(_fingerprint((args, kwargs)))

    def _post(self, mod, args, output):
        fin = self._stack.pop() if self._stack else []
        self.done.append((self.names.get(id(mod), "?"), type(mod).__name__, fin, _fingerprint(output)))


def check_determinism(work, inputs, ck: Checklist) -> None:
    import torch

    work.eval()
    runs = []
    outs = []
    for _ in range(2):
        rec = CallRecorder(work)
        with torch.no_grad(), rec:
            outs.append(run_forward(work, inputs, phase="forward (eval mode, determinism check)"))
        runs.append(rec.done)
    diff = max_diff(outs[0], outs[1])
    if diff == 0.0:
        ck.row("determinism", "ok", "two eval runs are bit-identical")
        return
    if diff is not None and diff <= 1e-6 * scale(outs[0]) + 1e-9:
        ck.row("determinism", "ok", f"two eval forwards agree to {diff:.1e} (floating-point reduction order)")
        return
    culprit, kind = "", ""
    for (n1, t1, in1, o1), (n2, _t2, in2, o2) in zip(*_read(runs)):
        if n1 != n2 or (_same_fp(in1, in2) and not _same_fp(o1, o2)):
            culprit, kind = n1, t1
            break
    what = "different outputs" + (f" (max abs difference {diff:.4g})" if diff not in (None, float("inf")) else "")
    message = (f"in eval mode the same input gives {what}; {name(culprit)} ({kind or '?'}) is the first module "
               f"whose output changes while its input does not")
    ck.find("determinism", "nondeterministic-eval", "error", name(culprit), message, RANDOM_EVAL_HINT,
            verdict=f"eval output changes between two runs: {name(culprit)}")
