"""lealla_tf.mining.run_folders: a run commits through the manifest, removes only
the run folders its output made, and the leftovers of killed runs go."""

import json
import os
import subprocess
import sys

import pytest
from conftest import dead_pid

from lealla_tf.mining.run_folders import (
    MANIFEST,
    RUNS_RECORD,
    DamagedManifestError,
    commit_run,
    file_in_the_way,
    host_tag,
    manifest_files,
    read_manifest,
    remove_dead_leftovers,
    run_directory,
)


def one_run(output, name="embeddings-00000-of-00001.tfrecord.gz", **details):
    """A run into `output` that writes one file and commits: its manifest."""
    with run_directory(str(output)) as run_dir:
        (output / os.path.basename(run_dir) / name).write_bytes(b"shard")
        return commit_run(str(output), run_dir, [os.path.join(run_dir, name)], **details)


def entries(output):
    return sorted(path.name for path in output.iterdir())


def test_a_commit_replaces_the_manifest_and_removes_only_this_outputs_runs(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    first = one_run(output, counts={"embedded": 1})
    assert read_manifest(str(output)) == first and first["counts"] == {"embedded": 1}
    assert first["files"] == [f"{first['run']}/embeddings-00000-of-00001.tfrecord.gz"]
    assert manifest_files(str(output)) == [str(output / first["files"][0])]
    assert manifest_files(str(output), suffix=".json") == []
    users = ["run-important", "run-20240101T000000123456Z"]  # the second named as ours
    for name in users:
        (output / name).mkdir()
    second = one_run(output)
    assert second["run"] != first["run"]
    assert entries(output) == sorted([MANIFEST, RUNS_RECORD, second["run"], *users])
    assert json.loads((output / RUNS_RECORD).read_text()) == {"runs": [second["run"]]}


def test_a_failed_run_leaves_the_committed_one_and_no_folder_of_its_own(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    committed = one_run(output)
    with pytest.raises(RuntimeError, match="the pipeline failed"):
        with run_directory(str(output)) as run_dir:
            assert os.path.isdir(run_dir)
            raise RuntimeError("the pipeline failed")
    assert not os.path.exists(run_dir)
    assert read_manifest(str(output)) == committed
    assert entries(output) == sorted([MANIFEST, RUNS_RECORD, committed["run"]])


KILLED = """
import os, signal, sys
from lealla_tf.mining.run_folders import run_directory
with run_directory(sys.argv[1]) as run_dir:
    print(os.path.basename(run_dir), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_runs_folder_is_removed_by_the_next_run(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    committed = one_run(output)
    killed = subprocess.run([sys.executable, "-c", KILLED, str(output)], capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    abandoned = killed.stdout.strip()
    assert (output / abandoned).is_dir() and abandoned in (output / RUNS_RECORD).read_text()
    with run_directory(str(output)) as run_dir:
        assert not (output / abandoned).exists()  # gone before the new run writes
        assert (output / committed["run"]).is_dir()
        assert os.path.isdir(run_dir)


@pytest.mark.parametrize("damage", ["truncated", "not_an_object", "no_files", "not_utf8"])
def test_a_damaged_manifest_is_a_typed_error_naming_the_file(tmp_path, damage):
    """A MANIFEST.json cut short (or holding something else) is no raw
    JSONDecodeError, KeyError or TypeError: DamagedManifestError (a
    ValueError) with the file's path and what to do. A commit repairs it."""
    output = tmp_path / "out"
    output.mkdir()
    first = one_run(output)
    manifest = output / MANIFEST
    manifest.write_bytes({"truncated": manifest.read_bytes()[:25], "not_an_object": b"[1, 2]",
                          "no_files": b'{"run": "run-x"}', "not_utf8": b'{"run": "\xff"}'}[damage])
    for read in (read_manifest, manifest_files):
        with pytest.raises(DamagedManifestError) as caught:
            read(str(output))
        assert isinstance(caught.value, ValueError) and caught.value.path == str(manifest)
        message = str(caught.value)
        assert str(manifest) in message and "\n" not in message, message
        assert "rerun embed_corpus" in message
    repaired = one_run(output)
    assert read_manifest(str(output)) == repaired
    assert not (output / first["run"]).exists()  # the record still knew it
    manifest.unlink()
    assert read_manifest(str(output)) is None
    with pytest.raises(FileNotFoundError, match="has no MANIFEST.json"):
        manifest_files(str(output))


def test_leftovers_of_dead_processes_on_this_host_go_and_nothing_else(tmp_path):
    dead, pattern = dead_pid(), r"x\.tmp-(?P<pid>\d+)(?:-(?P<host>[A-Za-z0-9_]+))?"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        removed = [f"x.tmp-{dead}-{host_tag()}", f"x.tmp-{dead}"]  # the second: no host
        kept = [f"x.tmp-{live.pid}-{host_tag()}", f"x.tmp-{dead}-another_host",
                f"x.tmp-{os.getpid()}-{host_tag()}", f"y.tmp-{dead}", "x.tmp-notes"]
        (tmp_path / removed[0]).mkdir()
        (tmp_path / removed[0] / "half").write_text("x")
        for name in removed[1:] + kept:
            (tmp_path / name).write_text("x")
        assert sorted(remove_dead_leftovers(str(tmp_path), pattern)) == sorted(
            str(tmp_path / name) for name in removed)
        assert entries(tmp_path) == sorted(kept)
    finally:
        live.kill()
        live.wait()
    assert remove_dead_leftovers(str(tmp_path / "absent"), pattern) == []


def test_file_in_the_way_names_the_file_a_path_lies_below(tmp_path):
    (tmp_path / "a_file").write_text("x")
    assert file_in_the_way(str(tmp_path / "a_file" / "deeper" / "out")) == str(
        tmp_path / "a_file")
    assert file_in_the_way(str(tmp_path / "new" / "out")) is None
    assert file_in_the_way("gs://bucket/out") is None
