"""Named seed streams. Every generator the run draws from is seeded from --seed: the base stream
(the run's own RNG, random inputs, the loss's random targets) uses it as it is, and each other use
has its own fixed offset, named here, so a new use takes a free one instead of a number written at
the call site. The offsets are the ones the streams always had: the seeds, and so every result, are
unchanged."""
from __future__ import annotations

DECODER_IDS = 1            # decoder_input_ids added for an encoder-decoder
EMBEDDING_IDS = 100        # + the input's index: integer ids drawn below their nn.Embedding's size
FRESH_BATCHES = 1000       # + the batch's index: gradflow's dead-unit re-check batches
OTHER_DRAWS = 2000         # + k: gradflow's k-th other draw of the RNG for parameters without a gradient
KEYWORD_IDS = 3000         # + k: the k-th keyword input of token ids a source's default layout made all zeros
SECOND_SAMPLE = 4000       # the noise that makes doctor's second sample from a batch of 1 (batch-1 erasure probe)
HEAD_LABELS = 5000         # the random labels given to a classification head's own loss (hf token/multi-label)


def decoder_ids(seed: int) -> int:
    return seed + DECODER_IDS


def embedding_ids(seed: int, index: int) -> int:
    """The stream of input `index`'s integer ids."""
    return seed + EMBEDDING_IDS + index


def keyword_ids(seed: int, k: int) -> int:
    """The stream of the k-th keyword token ids given values in their embedding's range."""
    return seed + KEYWORD_IDS + k


def output_target(seed: int, k: int) -> int:
    """The auto loss's random target of the k-th other output (k >= 1)."""
    return seed + k


def fresh_batch(seed: int, k: int) -> int:
    """The k-th fresh batch of gradflow's dead-unit re-check."""
    return seed + FRESH_BATCHES + k


def other_draw(seed: int, k: int) -> int:
    """The k-th other draw of gradflow's re-check of parameters the judged pass gave no gradient."""
    return seed + OTHER_DRAWS + k


def second_sample(seed: int) -> int:
    """The noise added to a batch's one sample to make a second (not the base stream: random inputs drawn from it
    would make the noise a copy of the sample, and the pair collinear, which BatchNorm cannot tell apart)."""
    return seed + SECOND_SAMPLE


def head_labels(seed: int) -> int:
    return seed + HEAD_LABELS
