"""Convert an offline teacher into a LaBSE/2-format hub module.

A thin entry point to `lealla_tf.cli.convert_teacher`, the command line of the console script
`lealla-convert-teacher` (`lealla-convert-teacher --help` lists every flag).
"""

import sys

if __name__ == "__main__":  # before TensorFlow and Beam load
    from lealla_tf.progress import quiet_startup

    quiet_startup()

from lealla_tf.cli.convert_teacher import main

if __name__ == "__main__":
    sys.exit(main())
