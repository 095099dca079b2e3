"""The paper's evaluations: Tatoeba P@1, BUCC F1 and UN-style retrieval
(`retrieval`), the held-out NTREX news set (`news`: mining F1 and P@1 by length
band), and their plots (`plots`).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.parallel_corpus, lealla_tf.configs, lealla_tf.losses, lealla_tf.mining,
lealla_tf.inference.
"""
