"""`python -m lealla_tf.models.kernels`: the command line in `lealla_tf.cli.build_kernels`
(`lealla-kernels`), which the Makefile's setup runs."""

import sys

if __name__ == "__main__":
    from lealla_tf.cli.build_kernels import main

    sys.exit(main())
