"""lealla_tf.json_files: what is written reads back, a missing file is None, and a
damaged one is an error, not an empty result."""

import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from lealla_tf.json_files import read_json, read_json_or_none, write_json


def test_values_read_back_as_written_with_sorted_keys(tmp_path):
    path = str(tmp_path / "config.json")
    values = {"b": [1, 2.5, None], "a": {"name": "Straße", "on": True}}
    write_json(path, values)
    assert read_json(path) == values == read_json_or_none(path)
    text = (tmp_path / "config.json").read_text(encoding="utf-8")
    assert text.endswith("}\n") and text.index('"a"') < text.index('"b"')
    assert json.loads(text) == values


def test_a_missing_file_is_none_and_a_damaged_one_an_error(tmp_path):
    assert read_json_or_none(str(tmp_path / "absent.json")) is None
    (tmp_path / "cut.json").write_text('{"run": "run-1", "fi')
    with pytest.raises(ValueError):
        read_json_or_none(str(tmp_path / "cut.json"))


def test_local_files_do_not_load_tensorflow(tmp_path):
    """configs imports this module, and a command line's --help (or a pipeline
    reading its manifest) must not wait for TensorFlow."""
    code = ("import sys\n"
            "from lealla_tf.json_files import read_json_or_none, write_json\n"
            "write_json(sys.argv[1], {'a': 1})\n"
            "assert read_json_or_none(sys.argv[1]) == {'a': 1}\n"
            "print('tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a.json")],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert done.stdout.strip() == "False", done.stderr[-2000:]
