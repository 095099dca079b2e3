"""`lealla-kernels`: compile the fused training kernels for this machine now.

    lealla-kernels [--strict] [--force]

The Makefile's setup runs it, so that the first training run does not wait for
the compiler (`lealla_tf.models.kernels`). Prints the library's path; when it
cannot be built here, prints why and exits 0 (training then runs without the
kernels), unless --strict.
"""

if __name__ == "__main__":  # before TensorFlow loads (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import sys

from lealla_tf.flags import ArgumentParser, HelpFormatter


def main(argv=None) -> int:
    parser = ArgumentParser(prog="lealla-kernels", description=__doc__,
                            formatter_class=HelpFormatter)
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when the kernels cannot be built or loaded")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)

    from lealla_tf.models import kernels

    try:
        path = kernels.build(force=args.force)
        kernels.load()
    except kernels.KernelBuildError as error:
        print(f"lealla_tf.models.kernels: not built: {error}", file=sys.stderr)
        return 1 if args.strict else 0
    print(f"lealla_tf.models.kernels: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
