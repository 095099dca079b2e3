"""Embed a corpus with any exported model, at scale, with Apache Beam.

The command line of `lealla_tf.cli.embed_corpus` (`python beam_pipelines/embed_corpus.py --help`
lists every flag).
"""

import sys

if __name__ == "__main__":  # before TensorFlow and Beam load
    from lealla_tf.progress import quiet_startup

    quiet_startup()

from lealla_tf.cli.embed_corpus import main

if __name__ == "__main__":
    sys.exit(main())
