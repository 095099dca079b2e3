"""`lealla-presets`: print every encoder preset with its exact parameter count.

    lealla-presets [--vocabulary_size=501153]

One row per preset of LEALLA's Tables 1 and 7 (`lealla_tf.models.presets`): L, d,
H, d_ff, the exact parameter count for a vocabulary size (default: LaBSE's
501,153 tokens), the count without the token embedding table, and the paper's.
"""

import sys

from lealla_tf.flags import ArgumentParser, HelpFormatter
from lealla_tf.models.presets import LABSE_VOCABULARY_SIZE, format_preset_table


def main(argv=None) -> int:
    parser = ArgumentParser(
        prog="lealla-presets", formatter_class=HelpFormatter,
        description="Print every encoder preset with its exact parameter count.")
    parser.add_argument("--vocabulary_size", type=int, default=LABSE_VOCABULARY_SIZE,
                        help="vocabulary size to count with (default: LaBSE's 501,153)")
    args = parser.parse_args(argv)
    if args.vocabulary_size <= 0:
        parser.error("--vocabulary_size must be positive")
    print(f"Parameter counts with a {args.vocabulary_size:,}-token vocabulary "
          "('encoder' excludes the token embedding table):")
    print(format_preset_table(args.vocabulary_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
