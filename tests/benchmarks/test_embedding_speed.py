"""benchmarks/embedding_speed.py: a quick run on a tiny export and data directory,
the forward pass in parts, the fused kernels op by op, the export formats set
against the float32 export, and its refusals."""

import json
import os
import shutil

import numpy as np
import pytest
from conftest import TINY_PAIRS, write_pairs

from benchmarks import embedding_speed
from lealla_tf.machine import bfloat16_arithmetic


@pytest.fixture()
def tiny_data(tmp_path, tiny_tatoeba_dir):
    """tatoeba_dev and NTREX-like news pairs, as ../shared/data has them."""
    data = tmp_path / "data"
    for language, pairs in TINY_PAIRS.items():
        write_pairs(data / "parallel" / "ntrex", language, pairs * 3)
    (data / "tatoeba_dev").symlink_to(tiny_tatoeba_dir)
    return data


def test_a_quick_run_measures_the_student_in_a_process_of_its_own(corpus_model, tiny_data,
                                                                   tmp_path):
    output = tmp_path / "speed.json"
    assert embedding_speed.main([
        f"--output_json={output}", f"--data_dir={tiny_data}", f"--student={corpus_model[0]}",
        f"--student_model_dir={tmp_path / 'none'}", "--models=student,student_int8",
        "--num_sentences=20", "--num_long=8", "--max_pairs=2", "--batch_size=4",
        "--parts=", "--peak_repeats=0"]) == 0
    result = json.loads(output.read_text())
    student = result["results"]["student"]
    assert result["sets"] == {"tatoeba": 20, "long": 8}
    for name, count in result["sets"].items():
        figures = student["sets"][name]
        assert figures["sentences"] == count and figures["dimension"] == 16
        # sorted batches of 4 mixed-length sentences pad some positions, not most
        assert 0.0 < figures["padding_waste"] < 0.5
        assert figures["tokens_per_second"] > figures["sentences_per_second"] > 0
    assert student["bytes"] > 10_000 and 0 <= student["p_at_1"] <= 100
    assert 0 < student["load_seconds"] < 120
    assert "--student_model_dir" in result["skipped"]["student_int8"]
    assert result["student_reference"] == "student" and result["variants"] == {}
    assert "forward_parts" not in result and "roofline" not in result


def test_the_bfloat16_export_is_measured_against_the_float32_one(exported_model, tiny_data,
                                                                 tmp_path):
    """`student_bf16`: exported from the model directory, loaded as `load_embedder`
    loads it (rebuilt), and as a TF-Hub handle (`student_bf16_hub`: its own graph),
    their vectors of every sentence of both sets set against float32's."""
    output = tmp_path / "speed.json"
    assert embedding_speed.main([
        f"--output_json={output}", f"--data_dir={tiny_data}",
        f"--student={exported_model['export']}",
        f"--student_model_dir={exported_model['model_dir']}",
        "--models=student,student_bf16,student_bf16_hub",
        "--num_sentences=20", "--num_long=8", "--max_pairs=2", "--batch_size=4",
        "--parts=", "--peak_repeats=1"]) == 0
    result = json.loads(output.read_text())
    assert "bfloat16" in result["results"]["student_bf16"]["model"]
    peaks = result["peaks_gflops"]
    assert set(peaks) == {"float32", "bfloat16"}
    assert all(v > 0 for p in peaks.values() for v in p.values())
    assert result["roofline"]["student_bf16"]["precision"] == (
        "bfloat16" if bfloat16_arithmetic() else "float32")
    assert result["roofline"]["student"]["sets"]["long"]["gflops"] > 0
    compared = result["variants"]["student_bf16"]
    assert 0.995 <= compared["min_cosine"] < 1.0  # 28 sentences, not float32's own vectors
    assert set(compared["over_student"]) == {"tatoeba", "long"}
    assert compared["p_at_1_difference"] is not None
    hub = result["results"]["student_bf16_hub"]["model"]
    assert hub.startswith("SavedModel file://") and "rebuilt" not in hub
    assert 0.995 <= result["variants"]["student_bf16_hub"]["min_cosine"] < 1.0
    assert result["roofline"]["student_bf16_hub"]["precision"] == "bfloat16"
    assert "student_bf16_hub" not in embedding_speed.DEFAULT_MODELS  # asked for only


def test_the_forward_pass_in_parts_is_timed_against_one_part():
    rows = embedding_speed.parts_table(["lealla_small"], [(3, 4)], [1, 2], repeats=1,
                                       num_layers=2)
    assert [(r["preset"], r["batch"], r["length"], r["parts"]) for r in rows] == [
        ("lealla_small", 3, 4, 1), ("lealla_small", 3, 4, 2)]
    assert rows[0]["over_one_part"] == 1.0 and rows[1]["milliseconds"] > 0


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                    reason="no C++ compiler to build the fused kernels")
def test_the_fused_kernels_are_timed_op_by_op_and_in_the_forward_pass():
    rows = embedding_speed.fused_table(["lealla_small"], [(4, 8), (3, 20)],
                                       ["bfloat16", "float32"], repeats=1, num_layers=2)
    assert [(r["batch"], r["length"], r["dtype"], r["layers"]) for r in rows] == [
        (4, 8, "bfloat16", 2), (4, 8, "float32", 2), (3, 20, "bfloat16", 2),
        (3, 20, "float32", 2)]
    for row in rows:
        for name in ("attention_ms", "bias_gelu_ms", "norm_ms", "forward_ms"):
            assert row[name] > 0, (row, name)
        assert row["forward_us_per_token"] == pytest.approx(
            1e3 * row["forward_ms"] / (row["batch"] * row["length"]))


def test_a_timed_batch_is_padded_at_the_end_its_first_sentence_full():
    mask = embedding_speed.padded_mask(50, 20, np.random.default_rng(0))
    lengths = mask.sum(axis=1)
    assert mask.shape == (50, 20) and lengths[0] == 20 and 16 <= lengths.min() < 20
    for row, length in zip(mask, lengths):
        assert row[:length].all() and not row[length:].any()


def test_each_export_format_is_set_against_the_float32_export():
    vectors = {"student": np.array([[1.0, 0.0], [0.0, 1.0]]),
               "student_int8": np.array([[0.99, 0.05], [0.0, 1.0]]),
               "student_xla": np.array([[1.0, 0.0], [0.0, 1.0]])}

    def entry(speed, size, p_at_1):
        return {"sets": {"tatoeba": {"sentences_per_second": speed}}, "bytes": size,
                "p_at_1": p_at_1}

    results = {"student": entry(100.0, 400, 50.0), "student_int8": entry(180.0, 100, 49.5),
               "student_xla": entry(120.0, 400, 50.0)}
    compared = embedding_speed.variants(results, vectors)
    int8 = compared["student_int8"]
    assert int8["over_student"] == {"tatoeba": 1.8} and int8["student_bytes_over_its"] == 4.0
    assert int8["p_at_1_difference"] == -0.5 and int8["max_abs_difference"] == pytest.approx(0.05)
    assert int8["min_cosine"] == pytest.approx(0.99 / np.hypot(0.99, 0.05))
    assert compared["student_xla"]["max_abs_difference"] == 0.0
    assert embedding_speed.variants({"student_xla": results["student_xla"]}, vectors) == {}


def test_the_roofline_sets_each_model_against_its_precisions_peak():
    peaks = {"float32": {"student_feed_forward_in": 50.0, "square_2048": 100.0},
             "bfloat16": {"student_feed_forward_in": 150.0, "square_2048": 400.0}}
    figures = {"sets": {"long": {"tokens": 4000, "sentences": 100, "tokens_per_second": 2e4}}}
    table = embedding_speed.roofline(
        {"student": figures, "student_bf16": figures, "e5_converted": figures,
         "labse_501k": figures}, peaks, {"labse_501k": {"preset": "labse"}},
        bfloat16_native=True)
    assert set(table) == {"student", "student_bf16", "labse_501k"}  # the teacher has no preset
    from lealla_tf.models.presets import count_flops_per_token, get_preset

    flops = count_flops_per_token(get_preset("lealla_small").encoder, 40.0)
    row = table["student"]["sets"]["long"]
    assert row["gflops"] == pytest.approx(2e4 * flops / 1e9)
    assert row["of_square_peak"] == pytest.approx(row["gflops"] / 100.0)
    assert row["of_student_shaped_peak"] == pytest.approx(row["gflops"] / 50.0)
    assert table["student_bf16"]["sets"]["long"]["of_square_peak"] == pytest.approx(
        row["gflops"] / 400.0)
    assert table["labse_501k"]["sets"]["long"]["flops_per_token"] > 10 * flops
    # The preset's bfloat16 export is set against bfloat16's peak.
    bf16 = embedding_speed.roofline({"labse_501k_bf16": figures}, peaks,
                                    {"labse_501k_bf16": embedding_speed.MODELS["labse_501k_bf16"]},
                                    bfloat16_native=True)["labse_501k_bf16"]
    assert (bf16["preset"], bf16["precision"]) == ("labse", "bfloat16")
    assert "labse_501k_bf16" not in embedding_speed.DEFAULT_MODELS  # asked for, not default
    # Without bfloat16 arithmetic the bfloat16 export runs in float32: float32's peak.
    rebuilt = embedding_speed.roofline({"student_bf16": figures}, peaks, {},
                                       bfloat16_native=False)["student_bf16"]
    assert rebuilt["precision"] == "float32"
    assert rebuilt["sets"]["long"]["of_square_peak"] == pytest.approx(row["gflops"] / 100.0)
    # ... but as a hub handle it runs its own bfloat16 graph either way.
    assert embedding_speed.roofline({"student_bf16_hub": figures}, peaks, {},
                                    bfloat16_native=False)["student_bf16_hub"][
        "precision"] == "bfloat16"
    # A student of another architecture is counted as its model directory says.
    base = get_preset("lealla_base").encoder
    other = embedding_speed.roofline({"student": figures}, peaks, {}, base)["student"]
    assert other["preset"] == "student"
    assert other["sets"]["long"]["flops_per_token"] == pytest.approx(
        count_flops_per_token(base, 40.0))


@pytest.mark.parametrize("flags, message", [
    (["--models=student,bert"], "unknown --models ['bert']"),
    (["--rounds=0"], "must be at least 1"),
    (["--peak_repeats=-1"], "--peak_repeats at least 0"),
    (["--parts=2,1"], "--parts must start with 1"),
    (["--part_shapes=3by4"], "--part_shapes rows x tokens"),
    (["--part_presets=lealla_tiny"], "unknown --part_presets"),
    (["--fused_shapes=3by4"], "--fused_shapes takes rows x tokens"),
    (["--fused_dtypes=float16"], "--fused_dtypes takes bfloat16 and/or float32"),
    (["--fused_repeats=0"], "--fused_repeats must be at least 1"),
])
def test_bad_flags_are_refused_with_a_message(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as stopped:
        embedding_speed.main([f"--output_json={tmp_path / 'r.json'}", *flags])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
