"""Mine parallel sentences between two languages' embedding shards.

    python beam_pipelines/mine_bitext.py --source=runs/emb_deu --target=runs/emb_eng \
        --output=runs/mined_deu_eng.tsv [--margin=ratio --retrieval=max --k=4 \
        --threshold=1.05 --index=flat|ivf|ivfpq]

--source / --target are `beam_pipelines/embed_corpus.py` outputs (ids, vectors and
sentences). Mining runs `lealla_tf.mining.mine` (faiss kNN, margin scoring k=4 both
ways, vectorised); the output is a TSV of score<TAB>source<TAB>target (plus the ids
with --with_ids), best first. Beam carries the IO so the same command runs on any
runner; the kNN step holds both sides of one language pair in memory (IVF-PQ
keeps that to ~d/8 bytes a sentence).
"""

import argparse
import logging
import sys

import apache_beam as beam


def mine_directories(directories, margin, retrieval, k, threshold, index, with_ids):
    """Reads both embedding outputs and yields TSV lines of the mined pairs."""
    from lealla_tf.embedding_io import read_embeddings
    from lealla_tf.mining import mine

    source_dir, target_dir = directories
    source_ids, source_vectors, source_texts = read_embeddings(source_dir, with_text=True)
    target_ids, target_vectors, target_texts = read_embeddings(target_dir, with_text=True)
    if not len(source_ids) or not len(target_ids):
        return
    mined = mine(source_vectors, target_vectors, k=k, margin=margin, retrieval=retrieval,
                 threshold=threshold, index_type=index)
    beam.metrics.Metrics.counter("mine_bitext", "pairs").inc(len(mined["score"]))
    for score, i, j in zip(mined["score"], mined["source"], mined["target"]):
        fields = [f"{score:.6f}", source_texts[i], target_texts[j]]
        if with_ids:
            fields += [source_ids[i], target_ids[j]]
        yield "\t".join(fields)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="beam_pipelines/mine_bitext.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--output", required=True, help="TSV file to write")
    parser.add_argument("--margin", default="ratio", choices=("absolute", "distance", "ratio"))
    parser.add_argument("--retrieval", default="max", choices=("fwd", "bwd", "intersect", "max"))
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=None)
    parser.add_argument("--index", default="flat", choices=("flat", "ivf", "ivfpq"))
    parser.add_argument("--with_ids", action="store_true")
    return parser


def mine_bitext(source: str, target: str, output: str, margin: str = "ratio",
                retrieval: str = "max", k: int = 4, threshold=None, index: str = "flat",
                with_ids: bool = False, pipeline_args=(), test_pipeline=None) -> int:
    """Mines `source` against `target` (embed_corpus outputs) into the TSV `output`;
    returns the number of pairs written."""
    from lealla_tf.beam_options import pipeline_options
    from lealla_tf.embedding_io import manifest_files

    if k < 1:
        raise ValueError(f"--k must be at least 1, got {k}")
    for directory in (source, target):
        manifest_files(directory)  # FileNotFoundError now, not inside a worker
    options = pipeline_options(pipeline_args, default_runner=test_pipeline is None)
    pipeline = test_pipeline or beam.Pipeline(options=options)
    (pipeline
     | "Directories" >> beam.Create([(source, target)])
     | "Mine" >> beam.FlatMap(mine_directories, margin, retrieval, k, threshold, index, with_ids)
     | "Write" >> beam.io.WriteToText(output, shard_name_template="", num_shards=1))
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(beam.metrics.MetricsFilter().with_name("pairs"))["counters"]
    return int(sum(c.committed for c in counters))


def run(argv=None, test_pipeline=None) -> int:
    """Parses flags (Beam's own pass through) and calls `mine_bitext`."""
    known, pipeline_args = build_parser().parse_known_args(argv)
    return mine_bitext(known.source, known.target, known.output, known.margin, known.retrieval,
                       known.k, known.threshold, known.index, known.with_ids, pipeline_args,
                       test_pipeline)


def main(argv=None) -> int:
    logging.getLogger().setLevel(logging.WARNING)
    try:
        count = run(argv)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"mined {count:,} pairs")
    return 0
