"""Launching a training run, as one library call: `train(config, model_dir,
vocab_file) -> summary`.

What `python -m lealla_tf.train` and the main job both call: everything before
the first step, then the `Trainer` (`lealla_tf.train.trainer`, which runs the
steps). It finds and checks the data (every file readable, at least one
well-formed pair; the lines skipped are printed by kind) BEFORE anything is
written, builds the teacher, resolves the config's defaults from the tokenizer
and the teacher
(`lealla_tf.train.resolution.resolve_train_config`), refuses to resume a model
directory with other settings, takes the model directory's one-writer lock,
writes `config.json`, and runs the `DistillationTask` with a `Trainer`.
"""

import contextlib
import hashlib
import os

import keras
import tensorflow as tf

from lealla_tf.configs import TrainConfig, config_to_dict
from lealla_tf.folder_lock import check_folder, hold_folder, release_folder
from lealla_tf.models.model_dir import (
    CONFIG_FILE,
    build_tokenizer,
    latest_checkpoint,
    read_model_config,
    write_model_config,
)
from lealla_tf.parallel_corpus import CorpusCounts
from lealla_tf.teachers.sources import build_teacher
from lealla_tf.train.data import find_training_files, language_sizes, precomputed_teacher_layout
from lealla_tf.train.distribution import worker_role
from lealla_tf.train.resolution import check_resumable, resolve_train_config, validate_train_config
from lealla_tf.train.task import DistillationTask, build_teacher_layers
from lealla_tf.train.trainer import Trainer


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_vocab_file(model_dir: str) -> str | None:
    """The vocabulary inside an existing model directory, or None for a new one."""
    if not os.path.exists(os.path.join(model_dir, CONFIG_FILE)):
        return None
    return os.path.join(model_dir, read_model_config(model_dir)["tokenizer"]["vocab_file"])


def check_model_dir(model_dir: str) -> None:
    """ValueError when `model_dir` cannot be a model directory: it is a file, or
    it cannot be created (a local path under a file or in a read-only place)."""
    check_folder(model_dir, f"--model_dir={model_dir}")


def prepare(config: TrainConfig, model_dir: str, vocab_file: str | None = None,
            strategy=None):
    """Everything `train` does before the first step; returns
    (resolved config, tokenizer, teacher, files, sizes, strategy, vocab file)."""
    check_model_dir(model_dir)
    validate_train_config(config)
    existing_vocab = model_vocab_file(model_dir)
    vocab_file = vocab_file or existing_vocab
    if vocab_file is None:
        raise ValueError("--vocab_file is required for a new --model_dir")
    if not config.data.train_data:
        raise ValueError("--train_data is required")
    strategy = strategy or tf.distribute.get_strategy()
    if config.global_batch_size % strategy.num_replicas_in_sync:
        raise ValueError(f"--global_batch_size={config.global_batch_size} is not divisible by "
                         f"{strategy.num_replicas_in_sync} replicas")
    files = find_training_files(config.data.train_data)
    corpus = CorpusCounts()
    sizes = language_sizes(files, corpus)
    # The pairs read and the lines skipped, by kind and file, as the main job's
    # sample says them: the stream skips the same lines (`parallel_corpus.parse_line`).
    print(corpus.describe(), flush=True)
    tokenizer = build_tokenizer(config.tokenizer, vocab_file)
    with strategy.scope():
        layers = build_teacher_layers(config, tokenizer) if config.teacher.in_step else None
        # Only a teacher that reads the records needs their vectors' layout.
        reads_records = not (config.teacher.in_step or config.teacher.hub)
        teacher = build_teacher(config.teacher, precomputed_teacher_layout(files)
                                if reads_records else None, layers)
    resolved = resolve_train_config(config, tokenizer.vocab_size,
                                    teacher.dimension if teacher else None)
    resolved.vocab_sha256 = file_sha256(vocab_file)
    if existing_vocab is not None and latest_checkpoint(model_dir) is not None:
        stored = read_model_config(model_dir)
        requested = config_to_dict(resolved)
        check_resumable({k: v for k, v in stored.items() if k in requested}, requested)
    return resolved, tokenizer, teacher, files, sizes, strategy, vocab_file


def build_trainer(config: TrainConfig, model_dir: str, vocab_file: str | None = None,
                  strategy=None, progress: bool = True,
                  writer: contextlib.ExitStack | None = None):
    """A `Trainer` ready to run `config` in `model_dir` (see `train`).

    `config.json` is written here, after every check passed; a model directory
    with no checkpoint yet takes the new settings. Across worker processes only
    the chief writes it (the others read model_dir, see `Trainer`).

    With `writer`, the chief takes model_dir's one-writer lock before it writes
    anything (`lealla_tf.folder_lock`; FolderInUseError naming the pid of a run
    writing it already) and `writer` releases it when it closes.
    """
    # One seed fixes initialisation, dropout and the data order: two runs of the
    # same command train the same model. It is set before anything is built.
    keras.utils.set_random_seed(config.data.seed)
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16" if config.mixed_precision
                                           else "float32")
    resolved, tokenizer, teacher, files, sizes, strategy, vocab_file = prepare(
        config, model_dir, vocab_file, strategy)
    if writer is not None and worker_role(strategy).chief:
        writer.callback(release_folder, hold_folder(model_dir, f"--model_dir={model_dir}"))
    task = DistillationTask(resolved, strategy, tokenizer, teacher, files, sizes)
    trainer = Trainer(task, model_dir, progress=progress)
    if trainer.role.chief and trainer.manager.latest_checkpoint is None:
        values = config_to_dict(resolved)
        write_model_config(model_dir, resolved.encoder, resolved.tokenizer,
                           source_vocab_file=vocab_file,
                           **{k: v for k, v in values.items()
                              if k not in ("encoder", "tokenizer")})
    return trainer


def train(config: TrainConfig, model_dir: str, vocab_file: str | None = None,
          strategy=None, progress: bool = True, planner=None) -> dict:
    """Trains (or resumes) the model of `config` in `model_dir`; returns the summary.
    Keras' global dtype policy is the caller's again when it returns.

    Args:
        config: a `TrainConfig`; None fields are resolved (see
            `lealla_tf.train.resolution.resolve_train_config`).
        model_dir: new, or one written by an earlier run with the same settings.
        vocab_file: the student's vocabulary (required for a new model_dir).
        strategy: a tf.distribute strategy (default: the current one). With a
            MultiWorkerMirroredStrategy every worker process calls this with
            the same arguments (model_dir on a file system they share); each
            reads its share of every global batch.
        progress: show a progress bar.
        planner: lets the run decide its own length while it warms up (see
            `lealla_tf.train.trainer.Trainer.train`); one process only.

    Raises:
        FileNotFoundError / ValueError with a message naming the setting;
        `lealla_tf.folder_lock.FolderInUseError` while another run writes
        model_dir (one writer a folder: the lock lasts until this returns).
    """
    policy = keras.mixed_precision.global_policy()
    with contextlib.ExitStack() as writer:
        # The run sets Keras' global dtype policy for what it builds; the
        # caller's comes back after it, so a model built later is not silently
        # bfloat16.
        writer.callback(keras.mixed_precision.set_dtype_policy, policy)
        return build_trainer(config, model_dir, vocab_file, strategy, progress,
                             writer).train(planner)
