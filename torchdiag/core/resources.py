"""How much memory a size the user asked for may take, checked before anything is allocated."""
from __future__ import annotations

import os
from typing import Any

from ..errors import ModelError, one_line

MAX_WORK_BYTES = 16 * 2**30   # more than this for one input or picture is a typo, not a test batch


def memory_limit() -> int:
    """MAX_WORK_BYTES, or less when the machine has less memory available now."""
    free = host_available()
    return MAX_WORK_BYTES if free is None else min(MAX_WORK_BYTES, free)


def host_available(swap: bool = False, share: int = 1) -> int | None:
    """Bytes of host memory available now (MemAvailable, with SwapFree where `swap`: a build that swaps is slow, not
    killed), or less where the process's address space is capped (ulimit -v, prlimit --as) or its container's
    memory is (a cgroup's limit less its usage: the OOM killer acts there first); None when the system does not say.
    `share`: the processes that will fill the host's memory at once (torchrun's ranks on this host), each given
    its part of it (the address space is each one's own)."""
    free = _mem_available()
    if free is not None and swap:
        free += _meminfo("SwapFree:") or 0
    shared = [c // share for c in (free, _cgroup_left()) if c is not None]
    caps = [c for c in (*shared, _address_space_left()) if c is not None]
    return min(caps) if caps else None


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_left() -> int | None:
    """The memory limit of this process's cgroup less its usage (v2 memory.max, v1 memory.limit_in_bytes); None
    where there is no limit (v1 writes "no limit" as a number near 2**63) or none is readable."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f:
                cap = f.read().strip()
            if cap == "max" or int(cap) >= 2**60:
                return None
            with open(usage) as f:
                return max(int(cap) - int(f.read().strip()), 0)
        except (OSError, ValueError):
            continue
    return None


def _mem_available() -> int | None:
    free = _meminfo("MemAvailable:")
    if free is not None:
        return free
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_left() -> int | None:
    """RLIMIT_AS less the process's virtual size now (VmSize), plus what the C allocator holds free inside that size
    (_allocator_free): a tensor freed stays mapped in malloc's heap, counted in VmSize, and the next allocations reuse
    it (under the zoo's 14 GiB cap a pass's 6 GB of freed activations left 4 GB "free" and refused efficientnet_b6's
    re-checks, which had run). None when uncapped or not known. Under a cap, taking too much raises MemoryError, which
    the callers catch: the OOM killer is not what an over-estimate here meets."""
    try:
        import resource

        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
        if cap == resource.RLIM_INFINITY or cap < 0:
            return None
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(cap - int(line.split()[1]) * 1024, 0) + _allocator_free()
    except (ImportError, OSError, ValueError, IndexError, AttributeError):
        pass
    return None


def _allocator_free() -> int:
    """Bytes glibc's malloc holds free in its main arena (mallinfo2's fordblks, glibc 2.33+); 0 where not known."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        info = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return 0
    info.restype = MallInfo2
    return int(info().fordblks)


def device_available(device, swap: bool = False) -> int | None:
    """Bytes free now on `device` (a torch.device): the host's for the CPU (its free swap too where `swap`; under
    torchrun this rank's part of it, shared with the other ranks on the host); for a
    CUDA device the driver's free memory plus what torch's caching allocator holds reserved but unused (it hands
    that out first); None where that is not known (mps, meta, an error)."""
    import torch

    if device.type == "cpu":   # under torchrun every rank on this host builds and runs its own copy at once
        from .distributed import current

        ranks = current()
        return host_available(swap, ranks.local_world if ranks is not None else 1)
    if device.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(device)
            cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return int(free) + max(int(cached), 0)
        except Exception:
            return None
    return None


def too_big_hint(spec: str) -> str:
    smaller = ("a smaller config: fewer layers or a smaller width in its config.json (--arg sets a top-level value, "
               "e.g. --arg num_hidden_layers=2; a composite model's sizes are in its sub-configs)"
               if spec.startswith("hf:") else "a smaller one with --arg where its builder takes a size")
    return f"--device meta builds it without allocating the weights (summary, flops and memory run there); or build {smaller}"


def takes_grad(p) -> bool:
    """A parameter backward gives a gradient of its own size: trainable, floating or complex (what the room checks
    count as gradients and optimizer state)."""
    return p.requires_grad and (p.is_floating_point() or p.is_complex())


def sparse_grads(model) -> set[int]:
    """ids of the weights only nn.Embedding/EmbeddingBag modules made with sparse=True read: backward gives them a
    sparse gradient holding the rows a batch looks up, its size the batch's, not the table's (a recommender's
    50 M-row table would be asked 12.8 GB of gradients it never gets). A weight another module reads too (a tied
    head) gets a dense one and is not among them; one a forward reads itself (`F.linear(h, emb.weight)`) is not seen
    until a pass runs, and is counted as sparse."""
    import torch

    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    readers: dict = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                readers.setdefault(id(p), []).append(isinstance(m, kinds) and m.sparse)
    return {i for i, sparse in readers.items() if all(sparse)}


def room_for_model(model, label: str, device, run=None) -> None:
    """`model`, built on meta with the builder the real build will use, is refused before that build when what the run
    needs does not fit in the memory available (ModelError, exit 3 as for a copy that does not fit or a run out of
    memory, one line naming the model, its parameters, the
    bytes needed and the bytes available), instead of the kernel's OOM killer ending the process with no line.

    The weights are built on the CPU at the dtype the builder makes (--dtype casts them after), then moved to
    `device`; `run` (a core.run.RunSpec) adds what its command always needs beside them there, at its --dtype (the
    registry's `trains`: gradients for "backward"; a copy, its gradients and the optimizer's state for "step"; memory
    and profile choose with --mode, and the copies commands make now and then are checked when made,
    core.train.room_for_copy). Where the free memory is not known (mps), nothing is refused."""
    import torch

    from ..commands import BY_NAME
    from ..fmt import bytes_apart, human_bytes

    params = list(model.parameters())
    tensors = params + list(model.buffers())
    run_dtype = getattr(torch, run.dtype) if run is not None and run.dtype else None

    def nbytes(ts, dtype=None) -> int:
        return sum(t.numel() * (dtype.itemsize if dtype is not None and t.is_floating_point() else t.element_size())
                   for t in ts)

    built = nbytes(tensors)
    held = nbytes(tensors, run_dtype)   # after --dtype
    parts: list[tuple[str, int]] = []   # what the command adds on the device: (what, bytes)
    command = getattr(run, "command", "")
    trains = getattr(run, "trains", None) or (BY_NAME[command].trains if command in BY_NAME else None)
    from .loading import DENSE_GRAD_COMMANDS

    # a sparse embedding's gradient holds a batch's rows, unless the command makes it dense first (loading.prepare)
    sparse = sparse_grads(model) if command not in DENSE_GRAD_COMMANDS else set()
    grads = nbytes([p for p in params if takes_grad(p) and id(p) not in sparse], run_dtype)
    if trains == "step":   # the copy trains, not the model: the gradients and the state are the copy's
        optimizer = run.optimizer
        parts += [("a copy to train", held), ("its gradients", grads)]
        if optimizer.states:
            parts.append((f"{optimizer.name} state", optimizer.states * grads))
    elif trains == "backward":
        parts.append(("gradients", grads))
    extra = sum(n for _, n in parts)
    count = sum(p.numel() for p in params)
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in params if t.is_floating_point()}) or ["no float"]
    cpu = torch.device("cpu")
    needs: list[tuple[Any, int, list[tuple[str, int]]]] = [(cpu, built, [])] if device.type != "cpu" else []
    needs.append((device, max(built, held + extra), parts if held + extra > built else []))
    for where, need, what in needs:
        free = device_available(where, swap=True)
        if free is None or need <= free:
            continue
        held_what = "weights and buffers" if len(tensors) > len(params) else "weights"   # buffers: BatchNorm's stats
        detail = f"{human_bytes(built)} of {'/'.join(dtypes)} {held_what}"
        if what:
            cast = f" ({run.dtype})" if run_dtype is not None else ""
            detail = (f"the {held_what} {human_bytes(held)}{cast}, "
                      + ", ".join(f"{w} {human_bytes(n)}" for w, n in what) + f" for {command}")
        total, left = bytes_apart(need, free)
        raise ModelError(f"{label} is too big for the memory here: {count:,} parameters need {total} on "
                         f"{where} ({detail}), {left} is available there", hint=too_big_hint(label))


def ran_out_building(spec: str, exc: BaseException) -> ModelError:
    """The one line (exit 3) for a build that ran out of memory anyway (a factory file.py:build, which is not built
    twice to size it, or a build that took more than its tensors): the model is too big here, not a bug in its code."""
    return ModelError(f"{spec} ran out of memory while it was built: {one_line(exc)}", hint=too_big_hint(spec))
