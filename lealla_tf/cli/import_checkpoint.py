r"""`lealla-import-checkpoint`: import a released LEALLA or LaBSE/2 SavedModel into a
lealla_tf model directory.

    lealla-import-checkpoint --saved_model=<LEALLA-small/1 or LaBSE/2 encoder dir> \
        --model_dir=runs/lealla_small_released

LEALLA uses TF1-BERT names under student_bert/ (its dead token_type_embeddings_real
and do_lower_case Variable are skipped); LaBSE/2 uses Model Garden BertEncoder names
with einsum kernels. The vocabulary is taken from the SavedModel's assets (LaBSE/2:
the encoder's cased_vocab.txt) unless --vocab_file is given. The model directory can
then be fine-tuned (lealla-train --init_from=...) or re-exported (lealla-export).
"""

if __name__ == "__main__":  # before TensorFlow and Beam load (lealla_tf.progress)
    from lealla_tf.progress import quiet_startup

    quiet_startup()

import sys

from lealla_tf.flags import ArgumentParser, HelpFormatter


def main(argv=None) -> int:
    parser = ArgumentParser(prog="lealla-import-checkpoint", description=__doc__,
                            formatter_class=HelpFormatter)
    parser.add_argument("--saved_model", required=True)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--vocab_file", default=None)
    parser.add_argument("--num_heads", type=int, default=None,
                        help="attention heads when the checkpoint stores 2-D kernels "
                             "(default: 8 for 128/256-d, 12 for 192/768-d)")
    parser.add_argument("--max_seq_length", type=int, default=128)
    args = parser.parse_args(argv)

    from lealla_tf.models.checkpoint_conversion import import_saved_model

    try:
        summary = import_saved_model(args.saved_model, args.model_dir, args.vocab_file,
                                     num_heads=args.num_heads, max_seq_length=args.max_seq_length)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    config = summary["encoder"]
    print(f"imported {summary['layout']} checkpoint: {config.num_layers} layers, "
          f"{config.hidden_dim}-d, {config.num_heads} heads, vocabulary {config.vocabulary_size:,}"
          f" -> {summary['checkpoint']}")
    if summary["unused_tensors"]:
        print(f"warning: unused tensors: {summary['unused_tensors']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
