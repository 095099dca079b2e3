"""The paper's evaluations: Tatoeba P@1 by cosine and by margin (`tatoeba`), the
BUCC 2018 mining protocol and its file format (`bucc`), embedding sentences for an
evaluation and UN-style retrieval over a large pool (`retrieval`), the held-out
NTREX news set (`news`: mining F1 and P@1 by length band), and their plots (`plots`).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.parallel_corpus, lealla_tf.configs, lealla_tf.losses, lealla_tf.mining,
lealla_tf.inference.
"""
