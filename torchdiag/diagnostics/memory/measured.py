"""The step measured on the real device, on a copy of the model (tensor-level; on CUDA the caching
allocator's own peaks too, and its allocation history when asked)."""
from __future__ import annotations

from ...core.precision import cast_model
from .step import StepReport, run_step


def cast_inputs(inputs, dtype):
    if dtype is None:
        return inputs
    return inputs.map(lambda t: t.to(dtype) if t.is_floating_point() else t)


def measure(model, inputs, opts, ctx) -> StepReport:
    import torch

    device = ctx.device
    dtype = getattr(torch, ctx.spec.dtype) if ctx.spec.dtype else None
    cuda = ctx.on_cuda
    history = cuda and opts.snapshot
    if cuda:
        with torch.cuda.device(device):
            # the cuBLAS handle and its workspace (allocator memory, kept for the process) exist
            # before `base`, so a first matmul in the step does not count them as step memory
            torch.cuda.current_blas_handle()
        torch.cuda.synchronize(device)
        if history:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        # run_step sets train/eval itself; the room is asked at --dtype, with the step's gradients and state
        work = ctx.train_copy(model, "to measure a step on it", dtype, steps=opts.mode == "train")
        if dtype is not None:   # complex parameters kept complex (Module.to would drop their imaginary part)
            work = cast_model(work, ctx.spec.dtype)
        ins = cast_inputs(inputs.clone(), dtype)
        report = run_step(work, ins, opts, ctx, emulate=device.type, round_to=512 if cuda else 1,
                          method=f"measured on {device} (tensor-level{', CUDA allocator' if cuda else ''})", real=True)
        if cuda:
            report.cuda = _allocator(device, base)
            if history:
                import pickle

                # what torch.cuda.memory._dump_snapshot writes, kept as bytes: render/memory.py writes the file
                report.snapshot = pickle.dumps(torch.cuda.memory._snapshot())
        del work, ins
        return report
    finally:
        if history:
            torch.cuda.memory._record_memory_history(enabled=None)


def _allocator(device, base: int) -> dict:
    import torch

    torch.cuda.synchronize(device)
    return {
        "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
        "step_peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device) - base),
        "total_bytes": int(torch.cuda.get_device_properties(device).total_memory),
        "memory_summary": torch.cuda.memory_summary(device, abbreviated=True),
    }
