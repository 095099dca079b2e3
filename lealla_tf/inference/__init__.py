"""Using a trained model: `embedder` (strings -> unit vectors from any model a
user has; `lealla_tf.load`), `export` (TF-Hub SavedModels, TFLite), `reload_check`
(an export loaded in a fresh process) and `saved_model_layer` (an export as a
Keras 3 layer that trains in `fit`).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.configs, lealla_tf.tokenizers, lealla_tf.mining, lealla_tf.models.
"""
