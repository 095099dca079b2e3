r"""Benchmark: how fast does the Beam embedding pipeline embed, against the bare
model on the same sentences, and on each runner?

    python -m benchmarks.beam_throughput --model=runs/recipe/export/lealla_small \
        --num_sentences=100000 --dask --output_json=benchmarks/results/beam_throughput.json

The model (`--model`, an export or a model directory; or, with --vocab_file
instead, a random lealla_small exported here: speed does not depend on the
weights) embeds the same --num_sentences sentences (Tatoeba dev, topped up from
the parallel data):

- `bare_model`: in-process, in length-sorted batches as the pipelines cut them
  (at most 1,024 sentences and 4,096 padded tokens a call);
- `fn_api`: through `beam_pipelines/embed_corpus.py` (its default batching, the
  same) on the FnApiRunner with --workers worker processes, model loading and
  process start-up included: the wall time a user sees (`--workers=0`: in this
  process, Beam's in-memory runner);
- `dask` (with --dask): the same pipeline with `--runner=DaskRunner` against a
  `distributed.LocalCluster` of --workers worker processes on 127.0.0.1,
  started before the clock starts, as a user's cluster would already be up,
  with the settings the README gives for such a cluster
  (`lealla_tf.pipelines.dask_partitions.EMBEDDING_WORKER_CONFIG`). Its output is
  compared with the FnApiRunner's (`outputs_equal`: same ids, the largest
  difference between vectors, same counts).

A quick run on tiny fixtures (what the tests do): `--model=<tiny export>
--data_dir=<tiny> --num_sentences=30 --workers=0`.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

from benchmarks.common import machine, tatoeba_sentences, write_result
from lealla_tf.pipelines.dask_partitions import EMBEDDING_WORKER_CONFIG


def benchmark_sentences(data_dir, count):
    """`count` non-empty sentences: Tatoeba dev across all languages, topped up
    (beyond its 90k sentences) with both sides of the parallel data, taken
    round-robin over languages."""
    from lealla_tf.parallel_corpus import find_parallel_files, read_pairs

    sentences = [s for s in tatoeba_sentences(data_dir, count) if s.strip()]
    if len(sentences) < count:
        readers = [read_pairs(f.path) for f in find_parallel_files([str(data_dir / "parallel")])]
        while readers and len(sentences) < count:
            for reader in list(readers):
                pair = next(reader, None)
                if pair is None:
                    readers.remove(reader)
                    continue
                sentences += [s for s in pair if s.strip()]
        for reader in readers:  # the files of those not read to their end
            reader.close()
    return sentences[:count]


def random_model(vocab_file: str, path: str) -> str:
    """A random lealla_small with `vocab_file`, exported to `path`."""
    from lealla_tf import Tokenizer, build_encoder, get_preset
    from lealla_tf.inference.formats import export_lealla_model

    tokenizer = Tokenizer(vocab_file)
    encoder = build_encoder(get_preset("lealla_small").encoder.replace(
        vocabulary_size=tokenizer.vocab_size))
    return export_lealla_model(encoder, tokenizer, path)


def runner_flags(workers: int) -> list:
    """The FnApiRunner's flags: `workers` processes, or in this process for 0."""
    if workers == 0:
        return ["--direct_running_mode=in_memory"]
    return [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]


def through_beam(name, corpus, model, output, flags, count) -> dict:
    """One embed_corpus run: its wall time and its own timeline; its embedding
    stage's sentences/s (from the first shard's start to the last shard's end of
    embedding) shows the model's speed inside the pipeline."""
    from lealla_tf.pipelines.embed_corpus import describe_timeline, embed_corpus

    start = time.perf_counter()
    manifest = embed_corpus([corpus], model, output, pipeline_args=flags)
    seconds = time.perf_counter() - start
    print(f"{name}: {count} sentences in {seconds:.1f} s = {count / seconds:.1f} sentences/s",
          flush=True)
    embed = manifest["timeline"]["stages"].get("embed")
    print(f"{name}: " + describe_timeline(manifest["timeline"]), flush=True)
    return {"flags": flags, "seconds": seconds, "sentences_per_second": count / seconds,
            "counts": manifest["counts"], "timeline": manifest["timeline"],
            "embedding_sentences_per_second": None if embed is None else count / max(
                embed["to"] - embed["from"], 1e-3)}


def same_outputs(first: str, second: str) -> dict:
    """Whether two embed_corpus outputs hold the same ids and vectors."""
    import numpy as np

    from lealla_tf.mining.shards import read_embeddings

    (ids_a, vectors_a), (ids_b, vectors_b) = read_embeddings(first), read_embeddings(second)
    return {"ids": ids_a == ids_b,
            "max_abs_difference": float(np.abs(vectors_a - vectors_b).max())}


def speed_ratios(runners: dict, bare_sentences_per_second: float) -> dict:
    """Each runner's sentences/s against the bare model's (`beam_over_bare` is the
    FnApiRunner's), and the DaskRunner's against the FnApiRunner's, where it ran."""
    speed = {name: runner["sentences_per_second"] for name, runner in runners.items()}
    ratios = {"beam_over_bare": speed["fn_api"] / bare_sentences_per_second}
    if "dask" in speed:
        ratios["dask_over_bare"] = speed["dask"] / bare_sentences_per_second
        ratios["dask_over_fn_api"] = speed["dask"] / speed["fn_api"]
    return ratios


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="an exported model or a model directory")
    model.add_argument("--vocab_file", help="or: a random lealla_small with this vocabulary")
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--num_sentences", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes (0: the FnApiRunner in this process)")
    parser.add_argument("--dask", action="store_true",
                        help="also on a local dask.distributed cluster (DaskRunner)")
    parser.add_argument("--data_dir", default=None)
    args = parser.parse_args(argv)
    if args.num_sentences < 1 or args.workers < 0 or (args.dask and args.workers < 1):
        parser.error("--num_sentences must be at least 1, --workers at least 0 (1 with --dask)")
    from lealla_tf import load_embedder
    from lealla_tf.evaluation.retrieval import embed_sentences
    from lealla_tf.recipe.settings import find_data_dir

    sentences = benchmark_sentences(find_data_dir(args.data_dir), args.num_sentences)
    work = tempfile.mkdtemp(prefix="beam_throughput_")
    cluster = None
    try:
        model = args.model or random_model(args.vocab_file, os.path.join(work, "model"))
        corpus = os.path.join(work, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write("\n".join(sentences) + "\n")
        start = time.perf_counter()
        embed_sentences(load_embedder(model), sentences)  # the pipelines' batching
        bare = time.perf_counter() - start
        results = {"fn_api": through_beam("fn_api", corpus, model,
                                          os.path.join(work, "fn_api"),
                                          runner_flags(args.workers), len(sentences))}
        dask_error = equal = None
        if args.dask:
            # The FnApiRunner's figure stands whatever happens on the Dask side.
            try:
                import dask
                import distributed

                with dask.config.set(EMBEDDING_WORKER_CONFIG):
                    cluster = distributed.LocalCluster(
                        n_workers=args.workers, threads_per_worker=1, processes=True,
                        host="127.0.0.1", dashboard_address=None)
                results["dask"] = dask_run(cluster.scheduler_address, corpus, model,
                                           os.path.join(work, "dask"), len(sentences))
                equal = same_outputs(os.path.join(work, "fn_api"), os.path.join(work, "dask"))
                equal["counts"] = results["fn_api"]["counts"] == results["dask"]["counts"]
            except Exception as error:  # recorded; the exit status says so
                results.pop("dask", None)
                dask_error = f"{type(error).__name__}: {error}"
                print(f"error: the DaskRunner's run failed ({dask_error}); the FnApiRunner's "
                      "figures are kept", file=sys.stderr, flush=True)
    finally:
        if cluster is not None:
            try:
                cluster.close()
            except Exception as error:  # the figures measured stand
                print(f"warning: the Dask cluster did not close cleanly ({error})",
                      file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    result = {"benchmark": "beam_throughput", "machine": machine(),
              "model": args.model or f"random lealla_small, {args.vocab_file}",
              "sentences": len(sentences), "workers": args.workers,
              "dask_worker_config": EMBEDDING_WORKER_CONFIG if args.dask else None,
              "bare_model": {"seconds": bare, "sentences_per_second": len(sentences) / bare},
              "runners": results, **speed_ratios(results, len(sentences) / bare)}
    if equal is not None:
        result["outputs_equal"] = equal
    if dask_error is not None:
        result["dask_error"] = dask_error
    write_result(args.output_json, result)
    return 1 if dask_error else 0


def dask_run(scheduler_address: str, corpus, model, output, count) -> dict:
    """`through_beam` on the DaskRunner against the cluster at `scheduler_address`."""
    return through_beam("dask", corpus, model, output,
                        ["--runner=DaskRunner", f"--dask_client_address={scheduler_address}"],
                        count)


if __name__ == "__main__":
    sys.exit(main())
