"""MODEL_SPEC forms beside file.py:factory: hf:PATH (a local config.json), torchvision:NAME, timm:NAME.

The zoo tests (`-k zoo`) need torchvision/timm built for the installed torch; they skip cleanly when
those cannot be imported (the project venv), and run in .venv-corpus:
`.venv-corpus/bin/python -m pytest tests/test_sources.py -k zoo`."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from support import ROOT, one_error_line

transformers = pytest.importorskip("transformers")


def importable(name):
    """The module, or a clean skip (also when it is installed but built for another torch)."""
    try:
        return __import__(name)
    except Exception as exc:  # e.g. "operator torchvision::nms does not exist"
        pytest.skip(f"{name} cannot be imported here: {type(exc).__name__}")


def gpt2_dir(tmp_path, **extra):
    folder = tmp_path / "gpt2-config"
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=500, n_positions=64,
                                  bos_token_id=0, eos_token_id=0, **extra)
    cfg.architectures = ["GPT2LMHeadModel"]
    cfg.save_pretrained(folder)
    return folder


def test_an_hf_override_that_is_no_field_of_the_config_is_said_with_the_nearest(tmp_path, cli):
    """A sweep: `--arg num_hiden_layers=1` ran the 2-layer model, exit 0, nothing said."""
    folder = gpt2_dir(tmp_path)
    r = cli("summary", f"hf:{folder}", "--arg", "n_layr=1", "--arg", "attn_implementation=eager", "--arg",
            "activation_function=relu", "--depth", "0", "--json")
    assert r.code == 0, r.stderr
    assert "; --arg n_layr (did you mean n_layer?): no field of GPT2Config" in r.json["source"], r.json["source"]
    assert "attn_implementation" not in r.json["source"] and "activation_function" not in r.json["source"]
    # a review: an override transformers reads and drops (llama's rope_theta beside the file's rope_parameters)
    llama = tmp_path / "llama"
    transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=64, vocab_size=100).save_pretrained(llama)
    r = cli("summary", f"hf:{llama}", "--arg", "rope_theta=500000", "--arg", "hidden_act=relu", "--depth", "0",
            "--json")
    assert r.code == 0 and "--arg rope_theta changed nothing in the config" in r.json["source"], r.json["source"]
    assert "hidden_act" not in r.json["source"]
    # a value the model refuses as it is built is said with the --arg that gave it (a sweep: "the model's own code")
    r = cli("summary", f"hf:{folder}", "--arg", "n_head=5")
    assert r.code == 3 and "(built with --arg n_head=5) raised" in r.stderr, r.stderr


def test_hf_config_builds_with_default_token_inputs(tmp_path, cli):
    folder = gpt2_dir(tmp_path)
    r = cli("summary", f"hf:{folder}", "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    assert doc["inputs"] == ["input[0]: 1x64 int64", "labels: 1x64 int64"]   # length capped by n_positions
    assert "labels = the input ids" in doc["input_source"]      # a causal LM: its own next-token loss
    assert "vocab 500" in doc["input_source"]
    assert any("[0, 500)" in n and "transformer.wte" in n for n in doc["input_notes"])
    assert "GPT2LMHeadModel from config.architectures" in doc["source"] and "random weights" in doc["source"]
    # closed form: wte 500*32 + wpe 64*32 + 2 blocks + final LayerNorm (lm_head tied to wte)
    block = 2 * 2 * 32 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32)
    assert doc["total_params"] == 500 * 32 + 64 * 32 + 2 * block + 2 * 32


def test_hf_config_file_itself_and_arg_overrides(tmp_path, cli):
    folder = gpt2_dir(tmp_path)
    one = cli("summary", f"hf:{folder}/config.json", "--arg", "n_layer=1", "--json")
    two = cli("summary", f"hf:{folder}/config.json", "--json")
    assert one.code == two.code == 0, one.stderr + two.stderr
    assert one.json["total_params"] < two.json["total_params"]


def test_hf_config_too_big_for_the_memory_is_refused_before_it_is_built(tmp_path, cli, monkeypatch):
    # zamba's default config (7.2e9 parameters, 27 GiB of float32) on a 24 GiB machine was OOM-killed while it was
    # built; here the machine is made small instead: sized on meta, refused in one line, and meta is never refused
    from torchdiag.core import resources

    folder = gpt2_dir(tmp_path)
    monkeypatch.setattr(resources, "device_available", lambda device, swap=False: 100_000)
    r = cli("summary", f"hf:{folder}", "--device", "cpu")
    assert r.code == 3, r.stderr
    one_error_line(r)
    # 43,520 parameters (lm_head tied to wte: counted once), float32
    assert f"error: hf:{folder} is too big for the memory here: 43,520 parameters need 170.00 KiB on cpu (170.00 KiB " \
        "of float32 weights), 97.66 KiB is available there" in r.stderr
    assert "hint: --device meta" in r.stderr
    assert cli("summary", f"hf:{folder}", "--device", "meta").code == 0


def test_hf_weights_from_safetensors_in_the_folder(tmp_path, cli):
    from safetensors.torch import save_file

    from torchdiag.core.context import prepare
    from torchdiag.core.run import RunSpec

    folder = gpt2_dir(tmp_path)
    model = transformers.GPT2LMHeadModel(transformers.AutoConfig.from_pretrained(folder))
    state = {k: torch.full_like(v, 0.25) for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: saved once
    save_file(state, str(folder / "model.safetensors"))
    built, _, ctx = prepare(RunSpec("summary", f"hf:{folder}", device="cpu"))
    assert torch.equal(built.transformer.h[1].mlp.c_fc.weight, torch.full((32, 128), 0.25))
    assert torch.equal(built.lm_head.weight, torch.full((500, 32), 0.25))
    assert "model.safetensors: " in ctx.header["checkpoint"][0]
    r = cli("summary", f"hf:{folder}", "--json")
    assert r.code == 0 and "random weights" not in r.json["source"]


def test_hf_folder_reads_what_from_pretrained_reads(tmp_path, cli):
    """A review: every *.safetensors in the folder was loaded (a step's file beside the weights failed the spec), and
    a stale shards' index was read before a newer model.safetensors. from_pretrained reads model.safetensors first."""
    from safetensors.torch import save_file

    from torchdiag.core.context import prepare
    from torchdiag.core.run import RunSpec

    folder = gpt2_dir(tmp_path)
    model = transformers.GPT2LMHeadModel(transformers.AutoConfig.from_pretrained(folder))
    state = {k: torch.full_like(v, 0.25) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    model.save_pretrained(folder, max_shard_size="50KB")            # an older sharded save: index + shards
    assert (folder / "model.safetensors.index.json").is_file()
    save_file(state, str(folder / "model.safetensors"))              # the newer weights, one file
    save_file({"step": torch.zeros(1)}, str(folder / "step100.safetensors"))
    built, _, ctx = prepare(RunSpec("summary", f"hf:{folder}", device="cpu"))
    assert torch.equal(built.transformer.h[1].mlp.c_fc.weight, torch.full((32, 128), 0.25))
    assert len(ctx.header["checkpoint"]) == 1 and "model.safetensors: " in ctx.header["checkpoint"][0]
    r = cli("summary", f"hf:{folder}", "--json")
    assert r.code == 0, r.stderr
    assert "model.safetensors.index.json, step100.safetensors in the folder not read (from_pretrained reads model.safetensors" in r.json["source"], r.json["source"]
    assert transformers.GPT2LMHeadModel.from_pretrained(folder).transformer.h[1].mlp.c_fc.weight.eq(0.25).all()
    # --checkpoint replaces the folder's weights: those are the ones not read (a review: the file given was)
    r = cli("summary", f"hf:{folder}", "--checkpoint", folder / "model.safetensors", "--json")
    assert "model.safetensors.index.json, step100.safetensors in the folder not read (--checkpoint given)" in \
        r.json["source"], r.json["source"]
    # a PEFT adapter alone is never read as the model's weights (its lora keys do not fit: exit 2)
    for f in list(folder.glob("*.safetensors*")):
        f.unlink()
    save_file({"base_model.model.lm_head.lora_A.weight": torch.zeros(2, 32)}, str(folder / "adapter_model.safetensors"))
    r = cli("summary", f"hf:{folder}", "--json")
    assert r.code == 0 and "adapter_model.safetensors in the folder not read" in r.json["source"], r.stderr
    # a review: with --checkpoint the weights are the file's, not "random weights"
    save_file(state, str(tmp_path / "elsewhere.safetensors"))
    r = cli("summary", f"hf:{folder}", "--checkpoint", tmp_path / "elsewhere.safetensors", "--json")
    assert r.code == 0 and "random weights" not in r.json["source"], r.json["source"]


def test_hf_seq2seq_gets_decoder_inputs_on_cpu_and_meta(tmp_path, cli):
    folder = tmp_path / "t5"
    cfg = transformers.T5Config(vocab_size=300, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                decoder_start_token_id=0)
    cfg.architectures = ["T5ForConditionalGeneration"]
    cfg.save_pretrained(folder)
    for device in ("cpu", "meta"):
        # the bare model: random decoder ids; the LM head: labels = the input ids, its decoder fed from them
        r = cli("summary", f"hf:{folder}", "--arg", "task=base", "--device", device, "--json")
        assert r.code == 0, (device, r.stderr)
        assert any(i.startswith("decoder_input_ids: 1x128 int64") for i in r.json["inputs"]), r.json["inputs"]
        r = cli("summary", f"hf:{folder}", "--device", device, "--json")
        assert r.code == 0, (device, r.stderr)
        assert r.json["inputs"] == ["input[0]: 1x128 int64", "labels: 1x128 int64"], r.json["inputs"]


def test_a_speech_seq2seq_keeps_its_decoder_ids_on_meta(tmp_path, cli):
    """A sweep: on meta, Whisper's decoder ids were made a copy of its input features (1x80x200 float32), over the
    layout's own 1x16 int64, and its decoder's embedding refused them (exit 3); the CPU run took 1x16 int64."""
    folder = tmp_path / "whisper"
    cfg = transformers.WhisperConfig(vocab_size=500, d_model=64, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                     decoder_ffn_dim=128, max_source_positions=100, pad_token_id=1, bos_token_id=2,
                                     eos_token_id=3, decoder_start_token_id=2)
    cfg.architectures = ["WhisperForConditionalGeneration"]
    cfg.save_pretrained(folder)
    for device in ("cpu", "meta"):
        r = cli("summary", f"hf:{folder}", "--device", device, "--json")
        assert r.code == 0, (device, r.stderr)
        assert any(i.startswith("decoder_input_ids: 1x16 int64") for i in r.json["inputs"]), (device, r.json["inputs"])


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_config_warning_is_said_once_though_the_model_is_built_twice(tmp_path):
    # sized on meta, then built: BertLMHeadModel's constructor logs its is_decoder advice at each build (a process of
    # its own: transformers' handler writes to the stderr it was made with)
    import subprocess

    folder = tmp_path / "bert"
    transformers.BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=40,
                            architectures=["BertLMHeadModel"]).save_pretrained(folder)
    r = subprocess.run([sys.executable, "-m", "torchdiag", "summary", f"hf:{folder}", "--device", "cpu"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("as a standalone, add `is_decoder=True.`") == 1, r.stderr


def test_hf_task_picks_the_head(tmp_path, cli):
    folder = tmp_path / "bert"
    transformers.BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=40).save_pretrained(folder)
    base = cli("summary", f"hf:{folder}", "--json")
    mlm = cli("summary", f"hf:{folder}", "--arg", "task=masked-lm", "--json")
    assert base.code == mlm.code == 0, base.stderr + mlm.stderr
    assert "AutoModel (" in base.json["source"] and "AutoModelForMaskedLM for task masked-lm" in mlm.json["source"]
    assert base.json["inputs"] == ["input[0]: 1x40 int64"]
    r = cli("summary", f"hf:{folder}", "--arg", "task=translate")
    assert r.code == 2 and "causal-lm" in r.stderr
    one_error_line(r)


def _bert_mlm(folder, layers=2):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    saved = transformers.BertForMaskedLM(config)
    saved.save_pretrained(folder)
    return saved


@pytest.mark.parametrize("task, cls", [("sequence-classification", "BertForSequenceClassification"),
                                       ("base", "BertModel")])
def test_another_head_on_a_saved_model_starts_as_from_pretrained_starts_it(tmp_path, cli, task, cls):
    # a sweep: an MLM folder under --arg task=sequence-classification (the usual fine-tuning start) was refused for
    # the classifier's keys (exit 2), and under --no-strict-checkpoint was exit 1 with nine key errors
    folder = tmp_path / "mlm"
    saved = _bert_mlm(folder)
    r = cli("nancheck", f"hf:{folder}", "--arg", f"task={task}", "--arg", "num_labels=3", "--json")
    assert r.code == 0, r.stderr
    (f,) = [f for f in r.json["findings"] if f["code"] == "checkpoint-new-head"]
    # the truth, as from_pretrained has it: what it newly initialises and drops, by name
    ref, info = getattr(transformers, cls).from_pretrained(folder, num_labels=3, output_loading_info=True)
    assert f["severity"] == "info" and set(f["members"]) == {*info["missing_keys"], *info["unexpected_keys"]}, (f, info)
    assert info["missing_keys"] and info["unexpected_keys"]   # the premise: both heads' keys differ
    word = ref.get_input_embeddings().weight
    assert torch.equal(word, saved.bert.embeddings.word_embeddings.weight)
    assert not [f for f in r.json["findings"] if f["severity"] == "error"]
    same = cli("nancheck", f"hf:{folder}", "--arg", "task=masked-lm", "--json")   # the saved head: strict as before
    assert same.code == 0 and not [f for f in same.json["findings"] if f["code"].startswith("checkpoint")]


@pytest.mark.parametrize("task", ["sequence-classification", "base"])
def test_another_head_does_not_excuse_a_key_the_saved_model_has(tmp_path, cli, task):
    # a review of the first version: every missing key was excused, and a file without a whole encoder layer
    # passed with exit 0; the keys both heads have stay strict
    folder = tmp_path / "mlm"
    _bert_mlm(folder)
    from safetensors.torch import load_file, save_file
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if ".layer.1." not in k}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    r = cli("nancheck", f"hf:{folder}", "--arg", f"task={task}")
    assert r.code == 2 and "encoder.layer.1.attention.self.query.weight" in r.stderr, r.stderr
    one_error_line(r)


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "has no config.json"),
    (lambda p: None, "no such folder or file"),
])
def test_hf_missing_config_is_one_line_exit_2_with_no_network(tmp_path, cli, make, words):
    folder = tmp_path / "model"
    make(folder)
    r = cli("summary", f"hf:{folder}")
    assert r.code == 2
    one_error_line(r)
    assert words in r.stderr and "never downloads" in r.stderr
    r = cli("summary", f"hf:{folder}", "--json")
    assert r.code == 2 and words in r.json["error"]["message"] and "never downloads" in r.json["error"]["hint"]


def test_hf_custom_code_is_refused(tmp_path, cli):
    folder = gpt2_dir(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(cfg))
    r = cli("summary", f"hf:{folder}")
    assert r.code == 2 and "custom model code" in r.stderr
    one_error_line(r)


@pytest.mark.parametrize("spec, package", [("torchvision:resnet18", "torchvision"), ("timm:resnet18", "timm"),
                                           ("hf:.", "transformers")])
def test_missing_library_is_one_line_with_install_command(tmp_path, cli, monkeypatch, spec, package):
    if package == "transformers":
        gpt2_dir(tmp_path)
        spec = f"hf:{tmp_path}/gpt2-config"
    monkeypatch.setitem(sys.modules, package, None)   # `import package` now fails as if it were absent
    r = cli("summary", spec)
    assert r.code == 2
    one_error_line(r)
    assert f"error: {package} is not installed: pip install {package}" in r.stderr


def test_empty_source_name(cli):
    r = cli("summary", "torchvision:")
    assert r.code == 2 and "names no model" in r.stderr


# ---- zoo: needs torchvision / timm for this torch (.venv-corpus) --------------------------------------

def test_zoo_torchvision_default_input_from_weights_transforms(cli):
    importable("torchvision")
    r = cli("summary", "torchvision:resnet18", "--depth", "0", "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input[0]: 1x3x224x224 float32"]
    assert "IMAGENET1K_V1.transforms() crop_size 224x224" in r.json["input_source"]
    assert r.json["total_params"] == 11_689_512      # torchvision's published count for resnet18
    r = cli("summary", "torchvision:inception_v3", "--device", "meta", "--depth", "0", "--json")
    assert r.code == 0 and r.json["inputs"] == ["input[0]: 1x3x299x299 float32"]


def test_zoo_torchvision_args_and_checkpoint(tmp_path, cli):
    tv = importable("torchvision")
    model = tv.models.resnet18(num_classes=10)
    torch.save(model.state_dict(), tmp_path / "r18.pt")
    r = cli("summary", "torchvision:resnet18", "--arg", "num_classes=10", "--checkpoint", tmp_path / "r18.pt", "--json")
    assert r.code == 0, r.stderr
    r = cli("summary", "torchvision:resnet18", "--checkpoint", tmp_path / "r18.pt")
    assert r.code == 2 and "fc.weight: checkpoint 10x512, model 1000x512" in r.stderr


def test_zoo_torchvision_unknown_name_nearest(cli):
    importable("torchvision")
    r = cli("summary", "torchvision:resnet5", "--json")
    assert r.code == 2
    assert r.json["error"]["message"] == "torchvision has no model named 'resnet5'"
    assert "resnet50" in r.json["error"]["hint"]


def test_zoo_torchvision_detection_never_downloads_a_backbone(cli, monkeypatch):
    importable("torchvision")
    import urllib.request

    def no_network(*a, **k):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    r = cli("summary", "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn", "--depth", "0", "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input[0][0]: 3x320x320 float32"]
    r = cli("summary", "torchvision:resnet18", "--arg", "weights=DEFAULT")
    assert r.code == 2 and "download" in r.stderr
    r = cli("summary", "torchvision:resnet18", "--arg", "pretrained=true")   # the old spelling (a sweep)
    assert r.code == 2 and "download" in r.stderr, r.stderr
    assert cli("summary", "torchvision:resnet18", "--arg", "pretrained=false", "--depth", "0").code == 0


def test_zoo_timm_model_and_nearest_name(cli):
    importable("timm")
    r = cli("summary", "timm:resnet18", "--depth", "0", "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input[0]: 1x3x224x224 float32"] and "pretrained_cfg" in r.json["input_source"]
    r = cli("summary", "timm:resnet18x")
    assert r.code == 2 and "did you mean" in r.stderr and "resnet18" in r.stderr


def test_zoo_timm_default_input_follows_the_size_and_channels_the_model_is_built_for(cli):
    """A sweep: timm keeps its pretrained_cfg's 3x224x224 under img_size/in_chans, and healthy models exited 3 on
    it (a ViT at 384: "Input height (224) doesn't match model (384)"; a RegNet at in_chans=1)."""
    importable("timm")
    r = cli("summary", "timm:vit_tiny_patch16_224", "--arg", "img_size=96", "--arg", "in_chans=1", "--depth", "0",
            "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input[0]: 1x1x96x96 float32"], r.json["inputs"]
    assert "in_chans=1 and img_size=96 from --arg" in r.json["input_source"]


def test_training_commands_get_a_default_batch_of_two(tmp_path, cli):
    # issue 26: BatchNorm after global pooling refuses one sample in train mode; a default input must
    # never break a healthy model, and summary/flops keep their per-sample numbers at batch 1
    folder = gpt2_dir(tmp_path)
    r = cli("summary", f"hf:{folder}", "--json")
    assert r.json["inputs"][0] == "input[0]: 1x64 int64"
    r = cli("gradflow", f"hf:{folder}", "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"][0] == "input[0]: 2x64 int64" and "batch 2 (1 for commands that do not train): the command " \
        "runs train mode" in r.json["input_source"]
    # said as it applies: GPT-2 has no BatchNorm (a sweep read "where BatchNorm needs more than one sample" on it)
    assert "BatchNorm" not in r.json["input_source"] and "one sample is an edge case" in r.json["input_source"]
    assert all(line.split(": ", 1)[1].startswith("2x") for line in r.json["inputs"])   # labels too: the same rows



def test_zoo_detection_trains_with_its_own_losses(cli, monkeypatch):
    # torchvision detection in train mode gets two images with targets and its loss dict is the loss;
    # every feature level of the head is matched by a box (no zero-grad on an unmatched level)
    importable("torchvision")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)   # a CPU run, on a GPU box too
    r = cli("gradflow", "torchvision:ssdlite320_mobilenet_v3_large", "--json")
    assert r.code == 0, r.stderr
    assert r.json["loss"] == "the scalar output itself (output['bbox_regression']) + output['classification'] itself"
    assert not [f for f in r.json["findings"] if f["severity"] != "info"], r.json["findings"]


def test_a_forward_that_reads_pixels_gets_an_image_when_the_config_names_no_size(cli, tmp_path):
    """Hugging Face's ResNet (like DETR) has no image_size in its config: its default input was token ids, which
    its first layer refused (exit 3 on every command). It reads pixel_values: it gets a 224 x 224 image."""
    from transformers import ResNetConfig

    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=3)
    config.architectures = ["ResNetForImageClassification"]
    config.save_pretrained(tmp_path / "resnet")
    r = cli("gradflow", f"hf:{tmp_path / 'resnet'}", "--device", "cpu", "--json")
    assert r.code == 0, r.stdout + r.stderr
    assert r.json["inputs"] == ["input[0]: 3x3x224x224 float32"]   # 3: it has BatchNorm
    assert "reads pixel_values; no image_size in its config" in r.json["input_source"]


def test_ids_a_model_pads_before_its_embedding_are_valued_in_that_embedding(tmp_path, cli):
    """A sweep: Longformer pads its ids to a multiple of its attention window inside its forward, so the tensor its
    word embedding reads is a new one; the ids were valued in the smallest table (its 2 token types), half of them
    the pad id."""
    from transformers import LongformerConfig

    config = LongformerConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=32, attention_window=16, max_position_embeddings=64)
    config.architectures = ["LongformerModel"]
    config.save_pretrained(tmp_path / "lf")
    r = cli("summary", f"hf:{tmp_path / 'lf'}", "--depth", "0", "--json")
    assert r.code == 0, r.stderr
    assert any("integer values in [0, 300)" in n and "word_embeddings" in n for n in r.json["input_notes"]), r.json


def test_the_image_size_of_a_sub_config():
    """SAM and CLIP keep image_size in vision_config: the default image is read from there."""
    from transformers import CLIPConfig

    from torchdiag.core.hf_inputs import image_of

    config = CLIPConfig(vision_config={"image_size": 96, "num_channels": 3})
    assert not hasattr(config, "image_size") and image_of(config) == (3, 96, 96)


def test_torchvision_weights_size_falls_back_to_the_imagenet_size():
    # ViT-H/14's default weights crop 518 and are for that size only (meta min_size), but the builder without
    # weights makes the 224 model: the weights' size is tried first and 224 after it
    from types import SimpleNamespace

    from torchdiag.core import sources

    def models_with(crop, min_size=(1, 1)):
        transform = SimpleNamespace(crop_size=[crop])
        weights = SimpleNamespace(transforms=lambda: transform, meta={"min_size": min_size})
        return SimpleNamespace(get_model_weights=lambda name: SimpleNamespace(DEFAULT=weights),
                               list_models=lambda module=None: [], detection=None)

    big = sources.Source(lambda: None, {}, "x")
    sources._torchvision_inputs(models_with(518, (518, 518)), "vit_h_14", big)
    assert big.inputs == ("1x3x518x518",) and big.alternatives == (("1x3x224x224",),)
    assert "the builder makes the 224 one" in big.input_source
    anysize = sources.Source(lambda: None, {}, "x")          # a convnet runs at any size: no second probe
    sources._torchvision_inputs(models_with(600), "efficientnet_b7", anysize)
    assert anysize.inputs == ("1x3x600x600",) and anysize.alternatives == ()
    plain = sources.Source(lambda: None, {}, "x")
    sources._torchvision_inputs(models_with(224), "resnet18", plain)
    assert plain.inputs == ("1x3x224x224",) and plain.alternatives == ()


def test_torchvision_default_input_follows_an_image_size_given():
    """A sweep: `torchvision:vit_b_16 --arg image_size=384` exited 3 on the weights' 224 crop."""
    from types import SimpleNamespace

    from torchdiag.core import sources

    transform = SimpleNamespace(crop_size=[224])
    weights = SimpleNamespace(transforms=lambda: transform, meta={"min_size": (224, 224)})
    models = SimpleNamespace(get_model_weights=lambda name: SimpleNamespace(DEFAULT=weights),
                             list_models=lambda module=None: [], detection=None)
    for given, want in ((384, "1x3x384x384"), ([160, 192], "1x3x160x192"), (224, "1x3x224x224")):
        source = sources.Source(lambda: None, {"image_size": given}, "x")
        sources._torchvision_inputs(models, "vit_b_16", source)
        assert source.inputs == (want,), (given, source.inputs)
        assert ("from --arg" in source.input_source) == (given != 224), source.input_source


def test_said_once_folds_a_library_s_repeated_lines_only():
    # a review: the filter folded the user's own repeated lines too, and a malformed log call raised out of it as
    # a failed build
    import io
    import logging

    from torchdiag.core.sources import said_once

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    lib, own = logging.getLogger("transformers.models.x"), logging.getLogger("mine")
    lib.setLevel(logging.WARNING)   # whatever transformers' verbosity is in this process
    logging.getLogger("transformers").addHandler(handler)
    own.addHandler(handler)
    try:
        with said_once():
            for _ in range(2):
                lib.warning("advice")
                own.warning("step")
            (once,) = handler.filters   # a malformed call is let through, for logging to report as it does
            bad = logging.LogRecord("transformers.x", logging.WARNING, __file__, 1, "built with %d layers", ("3",), None)
            assert once(bad) is True
    finally:
        logging.getLogger("transformers").removeHandler(handler)
        own.removeHandler(handler)
        lib.setLevel(logging.NOTSET)
    assert out.getvalue().splitlines().count("advice") == 1 and out.getvalue().splitlines().count("step") == 2
    assert not handler.filters


@pytest.mark.parametrize("saved, task, cls", [("ViTForImageClassification", "base", "ViTModel"),
                                              ("ViTModel", "image-classification", "ViTForImageClassification")])
def test_another_head_on_weights_transformers_converts_on_loading(tmp_path, cli, saved, task, cls):
    # reviews: a ViT folder (its attention converted by transformers 5's own loader) under another head was refused,
    # 32 missing and 32 unexpected (from_pretrained loads its 38 encoder tensors); the base model under a classifier
    # (the usual fine-tuning start) too, its pooler's keys said by the file's names; a layer removed stays refused
    folder = tmp_path / "vit"
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                    image_size=32, patch_size=8, num_labels=5)
    getattr(transformers, saved)(config).save_pretrained(folder)
    r = cli("summary", f"hf:{folder}", "--arg", f"task={task}", "--json")
    assert r.code == 0, r.stderr
    (f,) = [f for f in r.json["findings"] if f["code"] == "checkpoint-new-head"]
    ref, info = getattr(transformers, cls).from_pretrained(folder, output_loading_info=True)
    assert set(f["members"]) == {*info["missing_keys"], *info["unexpected_keys"]}, (f, info)
    from safetensors.torch import load_file, save_file
    state = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in state.items() if ".layer.1." not in k}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    assert cli("summary", f"hf:{folder}", "--arg", f"task={task}").code == 2


def test_another_head_on_a_folder_whose_config_names_no_architecture(tmp_path, cli):
    # a review: an MLM file under a config without `architectures` was read as the base model's (the default head),
    # and its cls.* keys were refused; the saved head is the one of the config's type that holds every key of the file
    folder = tmp_path / "mlm"
    _bert_mlm(folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("architectures")
    (folder / "config.json").write_text(json.dumps(config))
    r = cli("nancheck", f"hf:{folder}", "--arg", "task=sequence-classification", "--arg", "num_labels=3", "--json")
    assert r.code == 0, r.stderr
    (f,) = [f for f in r.json["findings"] if f["code"] == "checkpoint-new-head"]
    ref, info = transformers.BertForSequenceClassification.from_pretrained(folder, num_labels=3, output_loading_info=True)
    assert set(f["members"]) == {*info["missing_keys"], *info["unexpected_keys"]}, (f, info)
