"""device-mismatch (static): parameters and buffers spread over several devices."""
from __future__ import annotations

from .checklist import Checklist
from .shared import module_of, name


def check_device_spread(model, ck: Checklist) -> None:
    by_dev: dict[str, list[str]] = {}
    for named in (model.named_parameters(), model.named_buffers()):
        for n, t in named:
            by_dev.setdefault(str(t.device), []).append(n)
    if len(by_dev) <= 1:
        return
    main = max(by_dev, key=lambda d: len(by_dev[d]))
    spread = ", ".join(f"{d}: {len(v)}" for d, v in by_dev.items())
    for dev, names in by_dev.items():
        if dev == main:
            continue
        for m in sorted({module_of(n) for n in names}):
            own = [n.rpartition(".")[2] for n in names if module_of(n) == m]
            ck.suspects.add(m)
            ck.find("device", "device-mismatch", "error", name(m),
                    f"{', '.join(own)} on {dev} while most of the model is on {main} (tensors per device: {spread})",
                    "move the whole model at once with model.to(device); register tensors as buffers so .to() moves them",
                    verdict=f"parameters/buffers on several devices ({spread})")
