"""Training data: file discovery, balancing, sharding, decontamination, resume skip."""


import numpy as np
import pytest
import tensorflow as tf
from conftest import write_pairs

from lealla_tf.configs import DataConfig
from lealla_tf.parallel_corpus import language_sampling_probabilities
from lealla_tf.teachers.sources import PrecomputedTeacher
from lealla_tf.tokenizers.tokenizer import Tokenizer
from lealla_tf.train.data import (
    find_training_files,
    pair_dataset,
    teacher_dimension_of,
    tokenize_batches,
    write_pairs_tfrecord,
)


def take(dataset, count):
    return [{k: v.numpy() for k, v in item.items()} for item in dataset.take(count)]


@pytest.fixture()
def unbalanced(tmp_path):
    write_pairs(tmp_path, "deu", [(f"de {i}", f"en {i}") for i in range(400)])
    write_pairs(tmp_path, "xho", [(f"xh {i}", f"en x{i}") for i in range(4)])
    return str(tmp_path)


def test_probabilities_follow_temperature_sampling():
    probabilities = language_sampling_probabilities({"a": 100, "b": 1}, 0.5)
    assert np.isclose(probabilities["a"], 10 / 11) and np.isclose(probabilities["b"], 1 / 11)
    assert np.isclose(language_sampling_probabilities({"a": 100, "b": 1}, 0.0)["b"], 0.5)


@pytest.mark.parametrize("alpha,expected_share", [(1.0, 4 / 404), (0.0, 0.5)])
def test_language_balanced_sampling(unbalanced, alpha, expected_share):
    pairs, info = pair_dataset(DataConfig([unbalanced], language_alpha=alpha), 8)
    sample = take(pairs, 4000)
    share = np.mean([p["src_raw"].startswith(b"xh") for p in sample])
    assert abs(share - expected_share) < 0.03
    assert info["sizes"] == {"deu": 400, "xho": 4}


def test_stream_is_deterministic_and_resume_skips_whole_batches(unbalanced):
    config = DataConfig([unbalanced], seed=3)
    first, _ = pair_dataset(config, global_batch_size=4)
    stream = [p["src_raw"] for p in take(first, 40)]
    again, _ = pair_dataset(config, global_batch_size=4)
    assert [p["src_raw"] for p in take(again, 40)] == stream
    resumed, _ = pair_dataset(config, global_batch_size=4, steps_done=5)
    assert [p["src_raw"] for p in take(resumed, 20)] == stream[20:40]


def test_input_pipelines_get_disjoint_shards(unbalanced):
    config = DataConfig([unbalanced], language_alpha=1.0)
    seen = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                             num_replicas_in_sync=2)
        pairs, _ = pair_dataset(config, 8, input_context=context)
        seen.append({p["src_raw"] for p in take(pairs, 2000)})
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 404


def test_decontamination_drops_pairs_seen_in_evaluation(tmp_path, tiny_tatoeba_dir):
    write_pairs(tmp_path / "d", "deu", [("Der Hund ist nett.", "anything"),
                                        ("something", "THE CAT IS BIG.  "),
                                        ("Sauber", "Clean")])
    pairs, info = pair_dataset(DataConfig([str(tmp_path / "d")],
                                          decontaminate=[tiny_tatoeba_dir]), 1)
    kept = {p["src_raw"] for p in take(pairs, 30)}
    assert kept == {b"Sauber"}
    assert info["decontamination_sentences"] > 0


def test_malformed_tsv_lines_are_dropped(tmp_path):
    path = tmp_path / "fra-eng.tsv"
    path.write_text("ok\tfine\nno tab\n\tempty\nalso\tgood\n")
    pairs, _ = pair_dataset(DataConfig([str(path)]), 1)
    assert {p["src_raw"] for p in take(pairs, 20)} == {b"ok", b"also"}


def test_tfrecords_of_two_teacher_layouts_are_refused(tmp_path):
    vectors = np.ones((1, 4), np.float32)
    write_pairs_tfrecord(str(tmp_path / "deu-eng-00000-of-00001.tfrecord.gz"), [("a", "b")],
                         vectors, vectors)
    write_pairs_tfrecord(str(tmp_path / "fra-eng-00000-of-00001.tfrecord.gz"), [("c", "d")],
                         None, np.ones((1, 8), np.float32))
    with pytest.raises(ValueError, match="disagree on their teacher vectors") as error:
        teacher_dimension_of(find_training_files([str(tmp_path)]))
    assert "4-d, both sides" in str(error.value)
    assert "8-d, English side only" in str(error.value)


def test_tfrecords_with_teacher_vectors(tmp_path, tiny_vocab_file):
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = str(tmp_path / "deu-eng-00000-of-00001.tfrecord.gz")
    write_pairs_tfrecord(path, [("a", "b"), ("c", "d"), ("e", "f")], vectors, vectors + 1)
    files = find_training_files([str(tmp_path)])
    assert [f.language for f in files] == ["deu"]
    assert teacher_dimension_of(files) == 4
    pairs, _ = pair_dataset(DataConfig([str(tmp_path)], shuffle_buffer=1), 3, teacher_dim=4)
    batches = tokenize_batches(pairs, 3, Tokenizer(tiny_vocab_file), PrecomputedTeacher(4, True))
    batch = next(iter(batches))
    assert batch["teacher_target"].shape == (3, 4)
    first = batch["source"]["input_word_ids"].shape
    assert first[0] == 3
    rows = {tuple(r) for r in batch["teacher_target"].numpy().tolist()}
    assert rows <= {tuple(v) for v in (vectors + 1).tolist()}


def test_missing_training_data_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing"):
        find_training_files([str(tmp_path / "nothing*.tsv")])


def expected_bucket(length, buckets):
    """The bucket by doublings of BUCKET_BYTES, written out: <32, 32-63, 64-127, ..."""
    from lealla_tf.train.data import BUCKET_BYTES

    bucket, upper = 0, BUCKET_BYTES
    while length >= upper and bucket < buckets - 1:
        bucket, upper = bucket + 1, upper * 2
    return bucket


def test_length_buckets_double_in_width():
    from lealla_tf.train.data import length_bucket

    lengths = [0, 1, 31, 32, 63, 64, 127, 128, 255, 256, 511, 512, 5000]
    got = length_bucket(tf.constant(lengths), 6).numpy().tolist()
    assert got == [expected_bucket(n, 6) for n in lengths] == [0, 0, 0, 1, 1, 2, 2, 3, 3, 4,
                                                                4, 5, 5]
    assert length_bucket(tf.constant(lengths), 1).numpy().tolist() == [0] * len(lengths)


def test_length_buckets_batch_similar_lengths_deterministically(tmp_path):
    from lealla_tf.train.data import BUCKET_BYTES, SOURCE, TARGET, batch_by_length

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 4 * BUCKET_BYTES, size=600)
    pairs = tf.data.Dataset.from_tensor_slices(
        {SOURCE: ["x" * int(n) for n in lengths], TARGET: ["en"] * len(lengths)})

    def bucket_ids(buckets):
        return [sorted({expected_bucket(len(s), buckets) for s in batch[SOURCE]})
                for batch in take(batch_by_length(pairs, 8, buckets), 40)]

    assert all(len(ids) == 1 for ids in bucket_ids(4))  # each batch from one bucket
    assert all(ids == [0] for ids in bucket_ids(1))  # one bucket = stream order
    assert bucket_ids(4) == bucket_ids(4)  # deterministic
    ordered = [len(s) for b in take(batch_by_length(pairs, 8, 1), 40) for s in b[SOURCE]]
    assert ordered == [int(n) for n in lengths[:320]]
    padded = [max(len(s) for s in b[SOURCE]) for b in take(batch_by_length(pairs, 8, 4), 40)]
    plain = [max(len(s) for s in b[SOURCE]) for b in take(batch_by_length(pairs, 8, 1), 40)]
    assert sum(padded) < 0.8 * sum(plain)


def test_bucketed_batches_resume_at_the_same_batch(tmp_path):
    """Resume skips k bucketed batches, not k x batch raw pairs: bucketing takes
    pairs out of order and holds partial buckets back, so the two differ."""
    from lealla_tf.train.data import LANGUAGE, SOURCE, TARGET, tokenize_batches

    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 400, size=3000)
    pairs = tf.data.Dataset.from_tensor_slices(
        {SOURCE: ["x" * int(n) for n in lengths], TARGET: ["e" * int(n % 7 + 1) for n in lengths],
         LANGUAGE: np.zeros(len(lengths), np.int32)})

    def lengths_of(batches, count):
        return [batch["source"]["bytes"].numpy().tolist() for batch in batches.take(count)]

    def tokenize(strings):
        return {"bytes": tf.strings.length(strings)}

    straight = lengths_of(tokenize_batches(pairs, 8, tokenize, length_buckets=4), 30)
    resumed = lengths_of(tokenize_batches(pairs, 8, tokenize, length_buckets=4,
                                          steps_done=12), 18)
    assert resumed == straight[12:]
    # The raw-pair skip would have started elsewhere: the fix is not vacuous here.
    skipped_raw = lengths_of(tokenize_batches(pairs.skip(12 * 8), 8, tokenize,
                                              length_buckets=4), 18)
    assert skipped_raw != straight[12:]
    # pair_dataset leaves the skipping to the bucketing when buckets are on.
    write_pairs(tmp_path, "deu", [(f"de {'x' * (i % 90)} {i}", f"en {i}") for i in range(300)])
    config = DataConfig(train_data=[str(tmp_path)], length_buckets=4, shuffle_buffer=50)
    first = next(iter(pair_dataset(config, 8)[0]))
    unskipped = next(iter(pair_dataset(config, 8, steps_done=5)[0]))
    assert first[SOURCE].numpy() == unskipped[SOURCE].numpy()
    plain = DataConfig(train_data=[str(tmp_path)], shuffle_buffer=50)
    assert next(iter(pair_dataset(plain, 8, steps_done=5)[0]))[SOURCE].numpy() == [
        p[SOURCE].numpy() for p in pair_dataset(plain, 8)[0].take(41)][40]


def test_one_language_batches_hold_one_language_in_its_share(tmp_path):
    """Each batch is one language's (and one length bucket's), languages come in
    their sampling shares a batch at a time, and resume skips whole batches."""
    from lealla_tf.train.data import LANGUAGE

    write_pairs(tmp_path, "deu", [(f"de {'x' * (i % 70)} {i}", f"en {i}") for i in range(900)])
    write_pairs(tmp_path, "fra", [(f"fr {'y' * (i % 70)} {i}", f"en f{i}") for i in range(300)])
    config = DataConfig([str(tmp_path)], language_alpha=1.0, length_buckets=3,
                        one_language_batches=True, shuffle_buffer=100)

    def batches(steps_done=0, count=60):
        pairs, info = pair_dataset(config, 8, steps_done)

        def tokenize(strings):
            return {"text": strings}

        return [{"languages": set(b[LANGUAGE].numpy().tolist()),
                 "sources": b["source"]["text"].numpy().tolist()}
                for b in tokenize_batches(pairs, 8, tokenize, length_buckets=3,
                                          steps_done=steps_done, one_language=True).take(count)
                ], info

    straight, info = batches()
    assert all(len(b["languages"]) == 1 for b in straight)
    assert all(len({s[:2] for s in b["sources"]}) == 1 for b in straight)
    french = info["languages"].index("fra")
    share = np.mean([b["languages"] == {french} for b in straight])
    assert abs(share - 0.25) < 0.15
    resumed, _ = batches(steps_done=10, count=20)
    assert [b["sources"] for b in resumed] == [b["sources"] for b in straight[10:30]]
    # The same pairs mixed: batches hold both languages.
    mixed = DataConfig([str(tmp_path)], language_alpha=1.0, shuffle_buffer=100)
    pairs, _ = pair_dataset(mixed, 8)
    assert any(len(set(b[LANGUAGE].numpy().tolist())) == 2
               for b in pairs.batch(8).take(20))


def test_negative_length_buckets_are_refused(tmp_path):
    from lealla_tf.configs import TrainConfig
    from lealla_tf.train.resolution import validate_train_config

    config = TrainConfig(data=DataConfig(train_data=[str(tmp_path)], length_buckets=-1))
    with pytest.raises(ValueError, match="--length_buckets"):
        validate_train_config(config)


def test_input_pipeline_stays_off_the_steps_cores_on_a_small_host(tmp_path, tiny_vocab_file,
                                                                   monkeypatch):
    import lealla_tf.train.data
    from lealla_tf.train.data import input_pipeline_options


    small, large = input_pipeline_options(2), input_pipeline_options(64)
    assert small.autotune.enabled is False
    assert small.threading.private_threadpool_size == 1
    assert small.threading.max_intra_op_parallelism == 1
    assert large.autotune.enabled is not False
    assert large.threading.private_threadpool_size in (None, 0)
    # On a small host the training pipeline carries them, and still yields batches.
    monkeypatch.setattr(lealla_tf.train.data, "FEW_CORES", 10_000)
    pairs = tf.data.Dataset.from_tensor_slices(
        {"src_raw": ["un chien", "le chat"] * 4, "tgt_raw": ["a dog", "the cat"] * 4,
         "language": [0] * 8})
    batches = tokenize_batches(pairs, 4, Tokenizer(tiny_vocab_file))
    assert batches.options().threading.private_threadpool_size == 1
    assert batches.options().autotune.enabled is False
    first = next(iter(batches))
    assert first["source"]["input_word_ids"].shape[0] == 4


# === Issue 62, item 2: one definition of a corpus line, for the stream and the counts ===

EVERY_KIND_OF_LINE = [
    b"Hund\tdog\n", b"no tab here\n", b"chien\tdog\t0.93\n", b"ch\xe9ri\tdarling\n",
    b"\tonly English\n", b"only source\t\n", b"\xc2\xa0\tno-break space\n",
    b"\xe3\x80\x80\tideographic space\n", b"\x1c\tfile separator\n", b"  \t \n", b"\n",
    b"\r\n", b"Katze\tcat\r\n", b"Maus\r\tmouse\n", b"\xe2\r\x82\xac\tEuro\n",
    b"\xed\xa0\x80\tsurrogate\n", b"\xc0\x80\toverlong\n", b"\xef\xbb\xbfBOM\tbom\n",
    b"a\x00b\tnul\n", b"Vogel\tbird\t\n", b"\xff\tno\ttab\n", b"last\tline, no newline"]
# Pieces of random lines: the separator, the whitespace of either reader, and bytes
# that are UTF-8 only in some orders.
LINE_PIECES = [b"a", b"\xc3\xa9", b"\t", b" ", b"\r", b"\xc2\xa0", b"\xc2\x85", b"\x0b",
               b"\xe3\x80\x80", b"\xff", b"\xe2\x82", b"\xac", b"\xf0\x9f\x98\x80"]


def every_kind_of_line(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    generated = [b"".join(rng.choice(LINE_PIECES, size=rng.integers(0, 7))) + b"\n"
                 for _ in range(300)]
    return b"".join(EVERY_KIND_OF_LINE[:-1] + generated + EVERY_KIND_OF_LINE[-1:])


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_the_stream_trains_on_exactly_the_pairs_the_corpus_reader_counts(tmp_path, gz):
    """The stream split lines on their first tab: a third column rode into the
    English side and bytes that are not UTF-8 were trained on, while the pair
    count (the language weights) skipped both. Both now read a line one way."""
    import gzip

    from lealla_tf.parallel_corpus import read_pairs
    from lealla_tf.train.data import SOURCE, TARGET

    raw = every_kind_of_line()
    path = tmp_path / ("fra-eng.tsv.gz" if gz else "fra-eng.tsv")
    path.write_bytes(gzip.compress(raw) if gz else raw)
    expected = [(s.encode(), e.encode()) for s, e in read_pairs(str(path))]
    # One pass of the stream, in file order (a shuffle buffer of 1), is these pairs.
    pairs, info = pair_dataset(DataConfig([str(path)], shuffle_buffer=1), 1)
    assert info["sizes"] == {"fra": len(expected)}
    streamed = [(p[SOURCE], p[TARGET]) for p in take(pairs, len(expected) + 1)]
    assert streamed[:-1] == expected and streamed[-1] == expected[0]
    # Line by line, the two readers give every line the same kind and sides.
    from lealla_tf.parallel_corpus import parse_line
    from lealla_tf.train.data import KIND, tsv_lines

    lines = raw.split(b"\n")
    python = [parse_line(line) for line in lines[:-1] + [lines[-1]] * bool(lines[-1])]
    stream = take(tsv_lines([str(path)]), len(python) + 1)
    assert len(stream) == len(python)
    for number, (mine, theirs) in enumerate(zip(python, stream), 1):
        kind = theirs[KIND].decode()
        assert (mine.kind or "") == kind, (number, lines[number - 1], mine, theirs)
        if not kind:
            assert (mine.source.encode(), mine.english.encode()) == (
                theirs[SOURCE], theirs[TARGET]), (number, lines[number - 1])
    assert {line.kind for line in python} >= {None, "no_tab", "extra_columns", "not_utf8",
                                              "empty_side", "blank"}
