"""`python -m lealla_tf.recipe` (`make main`): the main job's command line.

The stages and what each writes: `lealla_tf.recipe`."""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import sys

# The flags, from a module that loads no TensorFlow; the job, which does, is
# imported in main().
from lealla_tf.recipe import command_line


def build_parser():
    """The main job's flags (`lealla_tf.recipe.command_line`), with this help."""
    return command_line.build_parser(description=__doc__)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from lealla_tf.recipe.job import run_recipe
    from lealla_tf.recipe.report import format_summary
    from lealla_tf.recipe.stages import StageInterrupted

    try:
        report = run_recipe(command_line.config_from_flags(vars(args)), fresh=args.fresh)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except StageInterrupted as stopped:
        print(f"stopped: {stopped}", file=sys.stderr)
        return 130
    print(format_summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
