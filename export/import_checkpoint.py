"""Import a released LEALLA or LaBSE/2 SavedModel into a model directory.

The command line of `lealla_tf.cli.import_checkpoint` (`python export/import_checkpoint.py --help` lists every flag).
"""

import sys

if __name__ == "__main__":  # before TensorFlow and Beam load
    from lealla_tf.progress import quiet_startup

    quiet_startup()

from lealla_tf.cli.import_checkpoint import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
