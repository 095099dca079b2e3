"""A `TrainConfig` checked and made whole (`lealla_tf.train.resolution`): impossible
runs named by their flag, the defaults that depend on the width, the teacher and
the objective, and the settings a resumed run may change."""

import dataclasses

import pytest
from conftest import tiny_config, vocab_size

from lealla_tf.configs import (
    EncoderConfig,
    LossConfig,
    OptimizerConfig,
    TeacherConfig,
    TrainConfig,
)
from lealla_tf.train.resolution import (
    RESUMABLE_CHANGES,
    check_resumable,
    default_learning_rate,
    default_train_steps,
    resolve_train_config,
    validate_train_config,
)

ENCODER = EncoderConfig(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8,
                        intermediate_dim=16, max_sequence_length=128)


@pytest.mark.parametrize("changes, flag", [
    ({"global_batch_size": 0}, "--global_batch_size must be positive"),
    ({"train_steps": 0}, "--train_steps must be positive"),
    ({"checkpoint_every": -1}, "--checkpoint_every must be positive"),
    ({"eval_every": -1}, "--eval_every must be >= 0"),
    ({"time_budget_minutes": -1.0}, "--time_budget_minutes must be >= 0"),
    ({"student": "lstm"}, "student must be one of"),
    ({"embedding_init": "teacher_random"}, "--embedding_init must be one of"),
    ({"embedding_init": "teacher_pca"}, "--embedding_init_source"),
    ({"optimizer": OptimizerConfig(clip_norm=-1.0)}, "--clip_norm must be >= 0"),
    ({"loss": LossConfig(scale=0.0)}, "--temperature and --scale must be positive"),
    ({"progressive_depth": 1.0}, r"--progressive_depth must be in \[0, 1\)"),
    ({"progressive_depth": 0.5}, "--progressive_depth inserts the pass-through layers"),
])
def test_an_impossible_run_is_named_by_its_flag(changes, flag):
    config = dataclasses.replace(TrainConfig(encoder=ENCODER), **changes)
    with pytest.raises(ValueError, match=flag):
        validate_train_config(config)


def test_a_sequence_longer_than_the_position_table_names_the_fix():
    config = TrainConfig(encoder=ENCODER)
    config.tokenizer.max_seq_length = 129
    with pytest.raises(ValueError, match="--encoder_overrides=max_sequence_length=129"):
        validate_train_config(config)
    config.tokenizer.max_seq_length = 128
    validate_train_config(config)  # as long as the table: fine


def test_teacher_select_and_init_from_do_not_combine():
    config = TrainConfig(embedding_init="teacher_select", embedding_init_source="t",
                         init_from="some/model")
    with pytest.raises(ValueError, match="overwrite --init_from"):
        validate_train_config(config)


def test_center_pairs_must_be_positive(teacher_records, sentence_vocab_file):
    config = tiny_config(vocab_size(sentence_vocab_file), teacher_records,
                         teacher=TeacherConfig(center=True, center_pairs=0))
    with pytest.raises(ValueError, match="--teacher_center_pairs must be positive"):
        validate_train_config(config)


def test_a_run_written_before_centring_existed_resumes_uncentred():
    stored = {"teacher": {"path": "", "english_only": False}, "train_steps": 5}
    requested = {"teacher": {"path": "", "english_only": False, "center": False,
                             "center_pairs": 2048}, "train_steps": 9}
    check_resumable(stored, requested)
    requested["teacher"]["center"] = True
    with pytest.raises(ValueError, match="teacher.center: False -> True"):
        check_resumable(stored, requested)


def test_a_run_written_before_progressive_depth_resumes_at_full_depth():
    stored = {"train_steps": 5}
    check_resumable(stored, {"train_steps": 9, "progressive_depth": 0.0})
    with pytest.raises(ValueError, match="progressive_depth: 0.0 -> 0.5"):
        check_resumable(stored, {"train_steps": 9, "progressive_depth": 0.5})


def test_a_run_written_before_the_teachers_shares_resumes_with_them_unchanged():
    """A config.json from before `distilled_rows`, `cooldown_distilled_rows` and
    `cooldown_margin` (and `one_language_batches`) ran with the teacher on every
    row and one margin throughout."""
    stored = {"train_steps": 5, "loss": {"objective": "lealla"}, "data": {}}
    same = {"train_steps": 9, "loss": {"objective": "lealla", "distilled_rows": 1.0,
                                       "cooldown_distilled_rows": 0.0, "cooldown_margin": None},
            "data": {"one_language_batches": False}}
    check_resumable(stored, same)
    with pytest.raises(ValueError, match="loss.cooldown_distilled_rows: 0.0 -> 1.0"):
        check_resumable(stored, {**same, "loss": {**same["loss"],
                                                  "cooldown_distilled_rows": 1.0}})
    with pytest.raises(ValueError, match="loss.cooldown_margin: None -> 0.3"):
        check_resumable(stored, {**same, "loss": {**same["loss"], "cooldown_margin": 0.3}})


def test_the_papers_defaults_follow_the_width():
    assert default_learning_rate(128) == 5e-4 and default_learning_rate(384) == 1e-3
    assert default_train_steps(128) == 100_000 and default_train_steps(256) == 200_000
    assert default_train_steps(768, "dimension_reduction") == 5000
    resolved = resolve_train_config(TrainConfig(encoder=ENCODER), 40, 12)
    assert resolved.encoder.vocabulary_size == 40  # the tokenizer's, not the preset's
    assert resolved.train_steps == 100_000 and resolved.optimizer.warmup_steps == 1000
    assert resolved.optimizer.learning_rate == 5e-4 and resolved.teacher_dimension == 12
    assert resolved.loss.weights == {"ams": 1.0, "fd": 1e3, "ld": 1e-2}  # lealla at d = 8
    given = dataclasses.replace(TrainConfig(encoder=ENCODER), train_steps=50,
                                loss=LossConfig(weights={"fd": 2.0}))
    resolved = resolve_train_config(given, 40, 12)
    assert resolved.optimizer.warmup_steps == 1 and resolved.loss.weights["fd"] == 2.0
    assert given.optimizer.warmup_steps is None  # resolution works on a copy


def test_the_teacher_sizes_what_the_objective_and_the_start_ask_for():
    first = resolve_train_config(TrainConfig(encoder=ENCODER, loss=LossConfig("ams+df")), 40, 12)
    assert (first.encoder.pooler_dim, first.encoder.output_dim) == (12, 8)
    bottleneck = TrainConfig(encoder=ENCODER, embedding_init="teacher_bottleneck",
                             embedding_init_source="t", loss=LossConfig("ams"))
    assert resolve_train_config(bottleneck, 40, 12).encoder.embedding_dim == 12
    with pytest.raises(ValueError, match="teacher_bottleneck needs a teacher"):
        resolve_train_config(bottleneck, 40, None)
    with pytest.raises(ValueError, match="needs a teacher: pass --teacher"):
        resolve_train_config(TrainConfig(encoder=ENCODER), 40, None)
    with pytest.raises(ValueError, match=r"terms not in the objective: \['mse'\]"):
        resolve_train_config(TrainConfig(encoder=ENCODER, loss=LossConfig(
            "ams", weights={"mse": 1.0})), 40, None)
    reduction = TrainConfig(encoder=ENCODER, student="dimension_reduction",
                            loss=LossConfig("ams"))
    resolved = resolve_train_config(reduction, 40, 12)
    assert (resolved.encoder.num_layers, resolved.train_steps) == (1, 5000)
    with pytest.raises(ValueError, match="AMS loss only"):
        resolve_train_config(dataclasses.replace(reduction, loss=LossConfig("lealla")), 40, 12)


def test_resume_refuses_changed_settings():
    stored = {"encoder": {"hidden_dim": 8}, "train_steps": 5, "loss": {"objective": "ams"}}
    check_resumable(stored, {"encoder": {"hidden_dim": 8}, "train_steps": 9,
                             "loss": {"objective": "ams"}})
    with pytest.raises(ValueError, match="loss.objective"):
        check_resumable(stored, {"encoder": {"hidden_dim": 8}, "train_steps": 5,
                                 "loss": {"objective": "lealla"}})


def test_only_how_long_and_how_often_may_change_on_resume():
    stored = {"train_steps": 5, "eval_every": 2, "optimizer": {"decay_fraction": 1.0,
                                                                "learning_rate": 1e-3},
              "tokenizer": {"vocab_file": "/old/vocab.txt"}}
    moved = {"train_steps": 50, "eval_every": 10, "optimizer": {"decay_fraction": 0.2,
                                                                 "learning_rate": 1e-3},
             "tokenizer": {"vocab_file": "/new/vocab.txt"}}
    check_resumable(stored, moved)
    assert "optimizer.decay_fraction" in RESUMABLE_CHANGES
    with pytest.raises(ValueError, match=r"optimizer.learning_rate: 0.001 -> 0.002"):
        check_resumable(stored, {**moved, "optimizer": {"decay_fraction": 0.2,
                                                        "learning_rate": 2e-3}})
