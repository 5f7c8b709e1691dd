"""hf: default inputs for models that read neither token ids nor one image (issue 26): what the forward
needs is found from its signature (main_input_name, required parameters) and the config's sizes, and the
layout by a probe forward, never from the model's name. Each shape below is computed from the config by
hand: the model's own documented input shape."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")


def save(tmp_path, cfg, arch):
    folder = tmp_path / arch
    cfg.architectures = [arch]
    cfg.save_pretrained(folder)
    return folder


def ran(cli, command: str, folder):
    """`command` on the saved config with --json; it must exit 0 (stderr shown if not)."""
    r = cli(command, f"hf:{folder}", "--json")
    assert r.code == 0, r.stderr
    return r


def test_time_series_past_values_from_context_length_and_channels(tmp_path, cli):
    # PatchTST: past_values (batch, context_length, num_input_channels), future_values (batch,
    # prediction_length, num_input_channels)
    cfg = transformers.PatchTSTConfig(context_length=24, prediction_length=6, num_input_channels=3, patch_length=4, patch_stride=4,
                                      d_model=16, num_attention_heads=2, num_hidden_layers=1, ffn_dim=32)
    folder = save(tmp_path, cfg, "PatchTSTModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x24x3 float32", "future_values: 1x6x3 float32"]
    assert "reads past_values" in r.json["input_source"]
    r = ran(cli, "gradflow", folder)
    assert r.json["inputs"] == ["input[0]: 3x24x3 float32", "future_values: 3x6x3 float32"]   # 3: it trains, with BatchNorm


def test_time_series_required_features_and_mask(tmp_path, cli):
    # TimeSeriesTransformer: past_values (batch, context_length + max(lags), input_size), past_time_features
    # (batch, that length, num_time_features), past_observed_mask like past_values: all three required
    cfg = transformers.TimeSeriesTransformerConfig(prediction_length=4, context_length=8, lags_sequence=[1, 2, 3],
                                                   num_time_features=2, d_model=16, encoder_layers=1, decoder_layers=1,
                                                   encoder_attention_heads=2, decoder_attention_heads=2,
                                                   encoder_ffn_dim=16, decoder_ffn_dim=16)
    folder = save(tmp_path, cfg, "TimeSeriesTransformerModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x11x1 float32", "past_time_features: 1x11x2 float32",
                                "past_observed_mask: 1x11x1 float32", "future_values: 1x4x1 float32",
                                "future_time_features: 1x4x2 float32"]   # what it predicts: prediction_length steps
    r = ran(cli, "gradflow", folder)


def test_audio_waveform_one_second_at_the_sampling_rate(tmp_path, cli):
    # Wav2Vec2: input_values, a raw waveform (batch, samples); 1 s at the feature extractor's 16 kHz
    cfg = transformers.Wav2Vec2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                      conv_dim=(8, 8), conv_kernel=(10, 3), conv_stride=(5, 2),
                                      num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, vocab_size=20)
    folder = save(tmp_path, cfg, "Wav2Vec2Model")
    r = ran(cli, "nancheck", folder)
    assert r.json["inputs"] == ["input[0]: 2x16000 float32"]


def test_audio_filter_banks_in_the_layout_the_model_reads(tmp_path, cli):
    # Whisper's encoder: input_features (batch, num_mel_bins, 2 * max_source_positions): channels first,
    # the length fixed by the positions its stride-2 convolution leaves
    cfg = transformers.WhisperConfig(num_mel_bins=12, max_source_positions=10, d_model=16, encoder_layers=1,
                                     encoder_attention_heads=2, encoder_ffn_dim=16, decoder_layers=1,
                                     decoder_attention_heads=2, decoder_ffn_dim=16, vocab_size=60,
                                     max_target_positions=16, num_labels=3)
    folder = save(tmp_path, cfg, "WhisperForAudioClassification")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x12x20 float32"]


def test_audio_filter_banks_as_a_one_channel_image(tmp_path, cli):
    """A sweep: ClapAudioModel reads input_features (batch, 1, time, num_mel_bins), time at most spec_size *
    (spec_size // num_mel_bins) (modeling_clap.py reshape_mel2img); every 3-D layout failed and the run exited 3."""
    cfg = transformers.ClapAudioConfig(hidden_size=32, depths=[1, 1], num_attention_heads=[2, 2], patch_embeds_hidden_size=32,
                                       spec_size=64, num_mel_bins=32, window_size=4, projection_dim=16)
    folder = save(tmp_path, cfg, "ClapAudioModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x1x64x32 float32"], r.json["inputs"]   # 64 <= 64 * (64 // 32) frames
    ran(cli, "gradflow", folder)


def test_batched_keeps_keyword_specs_and_widens_their_batch():
    from torchdiag.core.sources import batched

    assert batched(("1x8:float32", "mask=1x8:int64~ones", "freq=1:int64~zeros", "x=3x4"), 2) == \
        ("2x8:float32", "mask=2x8:int64~ones", "freq=2:int64~zeros", "x=3x4")


def test_text_and_image_models_keep_one_default_and_no_probe(tmp_path):
    from torchdiag.core import hf_inputs

    bert = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=16)
    vit = transformers.ViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=16)
    assert not hf_inputs.needs_candidates(transformers.BertModel, bert)
    assert not hf_inputs.needs_candidates(transformers.ViTModel, vit)
    assert hf_inputs.needs_candidates(transformers.Wav2Vec2Model, transformers.Wav2Vec2Config())


def test_required_padding_and_an_index_per_sample(tmp_path, cli):
    # TimesFM: past_values (batch, length), past_values_padding like it, freq one index per sample (batch, 1):
    # all three required; found by the probe (freq shaped like past_values, float, does not run)
    cfg = transformers.TimesFmConfig(patch_length=32, context_length=64, horizon_length=32, hidden_size=16,
                                     intermediate_size=32, head_dim=8, num_attention_heads=2, num_hidden_layers=1)
    folder = save(tmp_path, cfg, "TimesFmModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x64 float32", "past_values_padding: 1x64 int64", "freq: 1x1 int64"]
    r = ran(cli, "nancheck", folder)
    assert r.json["inputs"][2] == "freq: 2x1 int64"


def test_an_encoder_decoder_gets_decoder_inputs_of_its_own_kind(tmp_path, cli):
    # SpeechT5Model without pre-nets: input_values and decoder_input_values are hidden states (batch, T, hidden)
    cfg = transformers.SpeechT5Config(hidden_size=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                      decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, vocab_size=40)
    folder = save(tmp_path, cfg, "SpeechT5Model")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x128x16 float32", "decoder_input_values: 1x128x16 float32"]


def _text(arch_config, arch, tmp_path, max_positions):
    cfg = arch_config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=max_positions)
    return save(tmp_path, cfg, arch)


def test_a_text_model_numbering_positions_after_its_padding_index_gets_a_length_that_fits(tmp_path, cli):
    # RoBERTa numbers positions from padding_idx + 1 (pad_token_id 1): of a 40-row table only 40 - 2 = 38 fit; the
    # whole table (the default's cap) raised "index out of range" on every command (camembert, data2vec-text too)
    folder = _text(transformers.RobertaConfig, "RobertaForMaskedLM", tmp_path, 40)
    for command, batch in (("summary", 1), ("gradflow", 2)):
        r = cli(command, f"hf:{folder}", "--json")
        assert r.code == 0, r.stderr
        assert r.json["inputs"] == [f"input[0]: {batch}x38 int64"], r.json["inputs"]


def test_a_text_model_whose_whole_position_table_runs_keeps_it(tmp_path, cli):
    folder = _text(transformers.BertConfig, "BertForMaskedLM", tmp_path, 40)   # positions from 0: all 40 fit
    r = cli("summary", f"hf:{folder}", "--json")
    assert r.code == 0 and r.json["inputs"] == ["input[0]: 1x40 int64"], r.json["inputs"]


def test_a_speech_recogniser_gets_token_ids_for_its_decoder(tmp_path, cli):
    # Speech2TextModel: input_features (batch, frames, input_feat_per_channel * input_channels) into the encoder,
    # decoder_input_ids (batch, target length) into the decoder, which fails without them
    cfg = transformers.Speech2TextConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
                                         encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                                         decoder_ffn_dim=16, input_feat_per_channel=20, input_channels=1,
                                         max_source_positions=64, max_target_positions=12, conv_channels=8)
    folder = save(tmp_path, cfg, "Speech2TextModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"][-1] == "decoder_input_ids: 1x12 int64"        # max_target_positions, under 16
    assert r.json["inputs"][0].endswith("x20 float32")                     # the filter banks it reads
    # random ids in the decoder's vocabulary, not zeros (a pad id of 0 would make every token padding)
    assert any("values in [0, 50)" in n and "decoder_input_ids" in n for n in r.json["input_notes"])
    r = ran(cli, "gradflow", folder)


def test_a_dual_tower_gets_pixels_beside_ids_that_end_with_eos(tmp_path, cli):
    # CLIPModel compares a text and an image encoder: ids alone fail (pixel_values None), so the layout with
    # pixels (the vision sub-config's size) is tried after them; the text tower pools at the EOS position, so
    # ids without one are pooled at position 0, where causal attention's query/key get exactly zero gradient
    text = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=20, eos_token_id=2)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8)
    cfg = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)
    folder = save(tmp_path, cfg, "CLIPModel")
    r = cli("gradflow", f"hf:{folder}", "--json")
    assert r.code in (0, 1), r.stderr          # it runs (this tiny config's verdicts are not the point here)
    assert r.json["inputs"] == ["input[0]: 2x20 int64", "pixel_values: 2x3x32x32 float32"]
    assert any("ends with eos_token_id 2" in n for n in r.json["input_notes"])
    # the ids are ranged by the text vocabulary: the probe that finds their embedding has the pixels too
    assert any("integer values in [0, 64)" in n and "token_embedding" in n for n in r.json["input_notes"])
    statuses = {p["name"]: p["status"] for p in r.json["params"]}
    assert statuses["text_model.encoder.layers.0.self_attn.q_proj.weight"] == "ok"
    assert "zero-grad" not in statuses.values()


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_an_encoder_decoder_classifier_pooled_at_its_eos_gets_one_eos_a_row(tmp_path, cli, kind):
    # BART's and T5's sequence-classification heads pool the decoder at the EOS positions of the input ids and refuse
    # rows with different counts of it: random ids in a 200-token vocabulary held eos_token_id 2 in the middle too,
    # and every command exited 3 ("All examples must have the same number of <eos> tokens") on a healthy model
    if kind == "bart":
        cfg = transformers.BartConfig(vocab_size=200, d_model=32, encoder_layers=1, decoder_layers=1,
                                      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                      decoder_ffn_dim=64, max_position_embeddings=128)
        folder = save(tmp_path, cfg, "BartForSequenceClassification")
    else:
        cfg = transformers.T5Config(vocab_size=200, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2)
        folder = save(tmp_path, cfg, "T5ForSequenceClassification")
    r = ran(cli, "gradflow", folder)
    assert any("ends with eos_token_id" in n and "nowhere else" in n for n in r.json["input_notes"])


def test_ids_with_no_eos_inside_keep_a_vision_language_models_placeholders(tmp_path, cli):
    # a review: eos inside the ids became eos + 1, here LLaVA's image placeholder: the image layout had more
    # placeholders than features and the default fell back to text alone (the vision tower never checked)
    text = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                    eos_token_id=2, bos_token_id=1, pad_token_id=None)
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=28, patch_size=14, projection_dim=32)
    cfg = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=3,
                                   vision_feature_layer=-1)
    folder = save(tmp_path, cfg, "LlavaForConditionalGeneration")
    r = ran(cli, "summary", folder)
    assert any(i.startswith("pixel_values:") for i in r.json["inputs"]), r.json["inputs"]


def test_no_eos_at_the_end_where_eos_is_the_padding(tmp_path, cli):
    # GPT-2 style: eos_token_id = pad_token_id; a padded last position is not what a tokenizer gives
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32,
                                  eos_token_id=5, pad_token_id=5)
    folder = save(tmp_path, cfg, "GPT2ForSequenceClassification")
    r = ran(cli, "summary", folder)
    assert not any("eos_token_id" in n for n in r.json["input_notes"])


def test_a_waveform_reader_with_one_channel_gets_that_layout(tmp_path, cli):
    # DAC's encoder starts with Conv1d(1, ...): a waveform (batch, 1, samples), tried after the flat one
    cfg = transformers.DacConfig(encoder_hidden_size=8, downsampling_ratios=[2, 2], decoder_hidden_size=16,
                                 n_codebooks=2, codebook_size=16, codebook_dim=4, hidden_size=16, sampling_rate=800)
    folder = tmp_path / "dac"
    cfg.architectures = ["DacModel"]
    cfg.save_pretrained(folder)
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x1x800 float32"]


def test_a_vision_tower_reading_packed_patches_gets_them_with_their_grid(tmp_path, cli):
    # Qwen2.5-VL's vision tower: hidden_states (patches of every image packed, in_channels x temporal_patch_size x
    # patch_size² = 3 x 2 x 14² = 1176 each) beside grid_thw (images, 3) of (frames, rows, columns), rows and
    # columns multiples of spatial_merge_size: 2 images of 1 x 8 x 8 patches = 128 patches
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import (
        Qwen2_5_VLVisionConfig,
    )

    cfg = Qwen2_5_VLVisionConfig(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=32,
                                 patch_size=14, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                                 fullatt_block_indexes=[1])
    folder = save(tmp_path, cfg, "Qwen2_5_VisionTransformerPretrainedModel")
    r = ran(cli, "gradflow", folder)
    assert r.json["inputs"] == ["hidden_states: 128x1176 float32", "grid_thw: 2x3 int64"]
    assert "reads hidden_states" in r.json["input_source"]
    assert not [f for f in r.json["findings"] if f["severity"] != "info"]


@pytest.mark.parametrize("kind, arch, sizes, expected", [
    # Muse Spark: 3 x patch_temporal 2 x 14² = 1176 values a patch, merge_size 2: 2 images of 8 x 8 patches
    ("muse_spark_vision", "MuseSparkVisionModel", dict(merge_size=2, patch_temporal=2, patch_size=14,
                                                       layer_types=["full_attention"]),
     ["pixel_values: 128x1176 float32", "grid_thw: 2x3 int64"]),
    # Kimi-K2.5: no channels named (RGB), merge_kernel_size (2, 2), each patch unflattened (3, 14, 14)
    ("kimi_k25_vision", "Kimi_K25VisionModel", dict(merge_kernel_size=[2, 2], patch_size=14),
     ["pixel_values: 128x3x14x14 float32", "grid_thw: 2x3 int64"]),
    # a review: a (2, 3) kernel needs columns in threes: 2 images of 8 x 12 patches
    ("kimi_k25_vision", "Kimi_K25VisionModel", dict(merge_kernel_size=[2, 3], patch_size=14),
     ["pixel_values: 192x3x14x14 float32", "grid_thw: 2x3 int64"]),
    # VideoLLaMA3: a required merge_sizes (one per image) beside them; no merge size named: 1
    ("video_llama_3_vision", "VideoLlama3VisionModel", dict(num_channels=3, patch_size=16),
     ["pixel_values: 32x768 float32", "grid_thw: 2x3 int64", "merge_sizes: 2 int64"]),
])
def test_packed_patches_read_the_configs_names_for_their_sizes(tmp_path, cli, kind, arch, sizes, expected):
    cfg = transformers.AutoConfig.for_model(kind, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                            num_hidden_layers=1, **sizes)
    folder = save(tmp_path, cfg, arch)
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == expected


def test_a_video_tower_s_frame_count_comes_from_its_sub_config(tmp_path, cli):
    # VideoPrism's clip model: num_frames lives in vision_config only (its positions are made for that many
    # frames; 8, the default when no config names one, failed); 36 / 18 tubelets: 2 x 2 patches a frame
    cfg = transformers.VideoPrismConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, image_size=36,
                           tubelet_size=[1, 18, 18], num_frames=4, num_spatial_layers=1, num_temporal_layers=1,
                           num_auxiliary_layers=1),
        text_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=1,
                         vocab_size=100, max_position_embeddings=64))
    folder = save(tmp_path, cfg, "VideoPrismClipModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"][0] == "input[0]: 1x4x3x36x36 float32"


def test_a_grid_spec_gives_every_row_its_values():
    import torch

    from torchdiag.core import hf_inputs

    t = hf_inputs.make("grid_thw=2x3:int64~each=1,8,8", torch.device("cpu"), torch.Generator())
    assert t.dtype == torch.int64 and t.tolist() == [[1, 8, 8], [1, 8, 8]]


def test_a_vision_tower_reading_patch_rows_gets_their_shapes_and_mask(tmp_path, cli):
    # SigLIP2's NaFlex vision tower: pixel_values (batch, patches, num_channels x patch_size² = 3 x 4² = 48) beside
    # spatial_shapes (batch, 2) with rows x columns = patches (num_patches 16: 4 x 4) and a patch mask of ones
    cfg = transformers.Siglip2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, num_channels=3, patch_size=4, num_patches=16)
    folder = save(tmp_path, cfg, "Siglip2VisionModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["pixel_values: 1x16x48 float32", "pixel_attention_mask: 1x16 int64",
                                "spatial_shapes: 1x2 int64"]
    r = ran(cli, "gradflow", folder)
    assert r.json["inputs"][0] == "pixel_values: 2x16x48 float32"     # batch 2: it trains


def test_a_pixel_reader_that_takes_token_ids_gets_a_short_prompt_as_its_second_layout():
    # SAM3 reads pixel_values first and refuses them without a text prompt: the default keeps the image alone
    # first (every other pixel model runs on it) and tries a 16-token prompt beside it next
    from torchdiag.core import sources

    class Prompted:
        def forward(self, pixel_values, input_ids=None):
            raise NotImplementedError

    class PixelsOnly:
        def forward(self, pixel_values):
            raise NotImplementedError

    cfg = transformers.PretrainedConfig()
    cfg.max_position_embeddings = 8
    assert sources._ids_beside_pixels(Prompted, transformers.PretrainedConfig()) == "input_ids=1x16:int64"
    assert sources._ids_beside_pixels(Prompted, cfg) == "input_ids=1x8:int64"     # within the position table
    assert sources._ids_beside_pixels(PixelsOnly, cfg) is None


def test_a_vision_language_model_reading_ids_first_gets_ids_with_its_text_vocabulary(tmp_path, cli):
    # Fuyu: forward(input_ids, image_patches, …), image_size at the top of its config, the vocabulary only in
    # text_config: token ids in [0, 100), not an image fed to the token embedding
    cfg = transformers.FuyuConfig(text_config={"model_type": "persimmon", "vocab_size": 100, "hidden_size": 32,
                                               "intermediate_size": 64, "num_hidden_layers": 1,
                                               "num_attention_heads": 2}, image_size=30, patch_size=30, hidden_size=32)
    folder = save(tmp_path, cfg, "FuyuForCausalLM")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"][0] == "input[0]: 1x128 int64" and "vocab 100" in r.json["input_source"]


def test_a_byte_reader_under_another_input_name_gets_integer_ids(tmp_path, cli):
    # Perceiver's masked LM reads `inputs`: bytes in [0, vocab_size) fed to an embedding, not features
    cfg = transformers.PerceiverConfig(d_model=32, num_latents=8, d_latents=16, num_blocks=1,
                                       num_self_attends_per_block=1, num_self_attention_heads=2,
                                       num_cross_attention_heads=2, vocab_size=50, max_position_embeddings=256)
    folder = save(tmp_path, cfg, "PerceiverForMaskedLM")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x128 int64"]


def _llava(tmp_path, **kw):
    # CLIP tower at 32 x 32 with 8 x 8 patches: 16 patch features (LLaVA's default strategy drops the class token),
    # projected to the text width; image_token_id 90 inside the text vocabulary of 100
    vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=32, patch_size=8)
    text = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    cfg = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_id=90, **kw)
    return save(tmp_path, cfg, "LlavaForConditionalGeneration")


@pytest.mark.slow   # a gradflow run with its re-check: seconds
def test_a_vision_language_model_runs_its_image_with_one_token_per_image_feature(tmp_path, cli):
    folder = _llava(tmp_path)
    r = cli("gradflow", f"hf:{folder}", "--json")
    # 16 image tokens, a text id after the image, then 16 text ids; two sequences (it trains) beside two images
    assert r.json["inputs"][:2] == ["input[0]: 2x33 int64", "pixel_values: 2x3x32x32 float32"], r.stderr
    assert "first with an image" in r.json["input_source"]
    status = {p["name"]: p["status"] for p in r.json["params"]}
    assert status["model.vision_tower.encoder.layers.0.mlp.fc1.weight"] == "ok"
    assert status["model.multi_modal_projector.linear_1.weight"] == "ok"
    assert "not-reached" not in status.values()
    # now judged under its own LM loss (labels: the ids, placeholders -100), what LLaVA throws away: the tower's
    # last layer (it reads hidden_states[-2]) and its pooler norm (it reads patch features, not the pooled
    # output): the fact behind DDP's unused-parameter error in LLaVA training
    assert r.json["inputs"][2] == "labels: 2x33 int64"
    bad = [(f["code"], f["where"]) for f in r.json["findings"] if f["severity"] != "info"]
    assert bad == [("no-grad", "model.vision_tower.encoder.layers.1"), ("no-grad", "model.vision_tower.post_layernorm")]
    assert r.code == 1


def test_the_image_tokens_are_the_ones_the_model_counts(tmp_path):
    import torch

    from torchdiag.core import image_tokens, inputs, loading

    folder = _llava(tmp_path)
    loaded = loading.load_model(f"hf:{folder}", device=torch.device("cpu"))
    specs = tuple(loaded.default_inputs)
    assert specs[-1] == "image-tokens=token:90"
    got = inputs.spec_inputs(specs, loaded, torch.device("cpu"), 0)
    ids = got.args[0]
    assert ids.shape == (1, 33) and (ids[0, :16] == 90).all() and not (ids[0, 16:] == 90).any()
    assert inputs.runs(loaded.model, got)
    # a tower that gives one feature more per image (the class token kept): the count follows the model
    loaded = loading.load_model(f"hf:{_llava(tmp_path / 'full', vision_feature_select_strategy='full')}",
                                device=torch.device("cpu"))
    assert image_tokens.count(loaded.model, got) == 17


def test_a_vision_language_models_labels_leave_the_image_placeholders_out(tmp_path):
    """As a VLM trains: the placeholder positions are -100 in the labels (the loss does not predict them)."""
    import torch

    from torchdiag.core import inputs, loading

    loaded = loading.load_model(f"hf:{_llava(tmp_path)}", device=torch.device("cpu"))
    got = inputs.source_inputs(loaded, torch.device("cpu"))
    ids, labels = got.args[0], got.kwargs["labels"]
    image = ids == 90
    assert int(image.sum()) == 16 * ids.shape[0]
    assert (labels[image] == -100).all() and torch.equal(labels[~image], ids[~image])
    assert any("its image placeholders (id 90) -100: not predicted" in n for n in got.notes)
    assert sum(n.startswith("labels:") for n in got.notes) == 1
    assert torch.isfinite(loaded.model(*got.args, **got.kwargs).loss)


def test_labels_keep_to_the_classes_of_the_output_layer_and_placeholders_need_an_image():
    """Mllama's embedding has 8 rows more than its LM head: ids drawn over the embedding that the head has no
    class for are -100 (a target out of range crashed the loss); with no image, no id is taken for a placeholder."""
    import torch
    from torch import nn

    from torchdiag.core import inputs

    class LM(nn.Module):
        config = type("C", (), {"image_token_id": 98})()

        def __init__(self):
            super().__init__()
            self.head = nn.Linear(4, 100)

        def get_output_embeddings(self):
            return self.head

    ids = torch.tensor([[5, 98, 99, 100, 107]])
    got = inputs.ModelInputs((ids,), {}, "--input", [])
    inputs._labels_from_ids(got, None, LM())
    assert got.kwargs["labels"].tolist() == [[5, 98, 99, -100, -100]]   # 98: no image beside it, an ordinary id
    assert got.notes == ["labels: the input ids; ids ≥ 100 (no class of the output layer) -100 (the model's own loss)"]


def test_an_encoder_decoder_vision_model_writes_the_text_not_the_image():
    import torch
    from torch import nn

    from torchdiag.core import inputs

    class Seq2Seq(nn.Module):
        config = type("C", (), {"image_token_id": 9, "is_encoder_decoder": True})()

    ids = torch.tensor([[9, 9, 3, 4], [9, 9, 5, 6]])
    got = inputs.ModelInputs((ids,), {"pixel_values": torch.zeros(2, 3, 8, 8)}, "--input", [])
    inputs._labels_from_ids(got, 0, Seq2Seq())
    assert got.kwargs["labels"].tolist() == [[3, 4], [5, 6]]
    assert got.kwargs["decoder_input_ids"].tolist() == [[0, 3], [0, 5]]


def test_a_vision_language_model_whose_image_path_does_not_run_falls_back_to_ids(tmp_path, cli):
    # image_token_id outside the text vocabulary: the embedding refuses the placeholder ids, the ids alone still run
    folder = _llava(tmp_path)
    import json

    cfg = json.loads((folder / "config.json").read_text())
    cfg["image_token_id"] = 500
    (folder / "config.json").write_text(json.dumps(cfg))
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x64 int64", "labels: 1x64 int64"]
    assert "did not run; the first, input[0] " in r.json["input_source"]   # after the image layouts


def test_a_vision_language_model_with_packed_images_gets_a_block_of_tokens_per_image(tmp_path, cli):
    # Qwen2-VL: two images packed as 8 x 8 patches of 3 x 2 x 4² = 96 values beside image_grid_thw rows (1, 8, 8);
    # merged 2 x 2, each image is 16 features; its multimodal rotary positions read mm_token_type_ids
    cfg = transformers.Qwen2VLConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=200, max_position_embeddings=128, bos_token_id=1,
                         eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                          "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=4,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=150, video_token_id=151, vision_start_token_id=152, vision_end_token_id=153)
    folder = save(tmp_path, cfg, "Qwen2VLForConditionalGeneration")
    r = ran(cli, "summary", folder)
    # one sequence holds both images: 16 tokens, a text id, 16 tokens, a text id, 16 text ids
    assert r.json["inputs"] == ["input[0]: 1x50 int64", "pixel_values: 128x96 float32", "image_grid_thw: 2x3 int64",
                                "mm_token_type_ids: 1x50 int64", "labels: 1x50 int64"]
    r = ran(cli, "gradflow", folder)
    # two sequences (it trains), one image each: 16 + 1 + 16
    assert r.json["inputs"][0] == "input[0]: 2x33 int64"
    assert {p["status"] for p in r.json["params"]} == {"ok"}


def _q_former(config_class):
    """A tiny BLIP-2-style config: a 32 x 32 image, a one-layer Q-Former with 4 queries, OPT; placeholder id 99."""
    return config_class(
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        qformer_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                            encoder_hidden_size=16, vocab_size=100),
        text_config=dict(model_type="opt", hidden_size=16, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=16, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0),
        num_query_tokens=4, image_token_index=99)


@pytest.mark.slow   # a gradflow run with its re-check: seconds
def test_a_q_former_model_gets_one_placeholder_per_query(tmp_path, cli):
    # BLIP-2 reads pixels first and fills its ids' placeholders with the Q-Former's 4 query outputs without checking
    # their count: ids without placeholders leave the image out silently (its tower then gets zero gradients)
    cfg = _q_former(transformers.Blip2Config)
    folder = save(tmp_path, cfg, "Blip2ForConditionalGeneration")
    import torch

    from torchdiag.core import image_tokens, inputs, loading

    loaded = loading.load_model(f"hf:{folder}", device=torch.device("cpu"))
    got = inputs.spec_inputs(tuple(loaded.default_inputs), loaded, torch.device("cpu"), 0)
    ids = got.kwargs["input_ids"]
    assert ids.shape == (1, 20) and ids[0, :4].tolist() == [99] * 4 and not (ids[0, 4:] == 99).any()
    assert len(set(ids[0, 4:].tolist())) > 1   # a prompt, not the zeros of a keyword spec
    assert image_tokens.count(loaded.model, got) == 4
    r = ran(cli, "gradflow", folder)
    status = {p["name"]: p["status"] for p in r.json["params"]}
    assert status["vision_model.embeddings.patch_embedding.weight"] in ("ok", "transient-grad")
    assert "zero-grad" not in status.values() and "not-reached" not in status.values()


def test_a_tiling_vision_language_model_gets_its_views_and_their_size(tmp_path, cli):
    # LLaVA-NeXT reads (images, views, C, H, W) beside image_sizes; a 32 x 32 image on pinpoints 32x64 / 64x32 is
    # a base view and two tiles (of the 5 given, the rest unread); its image features follow the tiles' layout.
    # Two layers: LLaVA reads hidden_states[-2], so under its own LM loss a one-layer tower's layer is never read
    vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=32, patch_size=8)
    text = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=2, vocab_size=100, max_position_embeddings=256)
    cfg = transformers.LlavaNextConfig(vision_config=vision, text_config=text, image_token_index=90,
                                       image_grid_pinpoints=[[32, 64], [64, 32]])
    folder = save(tmp_path, cfg, "LlavaNextForConditionalGeneration")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"][1:] == ["pixel_values: 1x5x3x32x32 float32", "image_sizes: 1x2 int64", "labels: 1x53 int64"]
    r = cli("gradflow", f"hf:{folder}", "--json")
    status = {p["name"]: p["status"] for p in r.json["params"]}
    assert status["model.vision_tower.encoder.layers.0.mlp.fc1.weight"] == "ok", r.stderr
    assert "not-reached" not in status.values()


def test_an_ids_prompt_spec_gives_distinct_ids_from_its_start():
    import torch

    from torchdiag.core import hf_inputs

    t = hf_inputs.make("qformer_input_ids=2x4:int64~arange=2", torch.device("cpu"), torch.Generator())
    assert t.tolist() == [[2, 3, 4, 5], [2, 3, 4, 5]]   # not all zeros: 0 is a Q-Former's padding id


def test_a_vision_language_model_on_meta_counts_with_ids_alone(tmp_path, cli):
    # review: the image-token rebuild read a value on meta (internal error); transformers' VLMs check their count
    # with a value read, so on meta the ids alone are what runs
    r = cli("summary", f"hf:{_llava(tmp_path)}", "--device", "meta", "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input[0]: 1x64 int64", "labels: 1x64 int64"]


def test_a_q_former_prompt_is_not_its_padding(tmp_path):
    # InstructBLIP reads a Q-Former prompt beside the image: all zeros is all padding (pad_token_id 0), and the
    # Q-Former's word embedding then gets exactly zero gradient (review)
    import torch

    from torchdiag.core import inputs, loading

    cfg = _q_former(transformers.InstructBlipConfig)
    folder = save(tmp_path, cfg, "InstructBlipForConditionalGeneration")
    loaded = loading.load_model(f"hf:{folder}", device=torch.device("cpu"))
    got = inputs.spec_inputs(tuple(loaded.default_inputs), loaded, torch.device("cpu"), 0)
    prompt = got.kwargs["qformer_input_ids"][0]
    assert cfg.qformer_config.pad_token_id not in prompt.tolist() and len(set(prompt.tolist())) == len(prompt)
    assert got.kwargs["input_ids"][0, :4].tolist() == [99] * 4
    assert inputs.runs(loaded.model, got)


def test_a_layout_model_that_refuses_ids_alone_gets_a_box_per_token(tmp_path, cli):
    # UDOP's relative position biases need each token's box (batch, tokens, 4); as integers its bias cannot average
    # them, as floats it runs. The tokens are laid out as lines of words: one box for all (a first version) left
    # the horizontal and vertical biases constant over the keys, and gradflow warned vanishing-grad on them
    cfg = transformers.UdopConfig(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                                  vocab_size=100, image_size=32, patch_size=8)
    folder = save(tmp_path, cfg, "UdopModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"][:2] == ["input[0]: 1x128 int64", "bbox: 1x128x4 float32"], r.json["inputs"]
    assert "box per token" in r.json["input_source"]
    r = cli("gradflow", f"hf:{folder}", "--json")
    biases = {p["name"]: p["status"] for p in r.json["params"] if p["name"].startswith("encoder.relative_bias")}
    assert biases and set(biases.values()) == {"ok"}, biases


def test_token_boxes_are_lines_of_words_on_the_page():
    import torch

    from torchdiag.core import hf_inputs

    grid = hf_inputs.make("bbox=1x5x4:int64~boxes", torch.device("cpu"), None)[0].tolist()
    assert grid == [[0, 0, 333, 500], [333, 0, 666, 500], [666, 0, 1000, 500], [0, 500, 333, 1000],
                    [333, 500, 666, 1000]]   # 3 words a line (ceil sqrt 5), 2 lines, LayoutLM's 0..1000 grid
    unit = hf_inputs.make("bbox=2x4x4:float32~boxes", torch.device("cpu"), None)
    assert unit.shape == (2, 4, 4) and unit[1, 3].tolist() == [0.5, 0.5, 1.0, 1.0]


def test_the_count_is_read_from_an_idefics_style_merge():
    import torch
    from torch import nn

    from torchdiag.core import image_tokens
    from torchdiag.core.inputs import ModelInputs

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.patch = nn.Embedding(50, 8), nn.Linear(12, 8)

        def inputs_merger(self, input_ids, inputs_embeds, image_hidden_states):
            mask = (input_ids == 49).unsqueeze(-1)
            assert int(mask.sum()) * inputs_embeds.shape[-1] == image_hidden_states.numel(), "count mismatch"
            return inputs_embeds.masked_scatter(mask, image_hidden_states)

        def forward(self, input_ids, pixel_values):
            patches = pixel_values.unfold(2, 2, 2).unfold(3, 2, 2)          # (b, 3, 3, 3, 2, 2): 9 patches
            feats = self.patch(patches.permute(0, 2, 3, 1, 4, 5).reshape(pixel_values.shape[0], 9, 12))
            return self.inputs_merger(input_ids, self.embed(input_ids), feats).sum()

    model = Tiny()
    ids, pixels = torch.randint(0, 40, (2, 20)), torch.randn(2, 3, 6, 6)
    got = ModelInputs((ids,), {"pixel_values": pixels})
    assert image_tokens.count(model, got) == 9
    assert image_tokens.rebuild(got, model, 49) and int((got.args[0] == 49).sum()) == 18
    model(*got.args, **got.kwargs)     # the rebuilt ids run: 9 placeholders a row
    assert "inputs_merger" not in model.__dict__


def test_an_eos_that_is_the_image_placeholder_is_not_appended(tmp_path):
    # review: ending each sequence with eos added one placeholder more than the image has features
    import torch

    from torchdiag.core import inputs, loading

    folder = _llava(tmp_path)
    cfg = transformers.AutoConfig.from_pretrained(folder)
    cfg.text_config.eos_token_id = 90
    cfg.save_pretrained(folder)
    loaded = loading.load_model(f"hf:{folder}", device=torch.device("cpu"))
    got = inputs.spec_inputs(tuple(loaded.default_inputs), loaded, torch.device("cpu"), 0)
    assert int((got.args[0] == 90).sum()) == 16 and inputs.runs(loaded.model, got)


def test_a_small_image_is_whole_merged_patches():
    # review: Mistral3 merges 2 x 2 patches of 8: a 40-pixel side is 5 patches, which no merge tiles; 32 is
    from torchdiag.core.sources import _small_side

    cfg = transformers.Mistral3Config(vision_config=dict(model_type="pixtral", patch_size=8, image_size=40),
                                      spatial_merge_size=2)
    assert _small_side(40, cfg) == 32 and _small_side(1540, cfg) == 224


def test_when_no_layout_runs_the_one_that_went_furthest_into_the_model_is_used():
    # its error is the model's own, past the input layout: the real run reports that one, with its module
    import torch
    from torch import nn

    from torchdiag.core import inputs

    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("the model's own bug")

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), Broken())
    loaded = type("Loaded", (), {"model": model, "input_source": "test"})()
    sets = [("1x3:float32",), ("1x4:float32",), ("1x5:float32",)]
    got = inputs._first_that_runs(sets, loaded, torch.device("cpu"), 0)
    assert got.args[0].shape == (1, 4)
    assert got.source == "test; none of 3 layouts ran: layout 2, which went furthest into the model (5 module " \
                         "calls before it failed), is used"
    model[3] = nn.Identity()     # now the second runs: the first that runs, said as such
    got = inputs._first_that_runs(sets, loaded, torch.device("cpu"), 0)
    # with what the first layout was and the first line of why it did not run (a new user: neither was said)
    assert got.args[0].shape == (1, 4) and got.source == (
        "test; layout 2 of 3 (the first 1 did not run; the first, input[0] 1x3: mat1 and mat2 shapes cannot be "
        "multiplied (1x3 and 4x8))")


@pytest.mark.parametrize("trains", [True, False])
def test_a_model_that_refuses_the_default_train_batch_runs_one_sample(trains):
    """A sweep: GPT-NeoX's sequence classifier with no pad_token_id raises "Cannot handle batch sizes > 1" at the
    batch of 2 a train-mode command's defaults use, and every command exited 3. The first layout at batch 1 runs,
    said with the model's own words; a command that does not train never raised the batch, and keeps the failure."""
    import torch
    from torch import nn

    from torchdiag.core import inputs

    class OneAtATime(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            if x.shape[0] > 1:
                raise ValueError("no batches here")
            return self.lin(x)

    loaded = type("Loaded", (), {"model": OneAtATime(), "input_source": "test", "trains": trains})()
    got = inputs._first_that_runs([("2x4:float32",), ("2x5:float32",)], loaded, torch.device("cpu"), 0)

    class NoEntry(OneAtATime):   # a review: a failure of the values the batch of 2 drew, not of its size
        def forward(self, x):
            if ((x > -1.40) & (x < -1.39)).any():   # the second sample's -1.3986 (seed 0), as an id with no entry
                raise ValueError("no entry for that value")
            return self.lin(x)

    loaded.model = NoEntry()
    other = inputs._first_that_runs([("2x4:float32",), ("2x5:float32",)], loaded, torch.device("cpu"), 0)
    assert other.args[0].shape == (2, 4) and "none of 2 layouts ran" in other.source, other.source
    if trains:
        assert got.args[0].shape == (1, 4)
        assert got.source == "test; batch 1: the model refused the default batch (no batches here), one sample runs"
    else:
        assert got.args[0].shape == (2, 4) and "none of 2 layouts ran" in got.source


def test_a_main_input_name_the_forward_does_not_take_is_not_trusted():
    # transformers' Sam3LiteTextTextModel (a text encoder) inherits main_input_name = "pixel_values" from a vision
    # base class while its forward takes input_ids: the default input was an image and every command exited 3
    import torch

    from torchdiag.core.hf_inputs import forward_names

    class TextEncoder(torch.nn.Module):
        main_input_name = "pixel_values"

        def forward(self, input_ids, attention_mask=None):
            return input_ids

    class Vision(torch.nn.Module):
        main_input_name = "pixel_values"

        def forward(self, pixel_values, interpolate=False):
            return pixel_values

    class TwoNamed(torch.nn.Module):   # OneFormer: main_input_name = ["pixel_values", "task_inputs"]
        main_input_name = ["pixel_values", "task_inputs"]

        def forward(self, pixel_values, task_inputs):
            return pixel_values

    assert forward_names(TextEncoder) == ("input_ids", ["input_ids"])
    assert forward_names(Vision) == ("pixel_values", ["pixel_values"])
    assert forward_names(TwoNamed) == ("pixel_values", ["pixel_values", "task_inputs"])


def test_a_bool_mask_that_hides_everything_when_true_gets_the_layout_that_gives_an_output(tmp_path, cli):
    # Gemma3n's audio encoder: audio_mel (batch, frames, input_feat_size) and a required audio_mel_mask annotated
    # torch.BoolTensor in which True marks padding (masked_fill_ refuses an int64 mask). All True runs and gives
    # an output of all zeros; the probe keeps looking and takes all False: the whole input read
    cfg = transformers.Gemma3nAudioConfig(hidden_size=32, input_feat_size=32, conf_num_attention_heads=4,
                                          conf_num_hidden_layers=1, sscp_conv_channel_size=[16, 8])
    folder = save(tmp_path, cfg, "Gemma3nAudioEncoder")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"][1].endswith("bool") and "audio_mel_mask" in r.json["inputs"][1], r.json["inputs"]
    assert "gave all zeros" in r.json["input_source"]


def test_an_optional_mask_of_the_main_input_is_tried_when_the_forward_needs_it(tmp_path, cli):
    # AudioFlamingo3's encoder takes input_features_mask=None but sums it (AttributeError on None): layouts
    # with the mask are tried after those without; Whisper-like, it reads exactly 2 x max_source_positions frames
    cfg = transformers.AudioFlamingo3EncoderConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                                   num_hidden_layers=1, num_mel_bins=8, max_source_positions=50)
    folder = save(tmp_path, cfg, "AudioFlamingo3Encoder")
    r = ran(cli, "summary", folder)
    # the mask over the frames, (batch, sequence_length) as documented: the forward sums it into each length
    assert r.json["inputs"] == ["input[0]: 1x8x100 float32", "input_features_mask: 1x100 int64"], r.json["inputs"]


def test_a_layout_whose_output_is_all_zeros_or_nan_is_a_last_resort():
    import torch
    from torch import nn

    from torchdiag.core import inputs

    class Masked(nn.Module):   # x of width 3 is masked out entirely; width 4 is read
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return torch.zeros(1, 4) if x.shape[-1] == 3 else self.fc(x)

    loaded = type("Loaded", (), {"model": Masked(), "input_source": "test"})()
    got = inputs._first_that_runs([("1x3:float32",), ("1x4:float32",)], loaded, torch.device("cpu"), 0)
    assert got.args[0].shape == (1, 4) and got.source == "test; layout 2 of 2 (the first 1 did not run or gave all zeros or NaN)"
    got = inputs._first_that_runs([("1x3:float32",), ("1x5:float32",)], loaded, torch.device("cpu"), 0)
    assert got.args[0].shape == (1, 3) and got.source.endswith("the only ones that ran gave an output of all zeros")

    class Hidden(nn.Module):   # a fully masked softmax: NaN (width 2), zeros (width 3), read (width 4)
        def forward(self, x):
            return {2: torch.full((1, 4), float("nan")), 3: torch.zeros(1, 4)}.get(x.shape[-1], x)

    loaded.model = Hidden()
    got = inputs._first_that_runs([("1x2:float32",), ("1x3:float32",), ("1x4:float32",)], loaded, torch.device("cpu"), 0)
    assert got.args[0].shape == (1, 4)
    got = inputs._first_that_runs([("1x2:float32",), ("1x3:float32",)], loaded, torch.device("cpu"), 0)
    assert got.args[0].shape == (1, 3)   # all zeros before NaN
    # a review: -inf is a model's own (masked logits); sparse and fp8 outputs are read without raising
    assert inputs.blank_rank(torch.tensor([0.0, float("-inf")])) == 0
    assert inputs.blank_rank(torch.eye(3).to_sparse()) == 0 and inputs.blank_rank(torch.zeros(3, 3).to_sparse()) == 1
    assert inputs.blank_rank(torch.ones(3).to(torch.float8_e4m3fn)) == 0 and inputs.blank_rank(torch.zeros(3).to(torch.float8_e4m3fn)) == 1


def test_a_keyword_input_a_config_sizes_beyond_memory_is_one_line_not_an_allocation():
    """A review: a config with num_frames 10^9 went to the allocator (exit 4); -i shapes were already checked."""
    import torch

    from torchdiag.core import hf_inputs
    from torchdiag.errors import UsageError

    with pytest.raises(UsageError, match=r"input pixel_values \(1x1000000000x3x16x16\) would take 2861.0 GiB"):
        hf_inputs.make("pixel_values=1x1000000000x3x16x16:float32", torch.device("cpu"), torch.Generator())
    assert hf_inputs.make("pixel_values=1x3x4x4:float32", torch.device("cpu"), torch.Generator()).shape == (1, 3, 4, 4)


def test_an_input_the_first_linear_reads_wider_than_the_config_says_gets_that_width(tmp_path, cli):
    # Granite-Speech 5's encoder reads mel frames delta-expanded (x2) and stacked in pairs (x2): its input_linear
    # takes num_mel_bins * 4 features, while the config's num_mel_bins (20 here) is what the default layout
    # shapes input_features from; the layer that refused the input gives its width (core/input_width.py)
    cfg = transformers.AutoConfig.for_model("granite_speech5_encoder", hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                            head_dim=8, num_mel_bins=20, subsample_layers=[0, 1], context_size=16,
                                            max_position_embeddings=128)
    folder = save(tmp_path, cfg, "GraniteSpeech5Encoder")
    r = ran(cli, "summary", folder)
    (shape,) = [s for s in r.json["inputs"] if s.startswith("input[0]")]
    assert shape.split()[1].endswith("x80") and "80 wide: the width of the linear layer" in r.json["input_source"]


def test_a_waveform_beside_another_main_input_is_one_channel_of_a_second_of_audio():
    # PE Audio reads input_ids (its main input) and a required input_values waveform; a copy of the ids' shape
    # as floats failed in its DAC encoder's first Conv1d (in_channels 1): (1, rate) first, then flat
    import types

    from torchdiag.core import hf_inputs

    config = types.SimpleNamespace(sampling_rate=24000)
    assert [hf_inputs._other("input_values", (128,), config, v) for v in range(hf_inputs.VARIANTS)] == \
        ["1x1x24000:float32", "1x24000:float32", None, None]


def test_a_merge_kernel_is_read_from_a_vision_sub_config():
    # a review: Kimi-K2.5's full model keeps merge_kernel_size in vision_config only
    from torchdiag.core import hf_inputs

    config = transformers.AutoConfig.for_model("kimi_k25")
    assert hf_inputs.merge_pair(config) == (2, 2) and hf_inputs.merge_of(config) == 2


def test_a_config_with_an_infinite_value_saved_by_transformers_loads(tmp_path, cli):
    # Mamba-2's time_step_limit is (0, inf): save_pretrained writes inf as {"__float__": "Infinity"}, which
    # from_pretrained decodes; torchdiag reads config.json itself and refused it ("transformers refused the config")
    cfg = transformers.Mamba2Config(hidden_size=32, num_hidden_layers=1, num_heads=8, head_dim=8, expand=2,
                                    n_groups=1, state_size=16, vocab_size=100, chunk_size=16)
    folder = save(tmp_path, cfg, "Mamba2ForCausalLM")
    assert '"__float__": "Infinity"' in (folder / "config.json").read_text()
    ran(cli, "summary", folder)


def test_a_config_that_is_only_a_float_tag_is_one_line_exit_2(tmp_path, cli):
    # the tag decoded before the "JSON object" check: a lone {"__float__": "Infinity"} was an internal error
    (tmp_path / "config.json").write_text('{"__float__": "Infinity"}')
    r = cli("summary", f"hf:{tmp_path}")
    assert r.code == 2 and "is not a JSON object" in r.stderr and "Traceback" not in r.stderr + r.stdout


def test_each_layout_is_probed_with_the_labels_the_command_gives(tmp_path, cli):
    """GIT's causal-LM loss first drops the logits of its image tokens: ids alone run without labels but leave no
    logit for them, so the real run failed ("Expected input batch_size (0) to match target batch_size (254)").
    Probed with its labels, the text-only layout fails there, and the one with pixel_values runs."""
    cfg = transformers.GitConfig(vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                                "num_attention_heads": 2, "image_size": 32, "patch_size": 16},
                                 vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64)
    folder = save(tmp_path, cfg, "GitForCausalLM")
    r = cli("summary", f"hf:{folder}", "--device", "cpu", "--json")
    assert r.code == 0, r.stderr
    assert "pixel_values: 1x3x32x32 float32" in r.json["inputs"] and r.json["inputs"][-1].startswith("labels: ")


def test_a_layout_whose_output_is_all_zeros_but_its_loss_is_not_chosen():
    """A review: probed with labels, an output of all-zero logits carries the model's loss (log of the classes), which
    is not zero; the layout the model reads must still win over it."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from torchdiag.core import inputs

    class LM(nn.Module):   # ids of length 3: masked away, logits all zero; of length 4: read
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(10, 8), nn.Linear(8, 10)

        def forward(self, input_ids, labels=None):
            short = input_ids.shape[-1] == 3
            logits = torch.zeros(*input_ids.shape, 10) if short else self.head(self.emb(input_ids))
            out = {"logits": logits}
            if labels is not None:
                out["loss"] = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
            return out

    loaded = type("Loaded", (), {"model": LM(), "input_source": "test", "labels_from_ids": True})()
    got = inputs._first_that_runs([("1x3:int64[0,10)",), ("1x4:int64[0,10)",)], loaded, torch.device("cpu"), 0)
    assert tuple(got.args[0].shape) == (1, 4) and "gave all zeros" in got.source


def test_a_vision_tower_reading_patch_rows_beside_their_positions_gets_them_on_a_grid():
    # Gemma 4's vision tower: pixel_values (batch, patches, 3 x patch_size²) beside a required pixel_position_ids
    # (batch, patches, 2) of each patch's (x, y); its pooling takes pooling_kernel_size² patches: g = 4 x 3
    import types

    import torch

    from torchdiag.core import hf_inputs

    class Tower(torch.nn.Module):
        def forward(self, pixel_values, pixel_position_ids, **kwargs):
            return pixel_values

    config = types.SimpleNamespace(patch_size=4, num_channels=3, pooling_kernel_size=3)
    assert hf_inputs.candidates(Tower, config)[0] == ("pixel_values=1x144x48:float32",
                                                      "pixel_position_ids=1x144x2:int64~grid=12")
    t = hf_inputs.make("p=2x6x2:int64~grid=3", torch.device("cpu"), torch.Generator())
    assert t[1].tolist() == [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]]


def test_an_image_stacked_with_its_prompt_is_resized_by_the_ratio_its_error_names():
    # SegGPT stacks the prompt image above the image (1792 rows from two of 896) and wants 896: each image 448 high
    from torchdiag.core import error_sizes

    text = "ValueError: Input image size (1792*448) doesn't match model (896*448)."
    assert error_sizes.asked(text, {3, 896, 448})[0] == (896, 448)
    assert error_sizes.asked("Input image size (448*448) doesn't match model (896*448).", {3, 448}) == [(448, 896)]


def test_an_input_beside_the_main_one_gets_the_length_the_config_names_after_it():
    # OneFormer's task_inputs (batch, task_seq_len): a tokenized task the forward casts for its task MLP's Linear
    import types

    import torch

    from torchdiag.core import hf_inputs

    class Segmenter(torch.nn.Module):
        main_input_name = "pixel_values"

        def forward(self, pixel_values, task_inputs, text_inputs=None):
            return pixel_values

    config = types.SimpleNamespace(image_size=32, num_channels=3, task_seq_len=77, hidden_dim=16)
    got = hf_inputs.candidates(Segmenter, config)
    assert ("1x3x32x32:float32", "task_inputs=1x77:float32") in got
    assert ("1x3x32x32:float32", "task_inputs=1x77:int64") in got


def test_packed_patches_are_also_tried_a_merged_patch_a_row_its_pixels_channels_last():
    # Inkling2's tower: pixel_values (image tokens, patch x merge, patch x merge, channels) beside an image_grid_thw
    # counted in those tokens: two images of 8 x 8 tokens, each 2 x 2 patches of 5 x 5 pixels
    import types

    import torch

    from torchdiag.core import hf_inputs

    class Tower(torch.nn.Module):
        def forward(self, pixel_values, image_grid_thw, **kwargs):
            return pixel_values

    config = types.SimpleNamespace(patch_size=5, num_channels=3, spatial_merge_size=2)
    got = hf_inputs.candidates(Tower, config)
    assert ("pixel_values=128x10x10x3:float32", "image_grid_thw=2x3:int64~each=1,8,8") in got
    assert got.index(("pixel_values=128x10x10x3:float32", "image_grid_thw=2x3:int64~each=1,8,8")) == 2   # last


def test_video_pixels_required_beside_ids_are_shaped_as_video():
    # PE Video: pixel_values_videos (batch, frames, channels, height, width) required beside input_ids
    import types

    import torch

    from torchdiag.core import hf_inputs

    class Dual(torch.nn.Module):
        def forward(self, input_ids, pixel_values_videos, attention_mask=None):
            return input_ids

    config = types.SimpleNamespace(vocab_size=100, image_size=32, num_channels=3, num_frames=4)
    got = hf_inputs.candidates(Dual, config)
    assert got[0] == ("1x128:int64", "pixel_values_videos=1x4x3x32x32:float32")
    assert ("1x128:int64", "pixel_values_videos=1x3x32x32:float32") in got


class _Codec:
    """A codec's two required inputs (Xcodec2, NeuCodec): a waveform (batch, 1, samples) its Conv1d reads in hops of
    320 samples, and filter banks (batch, frames, feature_size) for its semantic tower, joined frame by frame: the
    features must have one frame per hop."""

    @staticmethod
    def build():
        import torch
        from torch import nn

        class Codec(nn.Module):
            main_input_name = "input_values"

            def __init__(self):
                super().__init__()
                self.wave = nn.Conv1d(1, 4, 320, stride=320)
                self.feat = nn.Linear(6, 4)

            def forward(self, input_values, input_features, padding_mask=None):
                acoustic = self.wave(input_values)                          # (batch, 4, samples / 320)
                semantic = self.feat(input_features).transpose(1, 2)        # (batch, 4, frames)
                return torch.cat([semantic, acoustic], dim=1)

        return Codec


def test_features_required_beside_a_waveform_are_shaped_as_features_from_the_config():
    # a copy of the waveform's shape (or an index) is no spectrogram: the config's feature size and lengths are
    import types

    from torchdiag.core import hf_inputs

    config = types.SimpleNamespace(sampling_rate=3200, feature_size=6)
    got = hf_inputs.candidates(_Codec.build(), config)
    assert ("1x1x3200:float32", "input_features=1x128x6:float32") in got
    assert all(not s.startswith("input_features=1x1x3200") and ":int64" not in s for c in got for s in c[1:])
    # time features keep their own rule (num_time_features wide, the main input's length): a forecaster's layouts
    assert hf_inputs._beside("past_time_features", (8, 1), types.SimpleNamespace(num_time_features=2), 0) == \
        hf_inputs._other("past_time_features", (8, 1), types.SimpleNamespace(num_time_features=2), 0)


def test_a_codec_gets_one_feature_frame_per_hop_from_the_size_torch_cat_asks_for():
    # torch.cat says the size the other tensor has: "Expected size 128 but got size 10 for tensor number 1 in the list"
    import types

    import torch

    from torchdiag.core import error_sizes, hf_inputs
    from torchdiag.core.inputs import _first_that_runs

    text = ("Sizes of tensors must match except in dimension 1. Expected size 128 but got size 10 for tensor number 1 "
            "in the list.")
    assert error_sizes.asked(text, {1, 3200, 128, 6}) == [(128, 10)]
    assert error_sizes.asked(text.replace("128", "10", 1).replace("size 10 for", "size 128 for"), {1, 128, 6}) == \
        [(128, 10)]
    torch.manual_seed(0)
    model = _Codec.build()()
    loaded = types.SimpleNamespace(model=model, input_source="test")
    sets = hf_inputs.candidates(type(model), types.SimpleNamespace(sampling_rate=3200, feature_size=6))
    got = _first_that_runs(sets, loaded, torch.device("cpu"), 0)
    assert [(n, tuple(t.shape)) for n, t in got.tensors()] == [("input[0]", (1, 1, 3200)),
                                                                ("input_features", (1, 10, 6))]
    assert "128 → 10: the size the model's own error asked for" in got.source


def test_a_resized_layout_that_runs_but_gives_all_zeros_is_a_last_resort():
    # Xcodec2 at random initialisation: its quantizer rounds every latent to zero, and the audio decoded is all zeros;
    # the variant that runs is still taken (said), not the layout that fails with the size it asked for
    import types

    import torch
    from torch import nn

    from torchdiag.core.inputs import _first_that_runs

    class Quantized(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.randn(1, 7, 4))

        def forward(self, x):
            return (x + self.pos) * 0.0

    loaded = types.SimpleNamespace(model=Quantized(), input_source="test")
    got = _first_that_runs([("1x5x4:float32",)], loaded, torch.device("cpu"), 0)
    assert got.args[0].shape == (1, 7, 4)
    assert got.source == ("test; layout 1 of 1 with 5 → 7: the size the model's own error asked for (no layout ran "
                          "as made; the only ones that ran gave an output of all zeros)")


def test_a_video_placeholder_model_gets_one_token_per_frame_query(tmp_path):
    """InstructBLIP-Video: a `video_token_index` only, pixels as (frames, C, H, W) a sample, and the mask made
    inline (`input_ids == video_token_id`, then `masked_scatter`): its ids held no placeholder, so the language
    projection got exactly zero gradient. Now 4 queries × 8 frames placeholders, counted from the model."""
    import torch

    from torchdiag.core import inputs, loading

    cfg = transformers.InstructBlipVideoConfig(
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 16},
        qformer_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                        "vocab_size": 60, "encoder_hidden_size": 16, "max_position_embeddings": 64},
        text_config={"model_type": "opt", "hidden_size": 16, "word_embed_proj_dim": 16, "ffn_dim": 32,
                     "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 100,
                     "max_position_embeddings": 128},
        num_query_tokens=4, video_token_index=90)
    loaded = loading.load_model(f"hf:{save(tmp_path, cfg, 'InstructBlipVideoModel')}", device=torch.device("cpu"))
    got = inputs.source_inputs(loaded, torch.device("cpu"))
    ids = got.kwargs.get("input_ids", got.args[0] if not got.args[0].is_floating_point() else None)
    assert ids is not None and int((ids == 90).sum(1).min()) == int((ids == 90).sum(1).max()) == 4 * 8, got.notes
    assert any(n.startswith("input[0]: 32 placeholder ids 90 per sequence") for n in got.notes), got.notes
    assert inputs.runs(loaded.model, got)


def test_when_no_layout_runs_and_one_ran_out_of_memory_that_is_the_error():
    """hf tvp under the zoo's memory cap: its pixel layout (48 frames at 448², batch 2) could not allocate, the token
    ids alone failed in the model, and the command reported that model error ("'NoneType' object has no attribute
    'dtype'"), not that the layout it needs did not fit."""
    import torch
    from torch import nn

    from torchdiag.core import inputs
    from torchdiag.errors import ModelError

    class Video(nn.Module):
        def forward(self, x):
            if x.shape[-1] == 5:
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                                   "memory: you tried to allocate 67108864 bytes")
            raise AttributeError("'NoneType' object has no attribute 'dtype'")

    loaded = type("Loaded", (), {"model": Video(), "input_source": "test"})()
    with pytest.raises(ModelError) as got:
        inputs._first_that_runs([("1x3:float32",), ("1x5:float32",)], loaded, torch.device("cpu"), 0)
    assert got.value.message.startswith("no default input layout ran on this machine: 1 probe forward(s) ran out of "
                                        "memory (RuntimeError: [enforce fail")
    assert "'NoneType' object has no attribute 'dtype'" in got.value.message and "-i" in got.value.hint


def test_token_ids_of_parallel_codebook_streams_get_a_trailing_axis(tmp_path, cli):
    # Kyutai speech-to-text: input_ids (batch, length, 1 + num_codebooks), a text stream beside each codebook's,
    # each stream offset into one embedding table (values below codebook_vocab_size); 2-D ids fail in its embedding
    cfg = transformers.KyutaiSpeechToTextConfig(
        num_codebooks=4, codebook_vocab_size=17, vocab_size=40, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=8, ffn_dim=32, max_position_embeddings=32,
        audio_pad_token_id=40 + 4 * 17, pad_token_id=0, sliding_window=32)
    folder = save(tmp_path, cfg, "KyutaiSpeechToTextModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x32x5 int64"]


def test_decoder_ids_of_parallel_channels_get_a_trailing_axis(tmp_path, cli):
    # Dia: decoder_input_ids (batch, length, num_channels) of its decoder_config; 2-D decoder ids as long as the
    # encoder's fail in its reshape to (batch, num_channels, -1)
    enc = transformers.DiaEncoderConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2, head_dim=8, max_position_embeddings=32, vocab_size=20)
    dec = transformers.DiaDecoderConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2, head_dim=8, cross_num_attention_heads=2,
                                        cross_head_dim=8, cross_num_key_value_heads=2, cross_hidden_size=16,
                                        max_position_embeddings=32, num_channels=3, vocab_size=30,
                                        pad_token_id=29, eos_token_id=28, bos_token_id=27)
    cfg = transformers.DiaConfig(encoder_config=enc, decoder_config=dec, delay_pattern=[0, 1, 2],
                                 pad_token_id=None, eos_token_id=None, bos_token_id=None)
    folder = save(tmp_path, cfg, "DiaModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"][1:] == ["decoder_input_ids: 1x16x3 int64"]


def test_cross_attended_images_come_one_a_sample_with_their_image_attention_mask():
    # IDEFICS: pixel_values (batch, images, C, H, W) and image_attention_mask (batch, text length, images)
    from torchdiag.core import hf_inputs

    class CrossAttends:
        def forward(self, input_ids=None, pixel_values=None, image_attention_mask=None):
            raise NotImplementedError

    class PixelsOnly:
        def forward(self, input_ids=None, pixel_values=None):
            raise NotImplementedError

    cfg = transformers.PretrainedConfig()
    cfg.image_size, cfg.num_channels = 32, 3
    assert hf_inputs.images_per_sample(CrossAttends, cfg, "1x16:int64") == (
        ("1x16:int64", "pixel_values=1x1x3x32x32:float32", "image_attention_mask=1x16x1:int64~ones"),)
    assert hf_inputs.images_per_sample(PixelsOnly, cfg, "1x16:int64") == ()


def test_an_image_read_scaled_down_is_large_enough_for_its_smallest_scale(tmp_path, cli):
    # DepthPro: the image is scaled by each of scaled_images_ratios and cut into patch_size patches, so a side
    # of patch_size / min(ratios) at least (64 / 0.25 = 256); its sub-configs' image_size (64) is refused
    sub = dict(model_type="dinov2", hidden_size=16, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2,
               image_size=64, patch_size=16)
    cfg = transformers.DepthProConfig(patch_size=64, scaled_images_ratios=[0.25, 0.5, 1],
                                      scaled_images_overlap_ratios=[0.0, 0.5, 0.25],
                                      scaled_images_feature_dims=[32, 32, 16], intermediate_hook_ids=[1, 0],
                                      intermediate_feature_dims=[16, 16], fusion_hidden_size=16, use_fov_model=False,
                                      image_model_config=dict(sub), patch_model_config=dict(sub),
                                      fov_model_config=dict(sub))
    folder = save(tmp_path, cfg, "DepthProModel")
    r = ran(cli, "summary", folder)
    assert r.json["inputs"] == ["input[0]: 1x3x256x256 float32"]


def test_a_video_model_gets_frames_at_the_side_its_config_pads_them_to(tmp_path, cli):
    # TVP: pixel_values (batch, num_frames, 3, max_img_size, max_img_size); its frame prompter builds a
    # max_img_size² mask and reads pixel_values.dtype (a forward given ids alone raised "'NoneType' object has no
    # attribute 'dtype'": the side was read from image_size only, which TVP's config does not have)
    backbone = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 8, 16], depths=[1, 1, 1, 1],
                                         out_features=["stage4"])
    cfg = transformers.TvpConfig(backbone_config=backbone, num_frames=2, max_img_size=96, visual_prompt_size=16,
                                 hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 vocab_size=100, max_position_embeddings=64)
    folder = save(tmp_path, cfg, "TvpModel")
    r = ran(cli, "summary", folder)
    assert "pixel_values: 1x2x3x96x96 float32" in r.json["inputs"], r.json["inputs"]
    # read from the config, not repaired from the model's error at 224 (a probe forward per size tried: 3 minutes on
    # TVP's own config)
    assert "the model's own error" not in r.json["input_source"], r.json["input_source"]


@pytest.mark.parametrize("arch, cfg", [
    ("BertForMultipleChoice", lambda: transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                               intermediate_size=64, vocab_size=1000)),
    ("RobertaForMultipleChoice", lambda: transformers.RobertaConfig(hidden_size=32, num_hidden_layers=1,
                                                                     num_attention_heads=4, intermediate_size=64,
                                                                     vocab_size=1000)),
])
def test_multiple_choice_heads_get_candidates_per_sample(tmp_path, cli, arch, cfg):
    """A multiple-choice head reads (batch, choices, length) ids: given 2-D ids it took 128 choices and its logits'
    view(-1, 128) failed, exit 3 blaming the model (a hunt's). Once the layout as given fails with no input named,
    one probe with 2 choices per sample runs."""
    import json

    r = ran(cli, "doctor", save(tmp_path, cfg(), arch))
    doc = json.loads(r.stdout)
    assert doc["inputs"] == ["input[0]: 2x2x128 int64"], doc["inputs"]
    assert "2 choices" in doc["input_source"]
    assert [f["code"] for f in doc["findings"] if f["severity"] != "info"] == []


@pytest.mark.parametrize("head", ["BertForTokenClassification", "multi-label", "regression",
                                  "BertForSequenceClassification", "one label"])
def test_a_classification_head_trains_on_its_own_loss_of_random_labels(tmp_path, cli, head):
    """A sweep: a token classifier's (N, T, C) logits got mse against random reals, a multi-label sequence classifier
    (problem_type multi_label_classification) softmax cross-entropy, where transformers computes a cross-entropy per
    token and a binary cross-entropy per label. Random labels of that kind are given, and the model's own loss is
    the loss; checked here against those losses computed from the logits. A single-label sequence classifier keeps
    the auto cross-entropy (its own loss)."""
    import torch
    import torch.nn.functional as F

    from torchdiag.core.inputs import source_inputs
    from torchdiag.core.loading import load_model

    cfg = transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=32, num_labels=1 if head == "one label" else 3)
    if head in ("multi-label", "regression"):
        cfg.problem_type = "multi_label_classification" if head == "multi-label" else "regression"
    folder = save(tmp_path, cfg, "BertForTokenClassification" if "Token" in head else "BertForSequenceClassification")
    r = ran(cli, "gradflow", folder)
    notes = " ".join(r.json["input_notes"])
    if head == "BertForSequenceClassification":
        assert "labels" not in notes and r.json["loss"].startswith("cross_entropy on output['logits']")
        return
    assert r.json["loss"] == "the model's own loss (output['loss'])", r.json["loss"]
    # one label and no problem_type: transformers' regression (a sweep: it got the auto mse, not its own loss)
    assert ("a random class in [0, 3) per token" if "Token" in head else "a random 0/1 per label, 3 labels"
            if head == "multi-label" else "a random normal value per sample" if head == "one label"
            else "3 random normal values per sample") in notes, notes
    loaded = load_model(f"hf:{folder}", device=torch.device("cpu"))
    inputs = source_inputs(loaded, torch.device("cpu"))
    out = loaded.model.eval()(*inputs.args, **inputs.kwargs)
    labels = inputs.kwargs["labels"]
    if head in ("regression", "one label"):
        width = 1 if head == "one label" else 3
        assert torch.allclose(out.loss, F.mse_loss(out.logits, labels)) and labels.shape == (out.logits.shape[0], width)
        return
    want = F.cross_entropy(out.logits.reshape(-1, 3), labels.reshape(-1)) if "Token" in head else \
        F.binary_cross_entropy_with_logits(out.logits, labels)
    assert torch.allclose(out.loss, want) and set(labels.unique().tolist()) <= {0, 1, 2}


@pytest.mark.parametrize("kind", ["gpt2", "t5"])
def test_inference_runs_without_the_labels_given_for_the_models_own_loss(tmp_path, cli, kind):
    # a sweep: memory --mode inference and profile (inference by default) on a GPT-2 ran its LM loss over the
    # vocabulary, the labels the default inputs carry for the training commands: +65% peak, +38% time
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32)
        folder = save(tmp_path, cfg, "GPT2LMHeadModel")
    else:
        cfg = transformers.T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
        folder = save(tmp_path, cfg, "T5ForConditionalGeneration")
    for args in (["memory", "--mode", "inference"], ["profile", "--active", "2", "--warmup", "1"]):
        r = cli(*args, f"hf:{folder}", "--json")
        assert r.code == 0, r.stderr
        names = [i.partition(":")[0] for i in r.json["inputs"]]
        assert "labels" not in names, r.json["inputs"]
        assert names == (["input[0]"] if kind == "gpt2" else ["input[0]", "decoder_input_ids"]), names
        assert any(n.startswith("labels: dropped (inference computes no loss)") for n in r.json["input_notes"])
        assert "labels =" not in r.json["input_source"], r.json["input_source"]
    train = cli("memory", f"hf:{folder}", "--json")   # a training step keeps them: the model's own loss
    assert any(i.startswith("labels:") for i in train.json["inputs"]), train.json["inputs"]


def test_inference_decoder_ids_take_the_pad_id_where_the_labels_leave_a_position_out():
    # a review: -100 in the labels (ids the decoder has no class for) became 0 in the decoder ids; transformers'
    # shift puts pad_token_id there
    import types

    import torch

    from torchdiag.core.inputs import ModelInputs, without_labels

    model = types.SimpleNamespace(config=types.SimpleNamespace(is_encoder_decoder=True, decoder_start_token_id=None,
                                                               pad_token_id=5))
    labels = torch.tensor([[7, -100, 9, 3]])
    got = without_labels(ModelInputs((labels.clamp_min(0),), {"labels": labels}, source="x; labels = y; batch 2",
                                     chosen=True), model)
    assert got.kwargs["decoder_input_ids"].tolist() == [[5, 7, 5, 9]] and "labels" not in got.kwargs
    assert got.source == "x; batch 2"
