"""The first hour (issue 33): one severity per cause in every command, causes told right, defaults that
fit the model, brief output when healthy."""
import re

import pytest

from support import sample

CUT_CNN = ("features.0.weight", "features.0.bias", "features.2.weight", "features.2.bias",
           "features.4.weight", "features.4.bias", "features.6.weight", "features.6.bias")
CUT_MLP = ("context.0.weight", "context.0.bias", "context.2.weight", "context.2.bias")


def findings(d, code):
    return [f for f in d["findings"] if f["code"] == code]


def check_row(d, check_id):
    return next(r for r in d["checks"] if r["id"] == check_id)


# ---------------------------------------------------------------- 1. one severity per cause
@pytest.mark.parametrize("spec, cut, total", [("broken_detached_cnn.py:build", CUT_CNN, 12),
                                              ("broken_detached.py:build", CUT_MLP, 8)])
@pytest.mark.parametrize("command, extra", [("doctor", ()), ("gradflow", ()), ("overfit-batch", ("--steps", "5"))])
def test_detached_trunk_is_the_same_no_grad_error_everywhere(cli, spec, cut, total, command, extra):
    r = cli(command, sample(spec), "--json", *extra)
    d = r.json
    assert r.code == 1 and d["exit_code"] == 1, r.stdout[-2000:]
    (f,) = findings(d, "no-grad")
    assert f["severity"] == "error"
    assert f["where"] == cut[0].split(".")[0]                # the cut module, as gradflow groups it
    if command == "gradflow" and len(cut) > 6:   # a long list: the names that differ only in their index, once
        assert "features.{0, 2, 4, 6}.weight, features.{0, 2, 4, 6}.bias" in f["message"]
    else:
        for n in cut[:6]:
            assert n in f["message"]
    if command != "gradflow":
        assert f"{len(cut)} of {total} trainable" in f["message"]
    if command == "doctor":
        row = check_row(d, "update")
        assert row["status"] == "error" and row["code"] == "no-grad"
    if command == "overfit-batch":
        codes = [x["code"] for x in d["findings"]]
        assert codes.index("no-grad") < codes.index("cannot-overfit")   # the cause before its consequence
        assert not findings(d, "unchanged-params")                      # the same parameters: said once


def test_overfit_batch_memorised_without_some_parameters_still_fails(cli):
    # broken_detached: the head alone can memorise 8 samples; the detached branch is still the error
    r = cli("overfit-batch", sample("broken_detached.py:build"))
    assert r.code == 1
    out = " ".join(r.stdout.split())   # the console wraps long lines where the numbers before them end
    assert "ERROR no-grad context: 4 of 8 trainable parameter tensor(s) got no gradient" in out
    assert "FAIL: 4 trainable parameter tensor(s) get no gradient (the batch was memorised without them" in out


def test_doctor_loss_without_graph_is_no_grad_error(cli):
    d = cli("doctor", sample("broken_detached.py:no_grad"), "--json").json
    # the context branch under no_grad: the trunk and head still train, the branch is no-grad
    (f,) = findings(d, "no-grad")
    assert f["severity"] == "error" and f["where"] == "context"


def test_doctor_healthy_model_keeps_update_ok(cli):
    d = cli("doctor", sample("mlp.py:build"), "--json").json
    assert check_row(d, "update")["status"] == "ok" and not findings(d, "no-grad")


# ---------------------------------------------------------------- 2. causes told right
@pytest.mark.parametrize("fn, kind", [("local_tensor", "tensor with requires_grad=True"), ("local_param", "nn.Parameter")])
def test_doctor_finds_a_weight_made_in_forward(cli, fn, kind):
    d = cli("doctor", sample(f"broken_forward_weights.py:{fn}"), "-i", "8x20", "--json").json
    (f,) = findings(d, "local-weight")
    assert f["severity"] == "error" and f"a 32x5 float32 {kind}" in f["message"]
    assert "not parameters of the model" in f["message"]
    assert not findings(d, "device-mismatch") and not findings(d, "param-not-updated")
    assert d["local_weights"] == [f"a 32x5 float32 {kind}"]


def test_doctor_parameter_recreated_in_forward_is_told_as_such(cli):
    d = cli("doctor", sample("broken_forward_weights.py:recreated"), "-i", "8x20", "--json").json
    (f,) = findings(d, "param-recreated")
    assert f["where"] == "w" and "re-initialised each call" in f["message"]
    assert not findings(d, "param-not-updated") and not findings(d, "device-mismatch")
    assert check_row(d, "update")["code"] == "param-recreated"


def test_local_leaves_are_found_by_the_graph_not_by_name():
    import torch

    from torchdiag.core.local_leaves import local_leaves

    lin = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)          # an input that requires grad: not a weight
    w = torch.randn(2, 2, requires_grad=True)          # a local weight: found
    unused = torch.randn(2, requires_grad=True)        # not on the loss's graph: not found
    loss = (lin(x) @ w).sum() + 0 * unused.detach().sum()
    assert [id(t) for t in local_leaves(loss, lin, [x])] == [id(w)]
    assert local_leaves(lin(x).sum(), lin, [x]) == []


def test_a_view_of_the_input_made_a_leaf_in_forward_is_the_input_not_a_weight(cli, tmp_path):
    """Hugging Face's wav2vec2-family feature encoders set requires_grad on `input_values[:, None]`: a new leaf,
    the same memory as the input. gradflow called it a weight made in forward (local-weight) on hubert,
    data2vec-audio, sew; a weight made from fresh memory is still found beside it."""
    (tmp_path / "enc.py").write_text(
        "import torch\n"
        "class Encoder(torch.nn.Module):\n"
        "    def __init__(self, fresh):\n"
        "        super().__init__(); self.conv = torch.nn.Conv1d(1, 4, 5); self.fresh = fresh\n"
        "    def forward(self, x):\n"
        "        h = x[:, None]\n"
        "        h.requires_grad = True            # as Wav2Vec2FeatureEncoder does in training\n"
        "        out = self.conv(h)\n"
        "        return out * torch.ones(1, requires_grad=True) if self.fresh else out\n"
        "def build(fresh=False):\n"
        "    return Encoder(fresh)\n"
        "def example_inputs():\n"
        "    return torch.randn(2, 64)\n")
    plain = cli("gradflow", f"{tmp_path}/enc.py:build", "--device", "cpu", "--json")
    assert plain.code == 0 and "local-weight" not in {f["code"] for f in plain.json["findings"]}, plain.stdout
    fresh = cli("gradflow", f"{tmp_path}/enc.py:build", "--arg", "fresh=True", "--device", "cpu", "--json")
    [f] = [f for f in fresh.json["findings"] if f["code"] == "local-weight"]
    assert "a 1 float32 tensor with requires_grad=True" in f["message"] and "2x1x64" not in f["message"]


def test_a_weight_cut_from_the_inputs_own_buffer_beside_it_is_still_a_weight():
    """Same storage as the input, other bytes: not the input (review: POOL[32:35] beside an input POOL[:32])."""
    import torch

    from torchdiag.core.local_leaves import local_leaves

    pool = torch.randn(100)
    x = pool[:32].view(8, 4)
    lin = torch.nn.Linear(4, 3)
    w = pool[32:35].detach().requires_grad_()
    view = x[:, None]
    view.requires_grad = True
    loss = (lin(view[:, 0]) + w).sum()
    assert [id(t) for t in local_leaves(loss, lin, [x])] == [id(w)]


def test_device_mismatch_names_the_forward_that_made_a_parameter(cli, tmp_path):
    # nn.Parameter(torch.randn(...)) without device= in forward: a real device bug, made IN forward
    p = tmp_path / "m.py"
    p.write_text("import torch\nfrom torch import nn\nclass N(nn.Module):\n    def __init__(self):\n"
                 "        super().__init__()\n        self.inp = nn.Linear(20, 32)\n    def forward(self, x):\n"
                 "        w = nn.Parameter(torch.randn(32, 5))\n        return self.inp(x) @ w\n"
                 "def build():\n    return N()\n")
    # on the CPU: on a GPU the forward itself fails (its weight is on the CPU), and no local weight can be judged
    d = cli("doctor", f"{p}:build", "-i", "8x20", "--device", "cpu", "--json").json
    (f,) = findings(d, "device-mismatch")
    assert "creates a 32x5 tensor without device=" in f["message"] and "outside forward" not in f["message"]
    assert findings(d, "local-weight")


def test_doctor_nan_forward_is_not_blamed_on_the_optimizer(cli):
    d = cli("doctor", sample("broken_nan_forward.py:build"), "--json").json
    (f,) = findings(d, "non-finite-loss")
    assert f["severity"] == "error" and "output holds NaN/Inf before any optimizer step" in f["message"]
    assert not findings(d, "non-finite-update")
    assert check_row(d, "modes")["status"] == "skipped"
    assert "NaN/Inf: not compared" in check_row(d, "modes")["verdict"]


def test_modes_with_dropout_and_nan_output_states_no_difference(cli, tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import torch\nfrom torch import nn\nclass N(nn.Module):\n    def __init__(self):\n"
                 "        super().__init__()\n        self.a = nn.Linear(8, 8)\n        self.drop = nn.Dropout(0.5)\n"
                 "    def forward(self, x):\n        return self.drop(torch.log(self.a(x)))\n"
                 "def build():\n    return N()\n")
    d = cli("doctor", f"{p}:build", "-i", "4x8", "--json").json
    (m,) = findings(d, "mode-dependent")
    assert "difference 0" not in m["message"] and "hold NaN/Inf: not compared" in m["message"]


# ---------------------------------------------------------------- 3. defaults that fit the model (hf:)
def _saved(tmp_path, config):
    config.architectures = None
    config.save_pretrained(tmp_path)
    import json

    assert "architectures" not in json.loads((tmp_path / "config.json").read_text()) or \
        json.loads((tmp_path / "config.json").read_text())["architectures"] is None
    return f"hf:{tmp_path}"


def test_hf_decoder_config_without_architectures_gets_its_lm_head_and_passes_overfit(cli, tmp_path):
    transformers = pytest.importorskip("transformers")
    spec = _saved(tmp_path, transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                                    bos_token_id=0, eos_token_id=0))
    r = cli("overfit-batch", spec, "--json")
    d = r.json
    assert r.code == 0 and d["passed"], r.stdout[-1500:]
    assert d["loss_rule"] == "the model's own loss (output['loss'])"
    assert "AutoModelForCausalLM: config.json names no architecture and model_type 'gpt2' is decoder-only" in d["source"]
    assert d["inputs"] == ["input[0]: 2x16 int64", "labels: 2x16 int64"]   # batch 2: overfit-batch trains


def test_hf_class_is_judged_from_transformers_mappings(tmp_path):
    transformers = pytest.importorskip("transformers")
    from torchdiag.core.sources import _hf_class

    def built(config, task=None):
        config.architectures = None
        return _hf_class(config, task)[0].__name__

    small = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    assert built(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2)) == "AutoModelForCausalLM"
    assert built(transformers.LlamaConfig(**small)) == "AutoModelForCausalLM"
    assert built(transformers.BertConfig(**small)) == "AutoModel"          # an encoder: has a masked-LM class
    # an encoder-decoder gets its seq2seq LM head, as a decoder-only one gets its causal-LM head
    assert built(transformers.BartConfig(vocab_size=64, d_model=32)) == "AutoModelForSeq2SeqLM"
    assert built(transformers.T5Config(vocab_size=64, d_model=32, num_layers=1)) == "AutoModelForSeq2SeqLM"
    assert built(transformers.BartConfig(vocab_size=64, d_model=32), "base") == "AutoModel"
    assert built(transformers.BertConfig(**small), "causal-lm") == "AutoModelForCausalLM"


def test_hf_task_causal_lm_gives_labels_so_the_model_trains_with_its_own_loss(cli, tmp_path):
    transformers = pytest.importorskip("transformers")
    spec = _saved(tmp_path, transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=64,
                                                     max_position_embeddings=16, is_decoder=True))
    d = cli("doctor", spec, "--arg", "task=causal-lm", "--json").json
    assert "AutoModelForCausalLM for task causal-lm" in d["source"]
    assert d["loss"] == "the model's own loss (output['loss'])"


# ---------------------------------------------------------------- 4. healthy tiny models pass overfit-batch by default
def _hf_dir(tmp_path, config, arch):
    config.architectures = [arch] if arch else None
    config.save_pretrained(tmp_path)
    return f"hf:{tmp_path}"


def _bert(transformers):
    return transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=16)


def _t5(transformers):
    # T5Config sets no decoder_start_token_id (a saved t5-small's config does): torchdiag shifts the labels
    # right itself, from the pad id; no position table, so the default length is 128
    # one layer, vocab 256: 379 steps to 1% at 1 thread (2 layers, vocab 1000: 403 steps at twice the cost a step)
    return transformers.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=1, num_heads=4)


def _bart(transformers):
    return transformers.BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
                                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                   decoder_ffn_dim=64, max_position_embeddings=16)


@pytest.mark.parametrize("what", ["cnn", "gpt_tiny", "bert-classifier", "bert-masked-lm", "bart", "t5",
                                  "t5-no-architectures"])
def test_healthy_tiny_model_passes_overfit_batch_at_default_settings(cli, tmp_path, what):
    if what == "cnn":
        args, loss = (sample("cnn.py:build"), "-i", "8x3x32x32"), "cross_entropy"
    elif what == "gpt_tiny":
        args, loss = (sample("gpt_tiny.py:build"), "--arg", "layers=1"), "next-token cross_entropy"
    else:
        transformers = pytest.importorskip("transformers")
        config, arch, loss = {"bert-classifier": (_bert(transformers), "BertForSequenceClassification", "cross_entropy"),
                              "bert-masked-lm": (_bert(transformers), "BertForMaskedLM",
                                                 "cross_entropy on output['logits'] against input[0] at the same positions"),
                              "bart": (_bart(transformers), "BartForConditionalGeneration",
                                       "the model's own loss"),
                              "t5": (_t5(transformers), "T5ForConditionalGeneration", "the model's own loss"),
                              "t5-no-architectures": (_t5(transformers), None, "the model's own loss")}[what]
        args = (_hf_dir(tmp_path, config, arch),)
    r = cli("overfit-batch", *args, "--json")
    d = r.json
    assert r.code == 0 and d["passed"], (d["loss_rule"], d["final_loss"], d["initial_loss"])
    assert d["loss_rule"].startswith(loss)
    assert d["final_loss"] <= 0.01 * d["initial_loss"]
    if what == "bart":   # labels = input ids, the decoder fed from them by the model itself
        assert d["inputs"] == ["input[0]: 2x16 int64", "labels: 2x16 int64"]   # batch 2: overfit-batch trains
    if what.startswith("t5"):   # labels = input ids; the decoder ids are them shifted right, from pad id 0
        assert d["inputs"] == ["input[0]: 2x128 int64", "decoder_input_ids: 2x128 int64", "labels: 2x128 int64"]
        assert "decoder_input_ids: the labels shifted right, starting with pad_token_id 0" in " ".join(d["input_notes"])
        assert ("AutoModelForSeq2SeqLM" if arch is None else "T5ForConditionalGeneration") in d["source"]


# ---------------------------------------------------------------- 5. brief when healthy
TIED = ("import torch\nfrom torch import nn\nclass LM(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.emb = nn.Embedding(64, 16)\n        self.body = nn.Linear(16, 16)\n"
        "        self.head = nn.Linear(16, 64, bias=False)\n        self.head.weight = self.emb.weight\n"
        "    def forward(self, ids):\n        return self.head(torch.tanh(self.body(self.emb(ids))))\n"
        "def build():\n    return LM()\n")


def test_gradflow_is_brief_by_default_and_all_prints_every_parameter(cli):
    spec = sample("gpt_tiny.py:build")
    brief, full = cli("gradflow", spec), cli("gradflow", spec, "--all")
    assert brief.code == full.code == 0
    assert "blocks.layers.0.linear1.weight" not in brief.stdout and "blocks.layers.0.linear1.weight" in full.stdout
    assert "--all prints the per-parameter table" in brief.stdout
    assert len(full.stdout.splitlines()) - len(brief.stdout.splitlines()) >= 29   # one row per parameter tensor
    d = cli("gradflow", spec, "--json").json
    assert len(d["params"]) == 29                                                  # always in JSON


def test_gradflow_activation_health_is_brief_when_healthy(cli):
    spec = sample("resnet.py:build")
    brief, full = cli("gradflow", spec), cli("gradflow", spec, "--all")
    d = cli("gradflow", spec, "--json").json
    assert brief.code == full.code == 0 and not [f for f in d["findings"] if f["code"] in ("dead-units", "saturated")]
    assert "Activation health (module outputs" not in brief.stdout and "│ layer1.0.relu " not in brief.stdout
    assert "Activation health (module outputs" in full.stdout and "│ layer1.0.relu " in full.stdout
    relus = [r for r in d["activations"] if r["dead_fraction"] is not None]
    most = f"{max(r['dead_fraction'] for r in relus):.1%}"
    tied = {r["module"] for r in relus if f"{r['dead_fraction']:.1%}" == most}   # any of equal worst may be named
    line = " ".join(brief.stdout.split())   # the console wraps the line at its width (80 columns under CI)
    said = re.search(r"Activation health (\d+) module outputs; dead units at most ([\d.]+%) \((\S+)\) after (\d+) "
                     r"ReLU-family modules", line)
    assert said, brief.stdout
    assert (int(said[1]), said[2], int(said[4])) == (len(d["activations"]), most, len(relus)), (line, most, tied)
    assert said[3] in tied, (line, tied)
    assert len(d["activations"]) == len(relus) + sum(1 for r in d["activations"] if r["dead_fraction"] is None) > 20


def test_gradflow_activation_health_still_shows_a_flagged_module(cli):
    spec = sample("broken_dead_relu.py:build")
    r, d = cli("gradflow", spec), cli("gradflow", spec, "--json").json
    flagged = {f["where"] for f in d["findings"] if f["code"] == "dead-units"}
    assert flagged == {"act1"}
    table = r.stdout.split("Activation health (module outputs, this batch)")[1].split("└")[0]
    shown = [m["module"] for m in d["activations"] if f"│ {m['module']} " in table]
    assert shown == ["act1"] and len(d["activations"]) == 3          # fc1, act1, fc2: the flagged one only
    assert f"… {len(d['activations']) - 1} more row(s) in --json" in r.stdout


def test_gradflow_labels_a_tied_head_tied_not_frozen(cli, tmp_path):
    p = tmp_path / "tied.py"
    p.write_text(TIED)
    d = cli("gradflow", f"{p}:build", "-i", "4x8:int64", "--json").json
    head = next(r for r in d["layers"] if r["layer"] == "head")
    assert head["status"] == "tied" and head["params"] == 0
    assert next(r for r in d["layers"] if r["layer"] == "emb")["params"] == 64 * 16


def test_doctor_says_the_generic_train_eval_note_once_compactly(cli):
    d = cli("doctor", sample("resnet.py:build"), "--json").json
    (m,) = findings(d, "mode-dependent")
    assert m["message"].startswith("12 BatchNorm2d make train and eval outputs differ") and not m.get("hint")
    assert m["message"].count("model.eval()") == 1
    assert check_row(d, "modes")["hint"] == ""


LOCAL_BN = ("import torch\nfrom torch import nn\nclass Net(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.inp = nn.Linear(20, 32)\n        self.bn = nn.BatchNorm1d(32)\n"
            "    def forward(self, x):\n        w = torch.randn(32, 5, requires_grad=True)\n"
            "        return torch.relu(self.bn(self.inp(x))) @ w\ndef build():\n    return Net()\n")


@pytest.mark.parametrize("command", ["gradflow", "doctor"])
def test_local_weight_is_an_error_never_an_internal_note(cli, tmp_path, command):
    # a bias behind BatchNorm made gradflow re-check on a float64 copy, which failed on the float32 local
    # weight and was shown as a note under a PASS
    p = tmp_path / "m.py"
    p.write_text(LOCAL_BN)
    r = cli(command, f"{p}:build", "-i", "8x20", "--device", "cpu", "--json")   # its weight is made on the CPU
    d = r.json
    assert r.code == 1
    (f,) = findings(d, "local-weight")
    assert f["severity"] == "error" and "a 32x5 float32 tensor with requires_grad=True" in f["message"]
    assert not any("re-check" in n or "double" in n for n in d["notes"]), d["notes"]


ZERO_START = '''
import torch
from torch import nn


class ZeroStart(nn.Module):
    """A decoder whose queries start at zero (made in forward with requires_grad, as MaskFormer's): the first
    LayerNorm reads a near-constant input and multiplies its gradient by ~1/sqrt(eps) until the bias before it moves."""

    def __init__(self, queries=50, width=32):
        super().__init__()
        self.queries, self.width = queries, width
        self.pos = nn.Parameter(torch.randn(queries, width))
        self.proj = nn.Linear(width, width)
        nn.init.zeros_(self.proj.bias)
        self.norm = nn.LayerNorm(width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        start = torch.zeros(x.shape[0], self.queries, self.width, requires_grad=self.training)
        h = self.norm(self.proj(start))
        return self.head(torch.relu(self.mix(h + self.pos + x.unsqueeze(1))))


def build():
    return ZeroStart()
'''


def test_weights_made_in_forward_leave_the_rechecks_running(cli, tmp_path):
    """A decoder whose queries start at zero, made in forward with requires_grad (MaskFormer's): gradflow skipped
    every re-check on a copy when such a weight existed, so a LayerNorm reading the zero start (its weight's
    gradient exactly 0 at initialisation, 0.003 after 3 steps) was a zero-grad error. The copy remakes the weight
    at each forward, as training does: zero-init (info) now; the projection that multiplies the zeros stays."""
    p = tmp_path / "m.py"
    p.write_text(ZERO_START)
    d = cli("gradflow", f"{p}:build", "-i", "8x32", "--device", "cpu", "--json").json
    assert {(f["code"], f["where"]) for f in d["findings"] if f["severity"] == "error"} == {
        ("local-weight", ""), ("zero-grad", "proj.weight")}, d["findings"]
    (f,) = [f for f in d["findings"] if f["where"] == "norm.weight"]
    assert f["code"] == "zero-init" and f["severity"] == "info", f


def _tiny_llava(folder, image_token_index=500):
    """A vision-language model (LLaVA: a CLIP vision tower, a projector, a Llama) from a small config. Its image
    placeholder id lies outside the text vocabulary by default, so the default inputs cannot run the image path
    (the ids' embedding refuses it) and fall back to ids alone (tests/test_hf_inputs.py runs the image path)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=32)
    text = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_index)
    config.architectures = ["LlavaForConditionalGeneration"]
    config.save_pretrained(folder)
    return f"hf:{folder}"


@pytest.mark.parametrize("command", ["gradflow", "doctor", "overfit-batch"])
def test_modules_the_default_input_never_runs_are_not_judged(cli, tmp_path, command):
    """hf's default input for a vision-language model whose image path does not run is text: its vision tower never
    runs. That is a fact about the input torchdiag chose, not about the model: info (not-reached), not the no-grad
    error."""
    spec = _tiny_llava(tmp_path / "llava")
    r = cli(command, spec, "--device", "cpu", "--json", *(["--steps", "50"] if command == "overfit-batch" else []))
    doc = r.json
    assert "no-grad" not in {f["code"] for f in doc["findings"]}, doc["findings"]
    reached = [f for f in doc["findings"] if f["code"] == "not-reached"]
    assert reached and all(f["severity"] == "info" for f in reached)
    assert [f["where"] for f in reached] == ["model.vision_tower", "model.multi_modal_projector"]
    assert "never ran" in reached[0]["message"] or "did not use them" in reached[0]["message"]
    if command == "overfit-batch":   # a sweep: the batch memorised, exit 0, and the verdict line read "FAIL"
        shown = cli(command, spec, "--device", "cpu", "--steps", "50")
        assert r.code == shown.code == 0 and "FAIL" not in shown.stdout, shown.stdout[-600:]
    if command == "gradflow":   # the verdict says what was not judged (review: it said "every trainable parameter")
        assert doc["status_counts"]["not-reached"] == 27
        shown = cli(command, spec, "--device", "cpu")
        assert "27 not reached by the default inputs: not judged" in " ".join(shown.stdout.split())


def test_a_parameter_the_default_input_does_not_use_in_a_module_that_ran_is_not_judged(cli, tmp_path):
    """ViT for masked image modeling reads its mask_token only where bool_masked_pos marks patches; the default
    input is pixels alone (review: no-grad, exit 1, on a healthy model)."""
    from transformers import ViTConfig

    config = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=8, encoder_stride=8)
    config.architectures = ["ViTForMaskedImageModeling"]
    config.save_pretrained(tmp_path / "vitmim")
    r = cli("gradflow", f"hf:{tmp_path / 'vitmim'}", "--device", "cpu", "--json")
    assert r.code == 0, r.stdout
    assert [(f["code"], f["where"]) for f in r.json["findings"] if f["code"] in ("no-grad", "not-reached")] == \
        [("not-reached", "vit.embeddings.mask_token")]


def test_the_users_own_input_that_never_runs_a_module_keeps_the_no_grad_error(cli, tmp_path):
    spec = _tiny_llava(tmp_path / "llava")
    r = cli("gradflow", spec, "-i", "2x8:int64[0,100]", "--device", "cpu", "--json")
    assert r.code == 1
    assert {f["where"] for f in r.json["findings"] if f["code"] == "no-grad"} == {"model.vision_tower",
                                                                                 "model.multi_modal_projector"}


def test_a_model_without_a_forward_says_so(tmp_path, cli):
    # a holder of sub-models (transformers' BarkModel) or a forgotten forward: torch's placeholder raises a bare
    # NotImplementedError; the error names what it holds instead
    (tmp_path / "holder.py").write_text(
        "from torch import nn\n"
        "class Holder(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.encoder, self.decoder = nn.Linear(4, 4), nn.Linear(4, 4)\n"
        "def build():\n"
        "    return Holder()\n")
    r = cli("summary", f"{tmp_path / 'holder.py'}:build", "-i", "2x4")
    assert r.code == 3
    assert "error: (root) (Holder) has no forward() of its own (it holds encoder, decoder), so it cannot be run" \
        in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["gradflow", "doctor"])
def test_a_layer_layerdrop_skipped_under_the_default_inputs_is_skipped_at_random(cli, tmp_path, command):
    """A sweep: HF autoformer's layerdrop 0.1 skipped a layer in the judged pass, and it was `not-reached` "because the
    forward did not use them with the default inputs torchdiag chose" (an input's doing), with gradflow and doctor
    naming different layers. Another draw of the RNG reaches it: `skipped-at-random`. A tiny BART with a layerdrop
    of 0.25 per layer, over seeds until a layer is skipped."""
    transformers = pytest.importorskip("transformers")
    spec = _saved(tmp_path, transformers.BartConfig(
        vocab_size=64, d_model=16, encoder_layers=4, decoder_layers=4, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        encoder_layerdrop=0.25, decoder_layerdrop=0.25))
    seen = set()
    for seed in range(4):
        d = cli(command, spec, "--seed", str(seed), "--json").json
        codes = {f["code"] for f in d["findings"]}
        assert "not-reached" not in codes and "no-grad" not in codes, [f["message"][:200] for f in d["findings"]]
        seen |= codes
        if "skipped-at-random" in seen:
            break
    assert "skipped-at-random" in seen


def test_only_a_skipped_member_of_a_stack_is_drawn_again():
    """A review: every not-reached module was drawn again three times on a copy, an image tower the text-only default
    inputs never feed too. Only an entry of a ModuleList or Sequential whose siblings of the same class ran is."""
    from torch import nn

    from torchdiag.core.unreached import in_a_stack

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
            self.image = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
            self.head = nn.Linear(4, 2)

    model = Model()
    reached = {"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias", "head.weight", "head.bias"}
    unreached = ["layers.1.weight", "layers.1.bias", "image.0.weight", "image.0.bias"]
    assert in_a_stack(unreached, model, reached) == ["layers.1.weight", "layers.1.bias"]
    # every layer of a stack skipped (a sweep: wav2vec2's two): the module holding it ran, so it is drawn again; not
    # a stack the root holds (a model that ran says nothing of it), nor one whose holder did not run
    reached -= {"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"}
    everyone = [f"layers.{i}.{k}" for i in range(3) for k in ("weight", "bias")]
    assert in_a_stack(everyone + unreached[2:], model, reached) == []
    encoder = nn.Module()
    encoder.proj, encoder.layers = nn.Linear(4, 4), nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
    wrapped = nn.Sequential(encoder, nn.Linear(4, 2))
    skipped = [f"0.layers.{i}.{k}" for i in range(2) for k in ("weight", "bias")]
    assert in_a_stack(skipped, wrapped, {"0.proj.weight", "0.proj.bias", "1.weight"}) == skipped
    assert in_a_stack(skipped, wrapped, {"1.weight"}) == []   # nothing of its holder ran: a branch never fed


def test_a_module_made_in_forward_is_said_not_a_traceback(cli, tmp_path):
    """A review: `self.mid = nn.Linear(...)` inside forward (a module made at every call) stopped gradflow with an
    internal KeyError (its layer table read the modules named before the pass)."""
    p = tmp_path / "m.py"
    p.write_text("import torch\nfrom torch import nn\nclass Net(nn.Module):\n    def __init__(self):\n"
                 "        super().__init__()\n        self.inp, self.out = nn.Linear(20, 32), nn.Linear(32, 4)\n"
                 "    def forward(self, x):\n        self.mid = nn.Linear(32, 32)\n"
                 "        return self.out(torch.relu(self.mid(torch.relu(self.inp(x)))))\n"
                 "def build():\n    return Net()\n")
    r = cli("gradflow", f"{p}:build", "-i", "8x20", "--device", "cpu", "--json")
    assert r.code == 0, r.stderr
    assert any("mid.weight" in n and "param-recreated" in n for n in r.json["notes"]), r.json["notes"]


def test_a_layer_the_forward_always_skips_in_training_is_not_blamed_on_the_inputs_alone(cli, tmp_path):
    """A review: a LayerDrop of 1.0 (every layer skipped in training) read "never ran in forward with the default
    inputs torchdiag chose", the hint to give other inputs. The other draws that did not reach it are said."""
    transformers = pytest.importorskip("transformers")
    spec = _saved(tmp_path, transformers.BartConfig(
        vocab_size=64, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        encoder_layerdrop=1.0, decoder_layerdrop=0.0))
    d = cli("gradflow", spec, "--json").json
    (f,) = [f for f in d["findings"] if f["code"] == "not-reached"]
    assert "encoder.layers" in f["where"] and "nor in 3 other random draw(s) of the forward" in f["message"], f
