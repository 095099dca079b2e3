"""`python -m lealla_tf.recipe`: the command line in `lealla_tf.cli.recipe`."""

import sys

if __name__ == "__main__":
    from lealla_tf.progress import quiet_startup

    quiet_startup()  # before TensorFlow and Beam load
    from lealla_tf.cli.recipe import main

    sys.exit(main())
