"""The TensorFlow and tensorflow-text internals lealla_tf relies on, in one place.

Neither library has a public API for three things lealla_tf needs:

- a SavedModel root that takes `variables`, `trainable_variables` and
  `regularization_losses` as plain lists (`export_root`, for the export formats of
  `lealla_tf.inference.formats`): tf.Module has them as read-only properties,
  which are not saved;
- tensorflow-text's `SentencepieceTokenizer` on a model resource kept by name
  (`SharedSentencepieceTokenizer`, for `lealla_tf.tokenizers.tokenizer`): the one
  it makes itself is private to the kernel that made it, and dies with TensorFlow's
  eager kernel cache;
- BERT's basic tokenization alone, words without word pieces (`basic_tokenizer`,
  for counting a corpus's words in `lealla_tf.tokenizers.vocabulary`).

`TENSORFLOW_INTERNALS` names every private each of them uses, what for, and the
public API that would replace it. Nothing else in lealla_tf imports
`tensorflow.python` or `tensorflow_text.python`, or reads `tf.__internal__`
(tests/test_architecture.py checks). Those that need no model are checked when
this module is imported, the tokenizer's by `check_sentencepiece(model)`: a
release that moves one fails with `TensorFlowInternalsError` naming the installed
versions and the internal, and tests/tokenizers/test_tensorflow_adapter.py fails
with the same words. (It sits in `lealla_tf.tokenizers`, the lowest layer
that needs these internals; the exports in `lealla_tf.inference` import it from there.)
"""

import hashlib

import tensorflow as tf
import tensorflow_text as text
from tensorflow_text.python.ops import bert_tokenizer as _bert_ops
from tensorflow_text.python.ops import sentencepiece_tokenizer as _sentencepiece_ops

# Every internal used below: {name: (what for, the public API that would replace it)}.
TENSORFLOW_INTERNALS = {
    "tf.__internal__.tracking.AutoTrackable": (
        "the export root, whose variable lists are saved as set",
        "tf.Module, were its `variables` and `trainable_variables` settable"),
    "TrackableResource._create_resource": (
        "creates the named SentencePiece model resource (the hook a "
        "tf.saved_model.experimental.TrackableResource subclass overrides)",
        "a public name for the hook"),
    "tensorflow_text.python.ops.sentencepiece_tokenizer.gen_sentencepiece_tokenizer": (
        "the SentencePiece model op, given a shared_name",
        "a `shared_name` argument of tensorflow_text.SentencepieceTokenizer"),
    "SentencepieceTokenizer.__init__": (
        "skipped: it would load the model again, into a kernel-owned resource",
        "the `shared_name` argument above"),
    "SentencepieceTokenizer._model_resource": (
        "the model resource its tokenize calls read, set to the shared one",
        "the `shared_name` argument above"),
    "tensorflow_text.python.ops.bert_tokenizer.BasicTokenizer": (
        "BERT's basic tokenization alone, to count a corpus's words",
        "a public BasicTokenizer (BertTokenizer and FastBertTokenizer go on to word "
        "pieces)"),
}


class TensorFlowInternalsError(RuntimeError):
    """The installed TensorFlow or tensorflow-text lacks an internal that lealla_tf
    uses (`TENSORFLOW_INTERNALS`); the message names it and the versions."""


def missing(internal: str, change: str = "has no") -> TensorFlowInternalsError:
    """The error for a `TENSORFLOW_INTERNALS` entry the installed libraries lack
    (or, `change`, have changed)."""
    purpose = TENSORFLOW_INTERNALS.get(internal, ("see lealla_tf.tokenizers.tensorflow_adapter",))
    return TensorFlowInternalsError(
        f"tensorflow {tf.__version__} with tensorflow-text {text.__version__} {change} "
        f"`{internal}`, which lealla_tf uses ({purpose[0]}); install the versions setup.py "
        "pins, or adapt lealla_tf.tokenizers.tensorflow_adapter to the new release")


# The internals checked at import: {internal: whether the installed libraries have it}.
# The two of SentencepieceTokenizer's instances need a model: `check_sentencepiece`.
_CHECKS = {
    "tf.__internal__.tracking.AutoTrackable":
        lambda: hasattr(getattr(getattr(tf, "__internal__", None), "tracking", None),
                        "AutoTrackable"),
    "TrackableResource._create_resource":
        lambda: hasattr(tf.saved_model.experimental.TrackableResource, "_create_resource"),
    "tensorflow_text.python.ops.sentencepiece_tokenizer.gen_sentencepiece_tokenizer":
        lambda: hasattr(getattr(_sentencepiece_ops, "gen_sentencepiece_tokenizer", None),
                        "sentencepiece_op"),
    "tensorflow_text.python.ops.bert_tokenizer.BasicTokenizer":
        lambda: hasattr(_bert_ops, "BasicTokenizer"),
}


def check_internals() -> None:
    """Raises `TensorFlowInternalsError` unless every internal of
    `TENSORFLOW_INTERNALS` that can be checked without a model is there."""
    for internal, present in _CHECKS.items():
        if not present():
            raise missing(internal)


check_internals()


def export_root():
    """An empty SavedModel root on which a plain attribute is saved as set,
    `variables` and `trainable_variables` lists included."""
    # tf.Module's variables / trainable_variables are read-only properties and
    # are not saved; a plain AutoTrackable root takes them as lists.
    return tf.__internal__.tracking.AutoTrackable()


class _SharedSentencepieceModel(tf.saved_model.experimental.TrackableResource):
    """tensorflow-text's SentencePiece model resource, kept by name instead of by kernel.

    tensorflow-text creates the model as a resource private to the kernel
    that made it; `tf.random.set_seed` (and so `keras.utils.set_random_seed`)
    clears TensorFlow's eager kernel cache, which deletes that resource, and
    every later tokenization failed with NotFoundError. Named after the
    model's bytes, the resource lives in the resource manager instead:
    tokenizers of the same model share it, and it outlives the kernel cache,
    also when the tokenizer is restored from a SavedModel.
    """

    def __init__(self, model: bytes):
        super().__init__()
        self._model = model
        self._shared_name = "lealla_tf_sentencepiece_" + hashlib.sha256(model).hexdigest()[:24]
        _ = self.resource_handle  # creates the resource now, as tensorflow-text's does

    def _create_resource(self):
        return _sentencepiece_ops.gen_sentencepiece_tokenizer.sentencepiece_op(
            model=self._model, shared_name=self._shared_name)


class SharedSentencepieceTokenizer(text.SentencepieceTokenizer):
    """tensorflow-text's `SentencepieceTokenizer` (int32 ids, no sampling, no BOS/EOS)
    on a `_SharedSentencepieceModel`. Its own `__init__` is skipped, because it would
    load the model a second time into the kernel-owned resource this replaces.

    The resource's options (BOS/EOS, reverse) are set in place by each tokenize
    call, so every tokenizer sharing one must keep tensorflow-text's defaults, as
    this one does.
    """

    def __init__(self, model: bytes):
        super(text.SentencepieceTokenizer, self).__init__()
        self.nbest_size, self.alpha, self.out_type = 0, 1.0, tf.int32
        self.reverse = self.add_bos = self.add_eos = self.return_nbest = False
        self._model_resource = _SharedSentencepieceModel(model)


def check_sentencepiece(model: bytes) -> None:
    """Raises `TensorFlowInternalsError` unless `SharedSentencepieceTokenizer`, whose
    `__init__` stands in for tensorflow-text's, sets what tensorflow-text's sets
    (`model`: a SentencePiece model's bytes)."""
    theirs = set(vars(text.SentencepieceTokenizer(model)))
    if "_model_resource" not in theirs:
        raise missing("SentencepieceTokenizer._model_resource")
    ours = set(vars(SharedSentencepieceTokenizer(model)))
    if theirs != ours:
        raise missing("SentencepieceTokenizer.__init__",
                      f"sets {sorted(theirs ^ ours)} otherwise than lealla_tf expects in")


def basic_tokenizer(lower_case: bool = False):
    """tensorflow-text's `BasicTokenizer`: strings -> words (a RaggedTensor of
    UTF-8 words: punctuation, CJK characters and whitespace split), BERT's first
    step before word pieces."""
    return _bert_ops.BasicTokenizer(lower_case=lower_case)
