"""Parallel-sentence mining: faiss kNN with margin scoring (`margins`), and the
embedding and pair shards the pipelines write and mining reads (`shards`).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress.
"""
