"""Export a trained model directory as a TF-Hub SavedModel.

A thin entry point to `lealla_tf.cli.export`, the command line of the console script
`lealla-export` (`lealla-export --help` lists every flag).
"""

import sys

if __name__ == "__main__":  # before TensorFlow and Beam load
    from lealla_tf.progress import quiet_startup

    quiet_startup()

from lealla_tf.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
