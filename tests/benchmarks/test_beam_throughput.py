"""benchmarks/beam_throughput.py: a quick run through Beam's in-process runner on
a tiny export, how it compares two runners' outputs, and its refusals."""

import json

import pytest
from conftest import TINY_PAIRS, write_embedding_output, write_pairs

from benchmarks import beam_throughput


@pytest.fixture()
def tiny_data(tmp_path, tiny_tatoeba_dir):
    data = tmp_path / "data"
    for language, pairs in TINY_PAIRS.items():
        write_pairs(data / "parallel" / "corpus", language, pairs)
    (data / "tatoeba_dev").symlink_to(tiny_tatoeba_dir)
    return data


def test_a_quick_run_embeds_every_sentence_bare_and_through_beam(corpus_model, tiny_data,
                                                                  tmp_path):
    """Tatoeba's 20 sentences are topped up from the parallel data to 30."""
    output = tmp_path / "beam.json"
    assert beam_throughput.main([f"--model={corpus_model[0]}", f"--data_dir={tiny_data}",
                                 "--num_sentences=30", "--workers=0",
                                 f"--output_json={output}"]) == 0
    result = json.loads(output.read_text())
    assert result["sentences"] == 30 and result["bare_model"]["sentences_per_second"] > 0
    fn_api = result["runners"]["fn_api"]
    assert fn_api["flags"] == ["--direct_running_mode=in_memory"]
    assert fn_api["counts"]["embedded"] == 30 and result["beam_over_bare"] > 0
    assert "dask" not in result["runners"] and "outputs_equal" not in result


def test_a_failed_dask_run_keeps_the_fn_api_runners_figure(corpus_model, tiny_data, tmp_path,
                                                             monkeypatch, capsys):
    """The Dask side fails (here its cluster cannot start); the FnApiRunner's run
    (here in this process, for speed) is still written, and the status says 1."""
    import distributed

    def no_cluster(**_):
        raise OSError("no free port on 127.0.0.1")

    monkeypatch.setattr(distributed, "LocalCluster", no_cluster)
    monkeypatch.setattr(beam_throughput, "runner_flags",
                        lambda workers: ["--direct_running_mode=in_memory"])
    output = tmp_path / "beam.json"
    assert beam_throughput.main([f"--model={corpus_model[0]}", f"--data_dir={tiny_data}",
                                 "--num_sentences=30", "--workers=1", "--dask",
                                 f"--output_json={output}"]) == 1
    result = json.loads(output.read_text())
    assert result["runners"]["fn_api"]["counts"]["embedded"] == 30
    assert result["beam_over_bare"] > 0 and "dask_over_bare" not in result
    assert result["dask_error"] == "OSError: no free port on 127.0.0.1"
    assert "the FnApiRunner's figures are kept" in capsys.readouterr().err


def test_two_runners_outputs_are_compared_id_by_id_and_vector_by_vector(tmp_path):
    """--dask compares the DaskRunner's output with the FnApiRunner's this way (the
    DaskRunner itself is tested in tests/pipelines/test_embed_corpus.py)."""
    import numpy as np

    vectors = np.eye(4, dtype=np.float32)
    write_embedding_output(tmp_path / "fn_api", vectors, shards=2)
    write_embedding_output(tmp_path / "dask", vectors, shards=3)
    assert beam_throughput.same_outputs(str(tmp_path / "fn_api"), str(tmp_path / "dask")) == {
        "ids": True, "max_abs_difference": 0.0}
    write_embedding_output(tmp_path / "moved", vectors + 0.25, shards=2)
    assert beam_throughput.same_outputs(str(tmp_path / "fn_api"), str(tmp_path / "moved"))[
        "max_abs_difference"] == 0.25


def test_each_runner_is_set_against_the_bare_model():
    runners = {"fn_api": {"sentences_per_second": 900.0},
               "dask": {"sentences_per_second": 600.0}}
    assert beam_throughput.speed_ratios(runners, 1000.0) == pytest.approx(
        {"beam_over_bare": 0.9, "dask_over_bare": 0.6, "dask_over_fn_api": 600 / 900})
    assert beam_throughput.speed_ratios({"fn_api": runners["fn_api"]}, 1000.0) == \
        pytest.approx({"beam_over_bare": 0.9})


@pytest.mark.parametrize("flags, message", [
    (["--model=m", "--vocab_file=v"], "not allowed with argument"),
    (["--model=m", "--workers=-1"], "--workers at least 0"),
    (["--model=m", "--workers=0", "--dask"], "(1 with --dask)"),
])
def test_bad_flags_are_refused_with_a_message(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as stopped:
        beam_throughput.main([f"--output_json={tmp_path / 'r.json'}", *flags])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
