"""JSON files the package writes next to its outputs (configs, manifests, summaries).

Local paths are plain files; remote ones (gs://, any `scheme://`) go through
`tf.io.gfile`, and only they load TensorFlow: `lealla_tf.configs` imports this
module, and the command lines parse their flags, and the pipelines read their
manifests, before TensorFlow loads or without it.

May import: nothing else of lealla_tf.
"""

import json
import os


def _open(path: str, mode: str):
    if "://" in path:
        import tensorflow as tf  # noqa: PLC0415 - heavy: remote paths only (module docstring)

        return tf.io.gfile.GFile(path, mode)
    return open(path, mode, encoding="utf-8")


def write_json(path: str, values: dict) -> None:
    """Writes `values` as indented JSON with sorted keys."""
    with _open(path, "w") as f:
        f.write(json.dumps(values, indent=2, sort_keys=True) + "\n")


def read_json(path: str) -> dict:
    """Reads a JSON file; ValueError when it is not JSON (or not UTF-8)."""
    with _open(path, "r") as f:
        return json.loads(f.read())


def read_json_or_none(path: str) -> dict | None:
    """The JSON file at `path`, or None when there is none."""
    if "://" not in path and not os.path.exists(path):
        return None
    return read_json(path)
