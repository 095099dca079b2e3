"""Training data: parallel pairs -> language-balanced, tokenized batches in tf.data.

Inputs are TSV (`xx<TAB>en`, plain or .gz; the stream takes the lines the pair
counts take, `parse_lines`) or TFRecord pair records (the schema is
`lealla_tf.records`': `src_raw`, `tgt_raw` and optionally the teacher vectors
`teacher_src`, `teacher_tgt`, written by `beam_pipelines/embed_corpus.py --pairs`).
A file's language comes from its name (`lealla_tf.parallel_corpus.language_of`).
Pairs seen in evaluation data are dropped in the stream (`lealla_tf.train.decontamination`).

The pair stream is a pure function of the seed: resuming at step k skips
exactly k global batches (before tokenization, so it is cheap: k batches of
pairs in stream order, or with length buckets the first k bucketed batches),
which is how a killed run continues with no repeated or skipped steps.
"""

import collections
import gzip
import os
import zlib
from collections.abc import Sequence

import tensorflow as tf
from google.protobuf.message import DecodeError

from lealla_tf.configs import DataConfig
from lealla_tf.machine import usable_cpus
from lealla_tf.mining.run_folders import manifest_files, read_manifest
from lealla_tf.parallel_corpus import (
    LINE_CHECKS,
    SEPARATOR,
    WHITESPACE,
    CorpusCounts,
    LineCounts,
    ParallelFile,
    find_parallel_files,
    language_of,
    language_sampling_probabilities,
    read_pairs,
)
from lealla_tf.records import (
    PAIR_SOURCE,
    PAIR_TARGET,
    PAIR_TEACHER_SOURCE,
    PAIR_TEACHER_TARGET,
    pair_example,
    pair_features,
)
from lealla_tf.train.decontamination import Decontaminator

TFRECORD_SUFFIXES = (".tfrecord", ".tfrecord.gz", ".tfrecords")
SOURCE, TARGET = PAIR_SOURCE, PAIR_TARGET
LANGUAGE = "language"
KIND = "kind"  # a TSV line's kind (`parse_lines`): "" for a pair


def find_training_files(patterns: Sequence[str]) -> list[ParallelFile]:
    """TSV pair files and TFRecord files for `patterns` (files, dirs, globs)."""
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p]
    records, others, empty = [], [], []
    for pattern in patterns:
        if tf.io.gfile.isdir(pattern) and read_manifest(pattern) is not None:
            # A pipeline output: only the files of its last complete run.
            records += manifest_files(pattern)
        elif tf.io.gfile.isdir(pattern):
            found = [os.path.join(root, name) for root, _, names in tf.io.gfile.walk(pattern)
                     for name in names if name.endswith(TFRECORD_SUFFIXES)]
            records += found
            others.append(pattern)  # TSV files in the directory too
        else:
            matches = tf.io.gfile.glob(pattern)
            if not matches:
                empty.append(pattern)
            records += [m for m in matches if m.endswith(TFRECORD_SUFFIXES)]
            others += [m for m in matches if not m.endswith(TFRECORD_SUFFIXES)]
    if empty:
        raise FileNotFoundError(f"no training files found for: {', '.join(empty)}")
    files = [ParallelFile(path, language_of(path.split(".tfrecord")[0]))
             for path in sorted(set(records))]
    if others:
        try:
            files += find_parallel_files(others)
        except FileNotFoundError:
            if not records:
                raise
    if not files:
        raise FileNotFoundError(f"no TSV or TFRecord pair files in {list(patterns)}")
    return files


def count_pairs(path: str, counts: LineCounts | None = None) -> int:
    """Well-formed pairs in a TSV file, or records in a TFRecord file; `counts` gets
    them, and a TSV file's skipped lines by kind (`read_pairs`). Raises ValueError
    naming the file when it is corrupt (a broken gzip stream, a truncated TFRecord)
    or holds no well-formed pair."""
    counts = counts if counts is not None else LineCounts(path)
    if path.endswith(TFRECORD_SUFFIXES):
        compression = "GZIP" if path.endswith(".gz") else ""
        first_record_features(path)  # a foreign schema fails here, naming the file
        try:
            records = int(tf.data.TFRecordDataset(path, compression_type=compression).reduce(
                tf.constant(0, tf.int64), lambda n, _: n + 1))
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
            raise ValueError(f"{path}: corrupt or truncated TFRecord file "
                             f"({error.message.splitlines()[0]})") from None
        counts.pairs += records
        return records
    try:
        return sum(1 for _ in read_pairs(path, counts=counts))
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise ValueError(f"{path}: unreadable or corrupt file ({error})") from None


def language_sizes(files: list[ParallelFile],
                   line_counts: CorpusCounts | None = None) -> dict[str, int]:
    """Pairs per language; ValueError when no file holds a well-formed pair.
    `line_counts` gets each file's pairs and skipped lines (`count_pairs`)."""
    line_counts = line_counts if line_counts is not None else CorpusCounts()
    sizes = collections.Counter()
    for parallel_file in files:
        sizes[parallel_file.language] += count_pairs(parallel_file.path,
                                                     line_counts.file(parallel_file.path))
    if not any(sizes.values()):
        raise ValueError("no well-formed pairs (source<TAB>English, both non-empty) in "
                         + ", ".join(f.path for f in files[:5])
                         + (f" and {len(files) - 5} more" if len(files) > 5 else ""))
    return dict(sizes)


LINES_AT_ONCE = 256  # lines `parse_lines` checks in one call: vectorised, not op by op
# A string of whitespace alone (`parallel_corpus.WHITESPACE`), for RE2.
_WHITESPACE_ONLY = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in WHITESPACE) + "]*"


def parse_lines(lines):
    """`parallel_corpus.parse_line` in TensorFlow ops, for a vector of lines as
    TextLineDataset reads them: {KIND: "" for a pair, else its kind; SOURCE, TARGET}.
    A line is UTF-8 when replacing what is not changes nothing; a side is empty when
    RE2 matches it to `WHITESPACE`; the kind is the first of `LINE_CHECKS` that holds."""
    text = tf.strings.unicode_transcode(lines, "UTF-8", "UTF-8", errors="replace",
                                        replacement_char=0xFFFD)
    columns = tf.strings.split(text, SEPARATOR)
    count, sides = columns.row_lengths(), columns.to_tensor("", shape=[None, 2])
    blank = tf.strings.regex_full_match(tf.stack([text, sides[:, 0], sides[:, 1]]),
                                        _WHITESPACE_ONLY)  # the line, either side
    holds = {"not_utf8": tf.not_equal(text, lines), "blank": blank[0],
             "no_tab": tf.equal(count, 1), "extra_columns": count > 2,
             "empty_side": tf.logical_or(blank[1], blank[2])}
    kind = tf.fill(tf.shape(lines), "")
    for check in reversed(LINE_CHECKS):
        kind = tf.where(holds[check], check, kind)
    return {KIND: kind, SOURCE: sides[:, 0], TARGET: sides[:, 1]}


def tsv_lines(paths: list[str], pairs_only: bool = False):
    """Every line of TSV files `paths`, in order, as `parse_lines` reads it; with
    `pairs_only`, the pairs alone ({SOURCE, TARGET}: what `read_pairs` yields)."""
    if any(p.endswith(".gz") for p in paths) and not all(p.endswith(".gz") for p in paths):
        return tsv_lines([p for p in paths if p.endswith(".gz")], pairs_only).concatenate(
            tsv_lines([p for p in paths if not p.endswith(".gz")], pairs_only))
    lines = tf.data.TextLineDataset(paths, compression_type="GZIP" if paths[0].endswith(
        ".gz") else "")

    def parse(batch):
        parsed = parse_lines(batch)
        if not pairs_only:
            return parsed
        pair = tf.equal(parsed.pop(KIND), "")
        return {key: tf.boolean_mask(value, pair) for key, value in parsed.items()}

    return lines.batch(LINES_AT_ONCE).map(
        parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()


def _record_pairs(paths: list[str], teacher_dim: int | None, has_source: bool = True):
    compression = "GZIP" if all(p.endswith(".gz") for p in paths) else ""
    features = pair_features(teacher_dim, has_source)
    records = tf.data.TFRecordDataset(paths, compression_type=compression)
    return records.map(lambda r: tf.io.parse_single_example(r, features),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def first_record_features(path: str) -> dict[str, tf.train.Feature] | None:
    """The features of the first record of TFRecord file `path` (None: no record).

    Raises ValueError naming the file when it is corrupt, or when its records
    are not training pairs (`src_raw`, `tgt_raw`): an embeddings output of
    beam_pipelines/embed_corpus.py, say, which holds `id` and `embedding`.
    """
    compression = "GZIP" if path.endswith(".gz") else ""
    try:
        for record in tf.data.TFRecordDataset(path, compression_type=compression).take(1):
            features = dict(tf.train.Example.FromString(record.numpy()).features.feature)
            break
        else:
            return None
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        raise ValueError(f"{path}: corrupt or truncated TFRecord file "
                         f"({error.message.splitlines()[0]})") from None
    except DecodeError:
        raise ValueError(f"{path}: its records are not tf.train.Example protos") from None
    missing = [key for key in (PAIR_SOURCE, PAIR_TARGET) if key not in features]
    if missing:
        raise ValueError(
            f"{path}: not a training-pair TFRecord (its records hold "
            f"{', '.join(sorted(features)) or 'no features'}; pairs need {PAIR_SOURCE} and "
            f"{PAIR_TARGET}). Train on TSV pairs or on the output of "
            "beam_pipelines/embed_corpus.py --pairs, not on an embeddings output")
    return features


def precomputed_teacher_layout(files: list[ParallelFile]) -> tuple[int, bool] | None:
    """(dimension, has source side) of the teacher vectors in TFRecord inputs, or None.

    Every TFRecord file must hold the same layout: records without teacher
    vectors, or of another width, cannot be batched with the others.
    """
    layouts = {}
    for parallel_file in files:
        if not parallel_file.path.endswith(TFRECORD_SUFFIXES):
            continue
        features = first_record_features(parallel_file.path)
        if features is None:
            continue
        target = features.get(PAIR_TEACHER_TARGET)
        layouts[parallel_file.path] = None if target is None else (
            len(target.float_list.value), PAIR_TEACHER_SOURCE in features)
    distinct = set(layouts.values())
    if len(distinct) > 1:
        def describe(layout):
            if layout is None:
                return "no teacher vectors"
            return f"{layout[0]}-d, " + ("both sides" if layout[1] else "English side only")

        examples = {layout: path for path, layout in layouts.items()}
        raise ValueError("the training TFRecords disagree on their teacher vectors: "
                         + "; ".join(f"{path}: {describe(layout)}"
                                     for layout, path in examples.items())
                         + ". Write them with one teacher, or train on them separately")
    return distinct.pop() if distinct else None


def teacher_dimension_of(files: list[ParallelFile]) -> int | None:
    """Length of the precomputed teacher vectors in TFRecord inputs (None if absent)."""
    layout = precomputed_teacher_layout(files)
    return layout[0] if layout else None


def pair_dataset(config: DataConfig, global_batch_size: int, steps_done: int = 0,
                 input_context: tf.distribute.InputContext | None = None,
                 teacher_dim: int | None = None, files: list[ParallelFile] | None = None,
                 sizes: dict[str, int] | None = None, teacher_source: bool = True):
    """An endless, language-balanced stream of pairs for one input pipeline.

    Each language is its own shuffled, repeated stream, sharded across input
    pipelines; streams are mixed with temperature-sampling probabilities.
    `steps_done` global batches are skipped (resume). With `teacher_dim`, the
    TFRecord inputs' teacher vectors are parsed too (`teacher_source`: the
    source side's as well as the English side's).

    Returns:
        (dataset of dicts {src_raw, tgt_raw[, teacher_src, teacher_tgt]},
         info dict with languages, sizes, probabilities).
    """
    files = files if files is not None else find_training_files(config.train_data)
    by_language = collections.defaultdict(list)
    for parallel_file in files:
        by_language[parallel_file.language].append(parallel_file.path)
    if sizes is None:
        sizes = language_sizes(files)
    probabilities = language_sampling_probabilities(sizes, config.language_alpha)
    languages = sorted(probabilities)
    decontaminator = Decontaminator(config.decontaminate) if config.decontaminate else None
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    streams = []
    for index, language in enumerate(languages):
        paths = by_language[language]
        records = [p for p in paths if p.endswith(TFRECORD_SUFFIXES)]
        tsvs = [p for p in paths if not p.endswith(TFRECORD_SUFFIXES)]
        if records and tsvs:
            raise ValueError(f"{language}: mix of TSV and TFRecord inputs; use one kind")
        if records:
            pairs = _record_pairs(records, teacher_dim, teacher_source)
        else:
            if teacher_dim:
                raise ValueError(f"{language}: precomputed teacher vectors need TFRecord "
                                 "inputs (beam_pipelines/embed_corpus.py --pairs)")
            pairs = tsv_lines(tsvs, pairs_only=True)
        if decontaminator is not None:
            pairs = pairs.filter(lambda p: decontaminator.keep(p[SOURCE], p[TARGET]))
        # The language's index (sorted codes; English is len(languages)).
        pairs = pairs.map(lambda p, i=index: {**p, LANGUAGE: tf.constant(i, tf.int32)})
        pairs = pairs.shard(pipelines, pipeline_id)
        pairs = pairs.shuffle(config.shuffle_buffer, seed=config.seed + index,
                              reshuffle_each_iteration=True).repeat()
        streams.append(pairs)
    weights = [probabilities[lang] for lang in languages]
    # Each input pipeline (worker) draws its own sequence of languages; with one
    # seed, every worker's share of a global batch would repeat the same mix.
    mixed = tf.data.Dataset.sample_from_datasets(streams, weights=weights,
                                                 seed=config.seed + pipeline_id,
                                                 stop_on_empty_dataset=False)
    per_pipeline = global_batch_size // pipelines
    if steps_done and not (config.length_buckets or config.one_language_batches):
        # Batches in stream order: step k starts at pair k x batch. Grouped batches
        # (`batch_by_length`) are skipped as batches instead (`tokenize_batches`).
        mixed = mixed.skip(steps_done * per_pipeline)
    info = {"languages": languages, "sizes": sizes, "probabilities": probabilities,
            "decontamination_sentences": decontaminator.size if decontaminator else 0}
    return mixed, info


BUCKET_BYTES = 32


def length_bucket(length_in_bytes, buckets: int):
    """The bucket of a pair whose longer side has this many UTF-8 bytes: 0 below
    `BUCKET_BYTES`, then one bucket per doubling (32-63, 64-127, 128-255, ...),
    the last one open. Doubling keeps the padding within a bucket a similar
    share of its batch for a 10-byte sentence and a 500-byte one."""
    doublings = tf.math.floor(tf.math.log(
        tf.maximum(tf.cast(length_in_bytes, tf.float32), 1.0) / BUCKET_BYTES) / tf.math.log(2.0))
    return tf.cast(tf.clip_by_value(doublings + 1, 0, buckets - 1), tf.int64)


def batch_by_length(pairs, batch_size: int, buckets: int, one_language: bool = False):
    """Batches pairs of similar length: the longer side's UTF-8 bytes pick one of
    `buckets` buckets (`length_bucket`), each batch the next `batch_size` pairs of
    one bucket (`one_language`: of one bucket and language). The stream's order is
    kept within a group, so the result is deterministic."""
    def group(pair):
        longest = tf.maximum(tf.strings.length(pair[SOURCE]), tf.strings.length(pair[TARGET]))
        language = tf.cast(pair[LANGUAGE], tf.int64) if one_language else 0
        return length_bucket(longest, buckets) + language * buckets

    return pairs.group_by_window(
        group, lambda _, window: window.batch(batch_size, drop_remainder=True),
        window_size=batch_size)


def tokenize_batches(pairs, batch_size: int, tokenizer, teacher=None, length_buckets: int = 0,
                     steps_done: int = 0, fixed_lengths: Sequence[int] = (), one_language=False):
    """Batches pairs (in stream order, or by length and/or language: see
    `batch_by_length`) and tokenizes both sides (each padded to its own longest,
    or, with `fixed_lengths`, both to the shortest of them that holds the longer:
    `pad_to_fixed_lengths`). Grouped batches skip their first `steps_done` before
    tokenization (resume: `pair_dataset` skips raw pairs only when ungrouped).

    Returns a dataset of dicts: `source`, `target` (BERT input dicts), `language`
    (the source side's language index) and what
    the teacher's step needs (`lealla_tf.teachers.sources.Teacher.batch_features`:
    precomputed vectors, or its own tokenization of the sentences).
    """
    def tokenize(batch):
        features = {"source": tokenizer(batch[SOURCE]), "target": tokenizer(batch[TARGET]),
                    LANGUAGE: batch[LANGUAGE]}
        if teacher is not None:
            features.update(teacher.batch_features(batch))
        if fixed_lengths:
            features = pad_to_fixed_lengths(features, fixed_lengths, tokenizer.pad_id)
        return features

    if length_buckets or one_language:
        batches = batch_by_length(pairs, batch_size, max(1, length_buckets),
                                  one_language).skip(steps_done)
    else:
        batches = pairs.batch(batch_size, drop_remainder=True)
    batches = batches.map(
        tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(
        tf.data.AUTOTUNE)
    return batches.with_options(input_pipeline_options())


# === Fixed shapes for an XLA-compiled step (--jit_compile) ===

def fixed_lengths(max_seq_length: int, shortest: int = 8) -> list[int]:
    """The lengths a compiled step's batches are padded to: powers of two from
    `shortest` below `max_seq_length`, then `max_seq_length`. XLA compiles the
    step once per shape, so a run compiles it at most this many times, and a
    batch carries less than twice its longest sentence."""
    lengths, length = [], shortest
    while length < max_seq_length:
        lengths.append(length)
        length *= 2
    return lengths + [int(max_seq_length)]


def pad_to_fixed_lengths(features: dict, lengths: Sequence[int], pad_id: int) -> dict:
    """The batch's `source` and `target` token dicts padded (word ids with
    `pad_id`, mask and type ids with 0) to the shortest of `lengths` that holds
    both sides' longest row; a teacher's own token dicts (`*_inputs`) likewise to
    theirs, with 0 (a row longer than every length keeps its own)."""
    ladder = tf.constant(sorted(int(n) for n in lengths), tf.int32)

    def rung(longest):
        fits = tf.boolean_mask(ladder, ladder >= longest)
        return tf.cond(tf.size(fits) > 0, lambda: fits[0], lambda: longest)

    def pad(inputs, width, word_pad):
        return {name: tf.pad(value, [[0, 0], [0, width - tf.shape(value)[1]]],
                             constant_values=word_pad if name == "input_word_ids" else 0)
                for name, value in inputs.items()}

    features = dict(features)
    for group, word_pad in ((("source", "target"), pad_id),
                            (tuple(k for k in features if k.endswith("_inputs")), 0)):
        if not group:
            continue
        width = rung(tf.reduce_max([tf.shape(features[k]["input_word_ids"])[1] for k in group]))
        for key in group:
            features[key] = pad(features[key], width, word_pad)
    return features


# Up to this many cores, the input pipeline gets one thread and no autotuning.
FEW_CORES = 4


def input_pipeline_options(cpu_count: int | None = None) -> tf.data.Options:
    """tf.data options for a training input pipeline on this host.

    On a host with few cores, tf.data's own thread pool and its autotuner
    compete with the training step for the same cores and slow it (docs/benchmarks.md,
    oneDNN and the input pipeline); there the pipeline runs on one private
    thread, without autotuning. Larger hosts keep TensorFlow's defaults.
    """
    options = tf.data.Options()
    if (cpu_count or usable_cpus()) <= FEW_CORES:
        options.autotune.enabled = False
        options.threading.private_threadpool_size = 1
        options.threading.max_intra_op_parallelism = 1
    return options


def write_pairs_tfrecord(path: str, pairs, teacher_source=None, teacher_target=None) -> int:
    """Writes pairs (and optional teacher vectors) as TFRecord pair records.

    The small, in-process writer; `beam_pipelines/embed_corpus.py --pairs`
    writes the same schema at scale.
    """
    count = 0
    options = tf.io.TFRecordOptions(compression_type="GZIP" if path.endswith(".gz") else "")
    with tf.io.TFRecordWriter(path, options) as writer:
        for i, (source, target) in enumerate(pairs):
            writer.write(pair_example(
                source, target, None if teacher_source is None else teacher_source[i],
                None if teacher_target is None else teacher_target[i]))
            count += 1
    return count
