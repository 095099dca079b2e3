"""JSON files the package writes next to its outputs (configs, manifests, summaries).

May import: nothing else of lealla_tf.
"""

import json
from typing import Optional


def write_json(path: str, values: dict) -> None:
    """Writes `values` as indented JSON (tf.io.gfile, so gs:// paths work)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps(values, indent=2, sort_keys=True) + "\n")


def read_json(path: str) -> dict:
    """Reads a JSON file (tf.io.gfile, so gs:// paths work)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "r") as f:
        return json.loads(f.read())


def read_json_or_none(path: str) -> Optional[dict]:
    """The JSON file at `path`, or None when there is none."""
    import os

    if "://" not in path and not os.path.exists(path):
        return None
    return read_json(path)
