"""lealla_tf.mining.neighbours: faiss kNN against brute force, in chunks, over
memory-mapped rows, with neighbour lists in memory or spilled to disk, and the
spill folders of killed runs removed by the next run."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO_ROOT

from lealla_tf.mining.neighbours import (
    SPILL_FOLDER,
    NeighbourLists,
    Rows,
    build_index,
    invalid_rows,
    knn,
    normalize_rows,
    plan_mining,
    spill_folder,
)
from lealla_tf.mining.run_folders import host_tag

RNG = np.random.default_rng(7)


def test_knn_matches_brute_force_and_chunks():
    queries, candidates = normalize_rows(RNG.normal(size=(50, 8))), normalize_rows(
        RNG.normal(size=(70, 8)))
    similarities, indices = knn(queries, candidates, 5, chunk_size=7)
    full = queries @ candidates.T
    np.testing.assert_array_equal(indices, np.argsort(-full, axis=1)[:, :5])
    np.testing.assert_allclose(similarities, np.sort(full, axis=1)[:, ::-1][:, :5], atol=1e-5)


@pytest.mark.parametrize("index_type", ["ivf", "ivfpq"])
def test_approximate_indexes_find_planted_neighbours(index_type):
    rng = np.random.default_rng(0)
    target = normalize_rows(rng.normal(size=(2000, 32)))
    source = normalize_rows(target + 0.05 * rng.normal(size=target.shape))
    index = build_index(target, index_type, nlist=16, nprobe=16, pq_subquantizers=8)
    _, indices = knn(source, target, 1, index=index)
    assert np.mean(indices[:, 0] == np.arange(2000)) > 0.95


def test_knn_marks_missing_neighbours():
    rng = np.random.default_rng(2)
    candidates = normalize_rows(rng.normal(size=(400, 8)))
    similarities, indices = knn(candidates[:50], candidates, 30, "ivf", nlist=40, nprobe=1)
    missing = indices == -1
    assert missing.any() and np.all(similarities[missing] == -np.inf)
    assert np.all(np.abs(similarities[~missing]) <= 1)


@pytest.mark.parametrize("options,message", [
    ({"index_type": "ivfpq", "nlist": 4, "pq_subquantizers": 3}, "must divide the dimension"),
    ({"index_type": "hnsw"}, "flat, ivf or ivfpq"),
    ({"index_type": "ivf", "nprobe": 0}, "nlist and nprobe must be at least 1"),
    ({"index_type": "ivf", "train_size": 0}, "train_size must be at least 1"),
])
def test_bad_index_settings_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message) as error:
        build_index(normalize_rows(RNG.normal(size=(500, 10))), **options)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="at least 256 candidates"):
        build_index(normalize_rows(RNG.normal(size=(30, 8))), "ivfpq")


def test_memory_mapped_rows_read_as_the_arrays_they_hold(tmp_path):
    matrix = np.random.default_rng(1).normal(size=(537, 24)).astype(np.float32)
    parts = []
    for number, (start, stop) in enumerate([(0, 100), (100, 101), (101, 101), (101, 537)]):
        path = tmp_path / f"part{number}.f32"
        matrix[start:stop].astype("<f4").tofile(path)
        parts.append((str(path), stop - start, matrix.shape[1]))
    rows = Rows(parts, "target")
    assert rows.rows == len(matrix) and rows.dim == matrix.shape[1]
    np.testing.assert_array_equal(rows.read(95, 130), matrix[95:130])
    np.testing.assert_array_equal(rows.take(np.array([0, 99, 100, 101, 500]), 64),
                                  matrix[[0, 99, 100, 101, 500]])
    np.testing.assert_array_equal(np.concatenate([x for _, x in rows.chunks(50)]), matrix)
    assert rows.read(600, 700).shape == (0, 24)
    queries = np.random.default_rng(2).normal(size=(60, 24))
    similarities, indices = knn(queries, rows, 3, chunk_size=17, memory_budget_gb=0.05)
    full = normalize_rows(queries) @ normalize_rows(matrix).T
    np.testing.assert_array_equal(indices, np.argsort(-full, axis=1)[:, :3])
    with pytest.raises(ValueError, match="2-D"):
        Rows([np.ones(4)], "flat")
    with pytest.raises(ValueError, match="differ in dimension: \\[3, 4\\]"):
        Rows([np.ones((2, 3)), np.ones((2, 4))], "mixed")


def test_invalid_rows_name_each_rows_reason():
    x = normalize_rows(RNG.normal(size=(9, 4)))
    x[2], x[5], x[7] = 0.0, np.nan, np.inf
    indices, reasons = invalid_rows(Rows([x[:4], x[4:]], "x"), chunk=3)
    assert indices.tolist() == [2, 5, 7]
    assert reasons.tolist() == ["zero", "non_finite", "non_finite"]


@pytest.mark.parametrize("spilled", [False, True])
def test_neighbour_lists_keep_the_k_best_of_every_merge(tmp_path, spilled):
    lists = NeighbourLists(3, 2, str(tmp_path) if spilled else None, "forward")
    try:
        lists.merge(0, np.array([[0.9, 0.2], [0.5, -3.4e38], [0.1, 0.0]]),
                    np.array([[4, 1], [2, -1], [7, 8]]), first=True)
        lists.merge(1, np.array([[0.7, 0.6], [1.5, 0.3]]), np.array([[9, 3], [5, 6]]),
                    first=False)
        sims, ids = lists.read(0, 3)
        assert ids.tolist() == [[4, 1], [9, 3], [5, 6]]  # a similarity above 1 is clipped
        np.testing.assert_allclose(sims, [[0.9, 0.2], [0.7, 0.6], [1.0, 0.3]])
        averages, positive = lists.averages(chunk=2)
        np.testing.assert_allclose(averages, [0.55, 0.65, 0.65])
        assert positive.tolist() == [True, True, True]
        if spilled:
            assert sorted(os.listdir(tmp_path)) == ["forward.ids", "forward.sims"]
    finally:
        lists.close()
    lonely = NeighbourLists(2, 2)
    lonely.merge(0, np.array([[0.3, 0.0], [-0.2, 0.4]]), np.array([[1, -1], [0, 2]]), first=True)
    averages, positive = lonely.averages(chunk=1)
    np.testing.assert_allclose(averages, [0.3, 0.1])
    assert positive.tolist() == [True, False]  # a cosine <= 0 among the found


def test_the_plan_fits_the_budget_and_spills_only_with_one():
    assert plan_mining(1000, 1000, 16, 4).spill is False
    plan = plan_mining(10 ** 6, 10 ** 6, 256, 4, memory_budget_gb=1.0, chunk_size=65_536)
    assert plan.spill and 64 <= plan.query_rows <= 65_536 and plan.block_rows < 10 ** 6
    with pytest.raises(ValueError, match="too small to mine 10,000,000 x 1"):
        plan_mining(10 ** 7, 1, 8, 4, memory_budget_gb=0.5)


KILLED = """
import os, signal, sys
import numpy as np
from lealla_tf.mining.neighbours import NeighbourLists, spill_folder
with spill_folder(sys.argv[1]) as folder:
    lists = NeighbourLists(50, 4, folder, "forward")
    lists.merge(0, np.zeros((50, 4)), np.zeros((50, 4), np.int64), first=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_runs_spill_folder_is_removed_by_the_next_run_and_nothing_else(tmp_path):
    """A run killed (SIGKILL) while its neighbour lists are spilled leaves its
    folder; the next run spilling there removes it, and only it: a live run's,
    another host's, this process's and a folder not named by us stay."""
    killed = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], cwd=REPO_ROOT,
                            timeout=300)
    assert killed.returncode == -9
    (left,) = os.listdir(tmp_path)
    match = re.fullmatch(SPILL_FOLDER, left)
    assert match and match.group("host") == host_tag(), left
    assert sorted(os.listdir(tmp_path / left)) == ["forward.ids", "forward.sims"]
    dead = int(match.group("pid"))
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        other_host = "another_host" if host_tag() != "another_host" else "yet_another_host"
        kept = [f"mining-{live.pid}-{host_tag()}-abcd1234", f"mining-{dead}-{other_host}-abcd1234",
                f"mining-{os.getpid()}-{host_tag()}-abcd1234", "mining-abcd1234", "notes"]
        for name in kept:
            (tmp_path / name).mkdir()
        with spill_folder(str(tmp_path)) as folder:
            assert sorted(os.listdir(tmp_path)) == sorted(kept + [os.path.basename(folder)])
        assert sorted(os.listdir(tmp_path)) == sorted(kept)  # its own goes after use
    finally:
        live.kill()
        live.wait()
