"""Students: starting one from another model directory (--init_from)."""

import numpy as np
import pytest
from conftest import Trainer, tiny_config, vocab_size

from lealla_tf.models.model_dir import load_encoder
from lealla_tf.train.distribution import make_strategy


@pytest.fixture(scope="module")
def bottleneck_run(teacher_records, sentence_vocab_file, tmp_path_factory):
    """A 2-step run with an embedding bottleneck and parameter recurrence (Ding's stage 1)."""
    model_dir = str(tmp_path_factory.mktemp("stage1") / "m")
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, "mse", train_steps=2)
    config.encoder = config.encoder.replace(embedding_dim=6, num_unique_layers=1)
    Trainer(config, model_dir, make_strategy("default"), sentence_vocab_file,
            progress=False).train()
    return model_dir


def test_init_from_restores_every_encoder_weight(bottleneck_run, teacher_records,
                                                 sentence_vocab_file, tmp_path):
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, "mcl",
                         init_from=bottleneck_run)
    config.encoder = config.encoder.replace(embedding_dim=6, num_unique_layers=1, dropout=0.1)
    task = Trainer(config, str(tmp_path / "stage2"), make_strategy("default"),
                   sentence_vocab_file, progress=False).task
    assert task.initialize_weights() == {"init_from": bottleneck_run}
    source = load_encoder(bottleneck_run)
    assert len(source.weights) == len(task.student.encoder.weights)
    for theirs, ours in zip(source.weights, task.student.encoder.weights):
        np.testing.assert_array_equal(np.asarray(theirs), np.asarray(ours))


def test_init_from_another_architecture_is_a_clear_error(bottleneck_run,
                                                         teacher_records,
                                                         sentence_vocab_file, tmp_path):
    # Was: the embedding table's shape clash surfaced as a TensorFlow traceback;
    # a deeper student would have kept its extra layers random without a word.
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, "mcl",
                         init_from=bottleneck_run)
    config.encoder = config.encoder.replace(num_layers=4, num_unique_layers=1)
    task = Trainer(config, str(tmp_path / "stage2"), make_strategy("default"),
                   sentence_vocab_file, progress=False).task
    with pytest.raises(ValueError, match="different architecture: num_layers 2 there, 4 here, "
                                         "embedding_dim 6 there, None here"):
        task.initialize_weights()


def test_a_mean_pooled_student_starts_from_a_cls_pooled_model(bottleneck_run,
                                                              teacher_records,
                                                              sentence_vocab_file, tmp_path):
    # An imported LaBSE/LEALLA checkpoint pools [CLS]; the recipe's students pool the mean.
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, "mcl",
                         init_from=bottleneck_run)
    config.encoder = config.encoder.replace(embedding_dim=6, num_unique_layers=1,
                                            pooling="mean")
    task = Trainer(config, str(tmp_path / "stage2"), make_strategy("default"),
                   sentence_vocab_file, progress=False).task
    assert task.initialize_weights() == {"init_from": bottleneck_run}
    source = {w.path: np.asarray(w) for w in load_encoder(bottleneck_run).weights}
    ours = {w.path: np.asarray(w) for w in task.student.encoder.weights}
    assert set(ours) < set(source)  # all but the pooler
    for path, value in ours.items():
        np.testing.assert_array_equal(source[path], value)


def test_the_dev_evaluation_embeds_as_the_encoder_computes(teacher_records,
                                                           sentence_vocab_file, tmp_path):
    """The evaluations along a run embed through the inference path (each sentence
    tokenized once, batches cut to their longest by token length, the step's
    kernels): the rows are the encoder's own, in input order, at any depth."""
    import tensorflow as tf

    from lealla_tf.evaluation.retrieval import embed_sentences
    from lealla_tf.inference.embedder import Embedder

    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records, "mcl")
    config.encoder = config.encoder.replace(num_layers=3)
    task = Trainer(config, str(tmp_path / "m"), make_strategy("default"), sentence_vocab_file,
                   progress=False).task
    sentences = ["a much longer sentence than the others , with many more words in it",
                 "short", "a middling sentence here", "hi", "one two three four five six"]
    rows = {}
    for skipped in (frozenset(), frozenset({1})):
        task.student.skipped_layers = skipped
        embed = task.embed_function()
        assert isinstance(embed, Embedder)
        rows[skipped] = embed_sentences(embed, sentences, batch_size=2)
        direct = task.student.encoder.forward(task.tokenizer(tf.constant(sentences)),
                                              skipped_layers=skipped)["sentence_embedding"]
        np.testing.assert_allclose(rows[skipped], np.asarray(direct), atol=2e-5)
    # An untrained student's rows lie close together: the skipped layer moves
    # them by far more than the tolerance above, all the same.
    assert np.abs(rows[frozenset()] - rows[frozenset({1})]).max() > 1e-4
