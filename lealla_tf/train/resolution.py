"""A `TrainConfig` checked and made whole: what a run may not be told
(`validate_train_config`), every default that depends on other settings
(`resolve_train_config`: the paper's loss weights and learning rate by width,
the step count, the distillation-first pooler sized from the teacher, filled in
from what the run actually has: the tokenizer's vocabulary and the teacher's
width), and what a resumed run may change (`check_resumable`).
"""

import copy

from lealla_tf.configs import EMBEDDING_INITS, STUDENTS, EncoderConfig, TeacherConfig, TrainConfig
from lealla_tf.losses.objectives import OBJECTIVES, TEACHER_LAYERS, parse_objective, terms_needing

# Settings that may change between a run and its resumption.
RESUMABLE_CHANGES = ("train_steps", "checkpoint_every", "eval_every", "log_every",
                     "time_budget_minutes", "keep_checkpoints", "eval_max_pairs", "jit_compile",
                     "optimizer.decay_fraction")


def default_learning_rate(hidden_dim: int) -> float:
    """Appendix B: 1e-3 for the wide models (d >= 384), 5e-4 for the thin ones."""
    return 1e-3 if hidden_dim >= 384 else 5e-4


def default_train_steps(hidden_dim: int, student: str = "encoder") -> int:
    """Appendix B / Section 3.2: 100k steps for d <= 192, 200k wider, 5k for reduction."""
    if student == "dimension_reduction":
        return 5000
    return 100_000 if hidden_dim <= 192 else 200_000


def _positive(name: str, value, allow_zero: bool = False) -> None:
    bad = value is None or isinstance(value, bool) or value < 0 or (value == 0 and not allow_zero)
    if bad:
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {value!r}")


def validate_train_config(config: TrainConfig) -> None:
    """ValueError naming the setting (as its flag) for an impossible run."""
    if config.student not in STUDENTS:
        raise ValueError(f"student must be one of {STUDENTS}, got {config.student!r}")
    if config.embedding_init not in EMBEDDING_INITS:
        raise ValueError(f"--embedding_init must be one of {EMBEDDING_INITS}, "
                         f"got {config.embedding_init!r}")
    if config.embedding_init == "teacher_select" and config.init_from:
        raise ValueError("--embedding_init=teacher_select sets every encoder layer from the "
                         "teacher, which would overwrite --init_from's weights: use one")
    if config.embedding_init != "random" and not config.embedding_init_source:
        raise ValueError(f"--embedding_init={config.embedding_init} needs "
                         "--embedding_init_source=<teacher module>")
    if config.teacher.in_step:
        if config.teacher.hub or config.teacher.english_only:
            raise ValueError("--teacher_in_step takes its teacher from --embedding_init_source "
                             "and embeds both sides: drop --teacher/--teacher_encoder and "
                             "--teacher_english_only")
        if config.student != "encoder" or not config.embedding_init_source:
            raise ValueError("--teacher_in_step runs the converted teacher on an encoder "
                             "student's tokens: pass --embedding_init_source=<converted teacher "
                             "with a SentencePiece vocabulary>")
    if not 0.0 <= config.progressive_depth < 1.0:
        raise ValueError(f"--progressive_depth must be in [0, 1), got {config.progressive_depth}")
    if config.progressive_depth and config.embedding_init != "teacher_select":
        raise ValueError("--progressive_depth inserts the pass-through layers of "
                         "--embedding_init=teacher_select late; this run has none")
    _positive("--global_batch_size", config.global_batch_size)
    if config.train_steps is not None:
        _positive("--train_steps", config.train_steps)
    _positive("--checkpoint_every", config.checkpoint_every)
    _positive("--log_every", config.log_every)
    _positive("--keep_checkpoints", config.keep_checkpoints)
    _positive("--eval_every", config.eval_every, allow_zero=True)
    _positive("--eval_max_pairs", config.eval_max_pairs, allow_zero=True)
    _positive("--time_budget_minutes", config.time_budget_minutes, allow_zero=True)
    _positive("--shuffle_buffer", config.data.shuffle_buffer)
    _positive("--teacher_center_pairs", config.teacher.center_pairs)
    if config.data.length_buckets < 0:
        raise ValueError(f"--length_buckets must be 0 (off) or positive, got "
                         f"{config.data.length_buckets}")
    if not 0.0 <= config.data.language_alpha <= 1.0:
        raise ValueError(f"--language_alpha must be in [0, 1], got {config.data.language_alpha}")
    optimizer = config.optimizer
    if optimizer.learning_rate is not None:
        _positive("--learning_rate", optimizer.learning_rate, allow_zero=True)
    if optimizer.warmup_steps is not None:
        _positive("--warmup_steps", optimizer.warmup_steps, allow_zero=True)
    _positive("--weight_decay", optimizer.weight_decay, allow_zero=True)
    _positive("--clip_norm", optimizer.clip_norm, allow_zero=True)
    if not 0.0 < optimizer.decay_fraction <= 1.0:
        raise ValueError(f"--decay_fraction must be in (0, 1], got {optimizer.decay_fraction}")
    if config.tokenizer.max_seq_length < 2:
        raise ValueError(f"--max_seq_length must be at least 2 ([CLS] and [SEP]), "
                         f"got {config.tokenizer.max_seq_length}")
    if (config.student == "encoder"
            and config.tokenizer.max_seq_length > config.encoder.max_sequence_length):
        raise ValueError(
            f"--max_seq_length={config.tokenizer.max_seq_length} exceeds the encoder's "
            f"position table of {config.encoder.max_sequence_length}; lower it or pass "
            f"--encoder_overrides=max_sequence_length={config.tokenizer.max_seq_length}")
    if config.loss.temperature <= 0 or config.loss.scale <= 0:
        raise ValueError("--temperature and --scale must be positive")
    if not 0 < config.loss.distilled_rows <= 1:  # NaN fails too
        raise ValueError(f"--distilled_rows must be in (0, 1], got {config.loss.distilled_rows}")
    if not 0 <= config.loss.cooldown_distilled_rows <= 1:
        raise ValueError("--cooldown_distilled_rows must be in [0, 1] (0: --distilled_rows "
                         f"throughout), got {config.loss.cooldown_distilled_rows}")
    if not 0 <= config.loss.margin < 1:
        raise ValueError(f"--margin must be in [0, 1) (a cosine gap), got {config.loss.margin}")
    if config.loss.cooldown_margin is not None and not 0 <= config.loss.cooldown_margin < 1:
        raise ValueError("--cooldown_margin must be in [0, 1) (a cosine gap; unset: --margin "
                         f"throughout), got {config.loss.cooldown_margin}")


def resolve_train_config(config: TrainConfig, vocabulary_size: int,
                         teacher_dimension: int | None) -> TrainConfig:
    """A copy of `config` with every default filled in from what the run has.

    - the encoder's vocabulary is the tokenizer's; dimension reduction gets
      its one-layer stand-in encoder of width `encoder.hidden_dim`;
    - a term with `teacher_width_pooler` (distillation-first, "df") makes the
      pooler the teacher's width, followed by a dense layer back down to d;
    - loss weights: each term's default from the objectives table (the
      paper's alpha, beta, gamma by width) unless given;
    - steps, warmup and learning rate: the paper's defaults for the width;
    - `teacher_dimension` is recorded.

    Raises ValueError when an objective term needs a teacher and there is
    none, or a weight names a term that is not in the objective.
    """
    validate_train_config(config)
    config = copy.deepcopy(config)
    terms = parse_objective(config.loss.objective)
    needs = [t for t in terms if OBJECTIVES[t].needs_teacher]
    if config.student == "dimension_reduction":
        if terms != ["ams"]:
            raise ValueError("dimension_reduction trains with the AMS loss only (--objective=ams)")
        needs = ["dimension_reduction"]
        config.encoder = EncoderConfig(vocabulary_size=vocabulary_size, num_layers=1,
                                       num_heads=1, hidden_dim=config.encoder.hidden_dim,
                                       intermediate_dim=1)
    else:
        config.encoder = config.encoder.replace(vocabulary_size=vocabulary_size)
    layered = terms_needing(terms, TEACHER_LAYERS)
    if layered and (config.student != "encoder"
                    or not (config.embedding_init_source or config.teacher.path)):
        raise ValueError(
            f"objective {config.loss.objective!r} ({', '.join(layered)}) runs the teacher on an "
            "encoder student's tokens: pass --embedding_init_source=<converted teacher with a "
            "SentencePiece vocabulary> (or --teacher=<it>) and train an encoder student")
    if layered and config.embedding_init != "teacher_select" and not config.init_from:
        raise ValueError(
            f"objective {config.loss.objective!r} ({', '.join(layered)}) distils the teacher's "
            "layers at the coordinates weight selection gives the student: pass "
            "--embedding_init=teacher_select (or --init_from=<a run that started from it>)")
    if needs and not teacher_dimension:
        raise ValueError(
            f"objective {config.loss.objective!r} ({', '.join(needs)}) needs a teacher: pass "
            "--teacher=<LaBSE/2-format module> or TFRecord training data with precomputed "
            "teacher vectors")
    if config.embedding_init == "teacher_bottleneck":
        if not teacher_dimension:
            raise ValueError("--embedding_init=teacher_bottleneck needs a teacher (its width is "
                             "the bottleneck's)")
        config.encoder = config.encoder.replace(embedding_dim=teacher_dimension)
    if any(OBJECTIVES[t].teacher_width_pooler for t in terms):
        config.encoder = config.encoder.replace(pooler_dim=teacher_dimension,
                                                output_dim=config.encoder.hidden_dim)
    unknown = sorted(set(config.loss.weights) - set(terms))
    if unknown:
        raise ValueError(f"--loss_weights for terms not in the objective: {unknown}")
    config.loss.weights = {t: float(config.loss.weights.get(
        t, OBJECTIVES[t].default_weight(config.encoder.hidden_dim))) for t in terms}
    if config.train_steps is None:
        config.train_steps = default_train_steps(config.encoder.hidden_dim, config.student)
    if config.optimizer.warmup_steps is None:
        config.optimizer.warmup_steps = max(1, config.train_steps // 100)
    if config.optimizer.learning_rate is None:
        config.optimizer.learning_rate = default_learning_rate(config.encoder.hidden_dim)
    config.teacher_dimension = teacher_dimension
    return config


# Settings added after model directories were first written, with the value
# such a directory ran with: a stored config without them resumes when the new
# run keeps that value.
ADDED_SETTINGS = {**{f"teacher.{name}": getattr(TeacherConfig, name)
                     for name in ("center", "center_pairs", "in_step")},
                  "progressive_depth": 0.0, "loss.distilled_rows": 1.0,
                  "loss.cooldown_distilled_rows": 0.0, "loss.cooldown_margin": None,
                  "data.one_language_batches": False}


def check_resumable(stored: dict, requested: dict) -> None:
    """Raises ValueError listing settings that differ from the stored run's.

    Only `RESUMABLE_CHANGES` (how long and how often) may change between a run
    and its resumption; the vocabulary file may move.
    """
    def flatten(values, prefix=""):
        flat = {}
        for key, value in values.items():
            if isinstance(value, dict) and key != "weights":
                flat.update(flatten(value, f"{prefix}{key}."))
            else:
                flat[prefix + key] = value
        return flat

    old, new = flatten(stored), flatten(requested)
    old = {**{k: v for k, v in ADDED_SETTINGS.items() if k in new}, **old}
    differences = [f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
                   for key in sorted(set(old) | set(new))
                   if key not in RESUMABLE_CHANGES and key != "tokenizer.vocab_file"
                   and old.get(key) != new.get(key)]
    if differences:
        raise ValueError("model_dir holds a run with different settings; use a new "
                         "--model_dir or the same flags:\n  " + "\n  ".join(differences))
