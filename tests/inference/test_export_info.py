"""`export_info`: the record a LEALLA export keeps of its precision and
architecture, read back as written, refused when it is not one, and what the
loaders decide from it on CPUs with and without bfloat16 arithmetic."""

import json

import pytest

from lealla_tf.inference import export_info


@pytest.fixture
def cpus(tmp_path):
    """/proc/cpuinfo-format files of a CPU with and one without bfloat16 arithmetic."""
    with_bf16, without = tmp_path / "zen4", tmp_path / "old"
    with_bf16.write_text("model name\t: A\nflags\t\t: fma avx2 avx512f avx512_bf16\n")
    without.write_text("model name\t: B\nflags\t\t: fma avx2\n")
    return {"bf16": str(with_bf16), "none": str(without)}


def test_the_record_reads_back_as_written(tmp_path):
    path = export_info.write_export_info(str(tmp_path), "bfloat16", {"hidden_dim": 8})
    assert path == str(tmp_path / "assets.extra" / "lealla_export.json")
    info = export_info.read_export_info(str(tmp_path))
    assert info == {"format": "lealla", "precision": "bfloat16",
                    "needs": [export_info.BFLOAT16_INSTRUCTIONS],
                    "encoder_config": {"hidden_dim": 8}, "jit_compile": False}
    export_info.write_export_info(str(tmp_path), "float32", {"hidden_dim": 8})
    assert export_info.read_export_info(str(tmp_path))["needs"] == []
    assert export_info.batch_rows_multiple(export_info.read_export_info(str(tmp_path))) == 1


def test_an_xla_export_records_the_rows_its_batches_come_in(tmp_path):
    export_info.write_export_info(str(tmp_path), "float32", {"hidden_dim": 8}, 16)
    info = export_info.read_export_info(str(tmp_path))
    assert info["jit_compile"] and info["jit_rows_multiple"] == 16
    assert export_info.batch_rows_multiple(info) == 16
    # an XLA export from before the record named it padded to the default
    del info["jit_rows_multiple"]
    assert export_info.batch_rows_multiple(info) == export_info.JIT_ROWS_MULTIPLE
    assert export_info.batch_rows_multiple(None) == 1


def test_no_record_is_none_and_a_bad_one_is_named(tmp_path):
    assert export_info.read_export_info(str(tmp_path)) is None
    path = tmp_path / "assets.extra" / "lealla_export.json"
    path.parent.mkdir()
    path.write_text("{not json")
    with pytest.raises(ValueError, match="lealla_export.json is not readable JSON"):
        export_info.read_export_info(str(tmp_path))
    path.write_text(json.dumps({"precision": "float16"}))
    with pytest.raises(ValueError, match="names no precision"):
        export_info.read_export_info(str(tmp_path))
    with pytest.raises(ValueError, match="precision must be one of"):
        export_info.write_export_info(str(tmp_path), "int4", {})


def test_a_bfloat16_export_warns_only_where_the_cpu_lacks_the_instructions(cpus):
    assert export_info.slow_precision_warning("bfloat16", "x", cpus["bf16"]) == ""
    assert export_info.slow_precision_warning("float32", "x", cpus["none"]) == ""
    warning = export_info.slow_precision_warning("bfloat16", "the export e", cpus["none"])
    assert warning.startswith("the export e computes in bfloat16") and "\n" not in warning
    assert "avx512_bf16" in warning


def test_the_loaders_plan_follows_precision_and_cpu(cpus):
    bf16 = {"precision": "bfloat16", "encoder_config": {"hidden_dim": 8}}
    assert export_info.bfloat16_plan(bf16, cpus["bf16"]) == "bfloat16"
    assert export_info.bfloat16_plan(bf16, cpus["none"]) == "float32"
    # The export's own functions: float32, XLA, no record, no architecture.
    assert export_info.bfloat16_plan(dict(bf16, precision="float32"), cpus["bf16"]) is None
    assert export_info.bfloat16_plan(dict(bf16, jit_compile=True), cpus["bf16"]) is None
    assert export_info.bfloat16_plan(None, cpus["bf16"]) is None
    assert export_info.bfloat16_plan(dict(bf16, encoder_config=None), cpus["bf16"]) is None
    # A precision asked for overrides the record's
    f32 = dict(bf16, precision="float32")
    assert export_info.bfloat16_plan(f32, cpus["bf16"], precision="bfloat16") == "bfloat16"
    assert export_info.bfloat16_plan(f32, cpus["none"], precision="bfloat16") is None
    assert export_info.bfloat16_plan(bf16, cpus["bf16"], precision="float32") == "float32"
    assert export_info.bfloat16_plan(f32, cpus["bf16"], precision="float32") is None
    for record in (None, dict(f32, jit_compile=True), dict(f32, encoder_config=None)):
        for precision in ("bfloat16", "float32"):
            with pytest.raises(ValueError, match="only a LEALLA-format export with its record"):
                export_info.bfloat16_plan(record, cpus["bf16"], precision=precision)
    with pytest.raises(ValueError, match="precision must be one of"):
        export_info.bfloat16_plan(f32, cpus["bf16"], precision="float16")
