"""The command lines: each module parses flags and calls the library, with one
convention (`lealla_tf.flags`: one-line flag errors, defaults in --help). They
run as `python -m lealla_tf.<package>` (train, recipe), `python -m
lealla_tf.cli.<name>`, the console scripts `lealla-<name>`, or the thin
wrappers in export/ and beam_pipelines/.

May import: anything in lealla_tf.
"""
