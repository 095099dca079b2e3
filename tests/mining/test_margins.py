"""Mining against a brute-force numpy reference (loops, as LASER writes it), and
its properties on any input: tiny sides, k beyond the candidates, duplicates,
zero / NaN rows, inverted lists shorter than k, chunked, blocked, spilled and
memory-mapped work."""

import itertools

import numpy as np
import pytest

from lealla_tf.mining import margins as mining
from lealla_tf.mining.margins import (
    best_threshold,
    greedy_one_to_one,
    margin_scores,
    mine,
)
from lealla_tf.mining.neighbours import MiningPlan, Rows, knn, normalize_rows


def planted(n_pairs=60, n_noise=40, d=16, noise=0.3, seed=0):
    """Sources and targets where source i translates target i (i < n_pairs)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n_pairs, d))
    source = np.vstack([base + noise * rng.normal(size=base.shape), rng.normal(size=(n_noise, d))])
    target = np.vstack([base + noise * rng.normal(size=base.shape), rng.normal(size=(n_noise, d))])
    return normalize_rows(source), normalize_rows(target)


def reference_mine(source, target, k, margin, retrieval, counts=None):
    """Direct transcription: full cosine matrix, Python loops, LASER's greedy max.

    ratio is Artetxe & Schwenk's: cos(x, y) / (sum_{z in NN_k(x)} cos(x, z) / 2k
    + sum_{z in NN_k(y)} cos(y, z) / 2k), undefined (no pair) where either
    neighbourhood holds a cosine <= 0. `counts`, a dict, receives the sentences
    and candidates left out for it."""
    cosine = source @ target.T
    k_f, k_b = min(k, len(target)), min(k, len(source))
    nearest_source = [sorted(row, reverse=True)[:k_f] for row in cosine]
    nearest_target = [sorted(col, reverse=True)[:k_b] for col in cosine.T]
    average_source = np.array([np.mean(n) for n in nearest_source])
    average_target = np.array([np.mean(n) for n in nearest_target])

    def score(i, j):  # None: undefined
        c = cosine[i, j]
        if margin == "absolute":
            return c
        mean = (average_source[i] + average_target[j]) / 2
        if margin == "distance":
            return c - mean
        if margin == "ratio_shifted":
            return (1 + c) / (1 + mean)
        if min(nearest_source[i]) <= 0 or min(nearest_target[j]) <= 0:
            return None
        return c / (sum(nearest_source[i]) / (2 * k_f) + sum(nearest_target[j]) / (2 * k_b))

    def best(scored):  # the best (score, i, j) of a sentence's defined candidates
        scored = [(score(i, j), i, j) for i, j in scored]
        scored = [p for p in scored if p[0] is not None]
        return max(scored, key=lambda p: p[0]) if scored else None

    forward = [best((i, j) for j in np.argsort(-cosine[i], kind="stable")[:k_f])
               for i in range(len(source))]
    backward = [best((i, j) for i in np.argsort(-cosine[:, j], kind="stable")[:k_b])
                for j in range(len(target))]
    if counts is not None:
        counts["degenerate_source"] = [i for i, n in enumerate(nearest_source) if min(n) <= 0]
        counts["degenerate_target"] = [j for j, n in enumerate(nearest_target) if min(n) <= 0]
        counts["degenerate_candidates"] = (
            sum(score(i, j) is None for i in range(len(source))
                for j in np.argsort(-cosine[i], kind="stable")[:k_f])
            + sum(score(i, j) is None for j in range(len(target))
                  for i in np.argsort(-cosine[:, j], kind="stable")[:k_b]))
    forward = [p for p in forward if p is not None]
    backward = [p for p in backward if p is not None]
    if retrieval == "fwd":
        pairs = forward
    elif retrieval == "bwd":
        pairs = backward
    elif retrieval == "intersect":
        back = {j: i for _, i, j in backward}
        pairs = [p for p in forward if back.get(p[2]) == p[1]]
    else:
        pairs, seen_source, seen_target = [], set(), set()
        for p in sorted(forward + backward, key=lambda p: -p[0]):
            if p[1] not in seen_source and p[2] not in seen_target:
                pairs.append(p)
                seen_source.add(p[1])
                seen_target.add(p[2])
    return {(i, j): s for s, i, j in pairs}


MARGINS = ["absolute", "distance", "ratio", "ratio_shifted"]


@pytest.mark.parametrize("margin,retrieval", list(itertools.product(
    MARGINS, ["fwd", "bwd", "intersect", "max"])))
def test_mine_matches_reference(margin, retrieval):
    source, target = planted()
    mined = mine(source, target, k=4, margin=margin, retrieval=retrieval)
    # Normal inputs: every neighbourhood positive, so the ratio is the paper's everywhere.
    assert len(mined["degenerate_source"]) == len(mined["degenerate_target"]) == 0
    assert mined["degenerate_candidates"] == 0
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
    assert margin_scores(c, a, b, "distance")[0] == pytest.approx(0.8 - (0.6 + 0.4) / 2)
    # Artetxe & Schwenk on plain cosines, k = 4: c / (sum_x / 2k + sum_y / 2k).
    assert margin_scores(c, a, b, "ratio")[0] == pytest.approx(0.8 / (4 * 0.6 / 8 + 4 * 0.4 / 8))
    assert margin_scores(c, a, b, "ratio_shifted")[0] == pytest.approx(
        (1 + 0.8) / (1 + (0.6 + 0.4) / 2))
    # Undefined ratios are -inf (never a pair): a mean <= 0, or a neighbourhood
    # that is not all positive; the shifted form stays defined there.
    assert margin_scores(np.array([0.3]), np.array([-0.2]), np.array([0.1]), "ratio")[0] == \
        -np.inf
    assert margin_scores(np.array([-0.4]), np.array([-0.2]), np.array([-0.1]), "ratio")[0] == \
        -np.inf  # the sign flip: -0.4 / -0.15 would be a "good" 2.67
    assert margin_scores(c, a, b, "ratio", positive=np.array([False]))[0] == -np.inf
    assert margin_scores(c, a, b, "ratio", positive=np.array([True]))[0] == pytest.approx(1.6)
    assert margin_scores(np.array([0.3]), np.array([-0.2]), np.array([0.1]),
                         "ratio_shifted")[0] == pytest.approx(1.3 / 0.95)
    assert margin_scores(np.array([-1.0]), np.array([-1.0]), np.array([-1.0]),
                         "ratio_shifted")[0] == 0
    # A missing (NaN) average is left out of the mean.
    assert margin_scores(c, np.array([np.nan]), b, "ratio")[0] == pytest.approx(0.8 / 0.4)
    assert margin_scores(c, np.array([np.nan]), b, "ratio_shifted")[0] == pytest.approx(1.8 / 1.4)


def test_best_threshold_maximises_f1():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    correct = np.array([True, True, False, True, False])
    result = best_threshold(scores, correct, num_gold=4)
    # Keeping the top 4 gives P = 3/4, R = 3/4, F1 = 0.75, the best cut.
    assert result["threshold"] == pytest.approx(0.6) and result["f1"] == pytest.approx(0.75)


def test_bad_options_are_errors():
    with pytest.raises(ValueError):
        mine(np.ones((3, 4)), np.ones((3, 4)), margin="cosine")
    with pytest.raises(ValueError):
        mine(np.ones((3, 4)), np.ones((3, 4)), retrieval="both")


@pytest.mark.parametrize("source,target,kwargs,message", [
    (np.zeros((0, 4)), np.ones((3, 4)), {}, "source side has no embeddings"),
    (np.ones((3, 4)), np.zeros((0, 4)), {}, "target side has no embeddings"),
    (np.ones((3, 4)), np.ones((3, 5)), {}, "differ in dimension: 4 vs 5"),
    (np.ones((3, 4)), np.ones((3, 4)), {"k": 0}, "k must be at least 1"),
    (np.ones((3, 4)), np.ones((3, 4)), {"k": -2}, "k must be at least 1"),
    (np.ones(4), np.ones((3, 4)), {}, "2-D"),
    (np.ones((3, 4)), np.ones((3, 4)), {"index_type": "hnsw"}, "flat, ivf or ivfpq"),
    (np.ones((30, 8)), np.ones((30, 8)), {"index_type": "ivfpq"}, "at least 256"),
    (np.ones((3, 4)), np.ones((3, 4)), {"memory_budget_gb": 0}, "must be positive"),
    (np.ones((3, 4)), np.ones((3, 4)), {"memory_budget_gb": -1}, "must be positive"),
    (np.ones((3, 4)), np.ones((3, 4)), {"memory_budget_gb": float("inf")},
     "memory_budget_gb must be positive and finite \\(GiB\\), got inf"),
    (np.ones((3, 4)), np.ones((3, 4)), {"memory_budget_gb": float("nan")}, "got nan"),
    (np.ones((10 ** 6, 1), np.float32), np.ones((1, 1)), {"memory_budget_gb": 0.05},
     "too small to mine 1,000,000 x 1"),
])
def test_user_mistakes_are_one_line_value_errors(source, target, kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        mine(source, target, **kwargs)
    assert "\n" not in str(error.value)


# === Properties on random inputs, against the brute-force reference ===

def check_invariants(mined, n_source, n_target, k, margin, retrieval, exact=True):
    """Finite scores in the margin's range, real indices, one-to-one where promised."""
    scores, sources, targets = mined["score"], mined["source"], mined["target"]
    assert np.all(np.isfinite(scores))
    assert np.all((sources >= 0) & (sources < n_source)), sources
    assert np.all((targets >= 0) & (targets < n_target)), targets
    k = min(k, max(n_source, n_target))
    # ratio: c is one of the searching sentence's k positive cosines, so mean > c / 2k.
    bound = {"absolute": (-1, 1), "distance": (-2, 2), "ratio": (0, 2 * k),
             "ratio_shifted": (0, k * (1 if exact else 2))}[margin]
    assert np.all(scores >= bound[0] - 1e-5) and np.all(scores <= bound[1] + 1e-5), (
        scores.min(), scores.max(), bound)
    assert np.all(np.diff(scores) <= 0), "best first"
    if retrieval in ("fwd", "intersect", "max"):
        assert len(set(sources.tolist())) == len(sources)
    if retrieval in ("bwd", "intersect", "max"):
        assert len(set(targets.tolist())) == len(targets)


def as_dict(mined):
    return {(int(i), int(j)): float(s) for s, i, j in zip(mined["score"], mined["source"],
                                                          mined["target"])}


SHAPES = [(1, 1), (1, 5), (5, 1), (2, 3), (3, 2), (7, 40), (40, 7), (25, 25)]


@pytest.mark.parametrize("n_source,n_target", SHAPES)
@pytest.mark.parametrize("k", [1, 4, 50])
def test_random_inputs_match_the_reference(n_source, n_target, k):
    rng = np.random.default_rng(n_source * 1000 + n_target + k)
    source = normalize_rows(rng.normal(size=(n_source, 8)))
    target = normalize_rows(rng.normal(size=(n_target, 8)))
    for margin, retrieval in itertools.product(MARGINS, ["fwd", "bwd", "intersect", "max"]):
        mined = mine(source, target, k=k, margin=margin, retrieval=retrieval)
        check_invariants(mined, n_source, n_target, k, margin, retrieval)
        counts = {}
        got = as_dict(mined)
        expected = reference_mine(source, target, k, margin, retrieval, counts)
        assert got.keys() == expected.keys(), (margin, retrieval)
        if margin == "ratio":
            for name, value in counts.items():
                assert np.asarray(mined[name]).tolist() == value, name
        for pair, value in expected.items():
            assert got[pair] == pytest.approx(value, abs=1e-5)


def test_unrelated_tiny_sides_do_not_pass_a_threshold_by_blowing_up():
    rng = np.random.default_rng(0)
    mined = mine(rng.normal(size=(2, 16)), rng.normal(size=(3, 16)), threshold=1.05)
    assert len(mined["score"]) == 0  # was 1.7e11 and 8.4e10 on raw cosines, unguarded
    assert mined["degenerate_source"].tolist() == [0, 1]
    assert mined["degenerate_target"].tolist() == [0, 1, 2]
    assert mined["degenerate_candidates"] == 2 * 3 + 3 * 2
    # Anti-correlated neighbourhoods (every cosine < 0) would flip the ratio's sign.
    x = normalize_rows(np.array([[1.0, 0.0], [0.9, 0.1]]))
    mined = mine(x, -x, k=4, margin="ratio")
    assert len(mined["score"]) == 0 and mined["degenerate_candidates"] == 8
    check_invariants(mine(x, -x, k=4, margin="ratio_shifted"), 2, 2, 4, "ratio_shifted", "max")


def test_a_near_zero_positive_mean_is_left_out_not_scored_in_the_thousands():
    """Negative neighbours can cancel positive ones: a mean just above 0 and a
    raw ratio of 1,514 on 5 x 4 random rows. The neighbourhood is degenerate
    (a cosine <= 0 among its k nearest): left out and counted, and what is
    scored is the paper's formula, below 2k."""
    rng = np.random.default_rng(849)
    n_source, n_target = rng.integers(1, 6, size=2)
    source = normalize_rows(rng.normal(size=(n_source, 16)))
    target = normalize_rows(rng.normal(size=(n_target, 16)))
    cosine = source @ target.T
    mean = (np.sort(cosine, axis=1)[:, ::-1][:, :4].mean(axis=1)[:, None]
            + np.sort(cosine, axis=0)[::-1][:4].mean(axis=0)[None, :]) / 2
    assert (cosine / np.where(mean > 0, mean, np.nan) > 1000).any(), "the case must blow up"
    for retrieval in ("fwd", "bwd", "intersect", "max"):
        mined = mine(source, target, k=4, retrieval=retrieval)
        counts = {}
        expected = reference_mine(source, target, 4, "ratio", retrieval, counts)
        assert as_dict(mined) == pytest.approx(expected, abs=1e-5)
        assert np.all(mined["score"] < 8)
        assert mined["degenerate_source"].tolist() == counts["degenerate_source"] != []
        assert mined["degenerate_candidates"] == counts["degenerate_candidates"] > 0


@pytest.mark.parametrize("margin,retrieval", [("ratio", "max"), ("distance", "intersect"),
                                              ("ratio", "fwd"), ("absolute", "bwd")])
def test_duplicate_rows(margin, retrieval):
    rng = np.random.default_rng(3)
    base = normalize_rows(rng.normal(size=(6, 8)))
    source = base[[0, 0, 1, 2, 2, 2, 3]]
    target = base[[0, 1, 1, 2, 4, 5, 5, 3]]
    for k in (1, 3, 20):
        mined = mine(source, target, k=k, margin=margin, retrieval=retrieval)
        check_invariants(mined, len(source), len(target), k, margin, retrieval)
        expected = reference_mine(source, target, k, margin, retrieval)
        # Ties between identical rows may pick either copy: each row's best score
        # agrees; a one-to-one matching may then differ, its best pair may not.
        expected = np.sort(list(expected.values()))[::-1]
        if retrieval in ("fwd", "bwd") or not len(expected):  # k = 20: ratio undefined
            np.testing.assert_allclose(mined["score"], expected, atol=1e-5)
        else:
            assert mined["score"][0] == pytest.approx(expected[0], abs=1e-5)


def with_bad_rows(rng, n, d, bad):
    x = normalize_rows(rng.normal(size=(n, d)))
    for row, value in bad.items():
        x[row] = value
    return x


def test_zero_and_nan_rows_are_refused_or_skipped_and_reported():
    rng = np.random.default_rng(5)
    source = with_bad_rows(rng, 12, 8, {2: 0.0, 7: np.nan})
    target = with_bad_rows(rng, 9, 8, {0: np.inf, 4: 0.0})
    with pytest.raises(ValueError, match="source row 2 is all zeros \\(2 such rows\\)"):
        mine(source, target)
    with pytest.raises(ValueError, match="target row 0 has a NaN or infinite value"):
        mine(normalize_rows(rng.normal(size=(3, 8))), target)
    for retrieval in ("fwd", "bwd", "intersect", "max"):
        mined = mine(source, target, k=4, retrieval=retrieval, skip_invalid=True)
        assert mined["invalid_source"].tolist() == [2, 7]
        assert mined["invalid_source_reason"].tolist() == ["zero", "non_finite"]
        assert mined["invalid_target"].tolist() == [0, 4]
        assert mined["invalid_target_reason"].tolist() == ["non_finite", "zero"]
        check_invariants(mined, 12, 9, 4, "ratio", retrieval)
        keep_s = np.setdiff1d(np.arange(12), [2, 7])
        keep_t = np.setdiff1d(np.arange(9), [0, 4])
        expected = reference_mine(source[keep_s], target[keep_t], 4, "ratio", retrieval)
        assert as_dict(mined) == pytest.approx(
            {(int(keep_s[i]), int(keep_t[j])): v for (i, j), v in expected.items()}, abs=1e-5)
    everything_bad = mine(source, np.zeros((3, 8)), skip_invalid=True)
    assert len(everything_bad["score"]) == 0 and len(everything_bad["invalid_target"]) == 3


@pytest.mark.parametrize("k,nlist", [(4, 800), (60, 128)])
def test_inverted_lists_shorter_than_k_never_give_index_minus_one(k, nlist):
    rng = np.random.default_rng(11)
    source = normalize_rows(rng.normal(size=(3200, 16)))
    target = normalize_rows(source + 0.2 * rng.normal(size=source.shape))
    options = {"index_type": "ivf", "nlist": nlist, "nprobe": 1}
    _, raw = knn(source, target, k, **options)
    assert (raw == -1).any(), "the case must produce faiss's -1 labels"
    for margin, retrieval in itertools.product(["ratio", "distance"], ["fwd", "bwd", "max"]):
        mined = mine(source, target, k=k, margin=margin, retrieval=retrieval, **options)
        check_invariants(mined, 3200, 3200, k, margin, retrieval, exact=False)
        assert len(mined["score"]) > 2000
    planted = mine(source, target, k=k, **options)
    assert np.mean(planted["source"] == planted["target"]) > 0.5  # chance: 1 / 3200


# === Chunked, blocked, spilled and memory-mapped work equals the plain run ===

def planted_large(seed=0, n=900, d=24):
    rng = np.random.default_rng(seed)
    source = rng.normal(size=(n, d)).astype(np.float32)
    target = np.vstack([source[: n // 2] + 0.3 * rng.normal(size=(n // 2, d)),
                        rng.normal(size=(n - n // 2 + 37, d))]).astype(np.float32)
    return source, target


def assert_same_mining(a, b, atol=1e-5):
    assert a["source"].tolist() == b["source"].tolist()
    assert a["target"].tolist() == b["target"].tolist()
    np.testing.assert_allclose(a["score"], b["score"], atol=atol)


@pytest.mark.parametrize("index_type", ["flat", "ivf"])
def test_blocked_and_spilled_mining_equals_the_plain_run(index_type, monkeypatch, tmp_path):
    source, target = planted_large()
    options = {"index_type": index_type, "nlist": 8, "nprobe": 3} if index_type == "ivf" else {
        "index_type": "flat"}
    plain = {r: mine(source, target, retrieval=r, **options) for r in ("max", "intersect")}
    # A real budget: neighbour lists spilled to the work folder, chunked queries.
    for retrieval, expected in plain.items():
        assert_same_mining(mine(source, target, retrieval=retrieval, memory_budget_gb=0.05,
                                work_dir=str(tmp_path), chunk_size=64, **options), expected)
    assert list(tmp_path.iterdir()) == [], "the work folder is cleaned"
    # Candidates in blocks of 100 (an index per block, results merged), 37-row chunks.
    blocked = MiningPlan(query_rows=37, block_rows=100, sample_rows=None, spill=True)
    monkeypatch.setattr(mining, "plan_mining", lambda *args, **kwargs: blocked)
    for retrieval, expected in plain.items():
        assert_same_mining(mine(source, target, retrieval=retrieval, **options), expected)


def test_mining_memory_mapped_rows_equals_mining_arrays(tmp_path):
    source, target = planted_large(seed=1)
    parts = []
    for number, (start, stop) in enumerate([(0, 100), (100, 101), (101, len(target))]):
        path = tmp_path / f"part{number}.f32"
        target[start:stop].astype("<f4").tofile(path)
        parts.append((str(path), stop - start, target.shape[1]))
    rows = Rows(parts, "target")
    expected = mine(source, target)
    assert_same_mining(mine(source, rows), expected)
    assert_same_mining(mine(Rows([source[:10], source[10:]], "source"), rows,
                            memory_budget_gb=0.05, chunk_size=50), expected)
