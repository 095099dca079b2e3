"""Import a released LEALLA or LaBSE/2 SavedModel into a model directory.

A thin entry point to `lealla_tf.cli.import_checkpoint`, the command line of the console script
`lealla-import-checkpoint` (`lealla-import-checkpoint --help` lists every flag).
"""

import sys

if __name__ == "__main__":  # before TensorFlow and Beam load
    from lealla_tf.progress import quiet_startup

    quiet_startup()

from lealla_tf.cli.import_checkpoint import main

if __name__ == "__main__":
    sys.exit(main())
