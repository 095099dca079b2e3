"""A teacher's SentencePiece vocabulary pruned to the pieces a corpus uses: every
kept piece the teacher's own, every corpus word still tokenized without <unk>."""

import collections
import io

import pytest
import sentencepiece
from conftest import write_pairs

from lealla_tf.tokenizers.pruning import count_pieces, prune_teacher_vocabulary, read_model_proto

CORPUS = {"deu": [("der Hund schläft", "the dog sleeps"), ("die Katze schläft", "the cat sleeps")],
          "fra": [("le chien dort", "the dog sleeps"), ("une maison", "a house")]}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A unigram model trained on more text than the corpus uses, and the corpus."""
    root = tmp_path_factory.mktemp("pruning")
    text = [s for pairs in CORPUS.values() for pair in pairs for s in pair]
    text += ["houses everywhere", "dogs and cats", "un chat noir", "ein großes Haus"]
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text * 30), model_writer=proto, vocab_size=70,
        model_type="unigram", hard_vocab_limit=False, minloglevel=2)
    path = root / "teacher.model"
    path.write_bytes(proto.getvalue())
    for language, pairs in CORPUS.items():
        write_pairs(root / "data", language, pairs * 3)
    return str(path), str(root / "data")


def pieces_of(path):
    processor = sentencepiece.SentencePieceProcessor(model_file=path)
    return processor, [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def test_pruning_keeps_used_pieces_and_falls_back_to_characters(teacher, tmp_path):
    model, data = teacher
    output = str(tmp_path / "pruned.model")
    summary = prune_teacher_vocabulary(model, [data], output, max_pieces=3, progress=False)
    pruned, kept = pieces_of(output)
    original, teacher_pieces = pieces_of(model)
    assert summary["pieces"] == len(kept) < len(teacher_pieces)
    assert summary["languages"] == 3 and summary["characters_added"] > 0
    # Every piece of the pruned model is a teacher piece (the embeddings can follow),
    # in the teacher's order.
    assert kept == [piece for piece in teacher_pieces if piece in set(kept)]
    # A corpus word whose piece was dropped still tokenizes into known pieces.
    for sentence in ("der Hund schläft", "the dog sleeps", "une maison"):
        assert pruned.unk_id() not in pruned.encode(sentence)
        assert pruned.decode(pruned.encode(sentence)) == sentence


def test_without_a_cap_every_occurring_piece_stays_and_covers_every_token(teacher, tmp_path):
    model, data = teacher
    output = str(tmp_path / "all.model")
    summary = prune_teacher_vocabulary(model, [data], output, progress=False)
    assert summary["weighted_token_coverage"] == pytest.approx(1.0)
    pruned, _ = pieces_of(output)
    original, _ = pieces_of(model)
    for sentence in ("die Katze schläft", "a house"):  # segmented exactly as the teacher
        assert pruned.encode(sentence, out_type=str) == original.encode(sentence, out_type=str)
    assert summary["pieces"] < original.get_piece_size()  # "un chat noir" was never used


def test_counts_are_per_language_over_every_sentence(teacher):
    model, _ = teacher
    processor = sentencepiece.SentencePieceProcessor(model_proto=read_model_proto(model))
    by_language = {"deu": ["der Hund", "der Hund"], "eng": ["a house"]}
    counts = count_pieces(processor, by_language, batch_size=1, progress=False)
    assert counts["deu"] == collections.Counter(processor.encode("der Hund") * 2)
    assert counts["eng"] == collections.Counter(processor.encode("a house"))


@pytest.mark.parametrize("output,max_pieces,needle", [("x.txt", None, "must end in .model"),
                                                      ("x.model", 0, "max_pieces must be")])
def test_an_impossible_request_is_refused_before_reading(teacher, tmp_path, output,
                                                         max_pieces, needle):
    model, data = teacher
    with pytest.raises(ValueError, match=needle):
        prune_teacher_vocabulary(model, [data], str(tmp_path / output), max_pieces=max_pieces,
                                 progress=False)
    assert not (tmp_path / output).exists()
