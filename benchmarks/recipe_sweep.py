r"""Benchmark: what does a lever of the recipe gain? The main job's student retrained
with other training flags, scored as the main job.

    make main   # once: the teacher, vocabulary and sample this reuses
    python -m benchmarks.recipe_sweep --work_dir=runs/recipe \
        --variant=main_job= --variant=lr1e-3=--learning_rate=1e-3 \
        --variant=ams_lr1e-3='--objective=ams --learning_rate=1e-3' \
        --output_json=benchmarks/results/recipe_sweep.json

Each `--variant=NAME=FLAGS` is the main job (`python -m lealla_tf.recipe`) with
FLAGS added, and only its training stage: the same teacher, pruned vocabulary,
sample, seed and start (weight selection), from the finished job in --work_dir,
so a row differs from the main job's student in FLAGS alone (an empty FLAGS is
the main job's student itself, retrained). Only flags that shape training may
vary (steps, learning rate, warmup, objective, loss weights, batch, length,
pooling...), or the sample's (`--language_alpha`, `--sample_pairs`: the row
draws its own sample); a flag that would need another teacher or vocabulary is
refused.

Every row is scored as the main job scores its student: on ALL of tatoeba_dev,
and on the held-out news set (mining F1 and P@1, when the main job had one);
also on the first 300 pairs a language (its per-language plot's pairs) and along
the way on the first 50 (the training curve), with the training seconds of each
point. Each
variant trains in its own process, under --work_dir/sweep/NAME; a finished one is
reused when the script is rerun.
"""

import argparse
import json
import multiprocessing
import os
import pathlib
import shlex
import sys

from benchmarks.common import machine, stop_signals_passed_to, write_result

# The recipe flags a row may change: they shape only the training stage, or
# (SAMPLE_FLAGS) the sample, which a row then draws for itself (it is cheap;
# the teacher and vocabulary are not, and stay the main job's).
SAMPLE_FLAGS = ("language_alpha", "sample_pairs", "seed")
TRAINING_FLAGS = SAMPLE_FLAGS + (
    "train_steps", "learning_rate", "warmup_steps", "decay_fraction", "clip_norm", "scale",
    "margin", "cooldown_margin", "distilled_rows", "cooldown_distilled_rows", "progressive_depth",
    "objective", "loss_weights", "global_batch_size", "max_seq_length", "length_buckets",
    "one_language_batches", "pooling", "encoder_overrides", "dropout", "embedding_init",
    "teacher_center", "eval_every", "eval_max_pairs", "mixed_precision")


def parse_variant(text: str):
    """'NAME=FLAGS' -> (NAME, [flags]); ValueError naming what is wrong."""
    name, equals, flags = text.partition("=")
    if not equals or not name or not name.replace("_", "").replace("-", "").replace(
            ".", "").isalnum():
        raise ValueError(f"--variant={text!r}: write NAME=FLAGS, NAME of letters, digits, "
                         "'_', '-' or '.' (FLAGS may be empty: the main job's own student)")
    from lealla_tf.recipe.command_line import config_from_flags, flag_values

    argv = shlex.split(flags)
    defaults = flag_values([])
    try:
        parsed = flag_values(argv)
    except ValueError as error:
        raise ValueError(f"--variant={text!r}: {error}") from None
    changed = sorted(k for k in parsed if parsed[k] != defaults[k])
    refused = [k for k in changed if k not in TRAINING_FLAGS]
    if refused:
        raise ValueError(f"--variant={text!r}: {', '.join('--' + k for k in refused)} would "
                         "need another teacher or vocabulary than the main job's; "
                         f"a row may change only --{', --'.join(TRAINING_FLAGS)}")
    from lealla_tf.losses.objectives import OBJECTIVES, parse_objective
    from lealla_tf.recipe.training import (
        check_learning_rates,
        student_loss_weights,
        student_train_config,
        teacher_in_step,
    )

    try:
        config = config_from_flags(parsed)
        check_learning_rates(config)
        needs_vectors = any(OBJECTIVES[t].needs_teacher
                            for t in parse_objective(config.objective))
        if needs_vectors and not teacher_in_step(config):
            raise ValueError(f"--objective={config.objective} needs teacher vectors, which only "
                             "an hd objective takes from the teacher in the step; the main "
                             "job's Beam teacher-vectors stage is not run here")
        # The training settings checked now, as the main job checks them (steps,
        # overrides, weights...), not in the child after minutes.
        student_train_config(config, pathlib.Path("data"), {"tokenizer": "sentencepiece",
                                                            "multilingual": True},
                             "teacher", "sample", config.objective,
                             student_loss_weights(config), teacher_in_step(config))
    except ValueError as error:
        raise ValueError(f"--variant={text!r}: {error}") from None
    return name, argv


def finished_stage(work_dir: str, name: str) -> dict:
    path = os.path.join(work_dir, "stages", f"{name}.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: run the main job (make main) with "
                                f"--work_dir={work_dir} first; this benchmark reuses its "
                                "teacher, vocabulary and sample")
    with open(path) as f:
        return json.load(f)["result"]


def resolved_recipe(argv) -> dict:
    """The main job's training settings with `argv` (what a row trained with,
    whatever the defaults were then: a finished row is reused only while they
    are the same)."""
    import dataclasses

    from lealla_tf.recipe.command_line import recipe_config

    settings = dataclasses.asdict(recipe_config(argv))
    return json.loads(json.dumps({k: settings[k] for k in TRAINING_FLAGS}))


def recorded_recipe(trained: dict) -> dict:
    """A finished row's settings, a flag added since it trained at the value it
    trained with (`lealla_tf.recipe.stages.with_added_flags`)."""
    from lealla_tf.recipe.stages import with_added_flags

    recipe = trained.get("recipe") or {}
    return with_added_flags(recipe, TRAINING_FLAGS) if recipe else recipe


def train_variant(name, argv, work_dir, data_dir, result_file):
    """Runs in a fresh process: the main job's training stage with `argv`, then
    the evaluation; writes `result_file`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import dataclasses
    import time

    from benchmarks.common import machine as this_machine
    from lealla_tf import load_embedder
    from lealla_tf.evaluation.news import NEWS_PRIMARY_METRIC
    from lealla_tf.evaluation.tatoeba import (
        TATOEBA_PRIMARY_METRIC,
        embed_tatoeba,
        first_pairs,
        tatoeba_metrics_with_margin,
    )
    from lealla_tf.models.model_dir import read_model_config
    from lealla_tf.recipe.command_line import flag_values, recipe_config
    from lealla_tf.recipe.corpus import sample_stage
    from lealla_tf.recipe.evaluations import news_stage
    from lealla_tf.recipe.stages import Models
    from lealla_tf.recipe.training import (
        mixed_precision,
        student_loss_weights,
        student_train_config,
        teacher_in_step,
    )
    from lealla_tf.train.launch import train

    config = recipe_config(argv)
    teacher = finished_stage(work_dir, "teacher")
    vocabulary = finished_stage(work_dir, "vocabulary")
    weights = student_loss_weights(config)
    data_dir = pathlib.Path(data_dir)
    in_step = teacher_in_step(config)
    model_dir = os.path.join(work_dir, "sweep", name)
    config = dataclasses.replace(config, mixed_precision=mixed_precision(config, model_dir))
    sample = os.path.join(work_dir, "sample")
    with open(os.path.join(work_dir, "stages", "sample.json")) as f:
        drawn = json.load(f).get("settings") or {}  # what the job's sample was drawn with
    defaults = flag_values([])  # an older job's settings lack a flag
    if any(getattr(config, flag) != drawn.get(flag, defaults[flag]) for flag in SAMPLE_FLAGS):
        sample = os.path.join(work_dir, "sweep", name + "_sample")
        if not os.path.exists(os.path.join(sample, "DONE")):
            sample_stage(config, data_dir, sample)
            open(os.path.join(sample, "DONE"), "w").close()
    try:
        # The flags as they are (no `steps`): the row's --train_steps and --eval_every.
        train_settings = student_train_config(config, data_dir, teacher,
                                              os.path.join(work_dir, "teacher"), sample,
                                              config.objective, weights, in_step)
        summary = train(train_settings, model_dir, vocabulary["output"], progress=False)
    except (ValueError, FileNotFoundError) as error:  # the job's and the trainer's refusals
        print(f"error: {name}: {error}".replace("\n", "; "), file=sys.stderr)
        sys.exit(2)
    if summary["final_step"] < train_settings.train_steps:  # stopped by a signal
        sys.exit(130)
    start = time.time()
    embedded = embed_tatoeba(load_embedder(model_dir), str(data_dir / "tatoeba_dev"))
    all_pairs = tatoeba_metrics_with_margin(embedded, time.time() - start)
    first_300 = tatoeba_metrics_with_margin(first_pairs(embedded, 300), 1.0)
    news_set = finished_stage(work_dir, "news_set")
    news = news_stage({name: model_dir}, os.path.join(work_dir, "news"), news_set["languages"],
                      vocabulary["output"], Models()).get(name, {})
    optimizer = read_model_config(model_dir)["optimizer"]  # as resolved for the run
    result = {"flags": argv, "recipe": resolved_recipe(argv),
              "objective": config.objective, "loss_weights": weights,
              "learning_rate": optimizer["learning_rate"],
              "warmup_steps": optimizer["warmup_steps"],
              "mixed_precision": train_settings.mixed_precision,
              "steps": summary["final_step"], "train_seconds": summary["train_seconds"],
              "stage_seconds": summary["seconds"],
              # A row stopped and rerun resumes: its time, speed and curve are then
              # the last part's only, and say so.
              "resumed_from_step": summary["start_step"],
              "pairs_per_second": (summary["final_step"] - summary["start_step"])
              * train_settings.global_batch_size / max(summary["train_seconds"], 1e-9),
              "p_at_1_all_pairs": all_pairs[TATOEBA_PRIMARY_METRIC],
              "p_at_1_first_300": first_300[TATOEBA_PRIMARY_METRIC],
              "news_mining_f1": news.get(NEWS_PRIMARY_METRIC),
              "news_p_at_1": news.get("news_length/average_p_at_1"),
              "news_gold_pairs": news.get("news/gold_pairs"),
              "sentences_per_second": all_pairs["tatoeba/sentences_per_second"],
              "curve_first_50": summary["evaluations"], "machine": this_machine()}
    with open(result_file + ".tmp", "w") as f:
        json.dump(result, f, indent=2, default=str)
    os.replace(result_file + ".tmp", result_file)  # a killed child leaves no half file


def read_json(path: str) -> dict:
    """A JSON file of this benchmark's; ValueError naming it when it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} cannot be read ({error}); delete it to start it over") \
            from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default="runs/recipe", help="a finished main job's")
    parser.add_argument("--data_dir", default=None, help="default: ../shared/data")
    parser.add_argument("--variant", action="append", default=[], required=True,
                        help="NAME=FLAGS (repeat); FLAGS are the main job's training flags")
    parser.add_argument("--output_json", required=True)
    args = parser.parse_args(argv)
    from lealla_tf.recipe.settings import find_data_dir

    try:
        variants = [parse_variant(v) for v in args.variant]
        data_dir = find_data_dir(args.data_dir)
        finished_stage(args.work_dir, "teacher")
        finished_stage(args.work_dir, "vocabulary")
        finished_stage(args.work_dir, "sample")
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    names = [n for n, _ in variants]
    if len(set(names)) != len(names):
        print(f"error: --variant names repeat: {names}", file=sys.stderr)
        return 2
    results = {}
    context = multiprocessing.get_context("spawn")
    os.makedirs(os.path.join(args.work_dir, "sweep"), exist_ok=True)
    for name, flags in variants:
        result_file = os.path.join(args.work_dir, "sweep", f"{name}.json")
        try:
            trained = read_json(result_file) if os.path.exists(result_file) else None
        except ValueError as error:
            print(f"error: {error} (and {result_file[:-5]}/)", file=sys.stderr)
            return 2
        if trained is not None and recorded_recipe(trained) != resolved_recipe(flags):
            print(f"error: {result_file} was trained with other settings (flags "
                  f"{trained.get('flags')}, the defaults of its day) than --variant={name}="
                  f"{' '.join(flags)} gives now; name the variant otherwise, or delete "
                  f"{result_file} and {result_file[:-5]}/", file=sys.stderr)
            return 2
        if not os.path.exists(result_file):
            process = context.Process(target=train_variant, args=(
                name, flags, args.work_dir, str(data_dir), result_file))
            process.start()
            with stop_signals_passed_to(process.pid) as stopped:
                process.join()
            if stopped or process.exitcode == 130:
                print(f"{name}: stopped before its last step; rerun to go on", file=sys.stderr)
                return 130
            if process.exitcode == 2:  # train_variant's refusals exit 2 after their reason
                print(f"{name}: stopped with exit 2 (a refused row's reason is the line above); "
                      f"the sweep stops, its finished rows are kept under "
                      f"{os.path.join(args.work_dir, 'sweep')}", file=sys.stderr)
                return 2
            if process.exitcode != 0:
                print(f"{name}: failed (exit {process.exitcode})", file=sys.stderr)
                continue
        results[name] = read_json(result_file)
        row = results[name]
        news = row.get("news_mining_f1")
        print(f"{name}: P@1 {100 * row['p_at_1_all_pairs']:.2f} all pairs, "
              + (f"news F1 {100 * news:.1f}, " if news is not None else "")
              + f"{100 * row['p_at_1_first_300']:.2f} first 300, {row['steps']} steps in "
              f"{row['train_seconds']:.0f} s ({row['pairs_per_second']:.1f} pairs/s)", flush=True)
    previous = {}
    if os.path.exists(args.output_json):
        try:
            previous = read_json(args.output_json).get("results", {})
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    # Each row keeps the machine it ran on; rows that failed this run are not kept
    # from an earlier one.
    previous = {k: v for k, v in previous.items() if k not in names}
    write_result(args.output_json, {"benchmark": "recipe_sweep", "machine": machine(),
                                    "work_dir": args.work_dir, "results": {**previous, **results}})
    return 0 if len(results) == len(variants) else 1


if __name__ == "__main__":
    sys.exit(main())
