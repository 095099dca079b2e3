"""Mining against a brute-force numpy reference (loops, as LASER writes it)."""

import itertools

import numpy as np
import pytest

from lealla_tf.mining import (best_threshold, build_index, greedy_one_to_one, knn,
                              margin_scores, mine, normalize_rows)

RNG = np.random.default_rng(7)


def planted(n_pairs=60, n_noise=40, d=16, noise=0.3, seed=0):
    """Sources and targets where source i translates target i (i < n_pairs)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n_pairs, d))
    source = np.vstack([base + noise * rng.normal(size=base.shape), rng.normal(size=(n_noise, d))])
    target = np.vstack([base + noise * rng.normal(size=base.shape), rng.normal(size=(n_noise, d))])
    return normalize_rows(source), normalize_rows(target)


def reference_mine(source, target, k, margin, retrieval):
    """Direct transcription: full cosine matrix, Python loops, LASER's greedy max."""
    cosine = source @ target.T
    k_f, k_b = min(k, len(target)), min(k, len(source))
    average_source = np.array([np.mean(sorted(row, reverse=True)[:k_f]) for row in cosine])
    average_target = np.array([np.mean(sorted(col, reverse=True)[:k_b]) for col in cosine.T])

    def score(i, j):
        c = cosine[i, j]
        if margin == "absolute":
            return c
        mean = (average_source[i] + average_target[j]) / 2
        return c - mean if margin == "distance" else c / mean

    def best_target(i):  # among the k nearest targets, the best by margin
        neighbours = np.argsort(-cosine[i], kind="stable")[:k_f]
        return max(neighbours, key=lambda j: score(i, j))

    def best_source(j):
        neighbours = np.argsort(-cosine[:, j], kind="stable")[:k_b]
        return max(neighbours, key=lambda i: score(i, j))

    forward = [(score(i, best_target(i)), i, best_target(i)) for i in range(len(source))]
    backward = [(score(best_source(j), j), best_source(j), j) for j in range(len(target))]
    if retrieval == "fwd":
        pairs = forward
    elif retrieval == "bwd":
        pairs = backward
    elif retrieval == "intersect":
        back = {j: i for _, i, j in backward}
        pairs = [p for p in forward if back[p[2]] == p[1]]
    else:
        pairs, seen_source, seen_target = [], set(), set()
        for p in sorted(forward + backward, key=lambda p: -p[0]):
            if p[1] not in seen_source and p[2] not in seen_target:
                pairs.append(p)
                seen_source.add(p[1])
                seen_target.add(p[2])
    return {(i, j): s for s, i, j in pairs}


def test_knn_matches_brute_force_and_chunks():
    queries, candidates = normalize_rows(RNG.normal(size=(50, 8))), normalize_rows(
        RNG.normal(size=(70, 8)))
    similarities, indices = knn(queries, candidates, 5, chunk_size=7)
    full = queries @ candidates.T
    np.testing.assert_array_equal(indices, np.argsort(-full, axis=1)[:, :5])
    np.testing.assert_allclose(similarities, np.sort(full, axis=1)[:, ::-1][:, :5], atol=1e-5)


@pytest.mark.parametrize("index_type", ["ivf", "ivfpq"])
def test_approximate_indexes_find_planted_neighbours(index_type):
    source, target = planted(n_pairs=2000, n_noise=0, d=32, noise=0.05)
    index = build_index(target, index_type, nlist=16, nprobe=16, pq_subquantizers=8)
    _, indices = knn(source, target, 1, index=index)
    assert np.mean(indices[:, 0] == np.arange(2000)) > 0.95


@pytest.mark.parametrize("margin,retrieval", list(itertools.product(
    ["absolute", "distance", "ratio"], ["fwd", "bwd", "intersect", "max"])))
def test_mine_matches_reference(margin, retrieval):
    source, target = planted()
    mined = mine(source, target, k=4, margin=margin, retrieval=retrieval)
    got = {(int(i), int(j)): float(s) for s, i, j in zip(mined["score"], mined["source"],
                                                          mined["target"])}
    expected = reference_mine(source, target, 4, margin, retrieval)
    assert got.keys() == expected.keys()
    for pair, value in expected.items():
        assert abs(got[pair] - value) < 1e-5
    assert np.all(np.diff(mined["score"]) <= 0), "best first"


def test_mining_recovers_planted_pairs_and_threshold_cuts():
    source, target = planted(n_pairs=80, n_noise=80, noise=0.2)
    mined = mine(source, target, retrieval="max", margin="ratio")
    top = {(int(i), int(j)) for i, j in zip(mined["source"][:80], mined["target"][:80])}
    assert len(top & {(i, i) for i in range(80)}) >= 76
    strict = mine(source, target, retrieval="max", margin="ratio", threshold=float(
        mined["score"][79]))
    assert len(strict["score"]) == 80


def test_greedy_rounds_equal_sequential_greedy():
    for trial in range(20):
        rng = np.random.default_rng(trial)
        n = 200
        scores = rng.integers(0, 30, size=n).astype(np.float64)  # many ties
        sources, targets = rng.integers(0, 40, size=n), rng.integers(0, 40, size=n)
        kept = greedy_one_to_one(scores, sources, targets)
        order = np.lexsort((np.arange(n), -scores))
        expected, taken_s, taken_t = [], set(), set()
        for p in order:
            if sources[p] not in taken_s and targets[p] not in taken_t:
                expected.append(p)
                taken_s.add(sources[p])
                taken_t.add(targets[p])
        assert sorted(kept.tolist()) == sorted(expected)


def test_margin_formulas():
    c, a, b = np.array([0.8]), np.array([0.6]), np.array([0.4])
    assert margin_scores(c, a, b, "absolute")[0] == pytest.approx(0.8)
    assert margin_scores(c, a, b, "distance")[0] == pytest.approx(0.3)
    assert margin_scores(c, a, b, "ratio")[0] == pytest.approx(1.6)


def test_best_threshold_maximises_f1():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    correct = np.array([True, True, False, True, False])
    result = best_threshold(scores, correct, num_gold=4)
    # Keeping the top 4 gives P = 3/4, R = 3/4, F1 = 0.75, the best cut.
    assert result["threshold"] == pytest.approx(0.6) and result["f1"] == pytest.approx(0.75)


def test_bad_options_are_errors():
    with pytest.raises(ValueError):
        mine(np.ones((3, 4)), np.ones((3, 4)), margin="cosine")
    with pytest.raises(ValueError, match="must divide"):
        build_index(normalize_rows(RNG.normal(size=(500, 10))), "ivfpq", nlist=4,
                    pq_subquantizers=3)
