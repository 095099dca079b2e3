"""The TensorFlow and tensorflow-text internals lealla_tf relies on
(lealla_tf.tokenizers.tensorflow_adapter): all there in the installed releases, doing
what the adapter promises, and a clear error naming the versions and the internal
when a release moves one."""

import pytest
import tensorflow as tf
import tensorflow_text as text

from lealla_tf.tokenizers import sentencepiece_model as spm_model
from lealla_tf.tokenizers import tensorflow_adapter
from lealla_tf.tokenizers.tensorflow_adapter import (
    TENSORFLOW_INTERNALS,
    SharedSentencepieceTokenizer,
    TensorFlowInternalsError,
    basic_tokenizer,
    export_root,
)


@pytest.fixture(scope="module")
def model() -> bytes:
    """A tiny SentencePiece model's bytes: <pad> <s> </s> <unk> and a few pieces."""
    pieces = [spm_model.Piece(p, 0, spm_model.CONTROL) for p in ("<pad>", "<s>", "</s>")]
    pieces.append(spm_model.Piece("<unk>", 0, spm_model.UNKNOWN))
    pieces += [spm_model.Piece(p, -float(i)) for i, p in enumerate(
        ["▁the", "▁dog", "▁is", "▁nice", "▁", "t", "h", "e", "d", "o", "g", "."], 1)]
    return spm_model.SentencePieceModel(
        pieces, spm_model.normalizer_spec_from_map({}, "identity")).serialize()


def test_every_internal_is_there_in_the_installed_releases(model):
    tensorflow_adapter.check_internals()
    tensorflow_adapter.check_sentencepiece(model)
    checked = set(tensorflow_adapter._CHECKS) | {"SentencepieceTokenizer.__init__",
                                                 "SentencepieceTokenizer._model_resource"}
    assert checked == set(TENSORFLOW_INTERNALS)
    for purpose, replacement in TENSORFLOW_INTERNALS.values():
        assert purpose and replacement


def test_a_moved_internal_is_named_with_the_installed_versions(monkeypatch):
    monkeypatch.setitem(tensorflow_adapter._CHECKS, "tf.__internal__.tracking.AutoTrackable",
                        lambda: False)
    with pytest.raises(TensorFlowInternalsError) as error:
        tensorflow_adapter.check_internals()
    message = str(error.value)
    assert (f"tensorflow {tf.__version__} with tensorflow-text {text.__version__} has no "
            "`tf.__internal__.tracking.AutoTrackable`") in message
    assert TENSORFLOW_INTERNALS["tf.__internal__.tracking.AutoTrackable"][0] in message
    assert "setup.py" in message and "tensorflow_adapter" in message


def test_a_changed_sentencepiece_init_is_named(model, monkeypatch):
    """A tensorflow-text whose tokenizer sets an attribute this one does not: refused,
    naming the attribute."""
    real_init = text.SentencepieceTokenizer.__init__

    def init_with_more(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.new_option = True

    monkeypatch.setattr(text.SentencepieceTokenizer, "__init__", init_with_more)
    with pytest.raises(TensorFlowInternalsError, match=r"sets \['new_option'\]"):
        tensorflow_adapter.check_sentencepiece(model)


def test_the_shared_tokenizer_gives_tensorflow_texts_ids_and_shares_its_model(model):
    sentences = tf.constant(["the dog is nice.", "dog", ""])
    ours = SharedSentencepieceTokenizer(model)
    theirs = text.SentencepieceTokenizer(model)
    assert ours.tokenize(sentences).to_list() == theirs.tokenize(sentences).to_list()
    again = SharedSentencepieceTokenizer(model)
    assert again._model_resource._shared_name == ours._model_resource._shared_name
    tf.random.set_seed(0)  # clears the eager kernel cache, and a kernel-owned model with it
    assert again.tokenize(sentences).to_list() == ours.tokenize(sentences).to_list()


def test_the_export_root_saves_its_variable_lists(tmp_path):
    root = export_root()
    weight = tf.Variable([1.0, 2.0])
    root.variables = [weight]
    root.trainable_variables = [weight]
    root.regularization_losses = []
    tf.saved_model.save(root, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    assert [v.numpy().tolist() for v in loaded.variables] == [[1.0, 2.0]]
    assert len(loaded.trainable_variables) == 1
    with pytest.raises(AttributeError):
        tf.Module().variables = [weight]  # why a plain tf.Module will not do


def test_basic_tokenization_gives_words_not_pieces():
    words = basic_tokenizer().tokenize(tf.constant(["The dog's 狗很好."]))
    assert words.flat_values.numpy().tolist() == [
        w.encode() for w in ["The", "dog", "'", "s", "狗", "很", "好", "."]]
