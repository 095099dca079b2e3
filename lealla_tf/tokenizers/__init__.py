"""Text to token ids: the in-graph tokenizer (`tokenizer`), SentencePiece model
files (`sentencepiece_model`), learning a WordPiece vocabulary from parallel
corpora (`vocabulary`) and pruning a teacher's SentencePiece vocabulary to the
pieces a corpus uses (`pruning`).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.parallel_corpus.
"""
