"""Tests for lealla_tf.machine: what a benchmark or the main job records of the machine."""

from lealla_tf.machine import (
    cpu_generation,
    cpu_model,
    describe,
    machine,
    usable_cpus,
    vector_extensions,
)

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC 9B45
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 sha_ni

processor\t: 1
model name\t: AMD EPYC 9B45
"""


def test_the_processor_and_its_vector_extensions_are_read_from_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert cpu_model(str(path)) == "AMD EPYC 9B45"
    assert cpu_generation(str(path)) == "family 26, model 2"
    assert vector_extensions(str(path)) == ["avx2", "fma", "avx512f", "avx512_bf16"]


def test_a_missing_cpuinfo_falls_back_to_the_platform_and_gives_no_extensions(tmp_path):
    import platform

    missing = str(tmp_path / "absent")
    assert vector_extensions(missing) == []
    assert cpu_generation(missing) is None
    assert cpu_model(missing) == (platform.processor() or None)


def test_the_record_names_the_cores_this_process_may_use_and_reads_as_one_line():
    import os

    record = machine()
    assert record["cpus"] == len(os.sched_getaffinity(0)) == usable_cpus()
    assert set(record) == {"platform", "processor", "cpu_generation", "cpus",
                           "vector_extensions", "python"}
    line = describe({"processor": "AMD EPYC", "cpus": 2, "vector_extensions": ["avx2"]})
    assert line == "AMD EPYC, 2 cores (avx2)"
    assert describe({"cpus": 2}) == "unknown processor, 2 cores"
    assert describe({"processor": "Apple M2"}) == "Apple M2"  # no "None cores"
    assert describe({"processor": "AMD EPYC", "cpu_generation": "family 25, model 17",
                     "cpus": 2}) == "AMD EPYC (family 25, model 17), 2 cores"


def test_bfloat16_arithmetic_is_the_cpus_own(tmp_path):
    from lealla_tf.machine import bfloat16_arithmetic

    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert bfloat16_arithmetic(str(path))
    path.write_text(CPUINFO.replace(" avx512_bf16", ""))
    assert not bfloat16_arithmetic(str(path))
    path.write_text(CPUINFO.replace(" avx512_bf16", " amx_tile amx_bf16"))
    assert bfloat16_arithmetic(str(path))
    assert not bfloat16_arithmetic(str(tmp_path / "absent"))
