"""flops: closed-form counts for Linear, Conv2d, matmul and attention; CPU == meta; published tables."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchdiag.api import run as api_run
from torchdiag.core.inputs import ModelInputs

from support import load, sample


def count(model, *args, backward=False, **kw):
    return api_run("flops", model, ModelInputs(tuple(args)), backward=backward, loss="sum", **kw)


def test_linear_closed_form(untouched):
    model = nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 5))
    x = torch.randn(8, 20)
    with untouched(model):
        r = count(model, x)
    macs = 8 * (20 * 30 + 30 * 5)
    assert r.data["forward_macs"] == macs and r.data["forward_flops"] == 2 * macs
    mods = {row["name"]: row["flops"] for row in r.table("modules").rows}
    assert mods == {"0": 2 * 8 * 20 * 30, "1": 0, "2": 2 * 8 * 30 * 5}


def test_the_header_says_the_count_is_of_eval_mode():
    # a Dropout model: train mode would draw masks; the count is eval's, and the header says so (a user asked)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)).train()
    r = count(model, torch.randn(3, 4))
    assert r.header["mode"].startswith("eval") and model.training


def test_linear_counts_sequence_dimension():
    # torchinfo 1.8.0 ignores the sequence dim for Linear; the truth includes it
    r = count(nn.Linear(16, 32), torch.randn(2, 50, 16))
    assert r.data["forward_macs"] == 2 * 50 * 16 * 32


def test_conv2d_closed_form():
    conv = nn.Conv2d(3, 8, kernel_size=3, stride=2, padding=1)
    r = count(conv, torch.randn(4, 3, 32, 32))
    h = w = 16
    assert r.data["forward_macs"] == 4 * 8 * h * w * 3 * 3 * 3


class MatMul(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def test_matmul_closed_form():
    r = count(MatMul(), torch.randn(3, 7, 11), torch.randn(11, 5))
    assert r.data["forward_macs"] == 3 * 7 * 11 * 5


class SDPA(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_attention_closed_form_on_cpu_and_meta(device):
    b, h, length, s, d = 2, 4, 9, 13, 8
    q, k, v = (torch.randn(b, h, n, d, device=device) for n in (length, s, s))
    r = count(SDPA(), q, k, v)
    # QK^T and AV: two batched matmuls of B*H*L*S*d MACs each
    assert r.data["forward_macs"] == 2 * b * h * length * s * d


def test_cpu_equals_meta_for_transformers_including_backward():
    for name in ("transformer_lm.py:build", "vit.py:build"):
        results = {}
        for device in ("cpu", "meta"):
            model, inputs = load(name, device=device)
            r = api_run("flops", model, inputs, backward=True, loss="sum")
            results[device] = (r.data["forward_flops"], r.data["backward_flops"])
        assert results["cpu"] == results["meta"], name
        assert results["cpu"][1] > results["cpu"][0]


def test_multihead_attention_fast_path_is_counted():
    dim, heads, b, t = 32, 4, 2, 10
    mha = nn.MultiheadAttention(dim, heads, batch_first=True).eval()

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    r = count(Wrap(), torch.randn(b, t, dim))
    proj = b * t * dim * 3 * dim + b * t * dim * dim
    attn = 2 * b * t * t * dim
    assert r.data["forward_macs"] == proj + attn
    assert torch.backends.mha.get_fastpath_enabled()  # restored


def test_backward_is_measured_twice_forward_for_linear():
    # dL/dW and dL/dX: two matmuls of the forward's size (the first layer needs no dX)
    model = nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 3))
    r = count(model, torch.randn(4, 10), backward=True)
    assert r.data["backward_macs"] == 4 * 10 * 20 + 2 * 4 * 20 * 3


def test_published_tables_resnet50_and_vit_b16():
    model, _ = load("resnet.py:resnet50", device="meta")
    r = count(model, torch.empty(1, 3, 224, 224, device="meta"))
    assert round(r.data["forward_macs"] / 1e9, 3) == 4.089
    model, _ = load("vit.py:vit_b_16", device="meta")
    r = count(model, torch.empty(1, 3, 224, 224, device="meta"))
    assert round(r.data["forward_macs"] / 1e9, 3) == 17.564


def test_7b_llama_hand_count_on_meta():
    model, _ = load("llama.py:build", "size='7b'", device="meta")
    t, dim, hidden, layers, vocab = 128, 4096, 11008, 32, 32000
    r = count(model, torch.empty(1, t, dtype=torch.int64, device="meta"))
    per_token = layers * (4 * dim * dim + 3 * dim * hidden) + dim * vocab
    attention = layers * 2 * t * t * dim
    assert r.data["forward_macs"] == t * per_token + attention


def test_uncounted_ops_listed_with_calls():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.LayerNorm(4))
    r = count(model, torch.randn(2, 4))
    unc = {row["op"].split(".")[0]: row for row in r.table("uncounted_ops").rows}
    assert unc["relu"]["calls"] == 1 and unc["native_layer_norm"]["calls"] == 1
    assert unc["relu"]["kind"] == "not counted by convention"
    # torchdiag's own copy of the input (kept for a forward that writes into it) is not the model's op (a sweep:
    # detach and clone were listed for a model that calls neither); the ops a dispatch mode sees are
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    ops: set = set()
    with Seen(), torch.no_grad():
        model.eval()(torch.randn(2, 4))
    assert set(unc) <= ops, (set(unc) - ops)


class _Experts(nn.Module):
    """Three experts' weights applied to their rows of the batch with one grouped matmul (a MoE layer's core)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 8, 4))
        self.register_buffer("offs", torch.tensor([4, 8, 16], dtype=torch.int32))

    def forward(self, x):
        return torch._grouped_mm(x, self.w, offs=self.offs)


def test_grouped_matmul_closed_form():
    """Rows 0:4, 4:8, 8:16 through experts 0, 1, 2: 16 rows of an 8x4 matmul, however they are grouped."""
    r = count(_Experts(), torch.randn(16, 8))
    assert r.data["forward_macs"] == 16 * 8 * 4
    assert "unsupported-op" not in {f.code for f in r.findings}


def test_matrix_vector_products_counted_and_matrix_functions_warned():
    """A sweep: spectral_norm's power iteration (mv, vdot), an orthogonal parametrisation's matrix_exp and FFTs were
    'not counted by convention', with no warning. mv/vdot/dot and FFTs now have formulas; matrix functions,
    compute with none, are unsupported-op."""
    from torch.nn.utils import parametrizations

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    parametrizations.spectral_norm(model[0])
    r = count(model, torch.randn(4, 8))
    # sigma = u · (W v): one (16x8)@8 mv and one 16-long vdot, besides the two Linears
    assert r.data["forward_macs"] == 4 * (8 * 16 + 16 * 4) + 16 * 8 + 16
    assert "unsupported-op" not in {f.code for f in r.findings}
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    parametrizations.orthogonal(model[0])
    ops = {f.where for f in count(model, torch.randn(4, 8)).findings if f.code == "unsupported-op"}
    assert any("matrix_exp" in o for o in ops), ops
    # FFTs by FFTW's convention: 5·n·log2(n) FLOPs for n complex points, half that for real data
    r = count(lambda_module(lambda x: torch.fft.irfft(torch.fft.fft(torch.fft.rfft(x)), n=16)), torch.randn(2, 16))
    assert "unsupported-op" not in {f.code for f in r.findings}
    assert r.data["forward_flops"] == 2 * (2.5 * 16 * 4) + 2 * (5 * 9 * math.log2(9)) // 1 + 2 * (2.5 * 16 * 4)


def test_a_triangular_solve_counts_its_substitution():
    """A zoo row (OLMo-Hybrid's gated delta net: `linalg.solve_triangular`, unitriangular) warned unsupported-op. Row
    i of a substitution takes i-1 multiplies, i-1 subtractions and a division (none on a unit diagonal), per
    right-hand side: counted here row by row, not from the formula."""
    n, k, batch = 8, 5, 3
    per_rhs = sum(2 * (i - 1) + 1 for i in range(1, n + 1))
    per_rhs_unit = sum(2 * (i - 1) for i in range(1, n + 1))
    a = torch.randn(batch, n, n).tril() + 3 * torch.eye(n)

    def solves(b):
        return (torch.linalg.solve_triangular(a, b, upper=False)
                + torch.linalg.solve_triangular(a, b.transpose(-1, -2), upper=False, left=False).transpose(-1, -2)
                + torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True))
    r = count(lambda_module(solves), torch.randn(batch, n, k))
    assert "unsupported-op" not in {f.code for f in r.findings}
    assert r.data["forward_flops"] == batch * k * (2 * per_rhs + per_rhs_unit)


def test_scatter_and_index_adds_are_arithmetic_not_data_movement():
    """A sweep: a GNN's message passing (index_add_, scatter_add_, scatter_reduce) was listed as data movement."""
    def passing(x):
        dst = torch.tensor([0, 1, 1, 2])
        out = torch.zeros(3, 4).index_add_(0, dst, x)
        return out + torch.zeros(3, 4).scatter_add_(0, dst[:, None].expand(-1, 4), x) \
            + torch.zeros(3, 4).scatter_reduce(0, dst[:, None].expand(-1, 4), x, "amax")
    kinds = {row["op"].split(".")[0]: row["kind"] for row in count(lambda_module(passing), torch.randn(4, 4))
             .table("uncounted_ops").rows}
    assert {kinds[k] for k in ("index_add_", "scatter_add_", "scatter_reduce")} == {"not counted by convention"}, kinds


def lambda_module(fn):
    class Fn(nn.Module):
        def forward(self, x):
            return fn(x)
    return Fn()


def test_interpolation_is_pointwise_not_a_missing_formula():
    """upsample_bilinear2d is named like a matmul (`linear`) but is per-element arithmetic: listed, not warned."""
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Upsample(scale_factor=2, mode="bilinear"))
    r = count(model, torch.randn(1, 3, 8, 8))
    unc = {row["op"].split(".")[0]: row for row in r.table("uncounted_ops").rows}
    assert unc["upsample_bilinear2d"]["kind"] == "not counted by convention"
    assert "unsupported-op" not in {f.code for f in r.findings}
    assert r.data["forward_macs"] == 4 * 3 * 8 * 8


def test_a_running_max_is_a_scan_not_a_matrix_product():
    """cummax/cummin hold `mm` in their names: they were taken for a matrix product without a formula and warned on
    Grounding DINO (a zoo row). A scan compares neighbours, per element, as cumsum adds them: listed, not warned."""
    model = nn.Sequential(nn.Linear(8, 8), lambda_module(lambda x: torch.cummax(x, 1).values + torch.cummin(x, 1).values))
    r = count(model, torch.randn(2, 8))
    unc = {row["op"].split(".")[0]: row["kind"] for row in r.table("uncounted_ops").rows}
    assert unc["cummax"] == unc["cummin"] == "not counted by convention", unc
    assert "unsupported-op" not in {f.code for f in r.findings}
    assert r.data["forward_macs"] == 8 * 8 * 2


def test_fvcore_engine_reports_macs_and_unsupported(cli):
    res = cli("flops", sample("cnn.py:build"), "-i", "1x3x32x32", "--engine", "fvcore", "--json")
    assert res.code == 0, res.stderr
    doc = res.json
    conv = 16 * 32 * 32 * 3 * 9 + 32 * 16 * 16 * 16 * 9
    fc = 32 * 8 * 8 * 10
    assert doc["engine"] == "fvcore" and doc["forward_macs"] == conv + fc
    assert doc["forward_flops"] == 2 * doc["forward_macs"]
    torch_doc = cli("flops", sample("cnn.py:build"), "-i", "1x3x32x32", "--json").json
    assert torch_doc["forward_macs"] == conv + fc


@pytest.mark.slow
@pytest.mark.subprocess
def test_fvcore_engine_lets_no_import_warning_through():
    """A hostile review: fvcore's import warns that torch.jit.script is deprecated, printed raw on stderr (its code,
    not the user's model). A fresh process, since the import warns once."""
    import subprocess
    import sys

    from support import ROOT

    out = subprocess.run([sys.executable, "-W", "default", "-m", "torchdiag", "flops", "sample_models/cnn.py:build",
                          "--engine", "fvcore", "--device", "cpu", "--json"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "Warning" not in out.stderr, out.stderr


def test_fvcore_cannot_trace_dict_kwargs_model(cli):
    res = cli("flops", sample("transformer_lm.py:build"), "--engine", "fvcore")
    assert res.code == 2 and "keyword inputs" in res.stderr


def test_cli_json_keys(cli):
    res = cli("flops", sample("mlp.py:build"), "--backward", "--json")
    assert res.code == 0, res.stderr
    doc = res.json
    for key in ("engine", "forward_flops", "forward_macs", "backward_flops", "modules", "operators", "uncounted_ops"):
        assert key in doc
    assert doc["loss"].startswith("cross_entropy")
    assert {"op", "flops", "calls"} <= set(doc["operators"][0])
    assert cli("flops", sample("mlp.py:build"), "--json").json["backward_flops"] is None


def test_fvcore_on_a_model_that_raises_is_exit_3(cli):
    res = cli("flops", sample("broken_shape.py:build"), "--engine", "fvcore")
    assert res.code == 3 and "forward failed in 2.0 (Linear)" in res.stderr


class LSTMThenGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2)
        self.gru = nn.GRU(16, 12, batch_first=True, bidirectional=True)

    def forward(self, x):           # x: T x B x 8
        out, _ = self.lstm(x)
        out, _ = self.gru(out.transpose(0, 1))
        return out


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_lstm_and_gru_closed_form_on_cpu_and_meta(device):
    # On CPU nn.LSTM runs as one oneDNN kernel (mkldnn_rnn_layer) that torch's counter has no
    # formula for: the LSTM counted ~0 there while meta counted its matmuls.
    t, b = 6, 3
    with torch.device(device):
        model = LSTMThenGRU()
    r = count(model, torch.randn(t, b, 8, device=device), backward=True)
    tokens = t * b
    lstm = tokens * ((8 * 4 * 16 + 16 * 4 * 16) + (16 * 4 * 16 + 16 * 4 * 16))  # two layers, 4 gates
    gru = 2 * tokens * (16 * 3 * 12 + 12 * 3 * 12)                               # two directions, 3 gates
    assert r.data["forward_macs"] == lstm + gru
    mods = {row["name"]: row["macs"] for row in r.table("modules").rows}
    assert mods == {"lstm": lstm, "gru": gru}
    assert not [u for u in r.table("uncounted_ops").rows if u["kind"].startswith("COMPUTE")]
    assert torch._C._get_mkldnn_enabled() and torch._C._get_cudnn_enabled()  # restored


@pytest.mark.slow
def test_rnn_backward_same_on_cpu_and_meta():
    results = {}
    for device in ("cpu", "meta"):
        model, inputs = load("rnn.py:build", device=device)
        r = api_run("flops", model, inputs, backward=True, loss="sum")
        results[device] = (r.data["forward_flops"], r.data["backward_flops"])
    assert results["cpu"] == results["meta"] and results["cpu"][1] > results["cpu"][0]


@pytest.mark.parametrize("args, words", [
    (["--engine", "bogus"], "--engine: 'bogus' is not one of torch, fvcore"),
    (["--engine", "fvcore", "--backward"], "--engine: fvcore counts the forward pass only"),
])
def test_engine_option_errors_come_before_loading(cli, args, words):
    # the spec does not exist: the option error must be reported first, without importing anything
    res = cli("flops", sample("nothere.py:build"), *args)
    assert res.code == 2 and res.stderr.startswith(f"error: {words}")


def test_transformer_encoder_layer_fast_path_is_counted_on_cpu():
    # eval + no_grad: nn.TransformerEncoderLayer would run as one fused kernel
    # (_transformer_encoder_layer_fwd) that hides every matmul from the counter
    dim, heads, ffn, b, t = 32, 4, 64, 2, 10
    layer = nn.TransformerEncoderLayer(dim, heads, ffn, batch_first=True).eval()
    r = count(layer, torch.randn(b, t, dim))
    proj = b * t * (3 * dim * dim + dim * dim)
    attn = 2 * b * t * t * dim
    mlp = b * t * 2 * dim * ffn
    assert r.data["forward_macs"] == proj + attn + mlp
    assert torch.backends.mha.get_fastpath_enabled()  # restored


@pytest.mark.parametrize("kw, name, words", [
    (dict(engine="bogus"), "engine", "'bogus' is not one of torch, fvcore"),
    (dict(engine="fvcore", backward=True), "engine", "fvcore counts the forward pass only"),
    (dict(depth=-1), "depth", "must be ≥ 0, got -1"),
])
def test_option_errors_from_python_name_the_keyword_before_counting(kw, name, words):
    from torchdiag.errors import OptionError

    with pytest.raises(OptionError) as e:
        api_run("flops", nn.Linear(3, 2), torch.randn(2, 3), **kw)
    assert e.value.message == f"{name}: {words}" and e.value.code == 2


def test_engine_option_error_is_exit_2_even_when_the_factory_raises(cli):
    res = cli("flops", sample("broken_factory.py:raises"), "--engine", "fvcore", "--backward", "--json")
    assert res.code == 2 and res.stderr.startswith("error: --engine: fvcore counts the forward pass only")
    assert res.json["exit_code"] == 2 and "Traceback" not in res.stderr


def test_torchdiags_own_ops_are_not_in_the_users_table(cli):
    """--backward: the random target (randint), the loss's forward, its backward down to the model's output
    and the backward seed (ones_like) are torchdiag's, not the model's: none of them is listed among the
    model's ops (counted or not)."""
    j = cli("flops", sample("mlp.py:build"), "--backward", "--json").json
    names = {row["op"] for row in j["uncounted_ops"]} | {row["op"] for row in j["operators"]}
    assert names and not names & {"randint", "randn", "ones_like", "nll_loss_forward", "_log_softmax",
                                  "nll_loss_backward", "_log_softmax_backward_data"}, names
    assert j["backward_flops"] > 0


def test_an_activations_backward_is_arithmetic_not_data_movement():
    """A new user's hour: --backward listed ReLU's backward (threshold_backward) as data movement; it is arithmetic
    per element, as the activation is, and not counted by convention with it. Views stay data movement."""
    from torchdiag.diagnostics.flops import op_kind

    assert op_kind("relu.default") == op_kind("threshold_backward.default") == "not counted by convention"
    assert op_kind("_softmax_backward_data.default") == "not counted by convention"
    assert op_kind("view.default") == "data movement" and op_kind("mm.default").startswith("COMPUTE")


class ClassTokenBlocks(nn.Module):
    """CaiT's pattern: a view of a parameter (the class token, expanded over the batch) passed to a module.
    Under no_grad that view requires grad but has no grad_fn, which torch's ModuleTracker (inside
    FlopCounterMode) asserts on (timm cait_xxs24_224: flops exit 3)."""

    def __init__(self):
        super().__init__()
        self.cls_token = nn.Parameter(torch.randn(1, 1, 8))
        self.block = nn.Linear(8, 8)

    def forward(self, x):
        self.recording = torch.is_grad_enabled()
        token = self.cls_token.expand(x.shape[0], -1, -1)
        return self.block(token) + x.mean(dim=1, keepdim=True)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_parameter_view_passed_to_a_module_is_counted(device, untouched):
    from torch.utils.flop_counter import FlopCounterMode

    model = ClassTokenBlocks().to(device)
    x = torch.randn(3, 5, 8, device=device)
    with pytest.raises(AssertionError), FlopCounterMode(display=False), torch.no_grad():
        model(x)   # torch itself refuses it: the case is real
    with untouched(model):
        r = count(model, x)
    assert r.data["forward_macs"] == 3 * 8 * 8   # the block: one token per sample, 8 -> 8
    # counted under no_grad: a retry with recording on kept every activation (pe_video's ViT-L: out of memory)
    assert model.recording is False


class _KeepsSome(nn.Module):
    """Rows kept by a mask made from the input's values, as a detector keeps the proposals that pass."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 8)

    def forward(self, x):
        return self.head(x[x.sum(1) > 0])


def test_a_count_the_input_values_size_says_so():
    """A sweep: a detector's FLOPs (75% in roi_heads, over the proposals that survived) were printed beside a note
    inviting comparison with published figures, and nothing said that another image gives another count."""
    x = torch.randn(16, 8)
    r = count(_KeepsSome(), x)
    kept = int((x.sum(1) > 0).sum())
    assert r.data["forward_macs"] == kept * 8 * 8   # the rows that passed, and only those
    assert any("may depend on the input's values: boolean-mask indexing" in n for n in r.notes), r.notes
    assert not any("depends on the input" in n for n in count(nn.Linear(8, 8), x).notes)
    assert not any("depends on the input" in n for n in count(_Checked(), x).notes)   # a review: .item()/bool()


class _Checked(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 8)

    def forward(self, x):
        assert torch.isfinite(x).all()   # reads a value, sizes nothing
        return self.head(x)


@pytest.mark.parametrize("groups", [1, 4, 16])
def test_a_grouped_convolutions_backward_is_twice_its_forward(groups):
    """A sweep: torch's counter takes the weight gradient over every input channel, not those of its group: a
    grouped convolution's backward was `groups` times too large (a depthwise one 64x its closed form). Closed form:
    input gradient and weight gradient each N·Cout·(Cin/groups)·Ho·Wo·k² multiply-adds, as the forward; the first
    convolution, whose input needs no gradient, the weight's alone."""
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1, groups=groups))
    r = count(model, torch.randn(2, 8, 8, 8), backward=True)
    first, second = 2 * 16 * 8 * 8 * 8 * 9, 2 * 16 * (16 // groups) * 8 * 8 * 9
    rows = {row["name"]: row for row in r.table("modules").rows}
    assert rows["1"]["macs"] == second and rows["1"]["backward_flops"] == 2 * 2 * second, rows["1"]
    assert rows["0"]["backward_flops"] == 2 * first and r.data["backward_macs"] == first + 2 * second


def test_the_last_modules_backward_is_its_own():
    """A sweep: the loss's gradient fed to the model's outputs as roots never fired their hooks, and the head's
    backward was charged to no module (0 in its row, the total right)."""
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    r = count(model, torch.randn(4, 32), backward=True)
    rows = {row["name"]: row["backward_flops"] for row in r.table("modules").rows}
    assert rows == {"0": 2 * 4 * 32 * 64, "1": 0, "2": 2 * 2 * 4 * 64 * 16, "3": 0, "4": 2 * 2 * 4 * 16 * 10}, rows


def test_an_identity_or_a_module_fed_no_gradient_keeps_no_later_backward():
    """A sweep: an Identity (timm's `bn.drop`) was charged every backward FLOP after it (100% of a model's convolution
    backward), its parent 0: its input's hook, which closes it, fires before its output's opens it, on the same tensor.
    A module whose input needs no gradient (xcit's projection of a constant map) was never closed: it took the
    backward of everything before it too. Closed forms: a convolution's input and weight gradients each its
    forward's multiply-adds; the first convolution's weight gradient alone."""

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.bn, self.drop = nn.BatchNorm2d(c), nn.Identity()

        def forward(self, x):
            return torch.relu(self.drop(self.bn(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv0, self.b0, self.conv1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), Block(8), \
                nn.Conv2d(8, 8, 3, padding=1), Block(8)
            self.pos = nn.Conv2d(2, 8, 1)   # a projection of a constant map, added after conv0
            self.grid = torch.randn(1, 2, 8, 8)

        def forward(self, x):
            return self.b1(self.conv1(self.b0(self.conv0(x) + self.pos(self.grid)))).mean((2, 3))

    r = count(Net().eval(), torch.randn(2, 3, 8, 8), backward=True)
    rows = {row["name"]: row["backward_flops"] for row in r.table("modules").rows}
    c0, c1, pos = 2 * 8 * 3 * 8 * 8 * 9, 2 * 8 * 8 * 8 * 8 * 9, 1 * 8 * 2 * 8 * 8
    assert rows["b0.drop"] == rows["b1.drop"] == 0, rows
    assert rows["conv1"] == 2 * 2 * c1 and rows["conv0"] == 2 * c0 and rows["pos"] == 2 * pos, rows


def test_a_module_that_writes_its_input_in_place_keeps_its_backward():
    """A review of the Identity fix: a residual block doing `x += self.fc(x)` and returning x was taken for an Identity
    (its output its input) and lost its backward (0, its own fc 4096). An input written in place opens it."""

    class InplaceRes(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            x += self.fc(x * 1)
            return x

    model = nn.Sequential(nn.Linear(16, 16), InplaceRes(), nn.Linear(16, 8))
    r = count(model, torch.randn(4, 16), backward=True)
    rows = {row["name"]: row["backward_flops"] for row in r.table("modules").rows}
    assert rows["1"] == rows["1.fc"] == 2 * 2 * 4 * 16 * 16, rows


def test_a_module_called_twice_in_a_row_keeps_both_calls_backward():
    """A review: torch's tracker keeps a set of module names, so on the tensor between two calls of one module the
    hook opening the first call's backward and the one closing the second's cancelled out: the first call's backward
    was charged to no module (HF ALBERT's shared layer group: 557,056 of 2,228,224). Closed form: the second call's
    input and weight gradients, the first's weight gradient (its input needs none)."""

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.head = nn.Linear(16, 16), nn.Linear(16, 8)

        def forward(self, x):
            return self.head(self.lin(self.lin(x)))

    r = count(Twice(), torch.randn(4, 16), backward=True)
    rows = {row["name"]: row["backward_flops"] for row in r.table("modules").rows}
    one = 2 * 4 * 16 * 16
    assert rows["lin"] == 3 * one and rows["head"] == 2 * 2 * 4 * 16 * 8, rows


def test_overlapping_backward_rows_are_said_to_overlap(cli, tmp_path):
    """A sweep: an encoder-decoder's per-module backward summed to more than the total (T5: 201 M of 151 M): torch's
    tracker keeps the decoder open while the encoder, whose output it reads, runs its backward. The table says so."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.T5Config(vocab_size=200, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                                num_heads=4)
    cfg.architectures = ["T5ForConditionalGeneration"]
    cfg.save_pretrained(tmp_path / "t5")
    d = cli("flops", f"hf:{tmp_path / 't5'}", "--backward", "--json").json
    top = sum(row["backward_flops"] for row in d["modules"] if "." not in row["name"])
    assert top > d["backward_flops"], (top, d["backward_flops"])
    text = cli("flops", f"hf:{tmp_path / 't5'}", "--backward").stdout
    assert "backward rows overlap" in " ".join(text.split())
    plain = count(nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 3)), torch.randn(4, 10), backward=True)
    assert "overlap" not in plain.table("modules").note
