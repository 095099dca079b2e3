"""Apache Beam pipelines: `embed_corpus` (corpus -> embedding or training-pair
shards; its Beam steps in `corpus_steps`) and `mine_bitext` (two embedding
outputs -> mined pairs), the options they share (`options`) and the files they
write through Beam's filesystems (`beam_files`). Their command lines are
`lealla_tf.cli.embed_corpus` and `lealla_tf.cli.mine_bitext` (also the scripts in
`beam_pipelines/`).

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.parallel_corpus, lealla_tf.configs, lealla_tf.flags, lealla_tf.tokenizers,
lealla_tf.mining, lealla_tf.models, lealla_tf.inference, lealla_tf.records,
lealla_tf.folder_lock.
"""
