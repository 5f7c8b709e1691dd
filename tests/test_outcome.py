"""A GPU's own failure is the model's (exit 3) with a hint that says where to look, not "a bug in torchdiag"
(exit 4). CUDA reports an assert at the next call that syncs, which is often torchdiag's own code (measured on an
H200: a device-side assert surfaced as "internal error in torchdiag: AcceleratorError"). errors.device_failure tells
it by class name and message, through the chain of causes; runner/outcome.failed, core/tracking.forward_error and the
loss use it."""
import pytest
import torch

from torchdiag.errors import DEVICE_HINT, OOM_HINT, ExitCode, UsageError, device_failure
from torchdiag.runner.outcome import BUG_HINT, failed


def _raised_from(cause):
    try:
        try:
            raise cause
        except Exception as exc:
            raise ValueError("a wrapper's own words") from exc
    except ValueError as wrapped:
        return wrapped


KERNEL = [torch.AcceleratorError("CUDA error: device-side assert triggered"),
          RuntimeError("CUDA error: an illegal memory access was encountered\nmore"),
          RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"),
          RuntimeError("CUDA driver error: unknown error")]
OOM = [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
       RuntimeError("CUDA error: out of memory")]


@pytest.mark.parametrize("exc", KERNEL + [_raised_from(KERNEL[0])])
def test_a_cuda_kernel_failure_is_the_models_with_a_hint(exc):
    out = failed(exc)
    assert out.code == ExitCode.MODEL and out.hint == DEVICE_HINT
    assert out.message.startswith("a CUDA kernel failed: ") and "\n" not in out.message
    assert "--device cpu" in out.hint and "CUDA_LAUNCH_BLOCKING=1" in out.hint


@pytest.mark.parametrize("exc", OOM + [_raised_from(OOM[0])])
def test_running_out_of_gpu_memory_is_said_as_such(exc):
    out = failed(exc)
    assert out.code == ExitCode.MODEL and out.hint == OOM_HINT and out.message.startswith("out of GPU memory: ")


def _raised_while_handling(cause, exc, suppress=False):
    try:
        try:
            raise cause
        except Exception:
            if suppress:
                raise exc from None
            raise exc  # noqa: B904 - raised while handling it, on purpose
    except Exception as raised:
        return raised


@pytest.mark.parametrize("exc", [RuntimeError("shape mismatch: CUDA error later"), ValueError("CUDA error: no"),
                                 ValueError("CUDA out of memory, says a user's message"), KeyError("CUDA error"),
                                 # a review: a handler's own bug while an OOM was being handled is still ours
                                 _raised_while_handling(OOM[0], KeyError("missing")),
                                 _raised_while_handling(OOM[0], ValueError("batch too big"), suppress=True)])
def test_any_other_error_stays_a_bug_of_ours(exc):
    assert device_failure(exc) is None
    out = failed(exc)
    assert out.code == ExitCode.INTERNAL and out.hint == BUG_HINT


HOST_OOM = [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                                        "allocate memory: you tried to allocate 220463104 bytes. Error code 12")]


@pytest.mark.parametrize("exc", HOST_OOM)
def test_running_out_of_host_memory_is_one_line_not_a_bug_of_ours(exc):
    # a MemoryError past the size check (an estimate short of what a step took) said "internal error in torchdiag"
    out = failed(exc)
    assert out.code == ExitCode.MODEL and out.hint.startswith("the run needs more memory than the machine has")
    assert out.message.startswith("out of memory: ") and "\n" not in out.message
    assert failed(_raised_while_handling(HOST_OOM[0], KeyError("missing"))).code == ExitCode.INTERNAL


class QuotaError(MemoryError):
    pass


@pytest.mark.parametrize("exc", [_raised_from(HOST_OOM[0]), QuotaError("licence seat quota exceeded"),
                                 ValueError("plugin says: can't allocate memory pool 'gpu0' (not configured)")])
def test_what_only_mentions_memory_is_not_the_host_running_out(exc):
    # a review: our own error raised over a MemoryError, a library's MemoryError subclass for a quota, and words
    # about memory were "out of memory" (exit 3, the hint to shrink the run): a bug of ours stays one
    assert failed(exc).code == ExitCode.INTERNAL


def test_our_own_usage_error_keeps_its_code():
    assert failed(UsageError("bad option")).code == ExitCode.USAGE


RAISES_IN_FORWARD = """import torch
from torch import nn
class Boom(nn.Module):
    def forward(self, x):
        raise torch.{cls}("{text}")
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.boom = Boom()
    def forward(self, x):
        return self.boom(self.lin(x))
def build():
    return Net()
"""


@pytest.mark.parametrize("cls,text,start,hint", [
    ("AcceleratorError", "CUDA error: device-side assert triggered", "a CUDA kernel failed (surfaced in forward, at boom (Boom))", DEVICE_HINT),
    ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 1.00 GiB", "out of GPU memory (surfaced in forward, at boom (Boom))", OOM_HINT)])
def test_a_gpu_failure_in_the_forward_says_where_it_surfaced(cli, tmp_path, cls, text, start, hint):
    (tmp_path / "gpu_boom.py").write_text(RAISES_IN_FORWARD.format(cls=cls, text=text))
    r = cli("summary", f"{tmp_path / 'gpu_boom.py'}:build", "-i", "2x4", "--device", "cpu", "--json")
    assert r.code == 3, r.stderr
    err = r.json["error"]
    assert err["message"].startswith(start) and text in err["message"] and err["hint"] == hint


FALLBACK = """import torch
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(32, 4)
    def forward(self, x):
        h = self.a(x)
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        except torch.OutOfMemoryError:
            return self.b(h)          # the fallback's own shape bug
def build():
    return Net()
"""

BACKWARD_OOM = """import torch
from torch import nn
class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1
    @staticmethod
    def backward(ctx, g):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB")
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)
    def forward(self, x):
        return Boom.apply(self.a(x))
def build():
    return Net()
"""


def test_an_error_in_a_fallback_after_a_gpu_failure_is_the_fallbacks(cli, tmp_path):
    (tmp_path / "fallback.py").write_text(FALLBACK)
    r = cli("summary", f"{tmp_path / 'fallback.py'}:build", "-i", "2x8", "--device", "cpu", "--json")
    assert r.code == 3, r.stderr
    err = r.json["error"]
    assert err["message"].startswith("forward failed in b (Linear) with input shapes (2x16)") and err["hint"] != OOM_HINT


def test_running_out_of_memory_in_backward_says_so(cli, tmp_path):
    (tmp_path / "bwd.py").write_text(BACKWARD_OOM)
    r = cli("gradflow", f"{tmp_path / 'bwd.py'}:build", "-i", "2x8", "--device", "cpu", "--json")
    assert r.code == 3, r.stderr
    err = r.json["error"]
    assert err["message"].startswith("out of GPU memory (surfaced in backward): OutOfMemoryError") and err["hint"] == OOM_HINT


def test_a_failure_names_input_shapes_only_where_they_were_recorded():
    """nancheck's recorded pass keeps no shapes: its message said "with input shapes ()" (the zoo's dia, tvp)."""
    import torch
    from torch import nn

    from torchdiag.core.tracking import ModuleTracker, forward_error

    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(16, 2))
    for record, said in ((True, "forward failed in 1 (Linear) with input shapes (3x8): "),
                         (False, "forward failed in 1 (Linear): ")):
        tracker = ModuleTracker(model, record_shapes=record)
        try:
            with tracker:
                model(torch.randn(3, 4))
        except RuntimeError as exc:
            assert forward_error(exc, tracker).message.startswith(said)
        else:
            raise AssertionError("the forward should fail")


class _Bags(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.EmbeddingBag(50, 4)

    def forward(self, ids, offsets):
        return self.emb(ids, offsets)


def test_a_module_given_integers_alone_names_no_input_shapes_in_nancheck():
    """A new user's EmbeddingBag refused its offsets under nancheck: "with input shapes ()", where nancheck's pass
    records floating inputs only and the module had two integer ones."""
    from torchdiag.api import run as api_run
    from torchdiag.errors import ModelError

    with pytest.raises(ModelError) as exc:
        api_run("nancheck", _Bags(), (torch.randint(0, 50, (12,)), torch.tensor([3, 6, 9])))
    assert exc.value.message.startswith("forward failed in emb (EmbeddingBag): "), exc.value.message


class _RefusedAllocation(torch.nn.Module):
    """A forward the CPU allocator refuses half-way (efficientnet_b7's nancheck at 3x600x600 under the zoo's 14 GiB
    address-space cap): the message, not a fault of the model's code."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.lin(x)
        raise HOST_OOM[1]


def test_a_forward_the_allocator_refuses_is_out_of_memory_with_the_memory_hint(cli, tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from tests.test_outcome import _RefusedAllocation\n\ndef model():\n    return _RefusedAllocation()\n")
    for cmd in ("nancheck", "summary"):
        r = cli(cmd, f"{f}:model", "-i", "2x4")
        assert r.code == ExitCode.MODEL, r.stderr
        assert "out of memory: forward failed in (root)" in r.stderr and "can't allocate memory" in r.stderr, r.stderr
        assert "the run needs more memory than the machine has" in r.stderr
        assert "the model's own code raised" not in r.stderr
