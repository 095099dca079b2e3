"""Apache Beam pipelines: `embed_corpus` (corpus -> embedding or training-pair
shards) and `mine_bitext` (two embedding outputs -> mined pairs), and the
options they share (`options`). The scripts in `beam_pipelines/` are their
command lines.

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.parallel_corpus, lealla_tf.configs, lealla_tf.flags, lealla_tf.tokenizers,
lealla_tf.mining, lealla_tf.models, lealla_tf.inference.
"""
