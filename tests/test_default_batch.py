"""Defaults never break a healthy model (issue 26): a source model's default batch is 2 for the commands
that run train mode (BatchNorm after global pooling refuses one sample there), 3 with BatchNorm (two
samples come out of it as exact negatives), 1 for the others; the user's own inputs are never changed."""
from __future__ import annotations

import torch


def test_batched_specs_and_the_users_own_inputs():
    from types import SimpleNamespace

    from torchdiag.core import sources

    assert sources.batched(("1x3x224x224", "1x128:int64", "3x8", "1"), 2) == ("2x3x224x224", "2x128:int64", "3x8", "1")
    from torch import nn

    bn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    loaded = SimpleNamespace(default_inputs=("1x3x32x32",), input_source="timm:x default", module=None, model=bn)
    sources.for_training(loaded)
    assert loaded.default_inputs == ("3x3x32x32",) and "its BatchNorm needs more than one sample" in loaded.input_source
    own = SimpleNamespace(default_inputs=(), input_source="", module=SimpleNamespace(example_inputs=lambda: 1))
    sources.for_training(own)      # a user's example_inputs are the user's: never changed
    assert own.default_inputs == () and own.input_source == ""
    assert [c for c in ("summary", "flops", "gradflow", "doctor", "nancheck") if sources.trains(c)] == \
        ["gradflow", "doctor", "nancheck"]
    # profile runs inference unless --mode train: its reason says it can train (a sweep read "the command runs
    # train mode" above "mode: inference")
    prof = SimpleNamespace(default_inputs=("1x3x32x32",), input_source="timm:x default", module=None, model=bn)
    sources.for_training(prof, "profile")
    assert "the command can run train mode (--mode train)" in prof.input_source


def test_the_training_commands_are_the_registrys():
    # one declaration (the registry's `trains`): every command that takes a loss and an optimizer runs train mode
    from torchdiag.commands import COMMANDS, MODEL, TRAINS
    from torchdiag.core import sources

    assert {c.name for c in COMMANDS if sources.trains(c.name)} == {c.name for c in COMMANDS if c.groups == MODEL} | {"check"}
    assert {c.trains for c in COMMANDS} == set(TRAINS)
    assert not sources.trains("no-such-command")
    from torchdiag.core.loading import COMPILED_COMMANDS

    assert set(COMPILED_COMMANDS) == {c.name for c in COMMANDS if c.compiled}


def test_detection_models_train_on_two_images_with_targets():
    # a torchvision detection model in train mode needs targets and returns its loss dict
    from types import SimpleNamespace

    from torchdiag.core import sources

    loaded = SimpleNamespace(default_inputs=(), input_source="torchvision:x default",
                             module=SimpleNamespace(example_inputs=sources._one_image))
    sources.for_training(loaded)
    images, targets = loaded.module.example_inputs()
    assert len(images) == len(targets) == 2 and all(tuple(i.shape) == (3, 320, 320) for i in images)
    for t in targets:
        b = t["boxes"]
        assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all() and b.min() >= 0 and b.max() < 320
        # 1 is a class of every detection model: Keypoint R-CNN's default has two (background, person)
        assert t["labels"].dtype == torch.int64 and t["labels"].tolist() == [1] * len(b)
        assert tuple(t["masks"].shape) == (len(b), 320, 320) and t["masks"].sum() > 0
        kp = t["keypoints"]
        assert tuple(kp.shape) == (len(b), 17, 3)
        assert ((kp[..., 0] >= b[:, None, 0]) & (kp[..., 0] <= b[:, None, 2])).all()
    assert "targets" in loaded.input_source


def test_two_samples_through_batchnorm_cancel_a_binary_heads_bias_gradient():
    """Why a model with BatchNorm gets 3 samples (a sweep: mobilevitv2 under bf16 got false zero-grad errors on
    its head's bias). Hand-built: BatchNorm, mean pool, a two-class linear head, targets [0, 1]."""
    from types import SimpleNamespace

    from torch import nn

    from torchdiag.core import sources

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    nn.init.zeros_(model[4].bias)

    def head_bias_grad(batch):
        model.zero_grad()
        x = torch.randn(batch, 3, 16, 16, dtype=torch.float64)
        nn.functional.cross_entropy(model.double()(x), torch.arange(batch) % 2).backward()
        return model[4].bias.grad.abs().max().item()

    assert head_bias_grad(2) < 1e-12      # the two pooled features are exact negatives: the gradients cancel
    assert head_bias_grad(3) > 1e-3
    loaded = SimpleNamespace(default_inputs=("1x3x16x16",), input_source="timm:x default", module=None, model=model)
    sources.for_training(loaded)
    assert loaded.default_inputs == ("3x3x16x16",) and "exact negatives" in loaded.input_source
