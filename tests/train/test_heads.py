"""The heads an objective's terms train beside the student (`lealla_tf.train.heads`):
the feature projection, EMS's reconstruction head, a dimension-reduction run's
fixed layer and, for hd, the frozen teacher's layers, each built only for the
terms that need it. (The hd term training with the teacher's layers:
tests/teachers/test_layers.py.)"""

import numpy as np
import pytest
import tensorflow as tf

from lealla_tf.train.heads import DistillationHeads, ReconstructionHead


def test_only_the_heads_the_terms_need_are_built():
    plain = DistillationHeads(["ams"], 8, None)
    assert (plain.projection, plain.reduction, plain.reconstruction, plain.teacher_layers) == (
        None, None, None, None)
    assert plain.trainable_weights == []
    distilled = DistillationHeads(["ams", "fd", "mse"], 8, 12)  # one projection serves both
    assert distilled.projection.units == 12 and distilled.reconstruction is None
    assert len(distilled.trainable_weights) == 2  # its kernel and bias
    out = distilled.projection(tf.ones([3, 8]))
    assert out.shape == (3, 12)


def test_a_head_a_term_needs_but_the_run_lacks_is_named():
    with pytest.raises(ValueError, match="hd objective needs a converted teacher"):
        DistillationHeads(["ams", "hd"], 8, None)
    with pytest.raises(ValueError, match="syn objective needs --reduction_dir"):
        DistillationHeads(["ams", "syn"], 8, 12)
    layers = object()  # what the hd term reads; the heads only keep it
    assert DistillationHeads(["hdsrc"], 8, None, teacher_layers=layers).teacher_layers is layers


def test_the_reconstruction_head_scores_the_vocabulary_in_the_target_language():
    head = ReconstructionHead(embedding_dim=8, vocabulary_size=30, num_languages=3,
                              special_ids=(1, 2, 0), language_dim=4)
    languages = tf.constant([0, 2, 1])
    english = head.english_ids(languages)
    assert english.numpy().tolist() == [3, 3, 3] and english.dtype == languages.dtype
    embedding = tf.random.stateless_normal([3, 8], seed=(1, 2))
    logits = head(embedding, english)
    assert logits.shape == (3, 30) and head.special_ids == (1, 2, 0)
    # The language is part of the input: another target language, other logits.
    assert not np.allclose(head(embedding, languages).numpy(), logits.numpy())
    names = [w.path for w in head.trainable_weights]
    assert len(names) == 5 and any("target_language_embedding" in n for n in names)
