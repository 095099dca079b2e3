"""Using a trained model: `loaders` (`load_embedder`: an `Embedder` from any model a
user has), `embedder` (the `Embedder`: strings -> unit vectors, with
sentence-transformers' `encode`), `batching` (length-aware batching, each sentence
tokenized once), `formats` (the export formats: TF-Hub SavedModels and TFLite, and
the functions that write them), `reload_check` (an export loaded in a fresh
process), `export_info` (what an export says of itself: its precision and
architecture), `saved_model_layer` (an export as a Keras 3 layer that trains in `fit`)
and `collapse` (whether a model's embeddings have collapsed: the export, training's
logs and the evaluations check it).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.configs, lealla_tf.tokenizers, lealla_tf.models.
"""
