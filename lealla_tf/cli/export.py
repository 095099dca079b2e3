r"""`lealla-export`: export a trained model directory as a TF-Hub SavedModel.

    lealla-export --model_dir=runs/small --export_path=exports/small \
        --format=lealla|labse|encoder_only|int8_tflite [--precision=bfloat16]

lealla:       raw strings -> L2-normalised [batch, d]; drop-in for tfhub.dev/google/LEALLA.
labse:        the LaBSE/2 preprocessor + encoder pair (export_path/{preprocessor,encoder}).
encoder_only: int32 ids -> embeddings, no text ops (for TFLite / ONNX converters).
int8_tflite:  that encoder as TFLite with int8 weights, plus its vocabulary
              (lealla-evaluate --model=<export_path> runs it on text).
The contracts are in lealla_tf/inference/formats.py.
"""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import json
import sys

from lealla_tf.flags import ArgumentParser, HelpFormatter
from lealla_tf.inference.export_info import PRECISIONS

# The formats of lealla_tf.inference.formats.FORMATS, here without TensorFlow for --help.
FORMATS = ("lealla", "labse", "encoder_only", "int8_tflite")


def load_hint(path: str) -> str:
    """How to load a LEALLA export, in each Keras (hub.KerasLayer needs the one line)."""
    return (f"load it: tf.saved_model.load({path!r}) after `import tensorflow_text`; in a Keras 3"
            f" model: lealla_tf.LeallaSavedModelLayer({path!r}, trainable=True); with "
            "hub.KerasLayer: os.environ['TF_USE_LEGACY_KERAS'] = '1' before TensorFlow is "
            "imported, then tf.keras (tf-keras) models")


def main(argv=None) -> int:
    parser = ArgumentParser(prog="lealla-export", description=__doc__,
                            formatter_class=HelpFormatter)
    parser.add_argument("--model_dir", required=True, help="written by lealla-train")
    parser.add_argument("--export_path", required=True)
    parser.add_argument("--format", default="lealla", choices=FORMATS)
    parser.add_argument("--checkpoint", default=None, help="checkpoint prefix (default: latest)")
    parser.add_argument("--seq_length", type=int, default=None,
                        help="labse format: the preprocessor's fixed output length "
                             "(default: the model's max_seq_length)")
    parser.add_argument("--jit_compile", action="store_true",
                        help="lealla format: run the encoder XLA-compiled (same outputs; "
                             "benchmarks/embedding_speed.py times it as the model student_xla)")
    parser.add_argument("--precision", default="float32", choices=PRECISIONS,
                        help="lealla format: the dtype the encoder computes in; bfloat16 "
                             "runs faster on a CPU with bfloat16 arithmetic (avx512_bf16 or "
                             "amx_bf16), within rounding of float32 (docs/benchmarks.md)")
    args = parser.parse_args(argv)
    if args.jit_compile and args.format != "lealla":
        parser.error("--jit_compile applies to --format=lealla")
    if args.precision != "float32" and args.format != "lealla":
        parser.error("--precision applies to --format=lealla")
    if args.precision != "float32" and args.jit_compile:
        parser.error("--jit_compile exports compute in float32; drop one of --jit_compile "
                     "and --precision")

    from lealla_tf.inference.formats import export_model_dir

    try:
        summary = export_model_dir(args.model_dir, args.export_path, args.format,
                                   checkpoint=args.checkpoint, seq_length=args.seq_length,
                                   jit_compile=args.jit_compile, precision=args.precision)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for name, path in summary["paths"].items():
        print(f"exported {args.format} {name}: {path} "
              f"({summary['bytes'][name] / 1e6:.1f} MB, {summary['embedding_dim']}-d, "
              f"{summary['parameters']:,} parameters)")
    print(json.dumps(summary, indent=2))
    if args.format == "lealla":
        print(load_hint(args.export_path))
    for warning in ("collapse_warning", "slow_precision_warning"):
        if summary.get(warning):
            print(summary[warning], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
