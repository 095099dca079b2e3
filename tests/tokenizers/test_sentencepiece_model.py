"""SentencePiece ModelProto files written without generated protobuf code."""

import io

import pytest
import sentencepiece
import tensorflow as tf

from lealla_tf.tokenizers import sentencepiece_model as spm_model
from lealla_tf.tokenizers.tokenizer import Tokenizer

WORDS = ["the dog sleeps", "the cat sleeps", "dogs and cats", "der Hund schläft",
         "le chien dort", "a house", "houses everywhere"]


def trained_model(**options):
    output = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(WORDS * 30), model_writer=output, vocab_size=60,
        model_type="unigram", hard_vocab_limit=False, minloglevel=2, **options)
    return output.getvalue()


def test_parse_then_serialize_encodes_identically():
    proto = trained_model(pad_id=3)
    model = spm_model.parse_model(proto)
    assert model.unk_piece == "<unk>" and model.pad_piece == "<pad>"
    original = sentencepiece.SentencePieceProcessor(model_proto=proto)
    rewritten = sentencepiece.SentencePieceProcessor(model_proto=model.serialize())
    for sentence in WORDS + ["unseen wörds ☃"]:
        assert rewritten.encode(sentence) == original.encode(sentence)
    assert (rewritten.unk_id(), rewritten.bos_id(), rewritten.eos_id(), rewritten.pad_id()) == (
        original.unk_id(), original.bos_id(), original.eos_id(), original.pad_id())


def test_pieces_in_fairseq_order_with_a_compiled_normalizer(tmp_path):
    spec = spm_model.normalizer_spec_from_map({0xFF21: [0x41], 0x1: []}, "nmt_nfkc")
    assert spm_model.normalizer_settings(spec)["name"] == "nmt_nfkc"
    pieces = [spm_model.Piece("<s>", 0, spm_model.CONTROL),
              spm_model.Piece("<pad>", 0, spm_model.CONTROL),
              spm_model.Piece("</s>", 0, spm_model.CONTROL),
              spm_model.Piece("<unk>", 0, spm_model.UNKNOWN),
              spm_model.Piece("\u2581A", -1.0), spm_model.Piece("\u2581b", -2.0)]
    path = tmp_path / "fairseq.model"
    path.write_bytes(spm_model.SentencePieceModel(pieces, spec).serialize())
    tokenizer = Tokenizer(str(path))
    assert (tokenizer.cls_id, tokenizer.pad_id, tokenizer.sep_id, tokenizer.unk_id) == (0, 1, 2, 3)
    # U+FF21 (fullwidth A) normalises to A, the control character vanishes.
    ids = tokenizer(tf.constant(["\uff21\x01 b"]))["input_word_ids"].numpy()[0].tolist()
    assert ids == [0, 4, 5, 2]


def test_invalid_models_are_refused():
    spec = spm_model.normalizer_spec_from_map({}, "identity")
    with pytest.raises(ValueError, match="duplicate piece"):
        spm_model.SentencePieceModel([spm_model.Piece("<unk>", 0, spm_model.UNKNOWN),
                                      spm_model.Piece("a"), spm_model.Piece("a")],
                                     spec).serialize()
    with pytest.raises(ValueError, match="UNKNOWN"):
        spm_model.SentencePieceModel([spm_model.Piece("a")], spec).serialize()
    with pytest.raises(ValueError, match="not a SentencePiece model"):
        spm_model.parse_model(b"\xff\xff\xff")


def test_a_compiled_normalizer_names_no_rule_file(tmp_path, monkeypatch):
    """sentencepiece records the rule file it compiled (`normalization_rule_tsv`,
    NormalizerSpec field 6): a build-time `/tmp/tmpXXXX.tsv` then travelled in every
    vocab.model and export. Neither a new spec nor a model written from an old one
    (a teacher converted by an earlier version) carries it, and they normalise alike."""
    import tempfile

    build_temp = tmp_path / "build-temp"
    build_temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(build_temp))
    norm_map = {0xFF21: [0x41], 0x1: []}
    spec = spm_model.normalizer_spec_from_map(norm_map, "nmt_nfkc")
    assert str(build_temp).encode() not in spec and b".tsv" not in spec
    assert 6 not in dict(spm_model._fields(spec))
    assert spm_model.normalizer_settings(spec)["name"] == "nmt_nfkc"
    old_spec = spec + spm_model._field_bytes(6, f"{build_temp}/tmpab12cd34.tsv".encode())
    pieces = [spm_model.Piece("<unk>", 0, spm_model.UNKNOWN), spm_model.Piece("\u2581A", -1.0),
              spm_model.Piece("\u2581b", -2.0)]
    written = spm_model.SentencePieceModel(pieces, old_spec).serialize()
    assert str(build_temp).encode() not in written and b".tsv" not in written
    assert written == spm_model.SentencePieceModel(pieces, spec).serialize()
    processor = sentencepiece.SentencePieceProcessor(model_proto=written)
    assert processor.encode("\uff21\x01 b") == processor.encode("A b") == [1, 2]
