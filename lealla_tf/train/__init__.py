"""Training a student by distillation (`python -m lealla_tf.train`).

`run.train(config, model_dir, vocab_file)` is training as one library
call; below it, tf-models' seam: `task` (what one step computes) and `trainer`
(steps, checkpoints, logs). Around them: `data` (pairs -> balanced, tokenized
batches), `teacher_sources` (where teacher vectors come from), `students`,
`heads` (what an objective's terms train beside the student), `initialization`
(teacher-initialised students), `optimizers`, `schedules`, `distribution`
(tf.distribute strategies, TPU included) and `logs`.

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.parallel_corpus, lealla_tf.configs, lealla_tf.losses, lealla_tf.tokenizers,
lealla_tf.mining, lealla_tf.models, lealla_tf.inference, lealla_tf.teachers,
lealla_tf.evaluation, lealla_tf.folder_lock.
"""
