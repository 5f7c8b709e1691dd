"""bench/corpus_zoo.py's shrunk Hugging Face configs (issue 26): the sizes that depend on each other stay
consistent, so a shrunk model runs its forward (an exit 3 in the zoo must be the model's or torchdiag's,
never the shrinking's)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import corpus_zoo  # noqa: E402
import zoo_complete  # noqa: E402


def _shrunk(name):
    config = getattr(transformers, name)()
    corpus_zoo.shrink(config)
    return config


def test_latent_attention_keeps_its_parts_consistent_and_runs():
    c = _shrunk("DeepseekV3Config")
    assert c.hidden_size == 32 and c.num_attention_heads == 4
    assert c.num_key_value_heads == c.num_attention_heads          # multi-head stays multi-head
    assert c.qk_head_dim == c.qk_nope_head_dim + c.qk_rope_head_dim and c.head_dim == c.qk_rope_head_dim
    assert c.kv_lora_rank <= 16 and c.q_lora_rank <= 16
    c.num_hidden_layers, c.first_k_dense_replace = 1, 1          # one dense layer: the test stays small
    model = transformers.DeepseekV3ForCausalLM._from_config(c)
    out = model(torch.randint(0, 100, (1, 8)))
    assert out.logits.shape == (1, 8, c.vocab_size)


def test_per_stage_heads_divide_the_widths():
    c = _shrunk("SwinConfig")
    assert list(c.num_heads) == [2, 4, 4, 4]
    widths = [c.embed_dim * 2 ** i for i in range(len(c.depths))]
    assert all(w % h == 0 for w, h in zip(widths, c.num_heads))


def test_a_second_width_and_its_heads_follow_the_first():
    c = _shrunk("VJEPA2Config")
    assert c.pred_hidden_size == 32 and c.pred_hidden_size % c.pred_num_attention_heads == 0


def _completed(name):
    config = getattr(transformers, name)()
    zoo_complete.complete(config, max(corpus_zoo._token_ids(c) for c in zoo_complete.sub_configs(config)))
    corpus_zoo.shrink(config)
    zoo_complete.after_shrink(config, corpus_zoo.LAYER_COUNTS, corpus_zoo.SMALL)
    return config


def test_completing_leaves_a_config_with_nothing_unset_as_it_was():
    config = transformers.BertConfig()
    before = config.to_json_string()
    zoo_complete.complete(config, 0)
    assert config.to_json_string() == before


def test_a_placeholder_id_the_model_compares_gets_one_inside_the_vocabulary():
    assert transformers.Blip2Config().image_token_index is None      # `input_ids == None`: a bool, exit 3
    c = _completed("Blip2Config")
    assert isinstance(c.image_token_index, int) and 0 <= c.image_token_index < c.text_config.vocab_size


def test_a_hybrid_keeps_an_attention_layer_and_runs():
    assert not transformers.BambaConfig().attn_layer_indices        # every layer Mamba: the cache refuses
    c = _completed("BambaConfig")
    assert c.attn_layer_indices == [1] and c.num_hidden_layers >= 2
    model = transformers.BambaForCausalLM._from_config(c).eval()
    with torch.no_grad():
        out = model(torch.randint(0, 100, (1, 8)))
    assert out.logits.shape == (1, 8, c.vocab_size)


def test_unset_experts_per_token_and_an_odd_expert_width():
    c = _completed("DeepseekV2Config")
    assert c.num_experts_per_tok == 2
    assert c.moe_intermediate_size == corpus_zoo.SMALL["intermediate_size"]


def test_a_dim_that_is_the_sum_of_two_widths_follows_them():
    """Xcodec's codebook_dim and Xcodec2's quantization_dim are the acoustic and semantic widths concatenated
    (1024 + 1024); left at 2048 beside widths of 32 the shrunk Xcodec2 could not run its quantizer (a Linear of 2048
    inputs given 64), and Xcodec fell back to its default config. A length or a count equal to such a sum stays."""
    c = _shrunk("Xcodec2Config")
    assert c.quantization_dim == c.hidden_size + c.semantic_model_config.hidden_size == 64
    c = _shrunk("XcodecConfig")
    assert c.codebook_dim == c.acoustic_model_config.hidden_size + c.semantic_model_config.hidden_size
    c = transformers.Xcodec2Config()
    c.sampling_rate = c.quantization_dim   # 2048: a rate, not a *_dim, though it equals the sum
    corpus_zoo.shrink(c)
    assert c.sampling_rate == 2048 and c.quantization_dim == 64


def test_sizes_every_checkpoint_sets_are_completed_and_the_model_runs():
    """Default configs that leave None what each checkpoint sets could not be built at any size (zoo rows "not built"):
    HunYuan's head_dim (the rotary table's `base ** (arange / None)`), Nemotron's num_key_value_heads, ESM's
    vocab_size, dots1's expert counts. Completed from the config's own widths, they build (and HunYuan runs)."""
    for name, key in [("HunYuanDenseV1Config", "head_dim"), ("NemotronConfig", "num_key_value_heads"),
                      ("EsmConfig", "vocab_size"), ("Dots1Config", "n_routed_experts")]:
        assert getattr(getattr(transformers, name)(), key) is None, name
    c = _completed("HunYuanDenseV1Config")
    assert c.head_dim * c.num_attention_heads == c.hidden_size
    c = _completed("NemotronConfig")
    assert c.num_key_value_heads == c.num_attention_heads
    c = _completed("Dots1Config")
    assert c.n_routed_experts >= c.num_experts_per_tok and c.n_shared_experts == 1
    assert isinstance(_completed("EsmConfig").vocab_size, int)
    c = _completed("HunYuanDenseV1Config")
    model = transformers.HunYuanDenseV1ForCausalLM._from_config(c).eval()
    with torch.no_grad():
        out = model(torch.randint(0, c.vocab_size, (1, 8)))
    assert out.logits.shape == (1, 8, c.vocab_size)


def test_a_head_width_that_does_not_divide_is_left_unset():
    c = transformers.HunYuanDenseV1Config(hidden_size=30, num_attention_heads=4)
    zoo_complete.complete(c, 0)
    assert c.head_dim is None


def test_a_forecaster_gets_a_horizon():
    assert transformers.AutoformerConfig().prediction_length is None   # "needs to be specified": not built before
    c = _completed("AutoformerConfig")
    assert c.prediction_length == zoo_complete.HORIZON and c.context_length == zoo_complete.HORIZON
    transformers.AutoformerModel._from_config(c)


def test_per_layer_overrides_follow_the_shrunk_depth_and_the_per_layer_input_shrinks():
    """Gemma 4's head_dim override on its full-attention layers (5, 11, ..., 29) named layers a 6-layer shrunk config
    does not have (the config refused to load); its per-layer input embedding (262,144 x 256 a layer) stayed 400 M."""
    c = _completed("Gemma4TextConfig")
    overrides = c._heterogeneity_spec.per_layer_overrides
    assert overrides and all(k < c.num_hidden_layers for k in overrides)
    assert c.layer_types[max(overrides)] == "full_attention"
    assert c.vocab_size_per_layer_input <= c.vocab_size and c.hidden_size_per_layer_input < c.hidden_size
    model = transformers.Gemma4ForCausalLM._from_config(corpus_zoo._as_read_back(c)).eval()
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    with torch.no_grad():
        out = model(torch.randint(0, c.vocab_size, (1, 8)))
    assert out.logits.shape == (1, 8, c.vocab_size)
