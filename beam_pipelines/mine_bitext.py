"""Mine parallel sentences between two languages' embedding shards.

The command line of `lealla_tf.pipelines.mine_bitext` (see its docstring for every flag);
Beam's own flags (--runner=..., --direct_num_workers=...) pass through.
"""

import sys

if __name__ == "__main__":
    from lealla_tf.progress import quiet_startup

    quiet_startup()  # before TensorFlow and Beam load
    from lealla_tf.pipelines.mine_bitext import main

    sys.exit(main())
