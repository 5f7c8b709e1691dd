"""core.saved: what a graph keeps for its backward, read without unpacking (no unpack hook, no recompute)."""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from torchdiag.core.saved import saved_bytes


def total(loss, own=()):
    return sum(s.total for s in saved_bytes(loss.grad_fn, own).values())


def test_each_storage_once_without_weights_or_inputs():
    for batch in (4, 16):
        model, x = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)), torch.randn(batch, 20)
        loss = nn.functional.mse_loss(model(x), torch.randn(batch, 5))
        # the ReLU's output (saved by it and by the second Linear: once), the output and the target the loss saves;
        # not x (given), nor the weights
        assert total(loss, [*model.parameters(), x]) == batch * (64 + 5 + 5) * 4
        # given nothing, the input and the second Linear's weight count too (the first one's is not saved: x needs
        # no gradient)
        assert total(loss) == batch * (64 + 5 + 5) * 4 + batch * 20 * 4 + 5 * 64 * 4


def test_a_checkpointed_block_is_not_recomputed_and_keeps_only_what_its_handle_holds():
    calls = []
    inner = nn.Sequential(nn.Linear(16, 256), nn.Tanh(), nn.Linear(256, 16))

    def block(t):
        calls.append(1)
        return inner(t)

    x = torch.randn(8, 16, requires_grad=True)
    loss = checkpoint(block, x, use_reentrant=False).pow(2).sum()
    measured = total(loss, [*inner.parameters(), x])
    assert calls == [1]                  # reading the saved tensors ran no recompute
    assert measured < 8 * 256 * 4        # the block's 8x256 activations are not kept: recomputed in backward
    loss.backward()
    assert calls == [1, 1] and x.grad is not None   # the backward recomputes once, as without the measurement


def test_an_offloading_hook_is_not_unpacked():
    """A pack hook that moves each tensor into a store and whose unpack takes it out (a second unpack raises): the
    measurement reads what the pack made, and the backward still finds every tensor."""
    store: dict = {}

    def pack(t):
        store[id(t)] = t.detach().clone()
        return ("offloaded", store[id(t)])

    def unpack(packed):
        key = next(k for k, v in store.items() if v is packed[1])
        return store.pop(key)

    lin = nn.Linear(32, 32)
    x = torch.randn(4, 32)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = lin(x).sigmoid().sum()
    n = len(store)
    measured = total(loss, [*lin.parameters(), x])
    assert len(store) == n and measured >= 4 * 32 * 4   # the sigmoid's output, as the hook stored it
    loss.backward()
    assert lin.weight.grad is not None and not store


def test_a_custom_functions_saved_tensors_count():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            big = t.repeat(1, 10)
            ctx.save_for_backward(big)
            return t * t

        @staticmethod
        def backward(ctx, g):
            (big,) = ctx.saved_tensors
            return 2 * big[:, : g.shape[1]] * g

    x = torch.randn(3, 7, requires_grad=True)
    loss = Square.apply(x).sum()
    assert total(loss, [x]) == 3 * 70 * 4


def test_floating_bytes_scale_to_a_copys_dtype_and_masks_do_not():
    x = torch.randn(8, 100)
    w = torch.randn(100, requires_grad=True)
    mask = torch.rand(8, 100) > 0.5
    loss = (x * w).masked_fill(mask, 0.0).sum()     # saves x (given), w (given) and the bool mask
    (row,) = saved_bytes(loss.grad_fn, [x, w]).values()
    assert row.total == 800 and row.floating == 0
    assert row.bytes_in(torch.float64) == 800       # a bool mask is not cast
    loss = (x * w).tanh().sum()                     # saves tanh's float32 output
    (row,) = saved_bytes(loss.grad_fn, [x, w]).values()
    assert row.total == row.floating == 3200 and row.bytes_in(torch.float64) == 6400
    assert row.bytes_in(torch.float16) == 1600 and row.bytes_in() == 3200


def test_after_backward_nothing_is_kept():
    lin = nn.Linear(8, 8)
    loss = lin(torch.randn(2, 8)).tanh().sum()
    loss.backward()
    assert total(loss, list(lin.parameters())) == 0


def _packed_bytes(model, x):
    """The independent count: every tensor autograd hands a pack hook during the forward, each storage once, the
    model's own tensors and the input left out."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), x]}
    seen: dict = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            seen[ptr] = t.untyped_storage().nbytes()
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).pow(2).mean()
    return loss, sum(seen.values())


def test_the_walk_matches_what_autograd_hands_a_pack_hook():
    torch.manual_seed(0)
    convs = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 8, 3), nn.GELU(), nn.Flatten(), nn.Dropout(0.1), nn.LazyLinear(10))
    convs(torch.randn(2, 3, 16, 16))
    attention = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    for model, x in ((convs, torch.randn(4, 3, 16, 16)), (attention, torch.randn(3, 12, 32))):
        model.train()
        loss, packed = _packed_bytes(model, x)
        assert packed > 0 and total(loss, [*model.parameters(), *model.buffers(), x]) == packed


def test_autocasts_weight_casts_are_not_charged_to_a_copy_run_without_autocast():
    """Under autocast each matmul saves a bfloat16 cast of its weight (autocast's weight cache): a new storage, so not
    the parameter's. A float64 copy run without autocast makes no such casts: charging them (as float64, four times
    their size) refused float64 re-checks that fit (a review: 1.9 GiB asked where 2 MiB were kept)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(4)])
    x = torch.randn(2, 256)
    with torch.autocast("cpu", torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    (row,) = saved_bytes(loss.grad_fn, [*model.parameters(), x], list(model.parameters())).values()
    assert row.casts == 0 and len(row.pending) == 3   # told apart only when a copy asks: no host sync before
    estimate = row.bytes_in(torch.float64)
    assert row.casts == 3 * 256 * 256 * 2   # the first Linear's is not kept: x needs no gradient
    double, xd = model.double(), x.double()
    (real,) = saved_bytes(double(xd).pow(2).mean().grad_fn, [*double.parameters(), xd]).values()
    assert real.total <= estimate <= 2 * real.total   # x's own bfloat16 cast is the difference
    assert row.bytes_in() == row.total     # a copy run as the pass was (under autocast) makes them too


def test_a_pack_hooks_nested_containers_are_read():
    lin = nn.Linear(32, 32)
    x = torch.randn(4, 32)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: {"where": "cpu", "held": (t.detach(),)},
                                                  lambda packed: packed["held"][0]):
        loss = lin(x).sigmoid().sum()
    assert total(loss, [*lin.parameters(), x]) == 4 * 32 * 4   # the sigmoid's output
    loss.backward()


def test_the_node_types_seen_are_not_kept_alive():
    """Node types are cached weakly: a custom Function made per call (or torch.compile's per graph) goes with it."""
    import gc
    import weakref

    def make():
        class Twice(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                ctx.save_for_backward(t)
                return 2 * t

            @staticmethod
            def backward(ctx, g):
                return 2 * g

        x = torch.randn(3, requires_grad=True)
        total(Twice.apply(x * 1).sum())
        return weakref.ref(Twice)

    gone = make()
    gc.collect()
    assert gone() is None


def test_each_diagnostic_sizes_its_copies_by_its_own_passes():
    """`check` runs several diagnostics on one context (or copies of it sharing the dict): gradflow's measurement
    sized overfit-batch's copies after it, which then failed where overfit-batch alone passed (a review)."""
    import types

    from torchdiag.api import run_spec
    from torchdiag.core.context import context_for
    from torchdiag.core.saved import Saved
    from torchdiag.runner.local import invoke

    model = nn.Linear(4, 2)
    ctx = context_for(model, run_spec("gradflow"))
    ctx.activations[torch.device("cpu")] = Saved(total=10**12)
    seen = []
    diagnostic = types.SimpleNamespace(run=lambda m, i, o, c: seen.append(dict(c.activations)) or
                                       types.SimpleNamespace(header={}, findings=[], ordered=True))
    invoke(diagnostic, model, None, None, ctx)
    assert seen == [{}]


def test_an_activation_of_a_weights_shape_is_not_taken_for_its_cast():
    """A batch of 512 through Linear(512, 512): each bfloat16 ReLU output has the weights' shape. Taken by shape
    alone for autocast's weight casts, they were left out of a float32 copy's activations (16 KiB asked where a
    float32 pass keeps 2 MiB, a review); a cast is now also checked to hold the weight's values."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU())
    x = torch.randn(512, 512)
    with torch.autocast("cpu", torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    (row,) = saved_bytes(loss.grad_fn, [*model.parameters(), x], list(model.parameters())).values()
    estimate = row.bytes_in(torch.float32)
    assert row.casts == 512 * 512 * 2   # the second Linear's weight cast (the first one's is not kept: x needs none)
    (real,) = saved_bytes(model(x).pow(2).mean().grad_fn, [*model.parameters(), x]).values()
    assert real.total <= estimate <= 2 * real.total


def test_gradflows_recheck_copies_run_without_autocast_are_asked_a_float32_passs_activations(monkeypatch):
    """Under --amp the judged pass keeps bfloat16 activations and weight casts; gradflow's re-check copies (the scale
    test, the float32 invariance re-check, the cut-batch comparison) run without autocast and keep float32 ones: they
    were asked the pass's figure (a review: 2.8 MB asked where a float32 pass keeps 4.2 MB)."""
    from types import SimpleNamespace

    from torchdiag.api import as_inputs, run_spec
    from torchdiag.core import train
    from torchdiag.core.context import context_for
    from torchdiag.diagnostics.gradflow.recheck import _copy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 16 * 16, 10))
    x = torch.randn(8, 3, 16, 16)
    ctx = context_for(model, run_spec("gradflow", amp="bf16"))
    with ctx.autocast():
        loss = model(x).float().pow(2).mean()
    ctx.saw_activations(loss, model, as_inputs(model, x))
    asked = []
    real = train.train_copy
    monkeypatch.setattr(train, "train_copy", lambda *a, **k: asked.append(k["activations"]) or real(*a, **k))
    _copy(model, SimpleNamespace(eval_mode=False), ctx)
    (real_pass,) = saved_bytes(model(x).pow(2).mean().grad_fn, [*model.parameters(), x]).values()
    (cpu,) = asked[0].values()
    assert real_pass.total <= cpu <= 1.5 * real_pass.total
