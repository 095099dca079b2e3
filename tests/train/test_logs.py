"""What a training run tells people at its end (lealla_tf.train.logs)."""

import json

import numpy as np
import tensorflow as tf
from conftest import Trainer, collapse, tiny_config, vocab_size

from lealla_tf.inference.formats import SPREAD_SENTENCES
from lealla_tf.train import logs
from lealla_tf.train.logs import format_summary


def test_a_collapsed_student_is_named_in_the_summary_without_a_tatoeba_dir(
        sentence_vocab_file, tiny_parallel_dir, tmp_path):
    """`python -m lealla_tf.train` without --tatoeba_dir ended at gradient norm 0
    and mean cosine 1.0 with no warning (the export was the first to say so).
    The summary now measures the spread of the export's check sentences itself."""
    config = tiny_config(vocab_size(sentence_vocab_file), tiny_parallel_dir, "ams",
                         train_steps=2)
    config.optimizer.learning_rate = 0.0
    trainer = Trainer(config, str(tmp_path), None, sentence_vocab_file, progress=False)
    trainer.restore_or_initialize()
    collapse(trainer.task.trainable)
    trainer.restore_or_initialize = lambda: 0  # keep the collapsed weights
    summary = trainer.train()
    assert summary["final_step"] == 2 and not summary["evaluations"]
    assert summary["mean_cosine"] > 0.999
    assert "has collapsed" in summary["collapse_warning"]
    assert str(tmp_path) in summary["collapse_warning"]
    assert summary["collapse_warning"] in format_summary(summary)
    written = json.loads((tmp_path / "train_summary.json").read_text())
    assert written["collapse_warning"] == summary["collapse_warning"]


def test_collapse_check_reads_the_last_evaluation_or_embeds_the_check_sentences():
    """With Tatoeba evaluations, their spread is the measure (nothing more is
    embedded); without, the export's check sentences; a spread model says nothing."""
    def never(*_):
        raise AssertionError("embedded although an evaluation measured the spread")

    last = [{"step": 1, "tatoeba/mean_cosine": 0.2}, {"step": 2, "tatoeba/mean_cosine": 1.0}]
    assert "has collapsed" in logs.collapse_check(last, never, "m")["collapse_warning"]
    assert logs.collapse_check(last[:1], never, "m") == {"collapse_warning": None}
    rows = np.random.default_rng(0).normal(size=(len(SPREAD_SENTENCES), 8))
    seen = []

    def spread():
        def embed(strings):
            seen.append([s.decode() for s in strings.numpy()])
            return tf.constant(rows, tf.float32)
        return embed

    check = logs.collapse_check([], spread, "m")
    assert seen == [SPREAD_SENTENCES] and check["collapse_warning"] is None
    assert abs(check["mean_cosine"]) < 0.5
    ones = lambda strings: tf.ones([len(SPREAD_SENTENCES), 8])  # noqa: E731
    check = logs.collapse_check([], lambda: ones, "m")
    assert check["mean_cosine"] > 0.999 and "the model in m has collapsed" in \
        check["collapse_warning"]
    assert logs.collapse_check([], lambda: None, "m") == {}  # nothing can embed strings


def test_the_logs_close_and_a_late_flush_is_harmless(tmp_path):
    """The trainer closes the logs when a step fails and flushes them on its way
    out: the flush after the close must not raise over the step's own error."""
    run = logs.RunLogs(str(tmp_path), tf.summary.create_noop_writer())
    run.evaluation(0, {"tatoeba/average_p_at_1": 0.5}, [])
    run.close()
    run.flush()
    assert run.train.closed and run.eval.closed
    assert json.loads((tmp_path / "eval_log.jsonl").read_text())["step"] == 0
