"""Decontamination (`lealla_tf.train.decontamination`): a pair either side of which
appears in evaluation data is dropped, compared case-folded and stripped."""

import tensorflow as tf

from lealla_tf.parallel_corpus import find_tatoeba_languages, read_tatoeba
from lealla_tf.train.decontamination import Decontaminator, evaluation_sentences


def test_a_pair_is_dropped_when_either_side_is_an_evaluation_sentence(tmp_path):
    held_out = tmp_path / "held_out.txt"
    held_out.write_text("The Dog Is Nice.\n  Hello there  \nThe Dog Is Nice.\n",
                        encoding="utf-8")
    decontaminator = Decontaminator([str(held_out)])
    assert decontaminator.size == 2  # distinct sentences
    keep = decontaminator.keep(tf.constant(["the dog is nice.", "A cat.", "A cat."]),
                               tf.constant(["Der Hund", " HELLO THERE ", "Eine Katze."]))
    assert keep.numpy().tolist() == [False, False, True]
    assert bool(decontaminator.keep(tf.constant("A cat."), tf.constant("Eine Katze.")))

    # In tf.data, as the pair stream runs it.
    pairs = tf.data.Dataset.from_tensor_slices((["hello there", "A cat."], ["x", "y"]))
    kept = [s.numpy().decode() for s, _ in pairs.filter(decontaminator.keep)]
    assert kept == ["A cat."]


def test_without_evaluation_sentences_every_pair_is_kept(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    decontaminator = Decontaminator([str(empty)])
    assert decontaminator.size == 0
    assert decontaminator.keep(tf.constant(["a", "b"]), tf.constant(["c", "d"])).numpy().all()


def test_evaluation_sentences_are_every_side_of_a_tatoeba_directory_and_every_line_of_a_file(
        tiny_tatoeba_dir, tmp_path):
    extra = tmp_path / "extra.txt"
    extra.write_text("one\ntwo\n", encoding="utf-8")
    expected = []
    for language in find_tatoeba_languages(tiny_tatoeba_dir):
        source, english = read_tatoeba(tiny_tatoeba_dir, language)
        expected += source + english
    assert evaluation_sentences([tiny_tatoeba_dir, str(extra)]) == expected + ["one", "two"]
