"""The main job: `python -m lealla_tf.recipe` (what `make main` runs).

At this stage of the project it learns a vocabulary from the parallel data,
builds a LEALLA-small encoder with it, tokenizes real Tatoeba sentences
in-graph, embeds them and prints a cross-lingual similarity table.
"""

import argparse
import os
import pathlib
import sys
import time

DEFAULT_DATA_DIRS = (
    pathlib.Path(__file__).resolve().parents[2] / "shared" / "data",
    pathlib.Path.cwd().parent / "shared" / "data",
)


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lealla_tf.recipe", description=__doc__)
    parser.add_argument("--data_dir", default=None, help="default: ../shared/data")
    parser.add_argument("--work_dir", default="runs/recipe")
    parser.add_argument("--vocab_size", type=int, default=32000)
    args = parser.parse_args(argv)
    try:
        data_dir = find_data_dir(args.data_dir)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import numpy as np
    import tensorflow as tf

    from lealla_tf.lealla_encoder import build_encoder
    from lealla_tf.parallel_corpus import read_tatoeba
    from lealla_tf.presets import get_preset
    from lealla_tf.tokenizer import Tokenizer
    from lealla_tf.vocab import build_vocabulary

    os.makedirs(args.work_dir, exist_ok=True)
    start = time.time()
    vocab_file = os.path.join(args.work_dir, "vocab.txt")
    summary = build_vocabulary([str(data_dir / "parallel")], args.vocab_size, vocab_file)
    print(f"vocabulary: {summary['vocab_size']:,} tokens in {summary['seconds']:.0f} s")
    tokenizer = Tokenizer(vocab_file)
    config = get_preset("lealla_small").encoder.replace(vocabulary_size=tokenizer.vocab_size)
    encoder = build_encoder(config)
    print(f"lealla_small with this vocabulary: {encoder.count_params():,} parameters")
    sentences = []
    for language in ("deu", "fra", "rus", "cmn"):
        if (data_dir / "tatoeba_dev" / f"tatoeba.{language}-eng.{language}").exists():
            source, english = read_tatoeba(str(data_dir / "tatoeba_dev"), language)
            sentences += [source[0], english[0]]
    embeddings = encoder(tokenizer(tf.constant(sentences)))["sentence_embedding"].numpy()
    similarity = embeddings @ embeddings.T
    print("cosine similarity (untrained encoder):")
    for i, sentence in enumerate(sentences):
        print(f"{sentence[:38]:<40}" + " ".join(f"{v:5.2f}" for v in similarity[i]))
    print(f"done in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
