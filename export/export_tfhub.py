"""Export a trained model directory as a TF-Hub SavedModel.

The command line of `lealla_tf.cli.export` (`python export/export_tfhub.py --help` lists every flag).
"""

import sys

if __name__ == "__main__":  # before TensorFlow and Beam load
    from lealla_tf.progress import quiet_startup

    quiet_startup()

from lealla_tf.cli.export import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
