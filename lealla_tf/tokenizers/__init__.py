"""Text to token ids: the in-graph tokenizer (`tokenizer`), SentencePiece model
files (`sentencepiece_model`), learning a WordPiece vocabulary from parallel
corpora (`vocabulary`) and pruning a teacher's SentencePiece vocabulary to the
pieces a corpus uses (`pruning`). The TensorFlow and tensorflow-text internals the
package relies on live in one adapter and nowhere else, `tensorflow_adapter` (the
tokenizer's shared SentencePiece model, BERT's basic tokenization, the exports'
SavedModel root), here because the tokenizer is the lowest layer that needs them.

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.parallel_corpus.
"""
