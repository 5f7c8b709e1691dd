"""`data` (issue 28): the spec loading, every content check on a broken loader built for it (the right
field and sample index), the healthy ones (scikit-learn's digits, a FakeData-like set) without a warning,
hangs and crashing workers, bad input, Ctrl-C, the pictures. The entry points are called directly."""
from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchdiag.core import batches as B
from torchdiag.core.datasets import kind_of, load_data
from torchdiag.core.loading import load_model
from torchdiag.diagnostics.data import Options, context, run_data
from torchdiag.diagnostics.data.traps import label_runs
from torchdiag.errors import ModelError, OptionError, UsageError

from support import SAMPLES, load_module

QUICK = dict(batches=3, sweep=False)


@pytest.fixture(autouse=True)
def samples_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(SAMPLES))   # the samples import data_fake


def run(spec, val=None, model=None, **opts):
    kw = {**QUICK, **opts}
    m = load_model(f"{SAMPLES}/{model}").model if model else None
    v = load_data(f"{SAMPLES}/{val}") if val else None
    return run_data(load_data(f"{SAMPLES}/{spec}"), Options(**kw), context("cpu"), val=v, model=m)


def codes(r, severity=None):
    return [f.code for f in r.findings if severity is None or f.severity == severity]


def one(r, code):
    found = [f for f in r.findings if f.code == code]
    assert len(found) == 1, [(f.code, f.message) for f in r.findings]
    return found[0]


def quiet(r):
    """No error and no warning."""
    return [f"{f.code}: {f.message}" for f in r.findings if f.severity != "info"]


# ---- loading the spec ------------------------------------------------------------------------------

def test_spec_kinds_and_dotted_module():
    assert load_data(f"{SAMPLES}/data_fake.py:loader").kind == "dataloader"
    assert load_data(f"{SAMPLES}/data_fake.py:dataset").kind == "dataset"
    assert load_data(f"{SAMPLES}/data_errors.py:stream").kind == "iterable"
    assert load_data("data_fake:val").kind == "dataset"          # module:factory (on sys.path)
    assert load_data(f"{SAMPLES}/data_fake.py:dataset", ["size=7"]).obj.size == 7   # --arg


def test_a_generators_first_batch_is_counted_when_nothing_is_timed():
    """A sweep: a generator of 30 batches of 16 under --no-speed was 464 samples in 29 batches: the batch read to find
    the fields was not given back to the content pass (with timing on, a note says where the pass starts)."""
    import torchdiag

    g = torch.Generator().manual_seed(0)
    labels = [torch.randint(0, 3, (16,), generator=g) for _ in range(30)]
    batches = ((torch.randn(16, 4, generator=g), y) for y in labels)
    r = torchdiag.data(batches, speed=False, sweep=False)
    train = r.data["splits"]["train"]
    assert (train["samples"], train["batches"]) == (480, 30), train
    truth = torch.cat(labels).bincount(minlength=3).tolist()
    counts = train["labels"]["counts"]
    assert [counts[str(k)] for k in range(3)] == truth, counts


def test_a_constant_field_beside_inputs_that_vary_is_info_and_a_named_target_leaves_the_rest_as_inputs():
    """A sweep: an all-ones attention mask beside varying features was "the model sees no information" (a warning);
    and TensorDataset(x_cat, x_num, y) with the target named [2] had its repeats and constant columns judged on x_cat
    alone: 475 "duplicates" of 25 categories (truth: no two (x_cat, x_num) rows alike), x_num's constant columns
    unsaid."""
    import torchdiag

    g = torch.Generator().manual_seed(0)
    feats = torch.randn(96, 5, generator=g)
    dicts = [{"features": feats[i], "mask": torch.ones(5), "label": i % 3} for i in range(96)]
    r = torchdiag.data(dicts, speed=False, sweep=False)
    f = one(r, "constant-input")
    assert f.severity == "info" and f.where == "train:mask" and "features" in f.message, f
    x_cat = torch.randint(0, 5, (500, 2), generator=g)
    x_num = torch.randn(500, 6, generator=g)
    x_num[:, [1, 4]] = 7.0
    y = torch.randint(0, 2, (500,), generator=g)
    assert len({tuple(a.tolist()) + tuple(b.tolist()) for a, b in zip(x_cat, x_num)}) == 500   # the truth
    data = torch.utils.data.TensorDataset(x_cat, x_num, y)
    # no model: x_cat alone is what it is sure goes in; the repeats say x_num was not read (hashing every field hid
    # true repeats whose metadata differed: a second review)
    r = torchdiag.data(data, target_field="[2]", speed=False, sweep=False)
    assert "judged on [0] alone: [1] not read as the model's input" in one(r, "duplicate-samples").message

    from torch import nn

    class Tab(nn.Module):   # forward(x_cat, x_num): both go in, and are judged together
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(5, 3), nn.Linear(12, 2)

        def forward(self, x_cat, x_num):
            return self.head(torch.cat([self.emb(x_cat).flatten(1), x_num], 1))

    r = torchdiag.data(data, model=Tab(), target_field="[2]", speed=False, sweep=False)
    assert "duplicate-samples" not in codes(r), r.findings
    assert "indices 1, 4" in next(f.message for f in r.findings if f.where == "train:[1]" and f.code == "constant-features")
    # a dict inside the tuple, the target named, a model of two inputs: no internal error (a review: KeyError '[0]',
    # exit 4); the one input it is given is the dict's first key, as before (a known limit: the model's error, exit 3)
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 2)

        def forward(self, d, mask):
            return self.fc(torch.cat([d["a"], d["b"]], 1) * mask)

    nested = [({"a": torch.randn(3, generator=g), "b": torch.randn(2, generator=g)}, torch.ones(5), i % 2)
              for i in range(40)]
    with pytest.raises(ModelError, match="missing 1 required positional argument"):
        torchdiag.data(nested, model=Two(), target_field="[2]", speed=False, sweep=False)
    # an index beside the one input, the target named, no model: not an input, the repeats of x still said (a review)
    x = torch.randn(100, 4, generator=g)
    x[50:] = x[:50]
    r = torchdiag.data(torch.utils.data.TensorDataset(x, torch.randint(0, 2, (100,), generator=g), torch.arange(100)),
                       target_field="[1]", speed=False, sweep=False)
    assert one(r, "duplicate-samples").message.startswith("50 sample(s) repeat"), r.findings


def test_a_list_of_samples_is_a_dataset_and_a_list_of_batches_is_not():
    """[(x, 3), …] is samples (collate would have made 3 a tensor with a batch axis): its int labels are kept."""
    import torchdiag

    samples = [(torch.randn(4), i % 3) for i in range(30)]
    r = torchdiag.data(samples, speed=False, sweep=False)
    fields = r.data["splits"]["train"]["fields"]
    assert [f["role"] for f in fields] == ["input", "target"], fields
    assert r.data["splits"]["train"]["samples"] == 30
    batches = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(4)]
    assert kind_of(batches, "x") == "iterable" and kind_of([(torch.randn(4), torch.tensor(1))], "x") == "dataset"
    # a review: a batch may carry a number of its own (a loss weight, a step); a one-hot label is a sample's
    assert kind_of([(torch.randn(16, 8), torch.randint(0, 3, (16,)), 1.0)], "x") == "iterable"
    assert kind_of([{"x": torch.randn(16, 8), "y": torch.randint(0, 3, (16,)), "step": 0}], "x") == "iterable"
    assert kind_of([(torch.randn(8), F.one_hot(torch.tensor(1), 3).float())], "x") == "dataset"
    # a sweep: Hugging Face-style {"input_ids": (L,), "labels": (L,)} items were read as batches of L scalars, unsaid;
    # a review: so are recommender batches {"user": (B,), "item": (B,)}. The reading taken is said, with the way out
    from torchdiag.core.datasets import loaded

    items = [{"input_ids": torch.randint(1, 100, (32,)), "labels": torch.randint(0, 2, (32,))} for _ in range(6)]
    assert "of 6 batches (each item's tensors share one leading size; a list of samples?" in loaded(items, "x", "x").label
    assert loaded(samples, "x", "x").label.endswith(" of 30 samples")


@pytest.mark.parametrize("factory,said", [("a_number", "returned an int"), ("a_tensor", "torch.Tensor of shape (10, 3)")])
def test_factory_returning_something_else_is_usage(factory, said):
    with pytest.raises(UsageError) as e:
        load_data(f"{SAMPLES}/data_errors.py:{factory}")
    assert e.value.code == 2 and said in e.value.message and "Dataset" in e.value.message


def test_factory_raising_and_missing():
    with pytest.raises(ModelError) as e:
        load_data(f"{SAMPLES}/data_errors.py:factory_raises")
    assert e.value.code == 3 and "not mounted" in e.value.message
    with pytest.raises(UsageError) as e:
        load_data(f"{SAMPLES}/data_errors.py:nope")
    assert e.value.code == 2


def test_torchvision_spec_behind_import_check(tmp_path):
    with pytest.raises(UsageError) as e:
        load_data("torchvision:MNIST", [f"root='{tmp_path}'"])
    if importlib.util.find_spec("torchvision") is None:
        assert "torchvision is not installed" in e.value.message
    else:   # installed: nothing on disk, and nothing downloaded
        assert "could not be read" in e.value.message


# ---- healthy data: real digits and FakeData-like ---------------------------------------------------

def test_digits_healthy_with_truth():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    # speed off: whether a step waits for data depends on the machine's load, not on the data
    r = run("data_digits.py:train", val="data_digits.py:val", model="data_digits.py:model", speed=False)
    assert quiet(r) == []
    d = load_digits()
    _, _, ytr, yva = train_test_split(d.images, d.target, test_size=0.25, random_state=0, stratify=d.target)
    tr, va = r.data["splits"]["train"], r.data["splits"]["val"]
    assert (tr["samples"], va["samples"]) == (len(ytr), len(yva))
    assert tr["labels"]["counts"] == {str(c): int(n) for c, n in enumerate(np.bincount(ytr))}
    assert va["labels"]["counts"] == {str(c): int(n) for c, n in enumerate(np.bincount(yva))}
    assert r.data["overlap"]["val_samples_in_train"] == 0 and tr["duplicates"]["count"] == 0
    x = next(f for f in tr["fields"] if f["role"] == "input")
    assert x["mean"] == pytest.approx(0, abs=1e-5) and x["std"] == pytest.approx(1, abs=1e-5)   # standardised by train stats
    assert r.data["num_classes"] == 10
    json.dumps(r.to_dict())   # every number is plain JSON


def test_fake_data_healthy():
    r = run("data_fake.py:loader", val="data_fake.py:val")
    assert quiet(r) == [] and r.exit_code == 0


def test_digits_leak_found_with_indices():
    r = run("data_digits.py:train", val="data_digits.py:leaky_val")
    f = one(r, "train-val-overlap")
    assert f.severity == "error" and "30 of 480" in f.message and r.exit_code == 1
    tr = load_data(f"{SAMPLES}/data_digits.py:train").obj.dataset
    va = load_data(f"{SAMPLES}/data_digits.py:leaky_val").obj.dataset
    for a, b in r.data["overlap"]["pairs"]:
        assert torch.equal(tr[a][0], va[b][0])


# ---- content checks, one broken loader each ---------------------------------------------------------

def test_non_finite_first_index():
    mod = load_module("data_content.py")
    f = one(run("data_content.py:non_finite"), "non-finite")
    assert f.where == "train:[0]" and f"sample {mod.NAN_AT}" in f.message and "2 sample(s)" in f.message


@pytest.mark.parametrize("factory", ["uint8_pixels", "float_pixels"])
def test_raw_pixels(factory):
    r = run(f"data_content.py:{factory}")
    f = one(r, "raw-pixels")
    assert f.where == "train:[0]" and "Normalize(mean=" in f.hint
    assert "not-standardised" not in codes(r)


def test_unstandardised_measures_normalize_values():
    r = run("data_content.py:unstandardised")
    f = one(r, "not-standardised")
    ds = load_data(f"{SAMPLES}/data_content.py:unstandardised").obj
    x = torch.stack([ds[i][0] for i in range(len(ds))]).double()
    mean, std = x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3), unbiased=False)
    got = next(d for d in r.data["splits"]["train"]["fields"] if d["field"] == "[0]")
    assert got["channel_mean"] == pytest.approx(mean.tolist(), rel=1e-6)
    assert got["channel_std"] == pytest.approx(std.tolist(), rel=1e-6)
    assert f"{mean[0]:.4f}" in f.hint and f.severity == "warning"


def test_inconsistent_shapes_names_the_sample():
    mod = load_module("data_content.py")
    r = run("data_content.py:inconsistent_shapes")
    f = one(r, "inconsistent-shapes")
    assert f.where == "train:[0]" and f"sample {mod.SHAPE_AT} has shape 3x12x12" in f.message


def test_constant_input_and_constant_features():
    r = run("data_content.py:constant")
    assert one(r, "constant-input").where == "train:[0]" and "duplicate-samples" not in codes(r)
    t = run("data_content.py:tabular")
    f = one(t, "constant-features")
    assert f.severity == "info" and "indices 2, 5" in f.message and quiet(t) == []


@pytest.mark.parametrize("val", ["text_val_leaky", "text_val_leaky_batched"])
def test_padded_text_is_compared_without_its_padding(val):
    """A sweep: the same sentence padded to another batch's length hashed apart: 42 of 50 training sentences copied
    into the validation split were found (8 at batch size 8). The attention mask cuts each row's padding; all-zero
    token_type_ids are no mask; a batch of one (nothing padded) is compared alike."""
    r = run("data_labels.py:text_train", val=f"data_labels.py:{val}")
    assert r.data["overlap"]["val_samples_in_train"] == 20, r.data["overlap"]
    assert r.data["splits"]["train"]["duplicates"]["count"] == 0


def test_duplicates_within_split():
    r = run("data_content.py:duplicates")
    f = one(r, "duplicate-samples")
    assert "3 sample(s)" in f.message and "sample 300 = sample 12" in f.message
    assert r.data["splits"]["train"]["duplicates"]["pairs"] == [[12, 300], [12, 301], [99, 450]]


# ---- labels ---------------------------------------------------------------------------------------------

def test_every_label_zero():
    f = one(run("data_labels.py:all_zero"), "single-class")
    assert f.where == "train:[1]" and f.severity == "error" and "every label is 0 (600" in f.message


def test_imbalance_ratio_and_absent_class():
    r = run("data_labels.py:imbalanced")
    y = load_data(f"{SAMPLES}/data_labels.py:imbalanced").obj.tensors[1]
    counts = torch.bincount(y)
    assert r.data["splits"]["train"]["labels"]["imbalance_ratio"] == pytest.approx(float(counts.max() / counts.min()))
    assert "class 3: 3" in one(r, "class-imbalance").message
    assert "[7]" in one(run("data_labels.py:absent"), "classes-absent").message


def test_an_even_draw_over_many_classes_is_no_imbalance():
    """A sweep: 600 labels drawn uniformly over 100 classes (1 to 11 a class) were "11.0x imbalanced" with a hint to
    re-weight the loss, in 79% of draws. Counts an even draw gives (chi-square against equal classes within 3
    sigmas) are not imbalanced whatever their ratio; 100 against 5 samples of two classes still is."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 100, (600,), generator=g)
    counts = torch.bincount(labels, minlength=100)
    assert counts.max() / counts[counts > 0].min() >= 10   # what the ratio alone called imbalanced
    r = run_data(torch.utils.data.TensorDataset(torch.randn(600, 4, generator=g), labels),
                 Options(**QUICK, speed=False), context("cpu"))
    assert "class-imbalance" not in codes(r), r.findings
    skewed = torch.cat([torch.zeros(100, dtype=torch.long), torch.ones(5, dtype=torch.long)])
    r = run_data(torch.utils.data.TensorDataset(torch.randn(105, 4, generator=g), skewed),
                 Options(**QUICK, speed=False), context("cpu"))
    assert "20.0×" in one(r, "class-imbalance").message
    # a review: one class of 1 among 99 of 30-62 kept the chi-square an even draw's; its count is not one
    rare = torch.cat([torch.arange(99).repeat_interleave(torch.randint(30, 63, (99,), generator=g)), torch.tensor([99])])
    r = run_data(torch.utils.data.TensorDataset(torch.randn(len(rare), 4, generator=g), rare),
                 Options(**QUICK, speed=False), context("cpu"))
    assert one(r, "class-imbalance").severity == "warning"
    # and an even draw under a WeightedRandomSampler whose weights do not depend on the class is none either (equal
    # weights, then weights in [0.5, 1.5]: a fourth review)
    for weights in (torch.ones(600), 0.5 + torch.rand(600, generator=g)):
        sampled = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(600, 4, generator=g), labels),
                                              batch_size=32, sampler=torch.utils.data.WeightedRandomSampler(weights, 600))
        assert "class-imbalance" not in codes(run_data(sampled, Options(**QUICK, speed=False), context("cpu")))


@pytest.mark.parametrize("spec, severity", [("imbalanced_weighted", "info"), ("imbalanced_weighted_weakly", "warning"),
                                            ("balanced_weighted_wrongly", "warning")])
def test_imbalance_under_a_weighted_sampler_is_judged_by_what_it_draws(spec, severity):
    """A sweep: 20x imbalanced classes drawn by a WeightedRandomSampler at 1/count were a warning whose hint was that
    sampler. The classes' summed weights are what training draws: their shares, checked against the weights."""
    r = run(f"data_labels.py:{spec}")
    f = one(r, "class-imbalance")
    assert f.severity == severity and "WeightedRandomSampler draws" in f.message, f.message
    loader = load_data(f"{SAMPLES}/data_labels.py:{spec}").obj
    y = loader.dataset.tensors[1]
    sums = torch.zeros(10, dtype=torch.float64).index_add_(0, y, loader.sampler.weights)
    shares = {row["class"]: row["train_drawn"] for row in r.table("class_counts").rows}
    assert shares == pytest.approx({c: float(sums[c] / sums.sum()) for c in range(10)})


def test_a_weighted_sampler_without_replacement_draws_the_set_as_it_is():
    """A review: replacement=False draws each sample once an epoch, whatever the weights; its 1/count weights were read
    as balancing a 20x imbalance (info)."""
    f = one(run("data_labels.py:imbalanced_weighted_once"), "class-imbalance")
    assert f.severity == "warning" and "WeightedRandomSampler" not in f.message, f.message


@pytest.mark.parametrize("spec, said", [("normalised_at_255", "scale to [0, 1] first"),
                                        ("normalised_at_1", "divide that Normalize's mean and std by 255")])
def test_a_normalisation_off_by_the_pixel_scale_says_so(spec, said):
    """A sweep: 0–255 pixels normalised with [0, 1] statistics (values to 858) were told to Normalize again with the
    measured mean and std; the 255 of the scale is the fix."""
    f = one(run(f"data_labels.py:{spec}"), "not-standardised")
    assert said in f.hint and "Normalize(mean=" not in f.hint, f.hint


def test_a_class_whose_images_are_blank_is_said_so():
    """A sweep: every image of one class black was `duplicate-samples` with the hint to drop the repeats."""
    r = run("data_labels.py:one_class_blank")
    f = one(r, "blank-inputs")
    assert f.severity == "warning" and "class 2: 16 of its 16" in f.message, f.message
    assert "duplicate-samples" not in codes(r)
    assert "blank-inputs" not in codes(run("data_labels.py:normalised_at_1"))


def test_labels_outside_model_output():
    mod = load_module("data_labels.py")
    r = run("data_labels.py:out_of_range", model="data_labels.py:model")
    f = one(r, "labels-out-of-range")
    assert "[10, 11]" in f.message and f"sample {mod.OUT_OF_RANGE_AT}" in f.message and "[0, 10)" in f.message
    assert "class-imbalance" not in codes(r)
    without = run("data_labels.py:out_of_range")     # no model, no --classes: 10 and 11 are just classes
    assert "labels-out-of-range" not in codes(without)
    assert "labels-out-of-range" in codes(run("data_labels.py:out_of_range", num_classes=10))


def test_dict_batches_and_named_fields():
    r = run("data_labels.py:dict_batches")
    assert one(r, "single-class").where == "train:label" and "dict key 'label'" in r.header["fields"]
    r = run("data_content.py:tabular", target_field="[0]", input_field="[1]")
    assert "input [1], target [0] (as named)" in r.header["fields"]
    with pytest.raises(UsageError) as e:
        run("data_content.py:tabular", target_field="labels")
    assert "--target-field 'labels'" in e.value.message and "[0], [1]" in e.value.hint


def test_roles_by_convention():
    x, y = torch.zeros(2, 3), torch.zeros(2)
    assert B.find_roles((x, y)).inputs == ["[0]"] and B.find_roles((x, y)).target == "[1]"
    roles = B.find_roles({"input_ids": x, "attention_mask": x, "labels": y})
    assert roles.target == "labels" and roles.inputs == ["input_ids", "attention_mask"]
    assert set(B.model_call({"input_ids": x, "attention_mask": x, "labels": y}, roles)[1]) == {"input_ids", "attention_mask"}
    assert B.find_roles(x).target is None
    # a sweep: class names left as strings were read as "a 1-tuple: no target"
    named = B.find_roles((x, ("zero", "one")))
    assert named.target is None and named.how == "[1] holds a tuple of str, not a tensor: no target read", named.how
    assert B.find_roles((x,)).how == "a 1-tuple: no target"
    # a review: a dict's `label` of strings, a namedtuple's field by its name, several target tensors
    assert B.find_roles({"x": x, "label": ["a", "b"]}).how == "dict key 'label' holds a list of str, not a tensor: " \
                                                            "no target read"
    import collections

    Pair = collections.namedtuple("Pair", "image name")
    assert B.find_roles(Pair(x, ("a", "b"))).how == "name holds a tuple of str, not a tensor: no target read"
    several = B.find_roles((x, (y, y)))
    assert several.target is None and several.how == "[1] holds 2 tensors ([1][0], [1][1]): no single target read"
    # a review: the one tensor under a target key is the target; a string label field is not passed over for the next
    nested = B.find_roles({"x": x, "target": {"cls": y}})
    assert nested.target == "target.cls" and nested.how == "dict key 'target' (the one tensor in it)"
    Triple = collections.namedtuple("Triple", "x idx label")
    triple = B.find_roles(Triple(x, y, ("a", "b")))
    assert triple.target is None and triple.how == "field 'label' holds a tuple of str, not a tensor: no target read"


# ---- order and batches ----------------------------------------------------------------------------------

def test_label_runs_truth():
    runs = label_runs([0] * 10 + [1] * 10, {0: 10, 1: 10})
    assert runs["mean_run"] == 10 and runs["shuffled_mean_run"] == 2 and runs["not_shuffled"]
    assert not label_runs([0, 1] * 10, {0: 10, 1: 10})["not_shuffled"]


def test_unshuffled_training_loader():
    f = one(run("data_order.py:sorted_labels"), "not-shuffled")
    assert "runs of 64.0" in f.message and "SequentialSampler" in f.message
    # a sweep: read one batch of 32 (--no-speed), runs of ~180 were told "runs of 32.0 on average (longest 32)"
    f = one(run("data_order.py:sorted_labels", speed=False), "not-shuffled")
    assert f.message.startswith("the first 32 samples the training loader gives all have one label (its runs are "
                                "at least that long)"), f.message


@pytest.mark.parametrize("order", ["shuffled", "sequential"])
def test_a_drop_last_loader_says_what_an_epoch_leaves_out(order):
    """A sweep: "97 samples in 4 batches" of a loader that gives 3 batches of 32 (the scan reads the data set)."""
    r = run(f"data_order.py:drop_last_{order}")
    split = dict(r.summary)["Train split"]
    assert "the loader gives 3 batches of 32 an epoch (drop_last=True), leaving out 1 sample(s) " in split, split
    assert ("drawn anew each epoch" in split) == (order == "shuffled"), split
    assert ("never trained on" in split) == (order == "sequential"), split
    assert "drop_last" not in dict(run("data_order.py:sorted_labels").summary)["Train split"]


def test_last_batch_of_one():
    f = one(run("data_order.py:last_batch_of_one"), "last-batch-of-one")
    assert f.severity == "info" and "161 samples in batches of 32" in f.message
    r = run("data_order.py:last_batch_of_one", model="data_order.py:batchnorm_model")
    f = one(r, "last-batch-of-one")
    assert f.severity == "error" and "Expected more than 1 value per channel" in f.message


# ---- hangs, workers, errors ------------------------------------------------------------------------------

def test_hang_in_process_names_the_line():
    r = run("data_hang.py:in_process", timeout=0.5)
    f = one(r, "loader-hang")
    assert "main process" in f.message and "wait_for_a_lock_nobody_releases" in f.message
    assert r.exit_code == 1 and r.data["hang"]["batch"] == 0


@pytest.mark.slow
def test_hang_in_workers_names_each_worker():
    r = run("data_hang.py:in_workers", timeout=1.0)
    stacks = r.data["hang"]["stacks"]
    assert [s["where"].split(" (")[0] for s in stacks] == ["worker 0", "worker 1"]
    assert all("wait_for_a_lock_nobody_releases" in s["stack"][-1] for s in stacks)


@pytest.mark.slow
def test_worker_randomness_by_behaviour():
    f = one(run("data_workers.py:own_rng"), "workers-repeat-randomness")
    assert "between workers and between epochs" in f.message
    assert "workers-repeat-randomness" not in codes(run("data_workers.py:global_rng"))   # torch seeds numpy per worker


@pytest.mark.slow
def test_worker_crash_is_one_line():
    with pytest.raises(ModelError) as e:
        run("data_workers.py:crash")
    assert e.value.code == 3 and "died with exit code 7" in e.value.message and "\n" not in e.value.message


@pytest.mark.parametrize("factory", ["crash", "crash_later"])
def test_a_worker_that_dies_is_named_with_its_exit_code_not_blamed_on_its_batch(factory):
    """Whether the main process first sees the death or a broken connection to the dying worker's last batch
    (crash_later: before, half of the runs blamed collate_fn with a ConnectionResetError), the crash is named."""
    with pytest.raises(ModelError) as e:
        run(f"data_workers.py:{factory}")
    assert "died with exit code 7" in e.value.message and "ConnectionResetError" not in e.value.message


def test_dead_workers_reads_the_exit_code_or_the_signal():
    from types import SimpleNamespace

    from torchdiag.core.fetch import dead_workers

    procs = [SimpleNamespace(pid=11, exitcode=None), SimpleNamespace(pid=12, exitcode=7),
             SimpleNamespace(pid=13, exitcode=-9), SimpleNamespace(pid=14, exitcode=0)]
    assert dead_workers(procs) == "worker 1 (pid 12) died with exit code 7; worker 2 (pid 13) died with signal SIGKILL"


@pytest.mark.parametrize("factory", ["raising", pytest.param("raising_in_workers", marks=pytest.mark.slow)])
def test_dataset_raising_names_the_index(factory):
    with pytest.raises(ModelError) as e:
        run(f"data_errors.py:{factory}")
    assert e.value.code == 3 and e.value.message.startswith("dataset[57] raised ValueError: cannot decode image 57")
    assert e.value.partial is not None and e.value.partial.command == "data"


def test_pin_memory_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning):
        r = run("data_workers.py:pinned")
    assert one(r, "pin-memory-without-cuda").severity == "info"


def test_infinite_stream_is_bounded():
    r = run("data_errors.py:stream", samples=100)
    assert r.data["splits"]["train"]["samples"] == 112   # 7 batches of 16: the first ≥ 100


def test_ctrl_c_keeps_the_partial_result():
    # data_errors.Interrupting: Ctrl-C at the 71st sample, 30 samples into the content pass after the probe's 4 batches
    r = run_data(load_module("data_errors.py").interrupting(), Options(batch_size=10, **QUICK), context("cpu"))
    assert r.exit_code == 130 and r.data["interrupted"] and "INTERRUPTED" in r.verdict
    assert r.data["splits"]["train"]["samples"] == 30 and r.data["throughput"]["as_configured"]["batches"] == 3


def test_options_validated():
    for bad in (dict(batches=0), dict(timeout=-1), dict(workers="a,b"), dict(samples=0), dict(input_field="")):
        with pytest.raises(OptionError):
            Options(**bad)
    assert Options(workers="0,2").workers == (0, 2)


@pytest.mark.slow
def test_sweep_with_model_and_user_loader_untouched():
    data = load_data(f"{SAMPLES}/data_digits.py:train")
    loader = data.obj
    before = (loader.worker_init_fn, loader.sampler, loader.num_workers, loader.collate_fn)
    model = load_model(f"{SAMPLES}/data_digits.py:model").model
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state(), np.random.get_state()[1].copy()
    r = run_data(data, Options(batches=3, workers=(0, 1)), context("cpu"), model=model)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())   # trained on a copy
    assert (loader.worker_init_fn, loader.sampler, loader.num_workers, loader.collate_fn) == before
    assert torch.equal(torch.get_rng_state(), rng[0]) and (np.random.get_state()[1] == rng[1]).all()
    sweep = r.data["throughput"]["sweep"]
    assert [s["num_workers"] for s in sweep] == [0, 1] and all(s["wait_share"] is not None for s in sweep)
    assert r.data["throughput"]["balanced_workers"] in (0, 1)
    assert 0 <= r.data["throughput"]["training"]["wait_share"] <= 1


def test_pictures_written(tmp_path):
    from PIL import Image

    from torchdiag.render.data import write_images, write_plot
    from torchdiag.render.images import drawn

    r = run("data_fake.py:loader", val="data_fake.py:val")
    assert not r.images                                   # the diagnostic describes, render draws
    drawn(r)
    grid = r.images["data/train/samples_per_class"]
    assert grid.dtype == np.uint8 and grid.shape[2] == 3
    write_images(r, tmp_path / "img")
    write_plot(r, tmp_path / "plot.png")
    for p in (tmp_path / "img" / "samples_train.png", tmp_path / "img" / "samples_val.png", tmp_path / "plot.png"):
        with Image.open(p) as im:
            assert im.size[0] > 100
    assert any(k.endswith("/labels") for k in r.histograms) and any("channel_2" in k for k in r.histograms)


@pytest.mark.slow
@pytest.mark.subprocess
def test_module_is_torch_free_options():
    code = "import sys, torchdiag.diagnostics.data.options; print('torch' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_input_bound_with_measured_workers():
    r = run("data_speed.py:very_slow", model="data_speed.py:model", sweep=True, workers=(0, 2))
    f = one(r, "input-bound")
    t = r.data["throughput"]
    assert t["training"]["wait_share"] >= 0.05 and f"{100 * t['training']['wait_share']:.1f}%" in f.message
    assert [s["num_workers"] for s in t["sweep"]] == [0, 2] and t["balanced_workers"] in (0, 2)
    assert "measured with num_workers=" in f.message


def test_no_workers_on_many_cores(monkeypatch):
    from torchdiag.diagnostics.data import traps

    monkeypatch.setattr(traps, "cpu_count", lambda: 8)
    assert one(run("data_fake.py:loader"), "no-workers").severity == "info"
    monkeypatch.setattr(traps, "cpu_count", lambda: 2)
    assert "no-workers" not in codes(run("data_fake.py:loader"))


def test_binary_and_one_hot_targets_are_not_class_indices():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=g)
    binary = torch.utils.data.TensorDataset(x, (torch.arange(200) % 2).float().unsqueeze(1))
    r = run_data(binary, Options(**QUICK, speed=False), context("cpu"), model=torch.nn.Linear(5, 1))   # a BCE logit
    assert r.data["num_classes"] is None and quiet(r) == []
    assert r.data["splits"]["train"]["labels"]["counts"] == {"0": 100, "1": 100}
    one_hot = torch.nn.functional.one_hot(torch.arange(200) % 20, 20).float()   # its classes by their argmax
    r = run_data(torch.utils.data.TensorDataset(x, one_hot), Options(**QUICK), context("cpu"))
    labels = r.data["splits"]["train"]["labels"]
    assert labels["counts"] == {str(c): 10 for c in range(20)} and not labels["multi_label"] and quiet(r) == []


def _targets(y, x=None):
    x = torch.randn(len(y), 6, generator=torch.Generator().manual_seed(1)) if x is None else x
    return run_data(torch.utils.data.TensorDataset(x, y), Options(**QUICK, speed=False), context("cpu"))


def test_a_one_hot_targets_never_hot_last_class_is_absent():
    """A one-hot target's last column never hot, no model to give the class count: the width gives it (before, a
    float (N, C) target had no label statistics at all)."""
    y = torch.nn.functional.one_hot(torch.arange(120) % 4, 5).float()
    f = one(_targets(y), "classes-absent")
    assert f.severity == "warning" and "[4]" in f.message and "of [0, 5)" in f.message


def test_multi_label_targets_count_each_label_and_name_the_constant_ones():
    g = torch.Generator().manual_seed(0)
    rates = torch.tensor([0.5, 0.3, 0.05, 0.0, 1.0, 0.2])
    for y in ((torch.rand(300, 6, generator=g) < rates).float(), torch.rand(300, 6, generator=g) < rates):   # float, bool
        r = _targets(y)
        labels = r.data["splits"]["train"]["labels"]
        assert labels["multi_label"] and not labels["per_element"]
        assert labels["counts"] == {str(c): int(n) for c, n in enumerate(y.sum(0).tolist())}
        f = one(r, "classes-absent")
        assert "label(s) [3] never 1" in f.message and "label(s) [4] 1 in every sample" in f.message
        assert "300 samples" in f.message and [row["train"] for row in r.tables[1].rows] == y.sum(0).int().tolist()
    healthy = (torch.rand(300, 6, generator=g) < torch.tensor([0.5, 0.3, 0.05, 0.1, 0.9, 0.2])).float()
    assert "classes-absent" not in codes(_targets(healthy))
    soft = torch.softmax(torch.randn(300, 6, generator=g), 1)   # distillation targets: values, not labels
    r = _targets(soft)
    assert r.data["splits"]["train"]["labels"] is None and quiet(r) == []


def test_per_position_labels_padded_to_a_fixed_length_are_not_multi_label():
    """A review: binary token labels padded to 32 positions (lengths 5-20) read as 32 labels, "labels [20, ..., 31]
    never 1" (a warning). Never-1 labels that run to the row's end are positions past every sequence: no per-label
    statistics, as before; a genuine multi-label target with one unused last label keeps them."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 21, (256,), generator=g)
    tags = (torch.rand(256, 32, generator=g) < 0.3) & (torch.arange(32) < lengths[:, None])
    for y in (tags, tags.float()):
        r = _targets(y)
        assert r.data["splits"]["train"]["labels"] is None and "classes-absent" not in codes(r), r.findings


class _Tagger(torch.nn.Module):
    """One logit per token: (N, T) logits for (N, T) labels."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 1)

    def forward(self, ids):
        return self.head(self.embed(ids)).squeeze(-1)


@pytest.mark.parametrize("pad", ["right", "left"])
def test_a_per_token_binary_taggers_sequence_length_is_not_its_class_count(pad):
    """A sweep: a tagger's (N, 30) logits beside (N, 30) 0/1 labels padded with -100 read as 30 classes: "28
    class(es) of [0, 30) have no sample" (a warning). An output of the target's own shape holding other values than
    0/1 gives one value per position; classes 0 and 1 are still counted."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 31, (300,), generator=g)
    kept = torch.arange(30) < lengths[:, None] if pad == "right" else torch.arange(30) >= 30 - lengths[:, None]
    tags = torch.where(kept, (torch.rand(300, 30, generator=g) < 0.3).long(), torch.tensor(-100))
    ids = torch.where(kept, torch.randint(1, 50, (300, 30), generator=g), torch.tensor(0))
    r = run_data(torch.utils.data.TensorDataset(ids, tags), Options(**QUICK, speed=False), context("cpu"),
                 model=_Tagger())
    assert "classes-absent" not in codes(r) and "labels-out-of-range" not in codes(r), r.findings
    counts = r.data["splits"]["train"]["labels"]["counts"]
    assert counts["0"] == int((tags == 0).sum()) and counts["1"] == int((tags == 1).sum())
    # a review: sorted longest first, the first batch has no padding; the whole split's values decide
    order = torch.argsort(lengths, descending=True)
    ids, tags = ids[order], tags[order]
    tags[:32] = (tags[:32] == 1).long()   # the first batch's rows full length: no -100 in it
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids, tags), batch_size=32)
    r = run_data(loader, Options(**QUICK, speed=False), context("cpu"), model=_Tagger())
    assert "classes-absent" not in codes(r) and "labels-out-of-range" not in codes(r), r.findings


def test_integer_labels_over_several_values_beside_one_output_per_position_are_said():
    """A review: labels 0-4 per token beside (N, T) logits (a token classifier missing its class dimension, or a
    per-position regression) passed silently once the output was read as one value per position."""
    g = torch.Generator().manual_seed(0)
    ids, tags = torch.randint(1, 50, (200, 30), generator=g), torch.randint(0, 5, (200, 30), generator=g)
    tags[:, -3:] = -100
    r = run_data(torch.utils.data.TensorDataset(ids, tags), Options(**QUICK, speed=False), context("cpu"),
                 model=_Tagger())
    f = one(r, "per-position-values")
    assert f.severity == "info" and "integers 0–4 (5 values)" in f.message and "(N, T, 5)" in f.hint, f


def test_integer_multi_hot_targets_are_read_by_the_models_width():
    """A review: sklearn's MultiLabelBinarizer gives int64 (N, C) 0/1 targets; beside a Linear(10, C) they were read
    as per-element classes 0 and 1: a false class-imbalance (19.8x) and 18 classes "absent". With the model's C
    outputs they are C labels (or C one-hot classes); without a model, per-position labels as before."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 10, generator=g)
    hot = (torch.rand(600, 6, generator=g) < torch.tensor([0.05, 0.1, 0.3, 0.0, 0.2, 0.5])).long()
    r = run_data(torch.utils.data.TensorDataset(x, hot), Options(**QUICK, speed=False), context("cpu"),
                 model=torch.nn.Linear(10, 6))
    labels = r.data["splits"]["train"]["labels"]
    assert labels["multi_label"] and labels["counts"] == {str(c): int(n) for c, n in enumerate(hot.sum(0).tolist())}
    assert codes(r, "warning") == ["classes-absent"] and "label(s) [3] never 1" in one(r, "classes-absent").message
    classes = torch.arange(600) % 5
    one_hot = torch.nn.functional.one_hot(classes, 6)   # int64, class 5 never hot
    r = run_data(torch.utils.data.TensorDataset(x, one_hot), Options(**QUICK, speed=False), context("cpu"),
                 model=torch.nn.Linear(10, 6))
    assert r.data["splits"]["train"]["labels"]["counts"] == {str(c): 120 for c in range(5)}
    assert "[5]" in one(r, "classes-absent").message and "class-imbalance" not in codes(r)


def test_a_multi_label_targets_unused_last_labels_are_said_beside_a_model_of_that_width():
    """A second review: 20 float labels, the last two never 1, beside Linear(8, 20): read as padded positions, nothing
    said. A third: a per-token tagger's (N, T) logits have that width too, and its padded positions are no fault. The
    labels are counted, and the run to the row's end is said as info with both readings; label 5 in the middle is a
    warning."""
    g = torch.Generator().manual_seed(0)
    y = (torch.rand(400, 20, generator=g) < 0.2).float()
    y[:, 18:] = 0
    y[:, 5] = 0
    r = run_data(torch.utils.data.TensorDataset(torch.randn(400, 8, generator=g), y), Options(**QUICK, speed=False),
                 context("cpu"), model=torch.nn.Linear(8, 20))
    said = {f.severity: f.message for f in r.findings if f.code == "classes-absent"}
    assert "label(s) [5] never 1" in said["warning"] and "labels 18–19 of 20 are never 1" in said["info"], said
    assert r.data["splits"]["train"]["labels"]["multi_label"]


@pytest.mark.parametrize("classes,severity", [(1000, "info"), (21, "warning")])
def test_token_ids_a_text_never_uses_are_no_warning(classes, severity):
    """A sweep: a GPT-2's next-token labels over its 1000 ids, 50 used: "950 classes have no sample", a warning whose
    hint said a split dropped them. Per-position labels over a vocabulary (1000 classes or more) are said as info; a
    segmentation's 21 classes keep the warning."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 15, (200, 16), generator=g)
    r = run_data(torch.utils.data.TensorDataset(torch.randn(200, 4, generator=g), ids),
                 Options(**QUICK, speed=False, num_classes=classes), context("cpu"))
    f = one(r, "classes-absent")
    assert f.severity == severity and f"{classes - 15} class(es) of [0, {classes}) have no sample" in f.message


def test_a_bool_field_gets_its_statistics():
    """A bool mask beside the input: min, max and its share of True (its mean), where it had dashes before."""
    g = torch.Generator().manual_seed(0)
    x, mask = torch.randn(200, 6, generator=g), torch.rand(200, 6, generator=g) < 0.3

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 3)

        def forward(self, x, m):
            return self.lin(x * m)

    data = torch.utils.data.TensorDataset(x, mask, torch.arange(200) % 3)
    r = run_data(data, Options(**QUICK, speed=False), context("cpu"), model=Masked())
    row = next(d for d in r.data["splits"]["train"]["fields"] if d["field"] == "[1]")
    assert row["role"] == "input" and row["dtype"] == "bool" and (row["min"], row["max"]) == (0, 1)
    assert row["mean"] == pytest.approx(mask.float().mean().item())


@pytest.mark.slow
def test_costly_worker_start_without_persistent_workers():
    f = one(run("data_workers.py:slow_start"), "workers-restart-each-epoch")
    assert f.severity == "info" and "persistent_workers=True" in f.hint


@pytest.mark.cuda
def test_pin_memory_swept_on_cuda():
    data = load_data(f"{SAMPLES}/data_fake.py:loader")
    r = run_data(data, Options(batches=3, workers=(0, 1)), context("cuda"),
                 model=load_model(f"{SAMPLES}/data_fake.py:model").model.cuda())
    sweep = r.data["throughput"]["sweep"]
    assert len(sweep) == 3 and sweep[-1]["pin_memory"] is True
    assert "pin-memory-without-cuda" not in codes(r)


def test_samples_bound_reads_a_random_subset():
    r = run("data_fake.py:dataset", samples=100)
    tr = r.data["splits"]["train"]
    assert tr["subset"] and tr["samples"] == 100 and tr["total"] == 512
    assert sum(tr["labels"]["counts"].values()) == 100


def test_tensorboard_gets_the_grid_and_histograms(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchdiag.render.tensorboard import write_result

    r = run("data_fake.py:loader")
    path = write_result(r, tmp_path)
    acc = EventAccumulator(str(path), size_guidance={"images": 0, "histograms": 0})
    acc.Reload()
    assert "data/train/samples_per_class" in acc.Tags()["images"]
    assert "data/train/[0]/channel_0" in acc.Tags()["histograms"]


# ---- what the model does with the input, what independent draws share -------------------------------------

class _Scale(torch.nn.Module):
    def forward(self, x):
        return x / 255.0 - 0.5


def _pixel_model(scaled: bool):
    torch.manual_seed(0)
    layers = [_Scale()] if scaled else []
    return torch.nn.Sequential(*layers, torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(3))


@pytest.mark.parametrize("scaled, severity", [(True, "info"), (False, "warning")])
def test_raw_pixels_scaled_inside_the_model_is_info(scaled, severity):
    """The same 0–255 floats: a model that divides them by 255 before its first convolution reads them scaled."""
    model = _pixel_model(scaled)
    model(torch.zeros(1, 3, 16, 16))   # materialise the lazy layer
    ds = load_data(f"{SAMPLES}/data_content.py:float_pixels")
    r = run_data(ds, Options(**QUICK), context("cpu"), model=model)
    f = one(r, "raw-pixels")
    assert f.severity == severity
    assert ("scaled inside the model" in f.message) == scaled
    if scaled:   # what the first convolution reads: x / 255 - 0.5 of pixels in [2, 254], under 0.5 in magnitude
        most = float(f.message.split("sees |x| ≤ ")[1].split()[0])
        assert 0.4 < most <= 254 / 255 - 0.5 + 1e-4   # printed to 4 digits


def _pool_loader(x: torch.Tensor, y: torch.Tensor) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)


def _draws(n: int, bits: int, g: torch.Generator) -> torch.Tensor:
    codes = torch.randint(0, 2 ** bits, (n,), generator=g)
    return ((codes[:, None] >> torch.arange(bits)) & 1).float()


class _Pixels(torch.utils.data.Dataset):
    """0–255 images: float, or uint8 beside a float side input in [0, 100)."""

    def __init__(self, uint8: bool):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (64, 3, 16, 16), generator=g, dtype=torch.uint8 if uint8 else torch.int64)
        self.x = self.x if uint8 else self.x.float()
        self.aux = torch.rand(64, 4, generator=g) * 100
        self.uint8 = uint8

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return ({"img": self.x[i], "aux": self.aux[i]} if self.uint8 else {"img": self.x[i]}), i % 3


class _TwoPaths(torch.nn.Module):
    """The float image divided by `divide`; a uint8 image read raw (as floats), its side input divided by 100."""

    def __init__(self, divide: float = 255.0):
        super().__init__()
        self.a, self.b, self.divide = torch.nn.Conv2d(3, 3, 3), torch.nn.Linear(4, 3), divide

    def forward(self, img, aux=None):
        if aux is None:
            return self.a(img / self.divide).mean((2, 3))
        return self.a(img.float()).mean((2, 3)) + self.b(aux / 100)


def test_a_uint8_image_read_raw_is_not_called_scaled():
    """The only float input (the side input) is scaled; the uint8 image beside it is not."""
    torch.manual_seed(0)
    r = run_data(_Pixels(uint8=True), Options(**QUICK), context("cpu"), model=_TwoPaths())
    assert one(r, "raw-pixels").severity == "warning"


def test_pixels_squashed_towards_zero_are_not_scaled():
    """x / 1e4: the first convolution reads values under 0.026, not a unit range; x / 255 is a unit range."""
    torch.manual_seed(0)
    r = run_data(_Pixels(uint8=False), Options(**QUICK), context("cpu"), model=_TwoPaths(divide=1e4))
    assert one(r, "raw-pixels").severity == "warning"
    r = run_data(_Pixels(uint8=False), Options(**QUICK), context("cpu"), model=_TwoPaths(divide=255.0))
    assert one(r, "raw-pixels").severity == "info"


def test_indicator_inputs_are_not_asked_to_be_standardised():
    """A bag of words (0/1, mostly 0: mean 0.05, std 0.22) is on a unit scale; counts of the same words are not."""
    g = torch.Generator().manual_seed(0)
    words = (torch.rand(800, 300, generator=g) < 0.05).float()
    y = words[:, :5].sum(1, keepdim=True)
    r = run_data(_pool_loader(words, y), Options(**QUICK), context("cpu"))
    assert "not-standardised" not in codes(r)
    counts = words * torch.randint(1, 40, words.shape, generator=g)
    r = run_data(_pool_loader(counts, y), Options(**QUICK), context("cpu"))
    assert one(r, "not-standardised").severity == "warning"
    # a sweep: features on scales 1000x apart (wine's proline beside the rest) were told one overall Normalize
    mixed = torch.randn(800, 4, generator=g) * torch.tensor([1.0, 1.0, 1000.0, 2.0]) + 500
    f = one(run_data(_pool_loader(mixed, y), Options(**QUICK), context("cpu")), "not-standardised")
    assert f.hint.startswith("standardise each feature") and "feature 2:" in f.hint, f.hint
    # a review: a windowed waveform's positions (ranges that change gradually, 8e3x end to end) and a near-constant
    # column (5.0 but one 5.001) are no features to standardise one by one: the overall Normalize
    wave = torch.randn(800, 256, generator=g) * torch.hann_window(256) + 0.5
    nearly = torch.cat([torch.randn(800, 4, generator=g) * 10 + 9, torch.full((800, 1), 5.0)], 1)
    nearly[0, 4] = 5.001
    for x in (wave, nearly):
        found = [f for f in run_data(_pool_loader(x, y), Options(**QUICK), context("cpu")).findings
                 if f.code == "not-standardised"]
        assert found and found[0].hint.startswith("Normalize("), [f.hint for f in found]
    # a sweep: token ids (int64 indices into an nn.Embedding, mean ~8000) were told to Normalize
    ids = torch.randint(0, 30000, (800, 64), generator=g)
    r = run_data(_pool_loader(ids, y), Options(**QUICK), context("cpu"))
    assert "not-standardised" not in codes(r), [f.message for f in r.findings]


class _Offset(torch.nn.Module):
    """x * 0 + a fixed draw: the output is the same whatever the input."""

    def __init__(self, n: int):
        super().__init__()
        self.register_buffer("noise", torch.randn(64, n, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return x * 0 + self.noise[: len(x)]


class _WideDeep(torch.nn.Module):
    """A review: a deep path through BatchNorm, and a wide Linear that reads the raw input beside it."""

    def __init__(self, n: int, concat: bool):
        super().__init__()
        self.bn, self.deep, self.concat = torch.nn.BatchNorm1d(n), torch.nn.Linear(n, n), concat
        self.out = torch.nn.Linear(2 * n if concat else n, 2)

    def forward(self, x):
        h = torch.relu(self.deep(self.bn(x)))
        return self.out(torch.cat([h, x], 1)) if self.concat else self.out(h) + self.out(x)


class _PerStep(torch.nn.Module):
    """A review: (N, T, F) through BatchNorm1d(T), which standardises each time step, not each feature."""

    def __init__(self):
        super().__init__()
        self.bn, self.fc = torch.nn.BatchNorm1d(10), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.bn(x)).mean(1)


@pytest.mark.parametrize("opening,severity", [
    (lambda n: [torch.nn.BatchNorm1d(n)], "info"),                         # standardised with the batch's statistics
    (lambda n: [torch.nn.BatchNorm1d(n), torch.nn.Dropout(0.5)], "info"),  # the same masks either way (seeded)
    (lambda n: [torch.nn.BatchNorm1d(n), torch.nn.LazyLinear(n)], "info"),  # a review: the copy crashed on it
    (lambda n: [], "warning"),                                             # nothing: the first Linear reads ~100
    (lambda n: [torch.nn.Linear(n, n), torch.nn.BatchNorm1d(n)], "warning"),   # per-feature scales reach BatchNorm mixed
    (lambda n: [_Offset(n)], "warning"),                                   # ignores its input: no evidence either way
    (lambda n: [_WideDeep(n, concat=False)], "warning"),                   # a Linear reads the raw input beside
    (lambda n: [_WideDeep(n, concat=True)], "warning"),                    # the raw input concatenated back in
])
def test_an_input_the_model_standardises_itself_is_info(opening, severity):
    """A tabular input of mean ~100 (std 20-80 per column): a model that opens with BatchNorm standardises it in
    training (the ported SO 34673164's fix), and standardising it first changes nothing it computes; anything
    that reads the raw values keeps the warning."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 8, generator=g) * torch.linspace(20, 80, 8) + 100
    y = (x[:, 0] > 100).long()
    layers = opening(8)
    model = torch.nn.Sequential(*layers, torch.nn.Linear(8, 2)) if not layers or not isinstance(layers[0], (
        _WideDeep, _Offset)) else torch.nn.Sequential(*layers)
    before = {k: v.clone() for k, v in model.state_dict().items() if not isinstance(v, torch.nn.parameter.UninitializedParameter)}
    r = run_data(_pool_loader(x, y), Options(**QUICK, speed=False), context("cpu"), model=model)
    f = one(r, "not-standardised")
    assert f.severity == severity, f.message
    if severity == "info":
        assert "standardising it per feature first changes the model's training-mode output" in f.message
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())   # BatchNorm's stats: a copy's


def test_a_lazy_model_is_timed_without_a_crash():
    """A review: the training step's copy checked its room by each parameter's size, which a LazyLinear has not
    before its first forward (an internal error)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 8, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LazyLinear(2))
    r = run_data(_pool_loader(x, (x[:, 0] > 0).long()), Options(**QUICK), context("cpu"), model=model)
    assert "training" in r.data["throughput"] and r.exit_code == 0
    assert isinstance(model[1].weight, torch.nn.parameter.UninitializedParameter)   # the user's model untouched


def test_a_sequence_standardised_per_time_step_keeps_the_warning():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 10, 4, generator=g)
    x[..., 0] = x[..., 0] * 3000 + 10000
    r = run_data(_pool_loader(x, (x[:, 0, 1] > 0).long()), Options(**QUICK, speed=False), context("cpu"),
                 model=_PerStep())
    assert one(r, "not-standardised").severity == "warning"


@pytest.mark.parametrize("wait_s,severity", [(0.002, "info"), (0.2, "warning")])
def test_waiting_a_fraction_of_a_millisecond_a_batch_is_no_warning(wait_s, severity):
    """A sweep: an in-memory set behind a 0.5 ms step read 62% waiting for data, a warning that said to add workers
    where the sweep had measured them worse. Under 1 ms a batch it is said (info); more workers measured no better
    are not advised."""
    import types

    from torchdiag.diagnostics.data import findings
    from torchdiag.diagnostics.data.speed import Timing
    from torchdiag.results import Result

    t = Timing(0, batches=10, wait_s=wait_s, step_s=0.003, stepped=True)
    worse = Timing(2, batches=10, wait_s=3 * wait_s, step_s=0.003, stepped=True)
    r = Result("data")
    findings._input_bound(r, types.SimpleNamespace(training=t, sweep=[t, worse]))
    f = one(r, "input-bound")
    assert f.severity == severity and "more workers were no better here" in f.hint, (f.message, f.hint)
    assert f"{1e3 * wait_s / 10:.2g} ms a batch" in f.message


@pytest.mark.parametrize("alone_s,severity", [(0.0024, "info"), (0.05, "warning")])
def test_a_wait_the_loader_alone_does_not_make_is_a_busy_machine(alone_s, severity):
    """A sweep: an in-memory set the loader delivered at 0.24 ms a batch alone read 24% waiting (2.2 ms a batch) beside
    a 6.8 ms step in 2 of 7 identical runs under --no-sweep: a warning whose hint said to cache and add workers. The
    loader timed alone says it keeps up (0.24 / (0.24 + 6.8) = 3%); where it does not, the warning stands."""
    import types

    from torchdiag.diagnostics.data import findings
    from torchdiag.diagnostics.data.speed import Timing
    from torchdiag.results import Result

    t = Timing(0, batches=10, wait_s=0.022, step_s=0.068, stepped=True)
    probe = Timing(0, batches=10, seconds=alone_s)
    r = Result("data")
    findings._input_bound(r, types.SimpleNamespace(training=t, sweep=[], probe=probe, scans={}))
    f = one(r, "input-bound")
    assert f.severity == severity, f.message
    if severity == "info":
        assert "delivered one in 0.24 ms alone" in f.message and "busy machine" in f.message, f.message


@pytest.mark.parametrize("better_wait_s,still", [(0.01, False), (1.0, True)])
def test_more_workers_still_waiting_are_not_the_whole_fix(better_wait_s, still):
    """A sweep: "set num_workers=2" where 2 workers still waited 99% of each step. The hint says the share that
    remains and to make loading cheaper; where the count measured under 5% it is the whole fix."""
    import types

    from torchdiag.diagnostics.data import findings
    from torchdiag.diagnostics.data.speed import Timing
    from torchdiag.results import Result

    t = Timing(0, batches=10, wait_s=2.0, step_s=0.003, stepped=True)
    better = Timing(2, batches=10, wait_s=better_wait_s, step_s=0.3, stepped=True)
    r = Result("data")
    findings._input_bound(r, types.SimpleNamespace(training=t, sweep=[t, better]))
    f = one(r, "input-bound")
    assert f.hint.startswith("set num_workers=2"), f.hint
    share = better.wait_share
    assert ("make loading cheaper" in f.hint and f"{100 * share:.0f}% of each step still waits there" in f.hint) == still
    assert (share >= 0.05) == still


def test_a_held_out_split_s_imbalance_is_said_with_how_to_judge_it_and_a_binary_logit_gets_pos_weight():
    """A sweep: the validation split's imbalance repeated the training hint (weight the loss, resample), and a model
    with one output per sample was told CrossEntropyLoss(weight=...)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2000, 8, generator=g), (torch.rand(2000, generator=g) < 0.02).long()
    model = torch.nn.Linear(8, 1)
    r = run_data(_pool_loader(x, y), Options(**QUICK), context("cpu"), val=_pool_loader(x[:500], y[:500]),
                 model=model)
    said = {f.where.split(":")[0]: f for f in r.findings if f.code == "class-imbalance"}
    assert said["train"].severity == "warning" and "pos_weight" in said["train"].hint
    assert said["val"].severity == "info" and "per-class" in said["val"].hint and "Sampler" not in said["val"].hint


def test_a_field_padded_per_batch_has_no_constant_features():
    """A sweep: an attention mask padded per batch read "5 of 59 features never vary" (its first positions are
    never padding); a fixed-width field keeps the finding."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 60, (400,), generator=g)

    def collate(items):
        n = max(int(k) for k, _ in items)
        mask = torch.stack([(torch.arange(n) < k).long() for k, _ in items])
        return mask, torch.stack([y for _, y in items])

    data = list(zip(lengths, torch.randint(0, 2, (400,), generator=g)))
    loader = torch.utils.data.DataLoader(data, batch_size=32, collate_fn=collate)
    assert "constant-features" not in codes(run_data(loader, Options(**QUICK), context("cpu")))
    fixed = torch.randn(400, 8, generator=g)
    fixed[:, 3] = 1.0
    assert one(run_data(_pool_loader(fixed, torch.zeros(400, 1)), Options(**QUICK), context("cpu")),
               "constant-features").severity == "info"


def test_a_fetcher_left_early_waits_for_its_thread():
    """A sweep: `data` aborted at exit now and then (exit 134, "terminate called without an active exception"): the
    fetching thread, a daemon, was still running the collate function's torch ops (a batch fetched ahead) when the
    interpreter finalised. Left early, the fetcher waits for its thread; a stuck loader's is not waited for."""
    from torchdiag.core.fetch import Fetcher

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 4)), batch_size=4)
    fetcher = Fetcher(loader, timeout=30.0, ahead=1)
    for _ in fetcher:
        break
    assert fetcher._thread is not None and not fetcher._thread.is_alive()


def test_a_fetcher_stopped_by_an_exception_does_not_wait_for_its_thread():
    """A review of the join above: Ctrl-C while a loader hung in __getitem__ waited 2 x --timeout (the join ran from
    the generator's finally and again from the caller). Stopped by an exception, the thread is not waited for."""
    import threading
    import time

    from torchdiag.core.fetch import Fetcher

    release = threading.Event()

    class Hangs(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            if i >= 4:
                release.wait(60)   # hung until the test lets it go
            return torch.zeros(2)

    waited = []
    for how in ("Ctrl-C inside the fetcher", "the consumer fails"):
        fetcher = Fetcher(torch.utils.data.DataLoader(Hangs(), batch_size=4), timeout=30.0, ahead=1)
        t0 = time.monotonic()
        with pytest.raises((KeyboardInterrupt, RuntimeError)):
            batches = iter(fetcher)
            next(batches)   # the first batch; the thread now fetches the second, which hangs
            if how == "the consumer fails":
                raise RuntimeError("the consumer failed while the next batch hangs")
            batches.throw(KeyboardInterrupt)   # as Ctrl-C arrives in the generator's wait
        if how == "the consumer fails":
            batches.close()   # the generator let go (GeneratorExit): the bounded wait
        fetcher.close()   # the caller's close too: not a second wait
        waited.append(time.monotonic() - t0)
        assert fetcher._stuck
    release.set()
    assert max(waited) < 15, waited   # not the 30 s --timeout, twice (a bound, not a timing: 60 s was the bug)


def test_inputs_that_are_no_tensors_are_said_not_checked():
    """A sweep: a dataset of (string, label) read "OK: no problem found in the data or the loader", its inputs never
    looked at. The verdict and a note say only the targets were checked."""
    class Texts(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return f"hello {i}", i % 2

    r = run_data(Texts(), Options(**QUICK), context("cpu"))
    assert r.verdict == "OK: no problem found in the targets (the inputs are no tensors: not checked)", r.verdict
    assert any("only the target was checked" in n for n in r.notes)


def test_one_based_labels_are_said_so_without_a_class_count():
    """A sweep: labels 1..10 with no --classes or --model read "1 class(es) of [0, 11) have no sample: [0]"."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, 8, generator=g), torch.randint(1, 11, (1000,), generator=g)
    f = one(run_data(_pool_loader(x, y), Options(**QUICK), context("cpu")), "classes-absent")
    assert "the labels run 1–10 with no 0: one-based" in f.message and "subtract 1" in f.hint


def test_a_small_input_read_as_it_is_is_not_called_scaled_inside():
    """Inputs already within a few units (uniform [0, 1): mean 0.5, std 0.29, not standardised): the first layer
    reads them as they are, which is not the model scaling them."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, 4, generator=g)
    torch.manual_seed(0)
    r = run_data(_pool_loader(x, x.sum(1, keepdim=True)), Options(**QUICK), context("cpu"),
                 model=torch.nn.Linear(4, 1))
    f = one(r, "not-standardised")
    assert f.severity == "info" and "scaled inside the model" not in f.message


class _Head(torch.nn.Module):
    """One output per sample: tanh hidden layers (saturated by any input scaling) with a linear layer on top, then
    `squash` (None: unbounded)."""

    def __init__(self, squash=None, head: float = 0.05):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        torch.nn.init.uniform_(self.body[2].weight, -head, head)   # |output| ≤ 16 × head < 1 on any input
        torch.nn.init.zeros_(self.body[2].bias)
        self.squash = squash

    def forward(self, x):
        y = self.body(x)
        return y if self.squash is None else self.squash(y)


@pytest.mark.parametrize("squash, targets, head, found", [
    (torch.sigmoid, [0.0, 1.0, 2.0], 0.05, True),        # three classes read as one number with a sigmoid
    (torch.sigmoid, [0.0, 1.0], 0.05, False),            # binary labels: within reach
    (torch.tanh, [-1.0, 0.5, 1.0], 0.05, False),
    (torch.tanh, [0.0, 3.0], 0.05, True),
    (lambda y: y.clamp(0, 1), [0.0, 200.0], 0.05, True),  # a clamped head cannot reach 200 either
    (None, [0.0, 50.0, 100.0], 0.05, False),              # a linear head: outputs in [-1, 1] at initialisation
    (None, [0.0, 5e3, 1e4], 1e-5, False),                 # ... even 1e-4 at most: scaled until it reaches 100
])
def test_targets_a_squashed_single_output_cannot_reach(squash, targets, head, found):
    """Measured on what follows the last weighted layer, not on the model's first outputs: a tanh network with a
    linear head gives outputs within [-1, 1] whatever its input, yet reaches any target (a review's false alarm)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 4, generator=g)
    y = torch.tensor(targets)[torch.randint(0, len(targets), (200, 1), generator=g)]
    r = run_data(_pool_loader(x, y), Options(**QUICK, speed=False), context("cpu"), model=_Head(squash, head))
    hits = [f for f in r.findings if f.code == "target-out-of-range"]
    assert bool(hits) == found
    if found:
        assert hits[0].severity == "warning" and hits[0].where == "train:[1]" and r.exit_code == 0
        assert f"targets span [{min(targets):g}, {max(targets):g}]" in hits[0].message


class _Unbounded(torch.nn.Module):
    """Healthy regressions whose outputs sit inside [-1, 1] at initialisation and whose last weighted layer saturates
    behind a squashing function, yet which reach any target (a review trained them past 5)."""

    def __init__(self, kind: str):
        super().__init__()
        torch.manual_seed(0)
        self.kind, self.h = kind, torch.nn.Linear(4, 8)
        self.value, self.gate = torch.nn.Linear(8, 1), torch.nn.Linear(8, 1 if kind == "gated" else 3)
        self.experts = torch.nn.Linear(8, 3)
        self.scale = torch.nn.Parameter(torch.tensor(1.0))
        for m in (self.value, self.experts):
            torch.nn.init.uniform_(m.weight, -0.01, 0.01)

    def forward(self, x):
        h = torch.relu(self.h(x))
        if self.kind == "gated":      # a value times a sigmoid gate: the gate runs last
            return (self.value(h) * torch.sigmoid(self.gate(h))).squeeze(-1)
        if self.kind == "mixture":    # experts mixed by a softmax gate
            return (self.experts(h) * torch.softmax(self.gate(h), -1)).sum(-1)
        return torch.tanh(self.value(h)).squeeze(-1) * self.scale   # a learnable output scale after the tanh


@pytest.mark.parametrize("kind", ["gated", "mixture", "scaled-tanh"])
def test_a_gate_a_mixture_or_a_learnable_scale_is_no_bound(kind):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 4, generator=g)
    y = torch.rand(200, generator=g) * 5
    r = run_data(_pool_loader(x, y), Options(**QUICK, speed=False), context("cpu"), model=_Unbounded(kind))
    assert "target-out-of-range" not in codes(r)


class _MeanProbability(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)

    def forward(self, x):
        return torch.sigmoid(self.fc(x)).mean()   # one number for the whole batch: not one output per sample


def test_reach_needs_one_output_per_sample_and_ignores_minus_100():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 4, generator=g)
    y = torch.randint(0, 3, (200,), generator=g)
    r = run_data(_pool_loader(x, y.float()), Options(**QUICK, speed=False), context("cpu"), model=_MeanProbability())
    assert "target-out-of-range" not in codes(r)
    labels = torch.where(torch.rand(200, generator=g) < 0.3, torch.tensor(-100), y.clamp(max=1))   # 0/1, some ignored
    r = run_data(_pool_loader(x, labels), Options(**QUICK, speed=False), context("cpu"), model=_Head(torch.sigmoid))
    assert "target-out-of-range" not in codes(r)


def test_repeated_rows_split_at_random_stay_a_leak():
    """Rows written twice, then split at random (a CSV concatenated with itself): the shares look like independent
    draws from a pool, yet continuous inputs have no pool. Two reviews broke rules that called this chance."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1000, 6, generator=g)
    rows = torch.cat([base, base[:300]])[torch.randperm(1300, generator=g)]
    x, xv = rows[:1040], rows[1040:]
    r = run_data(_pool_loader(x, x.sum(1, keepdim=True)), Options(**QUICK), context("cpu"),
                 val=_pool_loader(xv, xv.sum(1, keepdim=True)))
    assert one(r, "train-val-overlap").severity == "error" and r.exit_code == 1
    assert all(f.severity == "warning" for f in r.findings if f.code == "duplicate-samples")


def _discrete_leak(kind: str, g: torch.Generator):
    """Leaks on discrete tabular data that a rule reading chance from the data's own repeats passed (reviews of the
    twenty-fifth session's withdrawn pool rule): (train, val)."""
    ints = torch.randint(0, 100, (12_000, 6), generator=g).float()
    if kind == "oversampled":      # a minority class's rows repeated 5 times, then an 80/20 split
        rows = torch.cat([ints[:2_000], ints[:300].repeat(5, 1)])
    elif kind == "partly-doubled":   # a quarter of the rows written twice, then split
        rows = torch.cat([ints[:8_000], ints[:2_000]])
    elif kind == "one-hot-doubled":  # one-hot categories, every distinct row written twice, split 50/50
        a, b = torch.randint(0, 40, (400,), generator=g), torch.randint(0, 12, (400,), generator=g)
        one = torch.unique(torch.cat([F.one_hot(a, 40), F.one_hot(b, 12)], 1), dim=0).float()
        rows = torch.cat([one, one])
        rows = rows[torch.randperm(len(rows), generator=g)]
        return rows[:len(rows) // 2], rows[len(rows) // 2:]
    elif kind == "grid-copied":      # every combination of six categories once, 30 training rows copied (8%)
        grid = torch.cartesian_prod(*[torch.arange(k) for k in (4, 4, 4, 3, 3, 3)]).float()
        grid = grid[torch.randperm(len(grid), generator=g)]
        return grid[:1_382], torch.cat([grid[1_382:], grid[:30]])
    else:                            # "defaults": 5% all-zero records, validation copied from training
        ints[torch.rand(12_000, generator=g) < 0.05] = 0
        return ints[:10_000], ints[3_000:5_000].clone()
    rows = rows[torch.randperm(len(rows), generator=g)]
    cut = len(rows) * 4 // 5
    return rows[:cut], rows[cut:]


@pytest.mark.parametrize("kind", ["oversampled", "partly-doubled", "one-hot-doubled", "grid-copied", "defaults"])
def test_leaks_on_discrete_data_stay_errors(kind):
    x, xv = _discrete_leak(kind, torch.Generator().manual_seed(0))
    r = run_data(_pool_loader(x, torch.arange(len(x)) % 3), Options(**QUICK), context("cpu"),
                 val=_pool_loader(xv, torch.arange(len(xv)) % 3))
    assert one(r, "train-val-overlap").severity == "error" and r.exit_code == 1


def _grid_with_copies(copies: int):
    g = torch.Generator().manual_seed(0)
    grid = torch.cartesian_prod(*[torch.arange(k) for k in (4, 4, 4, 3, 3, 3)]).float()
    grid = grid[torch.randperm(len(grid), generator=g)]
    return grid[:1_382], torch.cat([grid[1_382:], grid[:copies]])


def test_an_overlap_within_the_scores_sampling_error_is_info():
    """6 of 352 validation rows copied from training move an accuracy by at most 1.7 points; measured on 352 samples
    it is uncertain by up to 0.5/sqrt(352) = 2.7 points. 10 copies (2.8%) are over that: an error."""
    x, xv = _grid_with_copies(6)
    r = run_data(_pool_loader(x, torch.arange(len(x)) % 3), Options(**QUICK), context("cpu"),
                 val=_pool_loader(xv, torch.arange(len(xv)) % 3))
    f = one(r, "train-val-overlap")
    assert f.severity == "info" and r.exit_code == 0
    assert "6 of 352" in f.message and "at most 1.7 points" in f.message and "(up to 2.7)" in f.message
    x, xv = _grid_with_copies(10)
    r = run_data(_pool_loader(x, torch.arange(len(x)) % 3), Options(**QUICK), context("cpu"),
                 val=_pool_loader(xv, torch.arange(len(xv)) % 3))
    assert one(r, "train-val-overlap").severity == "error" and r.exit_code == 1


def test_an_overlap_that_is_most_of_one_class_stays_an_error():
    """A review: the only 3 positives of 400 validation samples are copies of training rows. 3 of 400 is under the
    accuracy's standard error, but recall on that class is memorisation: each class is asked the same bound."""
    g = torch.Generator().manual_seed(0)
    x, xv = torch.randn(1000, 6, generator=g), torch.randn(397, 6, generator=g)
    y = (torch.arange(1000) < 50).long()
    xv, yv = torch.cat([xv, x[:3]]), torch.cat([torch.zeros(397, dtype=torch.long), torch.ones(3, dtype=torch.long)])
    r = run_data(_pool_loader(x, y), Options(**QUICK, speed=False), context("cpu"), val=_pool_loader(xv, yv))
    assert one(r, "train-val-overlap").severity == "error" and r.exit_code == 1
    # the same 3 copies spread over the majority class: under the bound in every class
    xv2 = torch.cat([torch.randn(397, 6, generator=g), x[-3:]])
    yv2 = torch.cat([(torch.arange(397) < 100).long(), torch.zeros(3, dtype=torch.long)])
    r = run_data(_pool_loader(x, y), Options(**QUICK, speed=False), context("cpu"), val=_pool_loader(xv2, yv2))
    f = one(r, "train-val-overlap")
    assert f.severity == "info" and "in each class under its own" in f.message, f.message


def _boards(n: int, seed: int, space: int = 512):
    """n draws of the 3x3 binary boards (the first `space` of the 512), their 9 cells and 16 copies of them (a
    board's wrap-around padding), labelled by whether most cells are alive."""
    import itertools

    boards = torch.tensor(list(itertools.product([0.0, 1.0], repeat=9)))[:space]
    x = boards[torch.randint(0, len(boards), (n,), generator=torch.Generator().manual_seed(seed))]
    return torch.utils.data.TensorDataset(torch.cat([x, x[:, :8], x[:, 1:9]], 1), (x.sum(1) > 4).long())


def test_inputs_that_enumerate_a_small_discrete_space_repeat_and_overlap_by_design():
    """A sweep of the ported training-bug programs: Game of Life's 3x3 boards (2^9 = 512, every one drawn among 8,000
    training samples) repeat 7,488 times and every validation board is a training one: a duplicate-samples warning and
    a train-val-overlap error that no split of the data can avoid (plain: dropping the overlap empties validation).
    Their inputs are every combination of their columns' values: info, with the space's size."""
    train, val = _boards(8000, 0), _boards(2000, 1)
    xs = train.tensors[0]
    assert len({tuple(r) for r in xs.tolist()}) == 512                                   # the premise: all 512 drawn
    assert {tuple(r) for r in val.tensors[0].tolist()} <= {tuple(r) for r in xs.tolist()}
    r = run_data(_pool_loader(*train.tensors), Options(**QUICK, speed=False), context("cpu"),
                 val=_pool_loader(*val.tensors))
    said = {(f.code, f.where.split(":")[0]): f for f in r.findings}
    for key in (("duplicate-samples", "train"), ("duplicate-samples", "val"), ("train-val-overlap", "val")):
        assert said[key].severity == "info" and "a discrete space of 512 inputs" in said[key].message, said[key]
    assert r.exit_code == 0


@pytest.mark.parametrize("case", ["part-of-the-space", "continuous-copies", "wide-integers", "validation-outside"])
def test_repeats_and_overlaps_of_a_space_not_enumerated_keep_their_level(case):
    """What a leak makes stays: boards from 500 of the 512 (a space not enumerated: oversampled rows of a categorical
    table), continuous rows written twice before a split, pairs of integers in 0..100 drawn 10,000 times (62% of
    validation shared by chance, docs/data.md: still an error)."""
    g = torch.Generator().manual_seed(0)
    if case == "part-of-the-space":
        train, val = _boards(8000, 0, space=500), _boards(2000, 1, space=500)
    elif case == "validation-outside":   # a review: half of validation outside the space training enumerates
        train, val = _boards(8000, 0), _boards(2000, 1)
        x = val.tensors[0].clone()
        x[1000:, 0] = 2.0
        val = torch.utils.data.TensorDataset(x, val.tensors[1])
    elif case == "continuous-copies":
        x = torch.randn(400, 4, generator=g)
        train = torch.utils.data.TensorDataset(torch.cat([x, x[:100]]), torch.arange(500) % 2)
        val = torch.utils.data.TensorDataset(torch.cat([torch.randn(150, 4, generator=g), x[:50]]), torch.arange(200) % 2)
    else:
        train = torch.utils.data.TensorDataset(torch.randint(0, 101, (10000, 2), generator=g).float(),
                                               torch.arange(10000) % 2)
        val = torch.utils.data.TensorDataset(torch.randint(0, 101, (2000, 2), generator=g).float(), torch.arange(2000) % 2)
    r = run_data(_pool_loader(*train.tensors), Options(**QUICK, speed=False), context("cpu"),
                 val=_pool_loader(*val.tensors))
    said = {(f.code, f.where.split(":")[0]): f for f in r.findings}
    assert said[("duplicate-samples", "train")].severity == ("info" if case == "validation-outside" else "warning")
    assert said[("train-val-overlap", "val")].severity == "error" and r.exit_code == 1


def test_an_overlap_counted_on_a_subset_stays_an_error():
    """A training split read in part undercounts the overlap: the bound is not asked of it."""
    x, xv = _grid_with_copies(6)
    r = run_data(_pool_loader(x, torch.arange(len(x)) % 3), Options(**QUICK, samples=1_000), context("cpu"),
                 val=_pool_loader(xv, torch.arange(len(xv)) % 3))
    f = one(r, "train-val-overlap")
    assert f.severity == "error" and r.exit_code == 1 and "inflated" in f.message


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for i in range(300):
            yield torch.randn(4, generator=g), i % 3


class _Twice(torch.utils.data.IterableDataset):
    """Sharded by worker (each its own contiguous half), each record twice in a row in the source."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(k * 150 // n, (k + 1) * 150 // n):
            for _ in range(2):
                yield torch.full((4,), float(i)), i % 3


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_dataset_is_read_not_crashed_on(workers):
    """An IterableDataset has no sampler to rebuild its loader with (it was an internal error); with two workers each
    gives the whole stream, and data says every sample comes twice."""
    r = run_data(torch.utils.data.DataLoader(_Stream(), batch_size=16, num_workers=workers),
                 Options(batches=3, sweep=False, speed=False), context("cpu"))
    assert r.data["splits"]["train"]["samples"] == 300 * max(workers, 1)
    dups = [f for f in r.findings if f.code == "duplicate-samples"]
    assert (len(dups) == 1 and "300 sample(s) repeat" in dups[0].message) if workers else not dups
    if workers:   # a sweep: the cause is said, and the fix (it said "drop the repeats")
        assert "each of the loader's 2 workers yields the whole stream" in dups[0].message, dups[0].message
        assert "get_worker_info" in dups[0].hint
        # a review: a stream sharded by worker whose source holds each record twice in a row is not told to shard
        r = run_data(torch.utils.data.DataLoader(_Twice(), batch_size=16, num_workers=workers),
                     Options(batches=3, sweep=False, speed=False), context("cpu"))
        dups = [f for f in r.findings if f.code == "duplicate-samples"]
        assert dups and "get_worker_info" not in dups[0].hint and "workers yields" not in dups[0].message
    r = run_data(_Stream(), Options(batches=3, sweep=False), context("cpu"))   # the bare dataset, batched by data
    assert r.data["splits"]["train"]["samples"] == 300 and quiet(r) == []


@pytest.mark.parametrize("kind", ["ages", "signs"])
def test_a_one_output_model_reads_integer_targets_as_values(kind):
    """Ages 10..90 or ±1 targets of a model with one output per sample are values: no class is absent, -1 is no
    negative class label; without the model they read as class indices (the documented default)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, 4, generator=g)
    y = (10 + 80 * x[:, :1]).round() if kind == "ages" else torch.where(x[:, :1] > 0.5, 1.0, -1.0)
    loud = {"ages": "classes-absent", "signs": "labels-out-of-range"}[kind]
    assert loud in codes(run_data(_pool_loader(x, y), Options(**QUICK, speed=False), context("cpu")))
    r = run_data(_pool_loader(x, y), Options(**QUICK, speed=False), context("cpu"), model=torch.nn.Linear(4, 1))
    assert quiet(r) == [] and r.exit_code == 0
    assert r.data["one_output"] is True and r.data["num_classes"] is None
    r = run_data(_pool_loader(x, y), Options(**QUICK, speed=False, num_classes=2), context("cpu"),
                 model=torch.nn.Linear(4, 1))
    assert "labels-out-of-range" in codes(r)   # --classes says they are classes


class _Squeezed(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.fc, self.shape = torch.nn.Linear(4, 1), shape

    def forward(self, x):
        return self.fc(x).reshape(self.shape(x.shape[0]))


@pytest.mark.parametrize("shape", [lambda n: (n,), lambda n: (n, 1, 1, 1)], ids=["N", "N111"])
def test_a_loss_that_refuses_the_output_leaves_the_step_untimed(shape):
    """±1 integer targets against a one-output model: the auto loss (cross_entropy) refuses it; data gives its
    findings and says why the step was not timed, instead of ending with exit 2 (a review)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(256, 4, generator=g)
    y = torch.where(x[:, 0] > 0.5, 1, -1)
    torch.manual_seed(0)
    model = _Squeezed(shape)
    r = run_data(_pool_loader(x, y), Options(**QUICK), context("cpu"), model=model)
    assert not {"labels-out-of-range", "classes-absent"} & set(codes(r))
    refused = [n for n in r.notes if n.startswith("training step not timed: cross_entropy needs an (N, C) output")]
    if model(x[:2]).dim() > 2:   # (N, 1, 1, 1): the auto loss (cross_entropy for integer targets) refuses it
        assert refused and "training" not in r.data["throughput"], r.notes
    else:                        # (N,): the auto loss takes it, and the step is timed
        assert not refused and "training" in r.data["throughput"]


def test_a_uint8_mask_of_zeros_and_ones_is_not_raw_pixels():
    g = torch.Generator().manual_seed(0)
    masks = (torch.rand(300, 1, 16, 16, generator=g) < 0.3).to(torch.uint8)
    r = run_data(_pool_loader(masks, torch.randint(0, 2, (300,), generator=g)), Options(**QUICK, speed=False),
                 context("cpu"))
    assert not {"raw-pixels", "not-standardised"} & set(codes(r))
    pixels = (masks * 255).to(torch.uint8)
    r = run_data(_pool_loader(pixels, torch.randint(0, 2, (300,), generator=g)), Options(**QUICK, speed=False),
                 context("cpu"))
    assert one(r, "raw-pixels").severity == "warning"


def test_int64_class_ids_shaped_as_an_image_are_not_raw_pixels():
    """A new user's segmentation mask, int64 classes 0–3 shaped (1, H, W), was "raw 0–255 pixel values" with a hint
    to divide by 255 (docs/data.md: uint8, or floats in [0, 255]). The same values as floats still are."""
    g = torch.Generator().manual_seed(0)
    masks = torch.randint(0, 4, (300, 1, 16, 16), generator=g)
    r = run_data(_pool_loader(masks, torch.randint(0, 2, (300,), generator=g)), Options(**QUICK, speed=False),
                 context("cpu"))
    assert not {"raw-pixels", "not-standardised"} & set(codes(r)), codes(r)
    images = (torch.rand(300, 3, 16, 16, generator=g) * 255).round()
    r = run_data(_pool_loader(images, torch.randint(0, 2, (300,), generator=g)), Options(**QUICK, speed=False),
                 context("cpu"))
    assert one(r, "raw-pixels").severity == "warning"


class _OneInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.conv(x)


def test_dict_keys_the_forward_does_not_take_are_a_usage_error_naming_the_field_options():
    """A new user's {'image', 'mask'} batches against forward(self, x): every key went to the model as a keyword, and
    the model's TypeError was exit 3, "fix it or the inputs (-i)" (data has no -i). Exit 2, naming the keys and the
    options that say which field is which; with them, the run reads the mask as the target."""
    g = torch.Generator().manual_seed(0)
    rows = [{"image": torch.rand(3, 8, 8, generator=g), "mask": torch.randint(0, 4, (8, 8), generator=g)}
            for _ in range(32)]
    loader = torch.utils.data.DataLoader(rows, batch_size=8)
    with pytest.raises(UsageError) as exc:
        run_data(loader, Options(**QUICK), context("cpu"), model=_OneInput())
    assert "takes no 'image' or 'mask'" in exc.value.message and "--input-field KEY --target-field KEY" in exc.value.hint
    with pytest.raises(UsageError):   # a review: through a wrapper's forward(*inputs, **kwargs) too
        run_data(loader, Options(**QUICK), context("cpu"), model=torch.nn.DataParallel(_OneInput()))
    r = run_data(loader, Options(**QUICK, input_field="image", target_field="mask"), context("cpu"), model=_OneInput())
    assert r.header["fields"].startswith("input image, target mask"), r.header["fields"]


def _timed(workers: int, share: float):
    from torchdiag.diagnostics.data.speed import Timing

    return Timing(workers, batches=10, seconds=1.0, wait_s=share, step_s=1.0 - share, stepped=True)


@pytest.mark.parametrize("shares, said", [
    ({0: 0.4, 2: 0.03, 4: 0.01}, "num_workers=2: the fewest workers with the training step waiting < 5%"),
    ({0: 0.48, 2: 0.46}, "num_workers=2: the least waiting for data of the counts tried (46.0%; none under 5%)"),
])
def test_the_workers_line_says_what_was_measured(shares, said):
    """A sweep where no worker count gets under 5% waiting named the least-waiting one "waiting < 5%" (a tiny MLP
    on digits: 47% waiting at every count)."""
    from types import SimpleNamespace

    from torchdiag.diagnostics.data.findings import balance_reason, balanced

    st = SimpleNamespace(sweep=[_timed(w, s) for w, s in shares.items()], training=_timed(0, 0.4))
    best = balanced(st)
    assert f"num_workers={best}: {balance_reason(st, best)}" == said


@pytest.mark.parametrize("factory", ["empty_dataset", "empty_loader"])
def test_empty_data_is_one_line_and_exit_2(cli, tmp_path, factory):
    # a review: an empty map-style Dataset reached DataLoader(shuffle=True), whose RandomSampler refuses length 0
    # (exit 4, "a bug in torchdiag"); the empty DataLoader already said it
    (tmp_path / "empty.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "def empty_dataset():\n    return TensorDataset(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))\n"
        "def empty_loader():\n    return DataLoader(empty_dataset(), batch_size=4)\n")
    r = cli("data", f"{tmp_path}/empty.py:{factory}", "--no-speed")
    assert r.code == 2 and "the training data gave no batch (it is empty)" in r.stderr, r.stderr
    said = " ".join(r.stdout.split())   # wrapped at the terminal's width
    assert "nothing was measured" in said and "the numbers above" not in said, r.stdout   # a sweep: none above
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_a_data_factory_calling_sys_exit_is_named_as_your_code(cli, tmp_path):
    (tmp_path / "bye.py").write_text("import sys\ndef data():\n    sys.exit(0)\n")
    r = cli("data", f"{tmp_path}/bye.py:data", "--no-speed")
    assert r.code == 3 and "your code called sys.exit(0)" in r.stderr and "model" not in r.stderr.splitlines()[0], r.stderr


def test_samples_laid_out_differently_are_said_as_such(cli, tmp_path):
    # a review: dicts whose keys and value types alternate gave "sample 1 has shape scalar where the others have scalar"
    (tmp_path / "mixed.py").write_text(
        "import torch\nfrom torch.utils.data import Dataset\n"
        "class Mixed(Dataset):\n    def __len__(self):\n        return 40\n"
        "    def __getitem__(self, i):\n"
        "        return {'x': torch.randn(3), 'y': i % 3} if i % 2 else {'x': 'text', 'z': [1, 2]}\n"
        "def data():\n    return Mixed()\n")
    r = cli("data", f"{tmp_path}/mixed.py:data", "--no-speed", "--json")
    msgs = [f["message"] for f in r.json["findings"] if f["code"] == "inconsistent-shapes"]
    assert r.code == 1 and msgs and all("not laid out like the others" in m for m in msgs), msgs
    assert not any("where the others have" in m for m in msgs)


class TwoInputs(torch.nn.Module):
    """A tabular model: categorical codes through an embedding, numeric features beside them."""

    def __init__(self):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(11, 4), torch.nn.Linear(4 * 4 + 6, 3)

    def forward(self, x_cat, x_num):
        return self.head(torch.cat([self.emb(x_cat).flatten(1), x_num], 1))


def test_a_tuple_of_two_inputs_and_a_target_is_read_by_the_models_forward():
    """A sweep: TensorDataset(x_cat, x_num, y) was read as (input, target, other): x_num the target, the model
    called with one input (exit 3), and duplicates counted on the categorical column alone."""
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    x_cat, x_num = torch.randint(0, 11, (300, 4), generator=g), torch.randn(300, 6, generator=g)
    y = torch.randint(0, 3, (300,), generator=g)
    res = run_data(TensorDataset(x_cat, x_num, y), Options(speed=False), context("cpu"), model=TwoInputs())
    roles = {r["field"]: r["role"] for r in res.table("field_stats").rows if r["split"] == "train"}
    assert roles == {"[0]": "input", "[1]": "input", "[2]": "target"}, roles
    assert int(res.exit_code) == 0 and "duplicate-samples" not in {f.code for f in res.findings}
    # without a model the (input, target) convention stands
    alone = run_data(TensorDataset(x_cat, x_num, y), Options(speed=False), context("cpu"))
    assert {r["field"]: r["role"] for r in alone.table("field_stats").rows}["[1]"] == "target"
    # nested ((x_cat, x_num), y), and a namedtuple by its fields (a review: both called the model with one input)
    import collections

    Row = collections.namedtuple("Row", "xc xn y")
    nested = [((x_cat[i:i + 20], x_num[i:i + 20]), y[i:i + 20]) for i in range(0, 300, 20)]
    named = [Row(x_cat[i:i + 20], x_num[i:i + 20], y[i:i + 20]) for i in range(0, 300, 20)]
    for batches, expect in ((nested, {"[0][0]": "input", "[0][1]": "input", "[1]": "target"}),
                            (named, {"xc": "input", "xn": "input", "y": "target"})):
        res = run_data(batches, Options(speed=False), context("cpu"), model=TwoInputs())
        assert {r["field"]: r["role"] for r in res.table("field_stats").rows} == expect
        assert int(res.exit_code) == 0, [f.to_dict() for f in res.findings]


def test_scikit_learn_arrays_are_read_as_a_dataset():
    """A sweep: `return X, y` numpy arrays were read as two batches, and a list of (ndarray, np.int64) pairs as
    1-tuples: false duplicates, shapes and statistics mixed over labels and features."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(120, 5)).astype(np.float32), rng.integers(0, 3, size=120)
    for data in ((x, y), [(x[i], np.int64(y[i])) for i in range(120)]):
        res = run_data(data, Options(speed=False), context("cpu"))
        roles = {r["field"]: (r["role"], r["shape"]) for r in res.table("field_stats").rows}
        assert roles == {"[0]": ("input", "5"), "[1]": ("target", "scalar")}, roles
        assert not {"duplicate-samples", "inconsistent-shapes"} & {f.code for f in res.findings}


def test_a_regression_target_of_a_large_scale_is_said():
    """A sweep: targets ~1e5 under MSE (a loss of 1e10) passed `data`; only gradflow said exploding-grad."""
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=g)
    for scale, found in ((1e5, True), (100.0, False)):
        y = scale * (1 + 0.3 * x[:, 0])
        res = run_data(TensorDataset(x, y), Options(speed=False), context("cpu"))
        got = [f for f in res.findings if f.code == "target-scale"]
        assert bool(got) == found, [f.to_dict() for f in res.findings]
    assert got == [] and int(res.exit_code) == 0


def test_flipped_or_big_endian_arrays_are_read_as_columns():
    """A review: `return X[:, ::-1], y` and big-endian arrays exited 4 (torch.as_tensor refuses them as they are)."""
    from torchdiag.core.datasets import as_columns

    x, y = np.arange(40, dtype=np.float32).reshape(10, 4), np.arange(10)
    for cols in ((x[:, ::-1], y), (x.astype(">f4"), y)):
        ds = as_columns(cols)
        assert ds is not None and torch.equal(ds[3][0], torch.as_tensor(np.ascontiguousarray(cols[0][3], "=f4")))


def test_the_same_loader_measured_twice_far_apart_is_not_called_input_bound():
    """A sweep: beside another job on a 2-core machine, the loader as configured (num_workers=0) read 40.7% of each
    step waiting, a warning, while the sweep's run of the same configuration read 6.9% (7% alone). A busy machine only
    adds waiting: the least of the two measurements of one configuration is the loader's."""
    import types

    from torchdiag.diagnostics.data import findings
    from torchdiag.diagnostics.data.speed import Timing
    from torchdiag.results import Result

    t = Timing(0, batches=10, wait_s=0.2, step_s=0.3, stepped=True)          # 40% waiting
    again = Timing(0, batches=10, wait_s=0.01, step_s=0.3, stepped=True)     # 3% waiting, the same configuration
    other = Timing(2, batches=10, wait_s=0.1, step_s=0.3, stepped=True)
    r = Result("data")
    findings._input_bound(r, types.SimpleNamespace(training=t, sweep=[again, other]))
    f = one(r, "input-bound")
    assert f.severity == "info" and "40.0%" in f.message and "3.2%" in f.message and "busy machine" in f.message, f
    r = Result("data")   # measured alike twice: the warning stands
    findings._input_bound(r, types.SimpleNamespace(training=t, sweep=[Timing(0, batches=10, wait_s=0.19, step_s=0.3,
                                                                             stepped=True), other]))
    assert one(r, "input-bound").severity == "warning"


HOSTILE = '''
import torch
from torch.utils.data import DataLoader, Dataset


class VarLen(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return torch.randn(i + 1), i % 2


def varlen_loader():   # a collate that keeps the samples as a list (no batch dimension to stack them on)
    return DataLoader(VarLen(), batch_size=4, collate_fn=lambda b: ([x for x, _ in b], torch.tensor([y for _, y in b])))


class LenRaises(Dataset):
    def __len__(self):
        raise TypeError("no len")

    def __getitem__(self, i):
        return torch.randn(3), 0


def len_raises():
    return LenRaises()


def huge_labels():
    return torch.utils.data.TensorDataset(torch.randn(20, 3), torch.full((20,), 10 ** 15 + 1))


def vectors():
    return torch.utils.data.TensorDataset(torch.randn(20, 3), torch.arange(20) % 2)


class Gappy(Dataset):
    """Every 4th sample is None (corrupt), the loader's collate drops them and class 0."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return None if i % 4 == 0 else (torch.full((3,), float(i)), i % 3)


class Boxes(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return torch.rand(3, 16, 16), {"boxes": torch.rand(1 + i % 3, 4), "labels": torch.full((1 + i % 3,), i % 2)}


def detection():   # torchvision's detection collate: a tuple of images, a tuple of target dicts
    return DataLoader(Boxes(), batch_size=4, collate_fn=lambda b: tuple(zip(*b)))


def dropping():
    keep = lambda b: torch.utils.data.default_collate([s for s in b if s is not None and s[1] != 0])  # noqa: E731
    return DataLoader(Gappy(), batch_size=8, collate_fn=keep)
'''


def test_hostile_loaders_of_a_sweep(cli, tmp_path):
    """A sweep: a collate returning a list of samples crashed the label count (exit 4); a __len__ that raises was an
    internal error (exit 4, it is the user's code: 3); labels past 2^24 were summed in float32 (10**15 + 1 read
    999999986991104); --images said it wrote grids where no input is an image (nothing written, not even the folder);
    the same field as input and target gave "OK" with no input read."""
    (tmp_path / "hostile.py").write_text(HOSTILE)
    spec = f"{tmp_path}/hostile.py"
    r = cli("data", f"{spec}:varlen_loader", "--no-speed", "--json")
    assert r.code == 0, r.stderr
    assert r.json["class_counts"] and sum(c["train"] for c in r.json["class_counts"]) == 20, r.json["class_counts"]
    r = cli("data", f"{spec}:len_raises", "--no-speed")
    assert r.code == 3 and "len() of the LenRaises raised TypeError: no len" in r.stderr, r.stderr
    r = cli("data", f"{spec}:huge_labels", "--no-speed", "--json")
    (label,) = [f for f in r.json["field_stats"] if f["role"] == "target"]
    assert label["min"] == label["max"] == label["mean"] == 10 ** 15 + 1, label
    r = cli("data", f"{spec}:vectors", "--no-speed", "--images", tmp_path / "grids")
    assert r.code == 0 and "data sample grids: none written: no input field is laid out as images" in r.stderr, r.stderr
    assert not (tmp_path / "grids").exists()
    r = cli("data", f"{spec}:vectors", "--no-speed", "--input-field", "[0]", "--target-field", "[0]")
    assert r.code == 2 and "--target-field: '[0]' is the --input-field too" in r.stderr, r.stderr
    # a review: a collate that drops samples keeps its own count (20 of 40: 10 None, then class 0 of the rest), and
    # the worker check collates with the loader's own collate (default_collate([None]) was an internal error)
    r = cli("data", f"{spec}:dropping", "--json", "--no-sweep", "--batches", "2")
    assert r.code == 0, r.stderr
    assert r.json["splits"]["train"]["samples"] == 20, r.json["splits"]
    # a review: the detection collate's 3 channels were counted as the samples of each batch (15 of 20)
    r = cli("data", f"{spec}:detection", "--no-speed", "--json")
    assert r.code in (0, 1) and r.json["splits"]["train"]["samples"] == 20, (r.stderr, r.json["splits"])


class _TinyLM(torch.nn.Module):
    def __init__(self, vocab=65):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab)

    def forward(self, ids):
        return self.head(self.emb(ids))


def test_a_language_models_classes_are_its_vocabulary_not_the_sequence_length():
    """A new user: data --model on (ids, next ids) of length 32 with a 65-token vocabulary warned "12 class(es) of
    [0, 32) have no sample": the (N, T, V) output's dim 1 was read as the classes."""
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20, (64, 33), generator=g)
    res = run_data(TensorDataset(ids[:, :-1], ids[:, 1:]), Options(speed=False), context("cpu"), model=_TinyLM())
    assert res.data["num_classes"] == 65, res.data["num_classes"]


def test_a_dataset_batched_here_into_a_last_batch_of_one_is_said_not_a_crash():
    """A sweep: 97 samples as a Dataset, batched here at --batch-size 32, left a last batch of 1 that a BatchNorm
    model refused in the timed training steps: exit 3 blaming the model. Now the finding, a warning (the user's own
    loader may batch otherwise), and the timing skips that batch."""
    from torch import nn
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(97, 8, generator=g), torch.randint(0, 3, (97,), generator=g))
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    res = run_data(data, Options(**QUICK), context("cpu"), model=model)
    f = one(res, "last-batch-of-one")
    assert f.severity == "warning" and "batched at --batch-size" in f.message and "97 samples" in f.message, f.message


def test_float64_arrays_against_a_float32_model_are_the_datas_usage_error():
    """A sweep: scikit-learn's `return X, y` (float64) with --model: a dtype mismatch, exit 3 blaming the model. A
    cast to float32 was tried and withdrawn (a review: it made rows 1e-12 apart collide, a float64 model fail, and a
    train/val overlap across a numpy and a torch split vanish): the data are read as given, and the mismatch is said
    as the data's (exit 2); a float64 model takes them."""
    from torch import nn

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(120, 5)), rng.integers(0, 3, size=120)
    with pytest.raises(UsageError) as exc:
        run_data((x, y), Options(speed=False), context("cpu"), model=nn.Linear(5, 3))
    assert "float64" in exc.value.message and "astype(np.float32)" in exc.value.hint
    res = run_data((x, y), Options(speed=False), context("cpu"), model=nn.Linear(5, 3).double())
    assert int(res.exit_code) == 0, [f.to_dict() for f in res.findings]

    class Casts(nn.Module):   # casts its input itself: takes float64 data (only a forward that fails is refused)
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 3)

        def forward(self, x):
            return self.fc(x.float())

    assert int(run_data((x, y), Options(speed=False), context("cpu"), model=Casts()).exit_code) == 0


def test_a_mask_padded_to_a_fixed_length_has_no_constant_features():
    """A sweep: HF's padding="max_length" masks (lengths 5-32 padded to 32) were told to drop positions 0-4."""
    g = torch.Generator().manual_seed(0)
    for top in (33, 21):   # padded to the longest, or beyond it (a review: constant runs at both ends)
        lengths = torch.randint(5, top, (200,), generator=g)
        mask = torch.stack([(torch.arange(32) < k).long() for k in lengths])
        loader = torch.utils.data.DataLoader(list(zip(mask, torch.randint(0, 2, (200,), generator=g))), batch_size=32)
        assert "constant-features" not in codes(run_data(loader, Options(**QUICK), context("cpu")))
    # a sentence pair's segment ids padded to 32, 0…0 1…1 0…0 (a review: told to drop positions 0-2)
    first, second = torch.randint(3, 10, (200,), generator=g), torch.randint(2, 12, (200,), generator=g)
    pos = torch.arange(32)
    segments = torch.stack([((pos >= a) & (pos < a + b)).long() for a, b in zip(first, second)])
    loader = torch.utils.data.DataLoader(list(zip(segments, torch.randint(0, 2, (200,), generator=g))), batch_size=32)
    assert "constant-features" not in codes(run_data(loader, Options(**QUICK), context("cpu")))
    # 0/1 columns that are no mask (reviews: one-hot data with an always-present first category, a 2-column field,
    # sorted fractions in [0, 1] ending at 1.0 were exempted)
    onehot = (torch.rand(200, 8, generator=g) > 0.5).long()
    onehot[:, 0] = 1
    two = torch.stack([torch.ones(200, dtype=torch.long), torch.randint(0, 2, (200,), generator=g)], 1)
    fractions = torch.cat([torch.rand(200, 9, generator=g).sort(1).values, torch.ones(200, 1)], 1)
    for x in (onehot, two, fractions):
        loader = torch.utils.data.DataLoader(list(zip(x, torch.randint(0, 2, (200,), generator=g))), batch_size=32)
        assert "constant-features" in codes(run_data(loader, Options(**QUICK), context("cpu"))), x[:2]


def test_an_unknown_torchvision_data_set_is_named_a_data_set():
    """A review: `data torchvision:NoSuchSet` said "torchvision has no model named 'NoSuchSet'"."""
    from torchdiag.core.sources import unknown_name

    err = unknown_name("torchvision", "MNST", ["MNIST", "CIFAR10"], "data set")
    assert err.message == "torchvision has no data set named 'MNST'" and "MNIST" in err.hint, (err.message, err.hint)
    assert "datasets" in unknown_name("torchvision", "Zzz", ["MNIST"], "data set").hint


def test_an_even_draws_tails_are_exact_and_cheap_on_token_counts():
    """even_draw's binomial tails against exact sums (fractions), and on two classes of five million labels each (a
    token field's counts), where a tail summed from 0 took millions of terms."""
    from fractions import Fraction
    from math import comb

    from torchdiag.diagnostics.data.findings import UNEVEN_P, even_draw

    def tail(n, k, classes):   # P(Binomial(n, 1/classes) <= k), exactly
        p = Fraction(1, classes)
        return float(sum(comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1)))

    # 100 classes of 60 and one of k: its lower tail times 101 classes against UNEVEN_P decides (the chi-square stays
    # an even draw's for these k); both verdicts occur
    said = []
    for k in (20, 25, 28, 32, 40):
        counts = {**{c: 60 for c in range(100)}, 100: k}
        said.append(even_draw(counts))
        assert said[-1] == (tail(6000 + k, k, 101) * 101 >= UNEVEN_P), k
    assert said[0] is False and said[-1] is True, said
    assert even_draw({0: 5_000_000, 1: 5_000_100}) and not even_draw({0: 5_000_000, 1: 4_000_000})
