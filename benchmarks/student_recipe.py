r"""Benchmark: what makes a student learn from multilingual-e5-small on a CPU (ablation table).

    python -m benchmarks.student_recipe --work_dir=runs/ablation \
        --output_json=benchmarks/results/student_recipe.json [--steps=300] [--only=a,b]

Every configuration trains the lealla_small architecture (mean pooling) for the
same --steps at batch 64, length 32 (length-bucketed batches, as the main job), on
the same language-balanced sample with the teacher's vectors of both sides, from
the same seed, and differs in ONE lever:
vocabulary (own 32k WordPiece vs the teacher's pruned SentencePiece), token
embedding initialisation (random vs teacher PCA vs teacher bottleneck), or the
objective (AMS alone, AMS+FD+LD, FD alone, Reimers' MSE, EMS's XTR + AMS, Ding et
al.'s two stages). Each is scored by Tatoeba dev P@1 on the first --eval_pairs
pairs of every language (56 languages) at the end (equal steps), and on the first
50 pairs along the way; the curve's training time (evaluations excluded) gives
P@1 at equal wall time. Each configuration runs in its own process; a finished one
is reused when the script is rerun.

Pointed at a finished main job (--work_dir=runs/recipe --steps=<its steps>), it
reuses that job's teacher, pruned vocabulary, sample and (truncated) teacher
vectors, so its rows compare with the main job's two students.
"""

import argparse
import json
import multiprocessing
import os
import pathlib
import sys

from benchmarks.common import machine, stop_signals_passed_to
from lealla_tf.recipe.config import RecipeConfig, recipe_loss_weights

_MAIN_JOB_INIT = RecipeConfig().embedding_init

LEALLA = "ams+fd+ld"
CONFIGURATIONS = {
    # Vocabulary and initialisation, with the main job's objective.
    "wordpiece_random": {"vocabulary": "wordpiece", "init": "random", "objective": LEALLA},
    "pruned_random": {"vocabulary": "pruned", "init": "random", "objective": LEALLA},
    "pruned_pca": {"vocabulary": "pruned", "init": "teacher_pca", "objective": LEALLA},
    "pruned_bottleneck": {"vocabulary": "pruned", "init": "teacher_bottleneck",
                          "objective": LEALLA},
    # Objectives, on the pruned vocabulary with teacher-PCA embeddings.
    "ams_only": {"vocabulary": "pruned", "init": "teacher_pca", "objective": "ams"},
    "fd_only": {"vocabulary": "pruned", "init": "teacher_pca", "objective": "fd"},
    "reimers_mse": {"vocabulary": "pruned", "init": "teacher_pca", "objective": "mse"},
    "ems_xtr_ams": {"vocabulary": "pruned", "init": "teacher_pca", "objective": "xtr+ams"},
    "ding_two_stages": {"vocabulary": "pruned", "init": "teacher_bottleneck",
                        "objective": "mse", "then": "mcl",
                        "overrides": {"num_unique_layers": 12}},
}
# The main job's own two students, when --work_dir is a finished main job (the
# recorded rows of 2026-11-23 were teacher_pca, the main job's initialisation then).
CONFIGURATIONS["main_job_lealla"] = {"vocabulary": "pruned", "init": _MAIN_JOB_INIT,
                                     "objective": LEALLA, "main_job": "student"}
CONFIGURATIONS["main_job_ams_only"] = {"vocabulary": "pruned", "init": _MAIN_JOB_INIT,
                                       "objective": "ams", "main_job": "student_ams_only"}
# Loss weights of the e5 recipe (lealla_tf.recipe.config.RECIPE_LOSS_WEIGHTS); the
# --only=weights_* runs sweep them.
WEIGHTS = {LEALLA: recipe_loss_weights(LEALLA), "fd": recipe_loss_weights("fd")}
for _beta in (1.0, 10.0, 100.0):
    for _gamma in (1e2, 1e4):
        CONFIGURATIONS[f"weights_fd{_beta:g}_ld{_gamma:g}"] = {
            "vocabulary": "pruned", "init": "teacher_pca", "objective": LEALLA,
            "weights": {"fd": _beta, "ld": _gamma}}
# Distillation from centred teacher vectors (lealla_tf.train.teacher_sources.CenteredTeacher).
CONFIGURATIONS["centered_lealla"] = {"vocabulary": "pruned", "init": "teacher_pca",
                                     "objective": LEALLA, "center": True}
CONFIGURATIONS["centered_fd_only"] = {"vocabulary": "pruned", "init": "teacher_pca",
                                      "objective": "fd", "center": True}
CONFIGURATIONS["centered_ams_ld1e5"] = {"vocabulary": "pruned", "init": "teacher_pca",
                                        "objective": "ams+ld", "center": True,
                                        "weights": {"ld": 1e5}}
# Every weight selected from the teacher (embedding_init="teacher_select").
CONFIGURATIONS["select_lealla"] = {"vocabulary": "pruned", "init": "teacher_select",
                                   "objective": LEALLA}
CONFIGURATIONS["select_ams_only"] = {"vocabulary": "pruned", "init": "teacher_select",
                                     "objective": "ams"}
CONFIGURATIONS["centered_select_lealla"] = {"vocabulary": "pruned", "init": "teacher_select",
                                            "objective": LEALLA, "center": True}
# Hidden-state distillation (the hd term: the teacher's layer outputs on the
# student's tokens) on top of weight selection, at six weights.
for _weight in (1.0, 10.0, 30.0, 100.0, 300.0, 1000.0):
    CONFIGURATIONS[f"select_lealla_hd{_weight:g}"] = {
        "vocabulary": "pruned", "init": "teacher_select", "objective": LEALLA + "+hd",
        "weights": {**recipe_loss_weights(LEALLA), "hd": _weight}}
    CONFIGURATIONS[f"select_ams_hd{_weight:g}"] = {
        "vocabulary": "pruned", "init": "teacher_select", "objective": "ams+hd",
        "weights": {"hd": _weight}}
# hd on the non-English side only (hdsrc): the teacher runs on half the
# sentences. Its weight is doubled, so the one side it keeps pulls as hard as in
# select_lealla_hd10.
CONFIGURATIONS["select_lealla_hdsrc20"] = {
    "vocabulary": "pruned", "init": "teacher_select", "objective": LEALLA + "+hdsrc",
    "weights": {**recipe_loss_weights(LEALLA), "hdsrc": 20.0}}
# The vocabulary's cap: every piece of the teacher's the corpus uses (218,827
# with the characters, whatever --max_pieces; the rows above ran with a
# 32,000-piece cap, the main job's until this row), so the student's (and the
# in-step teacher's) pieces are the teacher's own on every corpus word.
CONFIGURATIONS["select_lealla_hd300_all_pieces"] = {
    **CONFIGURATIONS["select_lealla_hd300"], "vocabulary": "pruned_all"}
# The teacher-PCA student of 2026-11-23 at other peak learning rates (default:
# 5e-4, the paper's for d < 384 at batch 8192); the --only=lr_* runs sweep it.
# Every row here trains at 5e-4 unless it says otherwise; the main job's
# student has trained at 2e-3 since 36830e7 (benchmarks/recipe_sweep.py), so its
# main_job_* rows compare with these only when that job ran at 5e-4.
for _rate in (2.5e-4, 1e-3, 2e-3):
    CONFIGURATIONS[f"lr_{_rate:g}"] = {"vocabulary": "pruned", "init": "teacher_pca",
                                       "objective": LEALLA, "learning_rate": _rate}


def vocab_path(work_dir, kind):
    """The vocabulary file of a row's `vocabulary` kind."""
    return os.path.join(work_dir, {"pruned": "vocab.model", "wordpiece": "vocab.txt",
                                   "pruned_all": os.path.join("vocab_all", "vocab.model")}[kind])


def prepare(work_dir, data_dir, sample_pairs, max_pieces, kinds=()):
    """Teacher, both vocabularies (and the uncapped pruned one when `kinds` holds
    "pruned_all"), the sample and its teacher vectors (reused)."""
    from lealla_tf.recipe.config import DEFAULT_WORDPIECE_SIZE, RecipeConfig
    from lealla_tf.recipe.stages import (
        Models,
        Stages,
        choose_teacher_backend,
        sample_stage,
        teacher_stage,
        teacher_vectors_stage,
        vocabulary_stage,
    )

    recipe = RecipeConfig(work_dir=work_dir, sample_pairs=sample_pairs)
    stages, models = Stages(work_dir), Models()
    teacher_dir = os.path.join(work_dir, "teacher")
    teacher = stages.run("teacher", lambda: teacher_stage(recipe, teacher_dir))
    vocabularies = {
        "pruned": stages.run("vocabulary", lambda: vocabulary_stage(
            RecipeConfig(vocabulary="teacher_pruned", vocab_size=max_pieces), data_dir,
            teacher_dir, work_dir)),
        "wordpiece": stages.run("vocabulary_wordpiece", lambda: vocabulary_stage(
            RecipeConfig(vocabulary="wordpiece", vocab_size=DEFAULT_WORDPIECE_SIZE), data_dir,
            teacher_dir, work_dir))}
    if "pruned_all" in kinds:  # built only for the rows that ask (a minute here)
        all_dir = os.path.dirname(vocab_path(work_dir, "pruned_all"))
        os.makedirs(all_dir, exist_ok=True)
        vocabularies["pruned_all"] = stages.run("vocabulary_all", lambda: vocabulary_stage(
            RecipeConfig(vocabulary="teacher_pruned", vocab_size=0), data_dir, teacher_dir,
            all_dir))
    sample_dir = os.path.join(work_dir, "sample")
    sample = stages.run("sample", lambda: sample_stage(recipe, data_dir, sample_dir))
    vectors = stages.run("teacher_vectors", lambda: teacher_vectors_stage(
        sample_dir, choose_teacher_backend(recipe, teacher_dir, sample_dir, models),
        os.path.join(work_dir, "pairs_teacher"), 2, False,
        recipe.max_seq_length if recipe.truncate_teacher else None))
    return {"teacher": teacher, "vocabularies": vocabularies, "sample": sample,
            "teacher_vectors": {k: vectors[k] for k in ("counts", "backend",
                                                        "sentences_per_second")},
            "preparation_seconds": stages.seconds}


def train_configuration(name, spec, work_dir, data_dir, steps, eval_pairs, result_file):
    """Runs in a fresh process: trains one configuration and evaluates it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from lealla_tf.configs import (
        DataConfig,
        LossConfig,
        OptimizerConfig,
        TeacherConfig,
        TokenizerConfig,
        TrainConfig,
    )
    from lealla_tf.evaluation.retrieval import TATOEBA_PRIMARY_METRIC, evaluate_tatoeba
    from lealla_tf.inference.embedder import load_embedder
    from lealla_tf.models.presets import get_preset
    from lealla_tf.recipe.config import RecipeConfig
    from lealla_tf.train.run import train

    tatoeba = str(pathlib.Path(data_dir) / "tatoeba_dev")
    vocab = vocab_path(work_dir, spec["vocabulary"])
    teacher_dir = os.path.join(work_dir, "teacher")
    encoder = get_preset("lealla_small").encoder.replace(pooling="mean",
                                                         **spec.get("overrides", {}))
    stages = [(spec["objective"], steps)] if "then" not in spec else [
        (spec["objective"], steps // 2), (spec["then"], steps - steps // 2)]
    summaries, previous = [], ""
    if "main_job" in spec:  # a student the main job trained in this work_dir: evaluate only
        previous = os.path.join(work_dir, spec["main_job"])
        with open(os.path.join(previous, "train_summary.json")) as f:
            summaries.append(json.load(f))
        stages = []
    for index, (objective, stage_steps) in enumerate(stages):
        model_dir = os.path.join(work_dir, "runs", name + (f"_stage{index + 1}"
                                                           if len(stages) > 1 else ""))
        if index > 0:  # a later stage continues the previous stage's architecture
            from lealla_tf.models.model_dir import encoder_config_of

            encoder = encoder_config_of(previous)
        config = TrainConfig(
            encoder=encoder, tokenizer=TokenizerConfig(max_seq_length=32),
            data=DataConfig(train_data=[os.path.join(work_dir, "pairs_teacher")],
                            decontaminate=[tatoeba],
                            length_buckets=RecipeConfig().length_buckets),
            teacher=TeacherConfig(center=spec.get("center", False)),
            loss=LossConfig(objective=objective,
                            weights=spec.get("weights", WEIGHTS.get(objective, {}))),
            optimizer=OptimizerConfig(learning_rate=spec.get("learning_rate"),
                                      warmup_steps=max(1, stage_steps // 10)),
            embedding_init=spec["init"] if index == 0 else "random",
            embedding_init_source=teacher_dir if spec["init"] != "random" and index == 0
            else "", init_from=previous, global_batch_size=64, train_steps=stage_steps,
            checkpoint_every=stage_steps, eval_every=max(1, steps // 6), tatoeba_dir=tatoeba,
            eval_max_pairs=50)
        summaries.append(train(config, model_dir, vocab, progress=False))
        if summaries[-1]["final_step"] < stage_steps:  # stopped by a signal: no result
            sys.exit(130)
        previous = model_dir
    embedder = load_embedder(previous)
    final = evaluate_tatoeba(embedder, tatoeba, max_pairs=eval_pairs)
    from lealla_tf.models.model_dir import load_encoder

    parameters = load_encoder(previous).count_params()
    curve, offset_steps, offset_seconds = [], 0, 0.0
    for summary in summaries:
        for point in summary["evaluations"]:
            curve.append({"step": point["step"] + offset_steps,
                          "train_seconds": point.get("train_seconds", 0.0) + offset_seconds,
                          "p_at_1_first_50": point["p_at_1"]})
        offset_steps += summary["final_step"]
        offset_seconds += summary.get("train_seconds", summary["seconds"])
    result = {"spec": spec, "vocab_file": vocab, "parameters": parameters,
              "steps": offset_steps, "train_seconds": offset_seconds,
              "pairs_per_second": offset_steps * 64 / max(offset_seconds, 1e-9),
              "p_at_1": final[TATOEBA_PRIMARY_METRIC], "eval_pairs": eval_pairs,
              "curve": curve, "initialization": summaries[0].get("initialization")}
    with open(result_file, "w") as f:
        json.dump(result, f, indent=2, default=str)


def at_time(curve, seconds):
    """P@1 (first 50 pairs) at `seconds` of training, interpolated along the curve."""
    points = [(0.0, curve[0]["p_at_1_first_50"])] + [
        (p["train_seconds"], p["p_at_1_first_50"]) for p in curve if p["step"] > 0]
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t0 <= seconds <= t1:
            return v0 + (v1 - v0) * (seconds - t0) / max(t1 - t0, 1e-9)
    return points[-1][1]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work_dir", default="runs/ablation")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--steps", type=int, default=200, help="the main job's")
    parser.add_argument("--sample_pairs", type=int, default=14000)
    parser.add_argument("--max_pieces", type=int, default=0,
                        help="cap of the pruned vocabulary (0, the main job's default: every "
                             "piece that occurs; the earlier rows were run with 32000)")
    parser.add_argument("--eval_pairs", type=int, default=200)
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    parser.add_argument("--equal_time_seconds", type=float, default=None,
                        help="training time at which rows are compared (default: the "
                             "shortest of this run's rows); pass the earlier run's to add rows")
    args = parser.parse_args()
    from lealla_tf.recipe.config import find_data_dir

    data_dir = find_data_dir(args.data_dir)
    os.makedirs(args.work_dir, exist_ok=True)
    names = [n for n in args.only.split(",") if n] or [
        n for n in CONFIGURATIONS if not n.startswith(("weights_", "main_job", "lr_"))]
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        sys.exit(f"error: unknown configurations {unknown}; known: {sorted(CONFIGURATIONS)}")
    prepared = prepare(args.work_dir, data_dir, args.sample_pairs, args.max_pieces,
                       {CONFIGURATIONS[n]["vocabulary"] for n in names})
    results = {}
    context = multiprocessing.get_context("spawn")
    for name in names:
        result_file = os.path.join(args.work_dir, f"{name}.json")
        if not os.path.exists(result_file):
            process = context.Process(target=train_configuration, args=(
                name, CONFIGURATIONS[name], args.work_dir, str(data_dir), args.steps,
                args.eval_pairs, result_file))
            process.start()
            with stop_signals_passed_to(process.pid) as stopped:
                process.join()
            if stopped:
                sys.exit(f"{name}: stopped by signal {stopped[0]}; rerun to train it again")
            if process.exitcode == 130:
                sys.exit(f"{name}: stopped before its last step; rerun to train it again")
            if process.exitcode != 0:
                print(f"{name}: failed (exit {process.exitcode})", flush=True)
                continue
        results[name] = json.load(open(result_file))
        print(f"{name}: P@1 {100 * results[name]['p_at_1']:.2f} (first {args.eval_pairs} pairs)"
              f", {results[name]['pairs_per_second']:.0f} pairs/s", flush=True)
    if results:
        budget = args.equal_time_seconds or min(r["train_seconds"] for r in results.values())
        for result in results.values():
            result["p_at_1_first_50_at_equal_time"] = at_time(result["curve"], budget)
        table = {"equal_time_seconds": budget}
    previous = {}
    if os.path.exists(args.output_json):
        previous = json.load(open(args.output_json)).get("results", {})
    previous.update(results)
    output = {"benchmark": "student_recipe", "machine": machine(), "steps": args.steps,
              "batch": 64, "max_seq_length": 32, "preparation": prepared,
              "results": previous, **(table if results else {})}
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(output, f, indent=2, default=str)


if __name__ == "__main__":
    main()
