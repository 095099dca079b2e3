"""The command lines: each module parses flags and calls the library, with one
convention (`lealla_tf.flags`: one-line flag errors, defaults in --help). Each is
documented by its console script, `lealla-<name>` (setup.py; `scripts` maps each
to its module here); `python -m lealla_tf.cli.<module>` runs the same command, as
do `python -m lealla_tf.train`, `python -m lealla_tf.recipe`, `python -m
lealla_tf.models.kernels` and the thin wrappers in export/ and beam_pipelines/.

May import: anything in lealla_tf.
"""
