r"""Benchmark: the embedding pipeline on the FnApiRunner and on a dask.distributed cluster.

    python -m benchmarks.beam_runners --model=runs/recipe/export/lealla_small \
        --output_json=benchmarks/results/beam_runners.json [--num_sentences=20000]

The same --num_sentences tatoeba_dev sentences (every language, both sides) go
through `beam_pipelines/embed_corpus.py` twice with the same model and shards:
on the FnApiRunner with 2 worker processes, and with `--runner=DaskRunner`
against a `distributed.LocalCluster` of 2 worker processes bound to 127.0.0.1
(started here, before the clock starts, as a user's cluster would already be
up). Wall time includes worker start-up inside the pipeline and model loading.
The two outputs are compared: same ids, vectors within 1e-6, same counts.
"""

import argparse
import os
import shutil
import tempfile
import time

from benchmarks.common import machine, tatoeba_sentences, write_result


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an exported model (or model_dir)")
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--num_sentences", type=int, default=20000)
    parser.add_argument("--num_shards", type=int, default=8)
    parser.add_argument("--data_dir", default=None)
    args = parser.parse_args()

    import distributed
    import numpy as np

    from lealla_tf.mining.shards import read_embeddings
    from lealla_tf.pipelines.embed_corpus import embed_corpus
    from lealla_tf.recipe.config import find_data_dir

    sentences = [s for s in tatoeba_sentences(find_data_dir(args.data_dir), args.num_sentences)
                 if s.strip()]
    work = tempfile.mkdtemp(prefix="beam_runners_")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None)
    runners = {"fn_api": ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
               "dask": ["--runner=DaskRunner",
                        f"--dask_client_address={cluster.scheduler_address}"]}
    results, outputs = {}, {}
    try:
        corpus = os.path.join(work, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write("\n".join(sentences) + "\n")
        for name, flags in runners.items():
            outputs[name] = os.path.join(work, name)
            start = time.perf_counter()
            manifest = embed_corpus([corpus], args.model, outputs[name],
                                    num_shards=args.num_shards, pipeline_args=flags)
            seconds = time.perf_counter() - start
            results[name] = {"flags": flags, "seconds": seconds,
                             "sentences_per_second": len(sentences) / seconds,
                             "counts": manifest["counts"]}
            print(f"{name}: {len(sentences)} sentences in {seconds:.1f} s = "
                  f"{len(sentences) / seconds:.1f} sentences/s", flush=True)
        (ids_a, vectors_a), (ids_b, vectors_b) = (read_embeddings(outputs[n]) for n in runners)
        equal = {"ids": ids_a == ids_b,
                 "max_abs_difference": float(np.abs(vectors_a - vectors_b).max()),
                 "counts": results["fn_api"]["counts"] == results["dask"]["counts"]}
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    result = {"benchmark": "beam_runners", "machine": machine(), "model": args.model,
              "sentences": len(sentences), "num_shards": args.num_shards, "runners": results,
              "dask_over_fn_api": results["dask"]["sentences_per_second"]
              / results["fn_api"]["sentences_per_second"], "outputs_equal": equal}
    write_result(args.output_json, result, leave_out="runners")


if __name__ == "__main__":
    main()
