"""The corpus of public architectures (issue 14), built from code/configs with random init.

Names: `tv_<torchvision name>` (every torchvision classification model), `timm_<timm name>`, `hf_<family>`
(Hugging Face from configs) and `pt_<name>` (plain-torch equivalents of tiny HF models, for the test
suite, which has no transformers). Each entry gives a factory and `-i` style input specs; integer
inputs get their values from torchdiag's own default-input rules (the embedding that consumes them,
decoder ids for encoder-decoder models), as on the command line.

CLI use: `torchdiag gradflow bench/corpus_models.py:build --arg name=timm_resnet50 -i 2x3x224x224`.
Needs torchvision / timm / transformers for those families (`.venv-corpus`, see bench/README.md)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Entry:
    name: str
    family: str                       # torchvision | timm | hf | plain
    factory: Callable[[], nn.Module]
    inputs: list[str]                 # -i specs at batch 2
    why: str = ""                     # what this model stands for in the corpus
    tags: set = field(default_factory=set)   # "fast": in the --fast slice
    spec: str = ""                    # a source form (timm:NAME, torchvision:NAME, hf:FOLDER): run as a user runs it
    args: list = field(default_factory=list)  # its --arg values
    params: int | None = None         # counted on meta when the zoo was listed


def _tv_input(name: str) -> list[str]:
    return ["2x3x299x299"] if name == "inception_v3" else ["2x3x224x224"]


def torchvision_entries() -> list[Entry]:
    try:
        import torchvision
    except ImportError:
        return []
    out = []
    for name in torchvision.models.list_models(module=torchvision.models):
        out.append(Entry(f"tv_{name}", "torchvision",
                         (lambda n=name: torchvision.models.get_model(n, weights=None)), _tv_input(name)))
    for e in out:
        if e.name in ("tv_mobilenet_v3_small", "tv_squeezenet1_1", "tv_shufflenet_v2_x0_5"):
            e.tags.add("fast")
    return out


TIMM = {   # name -> why it is in the corpus
    "resnet50": "zero-init residuals (last BN scale of each block = 0)",
    "convnext_tiny": "layer scale initialised at 1e-6",
    "vit_tiny_patch16_224": "ViT: cls_token/pos_embed initialised near 1e-6..0.02",
    "deit_tiny_patch16_224": "DeiT",
    "swin_tiny_patch4_window7_224": "Swin (window attention)",
    "efficientnet_b0": "EfficientNet (squeeze-excitation, BN)",
    "regnety_008": "RegNetY with zero-init last BN",
    "mixer_b16_224": "MLP-Mixer, zero-init head",
    "coatnet_0_rw_224": "CoAtNet",
    "maxvit_tiny_rw_224": "MaxViT",
}


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def _timm(name):
    def build():
        import timm

        return timm.create_model(name, pretrained=False)
    return build


def timm_entries() -> list[Entry]:
    if not _installed("timm"):
        return []
    return [Entry(f"timm_{n}", "timm", _timm(n), ["2x3x224x224"], why) for n, why in TIMM.items()]


def _hf(cls_name: str, config_name: str, **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        return getattr(transformers, cls_name)(cfg)
    return build


_SMALL = dict(vocab_size=1000)


def hf_entries() -> list[Entry]:
    if not _installed("transformers"):
        return []
    tiny_bert = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     max_position_embeddings=128, **_SMALL)
    return [
        Entry("hf_gpt2", "hf", _hf("GPT2LMHeadModel", "GPT2Config"), ["2x32:int64"], "GPT-2 small, default config"),
        Entry("hf_bert", "hf", _hf("BertModel", "BertConfig"), ["2x32:int64"], "BERT-base, default config"),
        Entry("hf_t5", "hf", _hf("T5Model", "T5Config"), ["2x32:int64"], "T5-small, default config (encoder-decoder)"),
        Entry("hf_gpt2_tiny", "hf", _hf("GPT2LMHeadModel", "GPT2Config", n_embd=64, n_layer=2, n_head=4,
                                        n_positions=128, **_SMALL), ["2x16:int64"], "tiny GPT-2", {"fast"}),
        Entry("hf_bert_tiny", "hf", _hf("BertModel", "BertConfig", **tiny_bert), ["2x16:int64"], "tiny BERT", {"fast"}),
        Entry("hf_t5_tiny", "hf", _hf("T5Model", "T5Config", d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                      **_SMALL), ["2x16:int64"], "tiny T5 (decoder ids added)", {"fast"}),
        Entry("hf_llama_tiny", "hf", _hf("LlamaForCausalLM", "LlamaConfig", hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=128, **_SMALL), ["2x16:int64"], "tiny Llama (GQA)"),
        Entry("hf_vit_tiny", "hf", _hf("ViTForImageClassification", "ViTConfig", hidden_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8,
                                       num_labels=10), ["2x3x32x32"], "tiny ViT classifier"),
        Entry("hf_bart_tiny", "hf", _hf("BartForConditionalGeneration", "BartConfig", d_model=64, encoder_layers=2,
                                        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                                        encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128,
                                        **_SMALL), ["2x16:int64"], "tiny BART (encoder-decoder)"),
    ]


# ---- plain-torch stand-ins for the fast slice (the project venv has no transformers/timm) -----------

class TinyBertLike(nn.Module):
    """BERT's layout: word (1000) / segment (2) / position (64) embeddings, post-LN encoder, pooler;
    HF-style keyword output (last_hidden_state, pooler_output) and attention_mask argument."""

    def __init__(self, vocab=1000, dim=32, layers=2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.token_type_embeddings = nn.Embedding(2, dim)
        self.position_embeddings = nn.Embedding(64, dim)
        self.norm = nn.LayerNorm(dim)
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.norm(self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
                      + self.position_embeddings(pos))
        pad = None if attention_mask is None else attention_mask == 0
        h = self.encoder(x, src_key_padding_mask=pad)
        return {"last_hidden_state": h, "pooler_output": torch.tanh(self.pooler(h[:, 0]))}


class TinySeq2SeqLike(nn.Module):
    """T5's contract: shared embedding, the decoder needs decoder_input_ids (no default)."""

    def __init__(self, vocab=500, dim=32):
        super().__init__()
        self.shared = nn.Embedding(vocab, dim)
        self.transformer = nn.Transformer(dim, 4, 1, 1, 64, dropout=0.0, batch_first=True)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids, decoder_input_ids=None):
        if decoder_input_ids is None:
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        h = self.transformer(self.shared(input_ids), self.shared(decoder_input_ids))
        return self.lm_head(h)


class AuxClassifier(nn.Module):
    """Inception's contract in train mode: (logits, aux_logits), the aux head on its own branch."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
        self.fc = nn.Linear(128, classes)
        self.aux = nn.Sequential(nn.Linear(128, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, x):
        h = self.stem(x)
        return (self.fc(h), self.aux(h)) if self.training else self.fc(h)


def plain_entries() -> list[Entry]:
    return [
        Entry("pt_bert_like", "plain", TinyBertLike, ["2x16:int64", "2x16:int64"], "BERT layout, dict output", {"fast"}),
        Entry("pt_seq2seq_like", "plain", TinySeq2SeqLike, ["2x12:int64"], "T5 contract (decoder ids)", {"fast"}),
        Entry("pt_aux_classifier", "plain", AuxClassifier, ["2x3x16x16"], "Inception contract (aux head)", {"fast"}),
    ]


ISSUE_26 = {f"timm_{n}" for n in ("cait_xxs24_224", "edgenext_xx_small", "nfnet_l0", "ghostnet_100",
                                    "poolformer_s12", "levit_128s", "resnest14d")}


def zoo_entries() -> list[Entry]:
    """The whole zoo (bench/corpus_zoo.py lists it into bench/corpus-zoo.json), as source specs with
    their default inputs; smallest first. Entries that did not build from a small config are kept (a row)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent / "corpus-zoo.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["entries"]
    rows.sort(key=lambda r: (r.get("params") is None, r.get("params") or 0))
    # families interleaved (timm, torchvision, hf, timm, ...), each smallest first: a run cut short still
    # covers every family
    by_family: dict[str, list] = {}
    for r in rows:
        by_family.setdefault(r["family"], []).append(r)
    order = [f for f in ("timm", "torchvision", "hf") if f in by_family] + sorted(set(by_family) - {"timm", "torchvision", "hf"})
    rows = [fam[i] for i in range(max(map(len, by_family.values()), default=0))
            for fam in (by_family[f] for f in order) if i < len(fam)]
    first = [r for r in rows if r["name"] in ISSUE_26]      # the report's models run first
    rows = first + [r for r in rows if r["name"] not in ISSUE_26]
    out = []
    for r in rows:
        out.append(Entry("zoo_" + r["name"], r["family"], _unbuildable(r.get("build_error")), [], r.get("why", ""),
                         spec="" if r.get("build_error") else r["spec"], args=list(r.get("args", [])),
                         params=r.get("params")))
    return out


def _unbuildable(error):
    def build():
        raise RuntimeError(error or "no spec")
    return build


def entries(prefix: str = "") -> list[Entry]:
    """Every entry, or those whose name starts with `prefix` (only that family's package is imported)."""
    families = (("pt_", plain_entries), ("tv_", torchvision_entries), ("timm_", timm_entries), ("hf_", hf_entries),
                ("zoo_", zoo_entries))
    out = []
    for fam, fn in families:
        if fam.startswith(prefix) or prefix.startswith(fam):
            out += [e for e in fn() if e.name.startswith(prefix)]
    return out


def build(name: str) -> nn.Module:
    """Factory for the CLI: `bench/corpus_models.py:build --arg name=tv_resnet50`."""
    for e in entries(name):
        if e.name == name:
            return e.factory()
    raise ValueError(f"unknown corpus model {name!r}")
