"""Where a run ran: the record every benchmark JSON and the main job's report keep.

The same command takes very different times on machines of one nominal size
(2 cores), so a figure of time is only comparable with the processor named
beside it. It is recorded with its family and model: two processors that share
a model name and their vector extensions can be different generations, several
times apart in speed, and the model name alone does not tell them apart
(docs/benchmarks.md keeps each figure with its machine).

May import: nothing else of lealla_tf.
"""

import os
import platform


def _cpuinfo_value(field: str, cpuinfo: str) -> str | None:
    """The first non-empty value of `field` in a /proc/cpuinfo-format file, or
    None (no such field, or no such file)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == field and value.strip():
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The processor's model name (Linux), or `platform.processor()` elsewhere;
    None when neither says."""
    return _cpuinfo_value("model name", cpuinfo) or platform.processor() or None


def cpu_generation(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """'family F, model M' of the processor (Linux x86), or None."""
    family, model = _cpuinfo_value("cpu family", cpuinfo), _cpuinfo_value("model", cpuinfo)
    if family is None or model is None:
        return None
    return f"family {family}, model {model}"


def vector_extensions(cpuinfo: str = "/proc/cpuinfo") -> list:
    """The SIMD extensions that set the speed of TensorFlow's and oneDNN's
    kernels here (avx2, avx512f, avx512_bf16, amx_tile, ...), as the kernel lists them."""
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
              "amx_bf16", "amx_int8")
    present = set((_cpuinfo_value("flags", cpuinfo) or "").split())
    return [w for w in wanted if w in present]


def bfloat16_arithmetic(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX), where
    TensorFlow's bfloat16 matmuls run at twice float32's rate; elsewhere oneDNN
    emulates them, slower than float32."""
    return bool({"avx512_bf16", "amx_bf16"} & set(vector_extensions(cpuinfo)))


def usable_cpus() -> int:
    """The cores this process may run on (its affinity), not the host's count
    (a cgroup CPU quota, as docker --cpus sets, is not read)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def machine() -> dict:
    """Where this process runs: platform, processor, cores, SIMD, Python."""
    return {"platform": platform.platform(), "processor": cpu_model(),
            "cpu_generation": cpu_generation(), "cpus": usable_cpus(),
            "vector_extensions": vector_extensions(), "python": platform.python_version()}


def describe(record: dict) -> str:
    """One line for a summary: '<processor> (family F, model M), 2 cores (avx2, ...)'."""
    extensions = ", ".join(record.get("vector_extensions") or [])
    cores = f", {record['cpus']} cores" if record.get("cpus") else ""
    generation = f" ({record['cpu_generation']})" if record.get("cpu_generation") else ""
    return (f"{record.get('processor') or 'unknown processor'}{generation}{cores}"
            + (f" ({extensions})" if extensions else ""))
