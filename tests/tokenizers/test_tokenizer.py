"""The in-graph tokenizer: ids, truncation, padding, bad inputs, graph contexts."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import BAD_INPUTS, multilingual_sentences, tiny_vocabulary

from lealla_tf.tokenizers.tokenizer import Tokenizer, read_wordpiece_vocabulary


@pytest.fixture(scope="module")
def tokenizer(tiny_vocab_file):
    return Tokenizer(tiny_vocab_file, max_seq_length=16)


def assert_valid(inputs, tokenizer, batch):
    ids = inputs["input_word_ids"].numpy()
    mask = inputs["input_mask"].numpy()
    types = inputs["input_type_ids"].numpy()
    assert ids.dtype == np.int32 and mask.dtype == np.int32 and types.dtype == np.int32
    assert ids.shape == mask.shape == types.shape
    assert ids.shape[0] == batch and 2 <= ids.shape[1] <= tokenizer.max_seq_length
    assert ids.min() >= 0 and ids.max() < tokenizer.vocab_size
    assert set(np.unique(mask)) <= {0, 1}
    for row_ids, row_mask in zip(ids, mask):
        length = int(row_mask.sum())
        assert row_mask[:length].all() and not row_mask[length:].any(), "mask not a prefix"
        assert row_ids[0] == tokenizer.cls_id and row_ids[length - 1] == tokenizer.sep_id
        assert (row_ids[length:] == tokenizer.pad_id).all()


def test_special_tokens_are_looked_up_not_assumed(tokenizer):
    vocabulary = tiny_vocabulary()
    assert tokenizer.pad_id == vocabulary.index("[PAD]") == 0
    assert tokenizer.unk_id == vocabulary.index("[UNK]") == 2
    assert tokenizer.cls_id == vocabulary.index("[CLS]") == 3
    assert tokenizer.sep_id == vocabulary.index("[SEP]") == 4
    assert tokenizer.vocab_size == len(vocabulary)


def test_missing_special_token_is_a_clear_error(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\ndog\n")
    with pytest.raises(ValueError, match=r"\[SEP\]"):
        Tokenizer(str(path))
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\ndog\ndog\n")
    with pytest.raises(ValueError, match="repeats tokens"):
        Tokenizer(str(path))
    with pytest.raises(FileNotFoundError):
        Tokenizer(str(tmp_path / "absent.txt"))


def test_known_words_map_to_their_ids(tokenizer):
    vocabulary = tiny_vocabulary()
    out = tokenizer(tf.constant(["The dog is nice.", "Puppies"]))
    expected = [vocabulary.index(t) for t in ["[CLS]", "T", "##h", "##e", "dog", "is", "nice",
                                                ".", "[SEP]"]]
    assert out["input_word_ids"].numpy()[0].tolist() == expected
    puppies = out["input_word_ids"].numpy()[1][:3].tolist()
    assert puppies == [tokenizer.cls_id, vocabulary.index("Puppies"), tokenizer.sep_id]


def test_pads_to_longest_in_batch_not_to_max_length(tokenizer):
    out = tokenizer(tf.constant(["dog", "the dog"]))
    assert out["input_word_ids"].shape == (2, 4)
    assert out["input_mask"].numpy().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_truncates_to_max_seq_length_keeping_sep(tokenizer):
    out = tokenizer(tf.constant(["dog " * 100]))
    ids = out["input_word_ids"].numpy()[0]
    assert ids.shape == (16,)
    assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id
    assert out["input_mask"].numpy().sum() == 16


def test_fixed_length_packing_and_pairs(tokenizer):
    a = tokenizer.tokenize(tf.constant(["the dog", "cat"]))
    b = tokenizer.tokenize(tf.constant(["is nice", "big house"]))
    out = tokenizer.pack([a, b], seq_length=10)
    assert out["input_word_ids"].shape == (2, 10)
    types = out["input_type_ids"].numpy()[0]
    assert types.tolist() == [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_gives_valid_ids(tokenizer, name):
    out = tokenizer(tf.constant([BAD_INPUTS[name], b"dog"]))
    assert_valid(out, tokenizer, batch=2)


def test_all_bad_inputs_in_one_batch_and_row_independence(tokenizer):
    values = list(BAD_INPUTS.values())
    together = tokenizer(tf.constant(values))
    assert_valid(together, tokenizer, batch=len(values))
    for i, value in enumerate(values):
        alone = tokenizer(tf.constant([value]))
        n = alone["input_word_ids"].shape[1]
        np.testing.assert_array_equal(together["input_word_ids"].numpy()[i, :n],
                                      alone["input_word_ids"].numpy()[0])


def test_empty_and_control_only_strings_become_cls_sep(tokenizer):
    out = tokenizer(tf.constant([b"", b"   ", b"\x00\x07"]))
    assert out["input_word_ids"].numpy().tolist() == [[tokenizer.cls_id, tokenizer.sep_id]] * 3


def test_empty_batch(tokenizer):
    out = tokenizer(tf.constant([], dtype=tf.string))
    assert out["input_word_ids"].shape[0] == 0


def test_same_ids_eager_tf_function_and_tf_data(tokenizer):
    sentences = [b"The dog is nice.", b"Die Katze", BAD_INPUTS["invalid_utf8"], b""]
    eager = tokenizer(tf.constant(sentences))["input_word_ids"].numpy()

    traced = tf.function(tokenizer.__call__, input_signature=[tf.TensorSpec([None], tf.string)])
    np.testing.assert_array_equal(traced(tf.constant(sentences))["input_word_ids"].numpy(), eager)

    dataset = tf.data.Dataset.from_tensor_slices(sentences).batch(4).map(tokenizer)
    (batch,) = list(dataset)
    np.testing.assert_array_equal(batch["input_word_ids"].numpy(), eager)


def saved_and_loaded(tokenizer, path):
    """`tokenizer` in a SavedModel at `path`, loaded back (a callable on strings)."""
    module = tf.Module()
    module.tokenizer = tokenizer
    module.__call__ = tf.function(
        lambda s: tokenizer(s), input_signature=[tf.TensorSpec([None], tf.string)])
    tf.saved_model.save(module, str(path))
    return tf.saved_model.load(str(path))


def test_works_after_saved_model_round_trip(tokenizer, tmp_path):
    loaded = saved_and_loaded(tokenizer, tmp_path / "tokenizer")
    sentences = tf.constant(list(BAD_INPUTS.values()) + [b"The dog is nice."])
    expected = tokenizer(sentences)
    actual = loaded(sentences)
    for key in expected:
        np.testing.assert_array_equal(actual[key].numpy(), expected[key].numpy())
    assets = list((tmp_path / "tokenizer" / "assets").iterdir())
    assert [a.name for a in assets] == ["cased_vocab.txt"], "vocabulary must travel as an asset"


def test_lower_case_option(tiny_vocab_file):
    cased = Tokenizer(tiny_vocab_file)
    uncased = Tokenizer(tiny_vocab_file, lower_case=True)
    word = tf.constant(["DOG"])
    dog = tiny_vocabulary().index("dog")
    assert dog not in cased(word)["input_word_ids"].numpy()[0].tolist()
    assert uncased(word)["input_word_ids"].numpy()[0].tolist() == [3, dog, 4]


def test_read_wordpiece_vocabulary_keeps_whole_lines(tmp_path):
    path = tmp_path / "v.txt"
    path.write_bytes(b"[PAD]\r\n a\n##b\n")
    assert read_wordpiece_vocabulary(str(path)) == ["[PAD]", " a", "##b"]
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="UTF-8"):
        read_wordpiece_vocabulary(str(path))


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory, tiny_parallel_dir):
    from lealla_tf.tokenizers.vocabulary import build_vocabulary

    output = str(tmp_path_factory.mktemp("spm") / "spm.model")
    summary = build_vocabulary([tiny_parallel_dir], vocab_size=120, output=output,
                               sentencepiece=True, progress=False)
    return summary["output"]


def test_sentencepiece_model_tokenizer(sentencepiece_model):
    tokenizer = Tokenizer(sentencepiece_model, max_seq_length=12)
    assert tokenizer.kind == "sentencepiece"
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id) == (0, 1, 2, 3)
    out = tokenizer(tf.constant(list(BAD_INPUTS.values()) + [b"The dog is nice."]))
    assert_valid(out, tokenizer, batch=len(BAD_INPUTS) + 1)
    assert out["input_mask"].numpy()[-1].sum() > 4


def test_seq_length_may_be_a_tensor(tokenizer):
    ids = tokenizer.tokenize(tf.constant(["the dog is nice", "cat"]))
    packed = tf.function(lambda n: tokenizer.pack(ids, seq_length=n))(tf.constant(5))
    assert packed["input_word_ids"].shape == (2, 5)
    assert packed["input_word_ids"].numpy()[0, -1] == tokenizer.sep_id
    with pytest.raises(ValueError, match="no room"):
        tokenizer.pack([ids, ids], seq_length=2)


def test_sentencepiece_tokenizer_survives_a_global_seed(sentencepiece_model, tmp_path):
    """keras.utils.set_random_seed clears TensorFlow's kernel cache; tensorflow-text's
    kernel-owned SentencePiece model went with it (NotFoundError on every later call),
    so a notebook that loaded a model and then called `train` lost the model."""
    import keras

    tokenizer = Tokenizer(sentencepiece_model, max_seq_length=12)
    loaded = saved_and_loaded(tokenizer, tmp_path / "tokenizer")
    sentences = tf.constant(["The dog is nice.", "cat"])
    expected = tokenizer(sentences)["input_word_ids"].numpy()
    assert (loaded(sentences)["input_word_ids"].numpy() == expected).all()
    keras.utils.set_random_seed(7)
    assert (tokenizer(sentences)["input_word_ids"].numpy() == expected).all()
    assert (loaded(sentences)["input_word_ids"].numpy() == expected).all()
    # In a fresh process the restored tokenizer makes its own resource, and keeps it.
    script = ("import json, sys, keras, tensorflow as tf, tensorflow_text\n"
              "loaded = tf.saved_model.load(sys.argv[1])\n"
              "keras.utils.set_random_seed(7)\n"
              "print(json.dumps(loaded(tf.constant(['The dog is nice.', 'cat']))"
              "['input_word_ids'].numpy().tolist()))\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "tokenizer")],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected.tolist()


def test_sentencepiece_models_kept_by_name_do_not_mix(sentencepiece_model, tmp_path):
    """Each model's resource is named after its bytes: two models in one process,
    each with the ids Python's sentencepiece gives, before and after a seed."""
    import keras
    import sentencepiece

    from lealla_tf.tokenizers.vocabulary import learn_sentencepiece

    other = learn_sentencepiece(multilingual_sentences() * 3, vocab_size=600,
                                output_prefix=str(tmp_path / "bpe"), model_type="bpe")
    sentences = ["The dog is nice.", "Der Hund ist nett.", "cat"]
    tokenizers = [Tokenizer(path, max_seq_length=64) for path in (sentencepiece_model, other)]
    want = [sentencepiece.SentencePieceProcessor(model_file=path).encode(sentences)
            for path in (sentencepiece_model, other)]
    assert want[0] != want[1]
    for seed in (None, 11):
        if seed is not None:
            keras.utils.set_random_seed(seed)
        for tokenizer, ids in zip(tokenizers, want):
            assert tokenizer.tokenize(tf.constant(sentences)).to_list() == ids
