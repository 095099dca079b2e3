"""What a LEALLA-format export says of itself: its precision and architecture.

`lealla-export --format=lealla` writes `assets.extra/lealla_export.json` beside
the SavedModel (the SavedModel convention for files TensorFlow itself does not
load, so the hub contract is untouched):

    {"format": "lealla", "precision": "float32" | "bfloat16",
     "needs": [] | ["avx512_bf16 or amx_bf16"],
     "encoder_config": {...the EncoderConfig...}, "jit_compile": false}

and an XLA-compiled export (`"jit_compile": true`) the row multiple its batches
are padded to, `"jit_rows_multiple"`, which `batch_rows_multiple` reads.

`lealla_tf.inference.loaders.load_embedder` reads it to run a bfloat16 export
at this CPU's best (see `bfloat16_plan`). Exports written before this file
existed have none, and load as they always did.

May import: nothing of TensorFlow (the loaders read it before deciding to).
"""

import json
import os

from lealla_tf.machine import bfloat16_arithmetic

PRECISIONS = ("float32", "bfloat16")
INFO_DIR = "assets.extra"
INFO_FILE = "lealla_export.json"
BFLOAT16_INSTRUCTIONS = "avx512_bf16 or amx_bf16"
# An XLA-compiled export pads each batch to a multiple of this many rows (one
# compiled program per row count and padded length; exports that predate the
# record's `jit_rows_multiple` padded to it too).
JIT_ROWS_MULTIPLE = 32


def info_path(export_path: str) -> str:
    return os.path.join(export_path, INFO_DIR, INFO_FILE)


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def write_export_info(export_path: str, precision: str, encoder_config: dict,
                      jit_rows_multiple: int = 0) -> str:
    """Writes the export's `lealla_export.json`; returns its path.
    `jit_rows_multiple`: an XLA-compiled export's row multiple (0: not compiled)."""
    check_precision(precision)
    info = {"format": "lealla", "precision": precision,
            "needs": [BFLOAT16_INSTRUCTIONS] if precision == "bfloat16" else [],
            "encoder_config": encoder_config, "jit_compile": bool(jit_rows_multiple)}
    if jit_rows_multiple:
        info["jit_rows_multiple"] = int(jit_rows_multiple)
    path = info_path(export_path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def batch_rows_multiple(info: dict | None) -> int:
    """Rows a batch of this export should come in multiples of: an XLA-compiled
    export's padding multiple (batches cut to it carry no padding rows), else 1."""
    if not info or not info.get("jit_compile"):
        return 1
    return int(info.get("jit_rows_multiple", JIT_ROWS_MULTIPLE))


def read_export_info(export_path: str) -> dict | None:
    """The export's `lealla_export.json`, or None where it has none. ValueError
    for a file that is not such a record (named, with what is wrong)."""
    path = info_path(export_path)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not readable JSON ({error}); re-export with "
                         "lealla-export --format=lealla") from None
    if not isinstance(info, dict) or info.get("precision") not in PRECISIONS:
        raise ValueError(f"{path} names no precision of {PRECISIONS}; re-export with "
                         "lealla-export --format=lealla")
    return info


def slow_precision_warning(precision: str, what: str, cpuinfo: str = "/proc/cpuinfo") -> str:
    """One line for a bfloat16 export on a CPU without bfloat16 arithmetic (oneDNN
    emulates it there, slower than float32); "" where there is nothing to say."""
    if precision != "bfloat16" or bfloat16_arithmetic(cpuinfo):
        return ""
    return (f"{what} computes in bfloat16, and this CPU has no bfloat16 arithmetic "
            f"({BFLOAT16_INSTRUCTIONS}): its own signatures run slower here than a float32 "
            "export's")


def bfloat16_plan(info: dict | None, cpuinfo: str = "/proc/cpuinfo",
                  precision: str | None = None) -> str | None:
    """How `load_embedder` runs an export with record `info`: "bfloat16" (its
    network rebuilt in-process in bfloat16, with the fused kernels where they
    load), "float32" (a bfloat16 export on a CPU without bfloat16 arithmetic:
    its float32 weights rebuilt in float32, the speed of a float32 export), or
    None (the export's own functions: a float32 export, an XLA one, one
    without a record or an architecture).

    `precision` overrides the precision the record names: "bfloat16" plans
    a float32 export as a bfloat16 one (its weights are the same float32
    weights) where the CPU has bfloat16 arithmetic, and None elsewhere (its
    own float32 functions); "float32" runs either in float32. ValueError where
    the export cannot be rebuilt (no record, no architecture, or XLA-compiled)."""
    rebuildable = bool(info and info.get("encoder_config") and not info.get("jit_compile"))
    if precision is not None:
        check_precision(precision)
        if not rebuildable:
            raise ValueError(
                "only a LEALLA-format export with its record (assets.extra/lealla_export.json "
                "with its architecture, not XLA-compiled) runs in another precision than its "
                "own; re-export it with lealla-export --format=lealla (without --jit_compile), "
                "or pass no precision")
        if precision == "float32":
            return "float32" if info.get("precision") == "bfloat16" else None
        if info.get("precision") == "float32" and not bfloat16_arithmetic(cpuinfo):
            return None
    elif not rebuildable or info.get("precision") != "bfloat16":
        return None
    return "bfloat16" if bfloat16_arithmetic(cpuinfo) else "float32"
