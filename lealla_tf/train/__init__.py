"""Training a student by distillation (`python -m lealla_tf.train`).

`launch.train(config, model_dir, vocab_file)` launches a run as one library call
(the data checked, the teacher built, the config resolved, the model directory
locked and its config.json written); below it, tf-models' seam: `task` (what one
step computes) and `trainer` (runs the steps and checkpoints). What plugs into
its loop are `callbacks`: `logs` (the logs and progress bar), `planning` (a run
that decides its own length), `depth` (progressive depth), `cooldown` (the
teacher's share and the margin while the rate decays) and `dev_evaluation`.
Around them: `resolution` (a `TrainConfig` checked, its defaults filled in, what
a resumed run may change), `data` (pairs -> balanced, tokenized batches),
`decontamination` (evaluation sentences kept out of the stream), `students`,
`heads` (what an objective's terms train beside the student), `initialization`
(students initialised from the teacher's weights), `optimizers`, `schedules`,
`distribution` (tf.distribute strategies, TPU included). The teacher's
side (where its vectors come from, its layers run in the step) is
`lealla_tf.teachers`.

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.parallel_corpus, lealla_tf.configs, lealla_tf.losses, lealla_tf.tokenizers,
lealla_tf.mining, lealla_tf.models, lealla_tf.inference, lealla_tf.teachers,
lealla_tf.evaluation, lealla_tf.folder_lock, lealla_tf.records.
"""
