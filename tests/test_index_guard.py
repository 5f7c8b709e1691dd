"""core/index_guard: a probe's out-of-range lookup raises on the host, as on a CPU, instead of asserting on a GPU
(measured on an H200: RoBERTa's default length probe poisoned the CUDA context and `summary` ended as an internal
error). The device is pretended here (`asserts` patched): the checks run on CPU tensors before CPU's own."""
import pytest
import torch
import torch.nn.functional as F

from torchdiag.core import index_guard

transformers = pytest.importorskip("transformers")

GUARDED = "checked before the GPU kernel would assert"


@pytest.fixture
def pretend_gpu(monkeypatch):
    monkeypatch.setattr(index_guard, "asserts", lambda t: True)


TABLE = torch.nn.Embedding(10, 4)
CASES = [  # (lookup, runs)
    (lambda: TABLE(torch.tensor([[1, 9]])), True),
    (lambda: TABLE(torch.tensor([[1, 10]])), False),
    (lambda: TABLE(torch.tensor([[-1, 3]])), False),
    (lambda: torch.randn(3, 5).index_select(1, torch.tensor([5])), False),
    (lambda: torch.randn(3, 5).gather(1, torch.tensor([[4]])), True),
    (lambda: torch.randn(3, 5).gather(0, torch.tensor([[3]])), False),
    (lambda: F.cross_entropy(torch.randn(3, 5), torch.tensor([1, -100, 4])), True),     # -100 is ignored
    (lambda: F.cross_entropy(torch.randn(3, 5), torch.tensor([1, -100, 5])), False),
    (lambda: F.cross_entropy(torch.randn(3, 5, 2), torch.tensor([[1, 1], [-100, 0], [5, 0]])), False),
    (lambda: F.cross_entropy(torch.randn(3, 5), torch.softmax(torch.randn(3, 5), 1)), True),   # probabilities
    # through other aten ops
    (lambda: F.embedding(torch.tensor([[1, 10]]), torch.randn(10, 4), max_norm=1.0), False),   # renorm_ first
    (lambda: F.embedding_bag(torch.tensor([1, 10]), torch.randn(10, 4), torch.tensor([0])), False),
    (lambda: F.embedding_bag(torch.tensor([1, 9]), torch.randn(10, 4), torch.tensor([0])), True),
    (lambda: torch.randn(5, 3)[torch.tensor([0, 5])], False),                  # advanced indexing
    (lambda: torch.randn(5, 3)[torch.tensor([0, -5])], True),                  # negatives count from the end
    (lambda: torch.randn(5, 3)[torch.tensor([-6])], False),
    (lambda: torch.randn(5, 3)[:, torch.tensor([3])], False),                  # the second dimension's size
    (lambda: torch.randn(5, 3)[torch.tensor([True, False, True, False, True])], True),   # a mask: not an index
    (lambda: torch.arange(4.).reshape(1, 4)[torch.tensor([1], dtype=torch.uint8)], True),   # an old uint8 mask
]


@pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8:UserWarning")   # the old mask, on purpose
@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_lookup_out_of_range_raises_before_it_runs(pretend_gpu, case):
    lookup, runs = CASES[case]
    with index_guard.guarded(TABLE):
        if runs:
            lookup()
        else:
            with pytest.raises(IndexError, match=GUARDED):
                lookup()


def test_nothing_is_checked_for_a_model_on_the_cpu():
    with index_guard.guarded(TABLE), pytest.raises(IndexError) as info:
        TABLE(torch.tensor([[10]]))
    assert GUARDED not in str(info.value)     # torch's own CPU error


@pytest.fixture
def raised(monkeypatch):
    """The ops whose indices the guard refused, in order."""
    out = []
    check = index_guard._check

    def counted(func, spec, args):
        try:
            check(func, spec, args)
        except IndexError:
            out.append(func.__name__)
            raise
    monkeypatch.setattr(index_guard, "_check", counted)
    return out


def test_the_probes_of_a_default_length_are_guarded(pretend_gpu, raised, tmp_path, cli):
    """RoBERTa numbers positions from padding_idx + 1: its whole 40-row table does not fit, and the probe that finds
    so must fail on the host (a GPU's assert would end the run) and go on to the 38 that fit."""
    cfg = transformers.RobertaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=40)
    cfg.architectures = ["RobertaForMaskedLM"]
    cfg.save_pretrained(tmp_path / "roberta")
    r = cli("summary", f"hf:{tmp_path / 'roberta'}", "--device", "cpu", "--json")
    assert r.code == 0, r.stderr
    assert r.json["inputs"] == ["input[0]: 1x38 int64"]
    assert len(raised) == 1     # the whole table, refused by the lookup of its positions (transformers 5: a gather)


class _PositionsFirst(torch.nn.Module):
    """AltCLIP's text embeddings: a gather from an 8-long buffer by position, before the ids reach the embedding."""

    def __init__(self):
        super().__init__()
        self.register_buffer("types", torch.zeros(1, 8, dtype=torch.long))
        self.emb = torch.nn.Embedding(20, 4)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        types = torch.gather(self.types.expand(ids.shape[0], -1), 1, positions)
        return self.emb(ids) + types[..., None]


def test_the_probe_that_finds_an_ids_embedding_is_guarded(pretend_gpu, raised):
    """core.inputs.embedding_consumers runs its own forward (a review: AltCLIP's 1x128 probe asked position 129 of a
    128-row buffer there, unguarded): the lookup fails on the host, and the probe says nothing was found."""
    from torchdiag.core.inputs import ModelInputs, embedding_consumers

    model = _PositionsFirst()
    assert embedding_consumers(model, ModelInputs((torch.randint(0, 20, (2, 16)),)), ["input[0]"]) == {}
    assert raised == ["gather.default"]
    assert embedding_consumers(model, ModelInputs((torch.randint(0, 20, (2, 8)),)), ["input[0]"]) == {"input[0]": ("emb", 20)}
