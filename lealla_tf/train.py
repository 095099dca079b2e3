"""Train a LEALLA student by distillation: `python -m lealla_tf.train`.

    python -m lealla_tf.train --preset=lealla_small --vocab_file=runs/vocab.txt \
        --train_data=runs/pairs_with_teacher --teacher_english_only \
        --model_dir=runs/small --tatoeba_dir=../shared/data/tatoeba_dev \
        [--tpu=local|grpc://host:port|<name> | --strategy=mirrored]

Teachers: --teacher=<dir with preprocessor/ and encoder/> (a LaBSE/2-format module,
e.g. from export/convert_teacher.py), or --teacher_encoder / --teacher_preprocessor
(paths or TF-Hub handles; the public LaBSE is --teacher_encoder=
https://tfhub.dev/google/LaBSE/2 --teacher_preprocessor=https://tfhub.dev/google/
universal-sentence-encoder-cmlm/multilingual-preprocess/2 and needs a network), or
TFRecord --train_data with precomputed teacher vectors.

Rerunning the same command resumes from the last checkpoint in --model_dir.
"""

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lealla_tf.train", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--preset", default="lealla_small",
        help="an encoder preset (python -m lealla_tf.presets) or dimension_reduction "
             "(Section 3.2: frozen teacher + dense layer to --reduction_dim, 5k steps)")
    add("--encoder_overrides", default="",
        help="change preset fields, e.g. num_layers=4,embedding_dim=64,num_unique_layers=2")
    add("--model_dir", required=True)
    add("--train_data", action="append", default=[],
        help="TSV (xx<TAB>en) or TFRecord files, dirs or globs; repeatable")
    add("--vocab_file", default=None,
        help="WordPiece vocabulary or SentencePiece .model (required for a new model_dir; "
             "LaBSE's cased_vocab.txt, or one from python -m lealla_tf.vocab)")
    add("--max_seq_length", type=int, default=128)
    add("--lower_case", action="store_true")
    add("--teacher", default="", help="LaBSE/2-format module directory (preprocessor/, encoder/)")
    add("--teacher_encoder", default="")
    add("--teacher_preprocessor", default="")
    add("--teacher_english_only", action="store_true",
        help="the teacher sees only the English side (monolingual teacher)")
    add("--reduction_dir", default="", help="dimension_reduction run for the syn objective")
    add("--reduction_dim", type=int, default=128, help="dimension_reduction: output size")
    add("--objective", default="lealla",
        help="'+'-joined terms of ams, fd, ld, df, syn, mse, mcl; or lealla (ams+fd+ld), "
             "reimers (mse), ding (mcl+mse)")
    add("--loss_weights", default="", help="e.g. fd=1e4,ld=1e-2 (default: the paper's)")
    add("--scale", type=float, default=100.0)
    add("--margin", type=float, default=0.3)
    add("--temperature", type=float, default=100.0)
    add("--global_batch_size", type=int, default=64)
    add("--train_steps", type=int, default=None,
        help="default: 100k for d <= 192, 200k for wider, 5k for dimension_reduction")
    add("--learning_rate", type=float, default=None,
        help="default: 1e-3 for d >= 384, else 5e-4")
    add("--warmup_steps", type=int, default=None, help="default: 1%% of train_steps")
    add("--weight_decay", type=float, default=0.01)
    add("--clip_norm", type=float, default=1.0)
    add("--language_alpha", type=float, default=0.3)
    add("--decontaminate", action="append", default=[],
        help="evaluation files or Tatoeba dirs whose sentences are dropped from training")
    add("--shuffle_buffer", type=int, default=10_000)
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
    add("--strategy", default="default", choices=("default", "mirrored", "tpu"))
    add("--tpu", default="", help="local, grpc://host:port or a Cloud TPU name")
    add("--no_progress", action="store_true")
    return parser


def parse_assignments(text: str, flag: str) -> dict:
    """`a=1,b=x` -> {"a": "1", "b": "x"}; ValueError naming the flag otherwise."""
    values = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} item {item!r} is not name=value")
        values[name.strip()] = value.strip()
    return values


def parse_weights(text: str) -> dict:
    """--loss_weights: term=float pairs."""
    return {name: float(value)
            for name, value in parse_assignments(text, "--loss_weights").items()}


def parse_overrides(text: str) -> dict:
    """--encoder_overrides: `a=1,b=none` -> {"a": 1, "b": None} (ints, floats, none, strings)."""
    def convert(value):
        if value.lower() == "none":
            return None
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
        return value

    return {name: convert(value)
            for name, value in parse_assignments(text, "--encoder_overrides").items()}


def resolve_config(args):
    """(TrainConfig, vocabulary file) from flags; for an existing model_dir the
    vocabulary inside it."""
    from lealla_tf.configs import EncoderConfig
    from lealla_tf.data import DataConfig
    from lealla_tf.model_dir import CONFIG_FILE, TokenizerConfig, read_model_config
    from lealla_tf.presets import get_preset
    from lealla_tf.tokenizer import Tokenizer
    from lealla_tf.trainer import (LossConfig, OptimizerConfig, TeacherConfig, TrainConfig,
                                   default_learning_rate, file_sha256, parse_objective)

    existing = os.path.exists(os.path.join(args.model_dir, CONFIG_FILE))
    vocab_file = args.vocab_file
    if vocab_file is None:
        if not existing:
            raise ValueError("--vocab_file is required for a new --model_dir")
        vocab_file = os.path.join(args.model_dir,
                                  read_model_config(args.model_dir)["tokenizer"]["vocab_file"])
    tokenizer = Tokenizer(vocab_file, max_seq_length=args.max_seq_length,
                          lower_case=args.lower_case)
    reduction = args.preset == "dimension_reduction"
    if reduction:
        encoder = EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1, num_heads=1,
                                hidden_dim=args.reduction_dim, intermediate_dim=1)
        objective = "ams"
        if args.objective not in ("lealla", "ams"):
            raise ValueError("dimension_reduction trains with the AMS loss only")
    else:
        encoder = get_preset(args.preset).encoder.replace(
            vocabulary_size=tokenizer.vocab_size, **parse_overrides(args.encoder_overrides))
        objective = args.objective
        if "df" in parse_objective(objective):
            # Distillation-first: a teacher-sized pooler, then a dense layer down to d.
            encoder = encoder.replace(pooler_dim=768, output_dim=encoder.hidden_dim)
    terms = parse_objective(objective)
    train_steps = args.train_steps or (5000 if reduction else
                                       100_000 if encoder.hidden_dim <= 192 else 200_000)
    config = TrainConfig(
        preset=args.preset, encoder=encoder,
        tokenizer=TokenizerConfig(max_seq_length=args.max_seq_length, lower_case=args.lower_case),
        data=DataConfig(train_data=list(args.train_data), language_alpha=args.language_alpha,
                        decontaminate=list(args.decontaminate),
                        shuffle_buffer=args.shuffle_buffer, seed=args.seed),
        teacher=TeacherConfig(path=args.teacher, encoder=args.teacher_encoder,
                              preprocessor=args.teacher_preprocessor,
                              english_only=args.teacher_english_only,
                              reduction_dir=args.reduction_dir),
        loss=LossConfig(objective=objective, scale=args.scale, margin=args.margin,
                        temperature=args.temperature, weights=parse_weights(args.loss_weights)),
        optimizer=OptimizerConfig(
            learning_rate=args.learning_rate or default_learning_rate(encoder.hidden_dim),
            warmup_steps=(args.warmup_steps if args.warmup_steps is not None
                          else max(1, train_steps // 100)),
            weight_decay=args.weight_decay, clip_norm=args.clip_norm),
        global_batch_size=args.global_batch_size, train_steps=train_steps,
        checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints,
        log_every=args.log_every, eval_every=args.eval_every, tatoeba_dir=args.tatoeba_dir,
        eval_max_pairs=args.eval_max_pairs, mixed_precision=args.mixed_precision,
        init_from=args.init_from, time_budget_minutes=args.time_budget_minutes,
        vocab_sha256=file_sha256(vocab_file))
    unknown_weights = sorted(set(config.loss.weights) - set(terms))
    if unknown_weights:
        raise ValueError(f"--loss_weights for terms not in the objective: {unknown_weights}")
    if not config.data.train_data:
        raise ValueError("--train_data is required")
    return config, vocab_file, existing


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # The TPU flag is checked before TensorFlow does anything with it.
    from lealla_tf.distribution import TPUUnavailableError, check_tpu_flag

    if args.tpu:
        try:
            check_tpu_flag(args.tpu)
        except TPUUnavailableError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    from lealla_tf.configs import config_to_dict
    from lealla_tf.distribution import make_strategy
    from lealla_tf.model_dir import read_model_config
    from lealla_tf.trainer import Trainer, check_resumable, format_summary

    try:
        config, vocab_file, existing = resolve_config(args)
        if existing:
            stored = read_model_config(args.model_dir)
            requested = config_to_dict(config)
            check_resumable({k: v for k, v in stored.items() if k in requested}, requested)
        strategy = make_strategy(args.strategy, args.tpu or None)
        trainer = Trainer(config, args.model_dir, strategy, vocab_file,
                          progress=not args.no_progress)
        summary = trainer.train()
    except (FileNotFoundError, ValueError, TPUUnavailableError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
