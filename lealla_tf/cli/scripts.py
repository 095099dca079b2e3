"""The console scripts `pip install` puts on the PATH (setup.py's entry points).

Each quiets TensorFlow's start-up (`lealla_tf.progress.quiet_startup`) before
its command line, and with it TensorFlow, loads; then runs that command line's
`main`. `lealla-<name> --help` lists every flag with its default.
"""

import importlib
import os
import sys

# console script -> the module whose main() it runs
COMMANDS = {
    "lealla-recipe": "lealla_tf.cli.recipe",
    "lealla-train": "lealla_tf.cli.train",
    "lealla-evaluate": "lealla_tf.cli.evaluate",
    "lealla-vocab": "lealla_tf.cli.vocab",
    "lealla-export": "lealla_tf.cli.export",
    "lealla-convert-teacher": "lealla_tf.cli.convert_teacher",
    "lealla-import-checkpoint": "lealla_tf.cli.import_checkpoint",
    "lealla-embed-corpus": "lealla_tf.cli.embed_corpus",
    "lealla-mine-bitext": "lealla_tf.cli.mine_bitext",
    "lealla-presets": "lealla_tf.cli.list_presets",
    "lealla-kernels": "lealla_tf.cli.build_kernels",
}


def run(script: str, argv=None) -> int:
    """Runs the command line behind console script `script`."""
    from lealla_tf.flags import use_program_name
    from lealla_tf.progress import quiet_startup

    quiet_startup()
    use_program_name(script)
    try:
        return importlib.import_module(COMMANDS[script]).main(argv)
    finally:
        use_program_name(None)


def main() -> int:
    """The entry point of every console script: which one is read from argv[0]."""
    script = os.path.basename(sys.argv[0])
    if script not in COMMANDS:
        print(f"error: {script} is none of the console scripts {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    return run(script)

