"""runner/outcome.failed, the ladder from an exception to an exit code: a CUDA kernel's failure is the model's
(exit 3) with a hint that says where to look, not "a bug in torchdiag" (exit 4). CUDA reports an assert at the next
call that syncs, which is often torchdiag's own code (measured on an H200: a device-side assert surfaced as
"internal error in torchdiag: AcceleratorError")."""
import pytest
import torch

from torchdiag.errors import ExitCode
from torchdiag.runner.outcome import BUG_HINT, DEVICE_HINT, failed


@pytest.mark.parametrize("exc", [torch.AcceleratorError("CUDA error: device-side assert triggered"),
                                 RuntimeError("CUDA error: an illegal memory access was encountered\nmore")])
def test_a_cuda_kernel_failure_is_the_models_with_a_hint(exc):
    out = failed(exc)
    assert out.code == ExitCode.MODEL and out.hint == DEVICE_HINT
    assert out.message.startswith("a CUDA kernel failed: ") and "CUDA error" in out.message and "\n" not in out.message
    assert "--device cpu" in out.hint and "CUDA_LAUNCH_BLOCKING=1" in out.hint


@pytest.mark.parametrize("exc", [RuntimeError("shape mismatch: CUDA error later"), ValueError("CUDA error: no")])
def test_any_other_error_stays_a_bug_of_ours(exc):
    out = failed(exc)
    assert out.code == ExitCode.INTERNAL and out.hint == BUG_HINT
