"""Mine parallel sentences between two languages' embedding shards.

The command line of `lealla_tf.pipelines.mine_bitext` (see its docstring for every flag);
Beam's own flags (--runner=..., --direct_num_workers=...) pass through.
"""

import sys

from lealla_tf.pipelines.mine_bitext import main

if __name__ == "__main__":
    sys.exit(main())
