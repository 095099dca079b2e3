"""Whether a model has collapsed: `mean_cosine` (how alike the embeddings of
different sentences are) and `collapse_warning` (the words when they are too alike).

The export checks every model it writes (`formats`), a training run its last
evaluation (`lealla_tf.train.logs`), and `lealla-evaluate` the model it scores
(`lealla_tf.evaluation.tatoeba` measures the mean cosine). numpy only.
"""

import numpy as np

# Embeddings of different sentences whose mean cosine is this high carry no
# information: a collapsed model (every sentence at one point) scores 1, trained
# students and teachers far below it.
COLLAPSED_MEAN_COSINE = 0.99


def _unit_rows(x) -> np.ndarray:
    """A float32 copy of `x` with unit rows (zero rows stay zero), as
    `lealla_tf.mining.neighbours.normalize_rows` makes it (inference does not
    import mining; tests/inference/test_collapse.py checks the two agree)."""
    x = np.array(x, dtype=np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
    x /= np.maximum(norms, 1e-30).astype(np.float32)[:, None]
    return x


def mean_cosine(embeddings, max_rows: int = 2000) -> float:
    """The mean cosine between the embeddings of different rows (the first
    `max_rows`): near 1 when a model maps every sentence to the same point. Rows
    of zeros (a model collapsed to the origin) count as the same point: cosine
    1 with each other, 0 with the rest."""
    x = _unit_rows(np.asarray(embeddings)[:max_rows])
    n = len(x)
    if n < 2:
        return float("nan")
    zeros = int(np.sum(~np.any(x, axis=1)))
    total = x.sum(axis=0, dtype=np.float64)
    pairs = total @ total - np.einsum("ij,ij->", x, x, dtype=np.float64) + zeros * (zeros - 1)
    return float(pairs / (n * (n - 1)))


def collapse_warning(cosine: float, what: str) -> str | None:
    """A warning naming `what` when `mean_cosine` says it has collapsed, else None."""
    if not cosine >= COLLAPSED_MEAN_COSINE:
        return None
    return (f"WARNING: {what} has collapsed: different sentences have a mean cosine of "
            f"{cosine:.5f}, so its embeddings barely tell them apart. Train longer, lower "
            "the learning rate, or train with the main job's recipe on your pairs "
            "(python -m lealla_tf.recipe --data_dir=DIR)")
