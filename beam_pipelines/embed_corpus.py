"""Embed a corpus with any exported model, at scale, with Apache Beam.

The command line of `lealla_tf.pipelines.embed_corpus` (see its docstring for every flag);
Beam's own flags (--runner=..., --direct_num_workers=...) pass through.
"""

import sys

if __name__ == "__main__":
    from lealla_tf.progress import quiet_startup

    quiet_startup()  # before TensorFlow and Beam load
    from lealla_tf.pipelines.embed_corpus import main

    sys.exit(main())
