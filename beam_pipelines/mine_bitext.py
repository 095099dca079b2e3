"""Mine parallel sentences between two languages' embedding shards.

The command line of `lealla_tf.cli.mine_bitext` (`python beam_pipelines/mine_bitext.py --help`
lists every flag).
"""

import sys

if __name__ == "__main__":  # before TensorFlow and Beam load
    from lealla_tf.progress import quiet_startup

    quiet_startup()

from lealla_tf.cli.mine_bitext import main

if __name__ == "__main__":
    sys.exit(main())
