"""summary: closed-form parameter counts, ties counted once, uncalled modules listed, model untouched."""
import torch
from torch import nn

from torchdiag.api import run
from torchdiag.diagnostics import summary

from support import load, sample


def linear_params(i, o, bias=True):
    return i * o + (o if bias else 0)


def lm_params(vocab=1000, dim=64, layers=2, context=64):
    block = 2 * (2 * dim) + linear_params(dim, 3 * dim) + linear_params(dim, dim) \
        + linear_params(dim, 4 * dim) + linear_params(4 * dim, dim)
    return vocab * dim + context * dim + layers * block + 2 * dim  # lm_head is tied to tok


def test_mlp_closed_form(untouched):
    model, inputs = load("mlp.py:build")
    with untouched(model):
        r = run("summary", model, inputs)
    expect = linear_params(784, 256) + linear_params(256, 128) + linear_params(128, 10)
    assert r.data["total_params"] == expect == 235_146
    assert r.data["param_bytes"] == 4 * expect
    rows = {row["name"]: row for row in r.table("layers").rows}
    assert rows["0"]["output_shape"] == "16x256" and rows["0"]["params"] == linear_params(784, 256)
    assert rows["4"]["output_shape"] == "16x10" and rows["1"]["params"] == 0


def test_tied_embedding_counted_once_and_shown(untouched):
    model, inputs = load("transformer_lm.py:build")
    with untouched(model):
        r = run("summary", model, inputs)
    assert r.data["total_params"] == lm_params() == 168_192
    assert r.data["shared"] == [["tok.weight", "lm_head.weight"]]
    # torchinfo 1.8.0 counts the tie twice; we report its number and correct it
    assert r.data["torchinfo_total_params"] == lm_params() + 1000 * 64
    assert any("torchinfo 1.8.0 reports 232,192" in n for n in r.notes)
    assert r.data["output_shape"] == "{logits: 4x32x1000, loss: scalar}"


def test_frozen_and_uncalled(untouched):
    from torchdiag.core.inputs import resolve_inputs
    from torchdiag.core.loading import load_model

    loaded = load_model(sample("two_input.py:build"), [], torch.device("cpu"))
    inputs = resolve_inputs(["4x3x16x16", "4x12"], loaded, torch.device("cpu"))
    model = loaded.model
    with untouched(model):
        r = run("summary", model, inputs, depth=2)
    frozen = linear_params(12, 8)
    total = (3 * 8 * 9 + 8) + frozen + linear_params(16, 3) + linear_params(16, 2)
    assert r.data["total_params"] == total
    assert r.data["frozen_params"] == frozen and r.data["trainable_params"] == total - frozen
    assert r.data["uncalled"] == ["aux_head"]
    rows = {row["name"]: row for row in r.table("layers").rows}
    assert rows["aux_head"]["output_shape"] == "(not called)" and rows["aux_head"]["params"] == 34
    assert rows["table"]["trainable"] == "no"
    # the footnote about dim rows only under a table with one (a sweep: said under every table)
    assert "dim rows never ran in forward" in r.table("layers").note
    model, inputs = load("mlp.py:build")
    assert "dim rows" not in run("summary", model, inputs).table("layers").note


def test_batchnorm_stats_and_mode_untouched(untouched):
    model, inputs = load("resnet.py:build")
    model.train()
    with untouched(model):
        run("summary", model, inputs)
    assert model.training


def test_resnet50_matches_published_count():
    model, _ = load("resnet.py:resnet50", device="meta")
    r = run("summary", model, _meta_inputs((1, 3, 224, 224)))
    assert r.data["total_params"] == 25_557_032


def _meta_inputs(shape, dtype=torch.float32):
    from torchdiag.core.inputs import ModelInputs

    return ModelInputs((torch.empty(shape, dtype=dtype, device="meta"),), {}, "test")


def test_buffer_bytes_by_dtype():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(torch.float64)
    from torchdiag.core.inputs import ModelInputs

    r = run("summary", model, ModelInputs((torch.randn(2, 3, dtype=torch.float64),)))
    (row,) = r.table("bytes_by_dtype").rows[:1]
    assert row["dtype"] == "float64" and row["params"] == 16 + 8 and row["param_bytes"] == 8 * 24
    # running_mean, running_var (float64) + num_batches_tracked (int64)
    assert r.data["buffer_bytes"] == 8 * 4 + 8 * 4 + 8


def test_7b_llama_on_meta(cli):
    res = cli("summary", sample("llama.py:build"), "--arg", "size='7b'", "--device", "meta",
              "-i", "1x64:int64", "--depth", "1", "--json")
    assert res.code == 0, res.stderr
    doc = res.json
    assert doc["total_params"] == 6_738_415_616 and doc["device"] == "meta"
    assert doc["built_on_meta_via"] == "parameters moved to meta as registered"


def test_cli_json_keys_and_table(cli):
    res = cli("summary", sample("cnn.py:build"), "--json")
    assert res.code == 0
    doc = res.json
    for key in ("total_params", "trainable_params", "frozen_params", "param_bytes", "layers", "shared", "uncalled"):
        assert key in doc
    assert {"name", "type", "output_shape", "params"} <= set(doc["layers"][0])
    text = cli("summary", sample("cnn.py:build"))
    assert text.code == 0 and "Total params" in text.stdout and "25,578" in text.stdout


def test_forward_failure_shows_rows_that_ran(cli):
    res = cli("summary", sample("broken_shape.py:build"))
    assert res.code == 3
    assert "Modules that ran before the error" in res.stdout and "(raised)" in res.stdout
    assert "forward failed in 2.0 (Linear)" in res.stderr
    # --json: one document with the error and the rows that ran
    import json

    res = cli("summary", sample("broken_shape.py:build"), "--json")
    doc = json.loads(res.stdout)
    assert res.code == 3 and doc["exit_code"] == 3 and "2.0 (Linear)" in doc["error"]["message"]
    rows = {row["name"]: row["output_shape"] for row in doc["partial"]["layers"]}
    assert rows["0"] == "4x32" and rows["2.0"] == "(raised)"


def test_lazy_modules_rows_count_the_parameters_forward_created():
    # nn.LazyLinear has its parameters only after the first forward: rows and totals must agree
    from torchdiag.core.inputs import ModelInputs

    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(2))
    r = run("summary", model, ModelInputs((torch.randn(3, 5),)))
    rows = {row["name"]: row["params"] for row in r.table("layers").rows}
    assert rows == {"0": linear_params(5, 8), "1": 0, "2": linear_params(8, 2)}
    assert r.data["total_params"] == linear_params(5, 8) + linear_params(8, 2)
    assert not any("torchinfo" in n for n in r.notes)


def test_bad_depth_is_exit_2_before_loading_and_named_per_caller(cli):
    import pytest

    from torchdiag.errors import OptionError

    r = cli("summary", sample("broken_factory.py:raises"), "--depth", "-1")   # the factory raises: exit 3 if loaded
    assert r.code == 2 and "--depth" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(OptionError, match=r"^depth: must be ≥ 0, got -1"):
        run("summary", nn.Linear(2, 2), torch.randn(1, 2), depth=-1)
    with pytest.raises(OptionError, match=r"^depth: 1.5 is not an integer"):
        summary.Options(depth=1.5)


def test_graph_is_data_and_says_plainly_when_it_cannot_trace():
    """The graph is traced into result.artefacts (render/tensorboard.py writes it); an untraceable
    model gets a plain note instead."""
    from torchdiag.core.inputs import ModelInputs

    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return {"logits": self.fc(x), "note": "not a tensor", "n": 3}

    r = run("summary", DictOut(), ModelInputs((torch.randn(2, 3),)), graph=True)
    assert "tb_graph" not in r.artefacts
    assert any(n.startswith("model graph not written: the tracer could not follow this model") for n in r.notes)
    r = run("summary", nn.Sequential(nn.Linear(3, 2), nn.ReLU()), torch.randn(2, 3), graph=True)
    graph_def, _ = r.artefacts["tb_graph"]
    assert any("Linear" in node.op or "linear" in node.op for node in graph_def.node)
    assert "model graph written (TensorBoard → Graphs)" in r.notes
    assert "tb_graph" not in run("summary", nn.Linear(3, 2), torch.randn(2, 3)).artefacts


def test_a_dynamically_quantized_model_counts_its_packed_weights():
    """A sweep: summary said 'Total params 0' for a quantize_dynamic model, with nothing else, and a note that its
    packed params 'never ran' and 'are still counted'. Its int8 weights and float biases are state_dict entries that
    are neither parameters nor buffers: listed as other state, counted by hand here."""
    from torchdiag.core.inputs import ModelInputs

    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    q = torch.ao.quantization.quantize_dynamic(m, {nn.Linear}, dtype=torch.qint8)
    r = run("summary", q, ModelInputs((torch.randn(4, 8),)))
    weights, biases, scalars = 16 * 8 + 4 * 16, 16 + 4, 2 * 2   # each Linear's scale and zero_point besides
    assert r.data["total_params"] == 0 and r.data["other_state"]["values"] == weights + biases + scalars
    assert not any("still counted" in n for n in r.notes), r.notes


def test_a_sequential_a_loop_iterates_ran_as_a_container():
    """A sweep: HF cvt's stages iterate their nn.Sequential of layers, and summary said the Sequentials "never ran in
    forward" though every layer in them ran. A module never called whose children all ran is a holder, as a
    ModuleList is; one whose children never ran is still said."""
    from torchdiag.core.inputs import ModelInputs

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
            self.unused = nn.Sequential(nn.Linear(4, 4))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    res = run("summary", Stage(), ModelInputs((torch.randn(2, 4),), {}))
    rows = {r["name"]: r["output_shape"] for r in res.table("layers").rows}
    assert rows["layers"] == "(container)" and rows["unused"] == "(not called)", rows
    assert res.data["uncalled"] == ["unused", "unused.0"], res.data["uncalled"]

    class Block(nn.Module):   # a review: its own gain, read only by its forward, which the model skips
        def __init__(self):
            super().__init__()
            self.norm, self.fc, self.gamma = nn.LayerNorm(4), nn.Linear(4, 4), nn.Parameter(torch.ones(4))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block.fc(self.block.norm(x))

    res = run("summary", Net(), ModelInputs((torch.randn(2, 4),), {}))
    assert res.data["uncalled"] == ["block"], res.data["uncalled"]


def test_a_module_called_twice_shows_both_outputs_and_its_call_count():
    # one MaxPool2d used after each conv: the row showed the first call's shape only (a user's report)
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
            self.pool = torch.nn.MaxPool2d(2)

        def forward(self, x):
            return self.pool(self.c2(self.pool(self.c1(x))))

    r = run("summary", Net(), torch.randn(2, 3, 32, 32))
    (pool,) = [row for row in r.table("layers").rows if row["name"] == "pool"]
    assert pool["calls"] == 2 and pool["output_shapes"] == ["2x8x16x16", "2x8x8x8"]
    assert pool["_shape"] == "2x8x16x16, 2x8x8x8 (2 calls)"
    (c1,) = [row for row in r.table("layers").rows if row["name"] == "c1"]
    assert c1["_shape"] == "2x8x32x32" and "output_shapes" not in c1
