r"""Train a LEALLA student by distillation: `python -m lealla_tf.train`.

On a CPU, start with the main job instead: `python -m lealla_tf.recipe` (what
`make main` runs; `--data_dir` for your own pairs) plans the student's steps to a
time budget on this machine, then exports and evaluates it. This command's default
step counts are the paper's, sized for accelerators.

    python -m lealla_tf.train --preset=lealla_small --vocab_file=runs/vocab.txt \
        --train_data=runs/pairs_with_teacher --model_dir=runs/small \
        --tatoeba_dir=../shared/data/tatoeba_dev \
        [--tpu=local|grpc://host:port|<name> | --strategy=mirrored|multi_worker]

Teachers: --teacher=<dir with preprocessor/ and encoder/> (a LaBSE/2-format module,
e.g. from export/convert_teacher.py), or --teacher_encoder / --teacher_preprocessor
(paths or TF-Hub handles; the public LaBSE is --teacher_encoder=
https://tfhub.dev/google/LaBSE/2 --teacher_preprocessor=https://tfhub.dev/google/
universal-sentence-encoder-cmlm/multilingual-preprocess/2 and needs a network), or
TFRecord --train_data with precomputed teacher vectors. A multilingual teacher gives
both-side targets; --teacher_english_only is for monolingual teachers.

Rerunning the same command resumes from the last checkpoint in --model_dir.
This module only parses flags; the work is `lealla_tf.train.launch.train`.
"""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import argparse
import sys

from lealla_tf.flags import ArgumentParser, HelpFormatter, parse_overrides, parse_weights


def build_parser() -> argparse.ArgumentParser:
    from lealla_tf.configs import EMBEDDING_INITS, TeacherConfig
    from lealla_tf.losses.objectives import objective_help

    parser = ArgumentParser(
        prog="python -m lealla_tf.train", description=__doc__,
        formatter_class=HelpFormatter)
    add = parser.add_argument
    add("--preset", default="lealla_small",
        help="an encoder preset (lealla-presets lists them) or dimension_reduction "
             "(Section 3.2: frozen teacher + dense layer to --reduction_dim, 5k steps)")
    add("--encoder_overrides", default="",
        help="change preset fields, e.g. num_layers=4,embedding_dim=64,num_unique_layers=2")
    add("--model_dir", required=True)
    add("--train_data", action="append", default=[],
        help="TSV (xx<TAB>en) or TFRecord files, dirs or globs; repeatable")
    add("--vocab_file", default=None,
        help="WordPiece vocabulary or SentencePiece .model (required for a new model_dir; "
             "LaBSE's cased_vocab.txt, or one from python -m lealla_tf.cli.vocab)")
    add("--max_seq_length", type=int, default=128)
    add("--lower_case", action="store_true")
    add("--teacher", default="", help="LaBSE/2-format module directory (preprocessor/, encoder/)")
    add("--teacher_encoder", default="")
    add("--teacher_preprocessor", default="")
    add("--teacher_english_only", action="store_true",
        help="the teacher sees only the English side (monolingual teacher)")
    add("--teacher_center", action="store_true",
        help="distil from centred teacher vectors (v - mean) / |v - mean|, the mean "
             "estimated on the first --teacher_center_pairs training pairs")
    add("--teacher_center_pairs", type=int, default=TeacherConfig.center_pairs)
    add("--teacher_in_step", action="store_true",
        help="teacher vectors from the converted teacher of --embedding_init_source run in "
             "the step on the student's own tokens (the pass the hd term runs anyway): "
             "plain TSV training data, no precomputed vectors")
    add("--reduction_dir", default="", help="dimension_reduction run for the syn objective")
    add("--reduction_dim", type=int, default=128, help="dimension_reduction: output size")
    add("--objective", default="lealla", help=objective_help())
    add("--loss_weights", default="", help="e.g. fd=1e4,ld=1e-2 (default: the paper's)")
    add("--scale", type=float, default=100.0)
    add("--margin", type=float, default=0.3)
    add("--temperature", type=float, default=100.0)
    add("--distilled_rows", type=float, default=1.0,
        help="the share of each batch's pairs the teacher runs on and the distillation terms "
             "read (AMS reads every pair); 1: all")
    add("--cooldown_distilled_rows", type=float, default=0.0,
        help="that share while the rate decays (the last --decay_fraction of the steps after "
             "warmup: every one at --decay_fraction=1); 0: --distilled_rows throughout")
    add("--cooldown_margin", type=float, default=None,
        help="the AMS margin while the rate decays; unset: --margin throughout")
    add("--embedding_init", default="random",
        help=f"one of {', '.join(EMBEDDING_INITS)} (needs --embedding_init_source)")
    add("--embedding_init_source", default="", help="teacher module for --embedding_init")
    add("--global_batch_size", type=int, default=64)
    add("--train_steps", type=int, default=None,
        help="default: 100k for d <= 192, 200k for wider, 5k for dimension_reduction")
    add("--learning_rate", type=float, default=None,
        help="default: 1e-3 for d >= 384, else 5e-4")
    add("--warmup_steps", type=int, default=None,
        help="0: none; default: 1%% of train_steps")
    add("--weight_decay", type=float, default=0.01)
    add("--clip_norm", type=float, default=1.0, help="global gradient-norm clip; 0: none")
    add("--decay_fraction", type=float, default=1.0,
        help="the share of the steps after warmup over which the rate decays; below 1 the "
             "rate holds at its peak until then (warmup-stable-decay)")
    add("--progressive_depth", type=float, default=0.0,
        help="the share of the steps during which the student skips the pass-through layers "
             "of --embedding_init=teacher_select (inserted, as initialised, for the rest); "
             "0: every layer from the start")
    add("--language_alpha", type=float, default=0.3)
    add("--decontaminate", action="append", default=[],
        help="evaluation files or Tatoeba dirs whose sentences are dropped from training")
    add("--shuffle_buffer", type=int, default=10_000)
    add("--length_buckets", type=int, default=0,
        help="batch pairs of similar length (this many buckets of 32 UTF-8 bytes); 0: off")
    add("--one_language_batches", action="store_true",
        help="each batch holds one language's pairs: a sentence's negatives are of its own "
             "language (see lealla_tf.configs.DataConfig)")
    add("--seed", type=int, default=0)
    add("--tatoeba_dir", default="", help="dev evaluation (Tatoeba P@1) directory")
    add("--eval_every", type=int, default=0, help="steps between dev evaluations (0: none)")
    add("--eval_max_pairs", type=int, default=0, help="pairs per language in dev eval (0: all)")
    add("--checkpoint_every", type=int, default=200)
    add("--keep_checkpoints", type=int, default=3)
    add("--log_every", type=int, default=10)
    add("--time_budget_minutes", type=float, default=0.0,
        help="stop (with a checkpoint) after this long; 0 for no limit")
    add("--mixed_precision", action="store_true", help="bfloat16 compute")
    add("--init_from", default="", help="model_dir whose encoder initialises the student")
    add("--strategy", default="default", choices=("default", "mirrored", "multi_worker", "tpu"),
        help="mirrored: this machine's GPUs (or CPUs); multi_worker: MultiWorkerMirroredStrategy "
             "over the processes in TF_CONFIG (every worker runs this same command; worker 0 "
             "writes --model_dir, which all must be able to read)")
    add("--tpu", default="", help="local, grpc://host:port or a Cloud TPU name")
    add("--jit_compile", nargs="?", const="true", default="auto",
        choices=("auto", "true", "false"),
        help="run the training step XLA-compiled, as a TPU runs it (no fused CPU kernels, "
             "batches padded to a few fixed lengths); auto: on under --tpu, off elsewhere "
             "(default: auto)")
    add("--no_progress", action="store_true")
    return parser


def check_flags(args) -> None:
    """What `validate_train_config` cannot tell from a config: ValueError
    naming the flag. A budget of nan minutes stopped nothing, and a negative
    seed failed in Keras naming no flag."""
    budget = args.time_budget_minutes
    if not 0 <= budget < float("inf"):
        raise ValueError(f"--time_budget_minutes must be a number of minutes (0: no limit), "
                         f"got {budget:g}")
    if not 0 <= args.seed < 2 ** 32:
        raise ValueError(f"--seed must be a non-negative integer below 2**32, got {args.seed}")
    if args.reduction_dim < 1:
        raise ValueError(f"--reduction_dim must be a positive integer, got {args.reduction_dim}")


def config_from_flags(args):
    """The (unresolved) `TrainConfig` the flags describe."""
    from lealla_tf.configs import (
        DataConfig,
        LossConfig,
        OptimizerConfig,
        TeacherConfig,
        TokenizerConfig,
        TrainConfig,
    )
    from lealla_tf.models.presets import student_preset

    student, encoder, objective = student_preset(
        args.preset, parse_overrides(args.encoder_overrides), args.reduction_dim, args.objective)
    return TrainConfig(
        preset=args.preset, student=student, encoder=encoder,
        tokenizer=TokenizerConfig(max_seq_length=args.max_seq_length, lower_case=args.lower_case),
        data=DataConfig(train_data=list(args.train_data), language_alpha=args.language_alpha,
                        decontaminate=list(args.decontaminate),
                        shuffle_buffer=args.shuffle_buffer,
                        length_buckets=args.length_buckets,
                        one_language_batches=args.one_language_batches, seed=args.seed),
        teacher=TeacherConfig(path=args.teacher, encoder=args.teacher_encoder,
                              preprocessor=args.teacher_preprocessor,
                              english_only=args.teacher_english_only,
                              reduction_dir=args.reduction_dir, center=args.teacher_center,
                              center_pairs=args.teacher_center_pairs,
                              in_step=args.teacher_in_step),
        loss=LossConfig(objective=objective, scale=args.scale, margin=args.margin,
                        temperature=args.temperature, weights=parse_weights(args.loss_weights),
                        distilled_rows=args.distilled_rows,
                        cooldown_distilled_rows=args.cooldown_distilled_rows,
                        cooldown_margin=args.cooldown_margin),
        optimizer=OptimizerConfig(learning_rate=args.learning_rate,
                                  warmup_steps=args.warmup_steps,
                                  weight_decay=args.weight_decay, clip_norm=args.clip_norm,
                                  decay_fraction=args.decay_fraction),
        embedding_init=args.embedding_init, embedding_init_source=args.embedding_init_source,
        global_batch_size=args.global_batch_size, train_steps=args.train_steps,
        checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints,
        log_every=args.log_every, eval_every=args.eval_every, tatoeba_dir=args.tatoeba_dir,
        eval_max_pairs=args.eval_max_pairs, mixed_precision=args.mixed_precision,
        init_from=args.init_from, time_budget_minutes=args.time_budget_minutes,
        progressive_depth=args.progressive_depth,
        jit_compile={"auto": None, "true": True, "false": False}[args.jit_compile])


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # The TPU flag is checked before TensorFlow does anything with it.
    from lealla_tf.folder_lock import FolderInUseError
    from lealla_tf.train.distribution import TPUUnavailableError, check_tpu_flag

    try:
        check_flags(args)
        if args.tpu:
            check_tpu_flag(args.tpu)
        config = config_from_flags(args)
        from lealla_tf.train.distribution import make_strategy
        from lealla_tf.train.launch import train
        from lealla_tf.train.logs import format_summary

        strategy = make_strategy(args.strategy, args.tpu or None)
        summary = train(config, args.model_dir, args.vocab_file, strategy,
                        progress=not args.no_progress)
    except (FileNotFoundError, ValueError, TPUUnavailableError, FolderInUseError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
