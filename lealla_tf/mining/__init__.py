"""Parallel-sentence mining and the outputs it reads: margin scoring and `mine`
(`margins`), faiss nearest neighbours within a memory budget (`neighbours`), an
embed_corpus output's embedding shards, whole or memory-mapped (`shards`), and a
pipeline output's run folders and manifest (`run_folders`).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.records.
"""
