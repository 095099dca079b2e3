"""lealla_tf.mining.shards: the manifest an output is read through."""

import numpy as np
import pytest
from conftest import write_embedding_output


@pytest.mark.parametrize("damage", ["truncated", "not_an_object", "no_files", "not_utf8"])
def test_a_damaged_manifest_is_a_typed_error_naming_the_file(tmp_path, damage):
    """A MANIFEST.json cut short (or holding something else) is no raw
    JSONDecodeError, KeyError or TypeError: every reader raises
    DamagedManifestError (a ValueError) with the file's path and what to do."""
    from lealla_tf.mining.shards import (
        DamagedManifestError,
        manifest_files,
        mmap_embeddings,
        read_embeddings,
        read_manifest,
    )

    output = tmp_path / "out"
    write_embedding_output(output, np.random.default_rng(0).normal(size=(6, 4)), shards=2)
    manifest = output / "MANIFEST.json"
    manifest.write_bytes({"truncated": manifest.read_bytes()[:25], "not_an_object": b"[1, 2]",
                          "no_files": b'{"run": "run-x"}', "not_utf8": b'{"run": "\xff"}'}[damage])
    for read in (read_manifest, manifest_files, read_embeddings, mmap_embeddings):
        with pytest.raises(DamagedManifestError) as caught:
            read(str(output))
        assert isinstance(caught.value, ValueError)
        assert caught.value.path == str(manifest)
        message = str(caught.value)
        assert str(manifest) in message and "\n" not in message, message
        assert "rerun embed_corpus" in message
    # Still no manifest at all is what it was: FileNotFoundError, None from read_manifest.
    manifest.unlink()
    assert read_manifest(str(output)) is None
    with pytest.raises(FileNotFoundError, match="MANIFEST"):
        read_embeddings(str(output))
