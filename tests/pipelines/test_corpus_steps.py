"""lealla_tf.pipelines.corpus_steps, step by step: lines parsed or dead-lettered
with a reason, duplicated ids counted, a shard embedded by the worker's one model
with the token cap, and the progress files the steps write."""

import json
import os
import subprocess
import sys
import threading

import pytest
from conftest import CORPUS_SENTENCES

from lealla_tf.pipelines import corpus_steps
from lealla_tf.pipelines.corpus_steps import (
    COUNT,
    DEAD,
    TIMING,
    VALID,
    EmbedShard,
    ReadLines,
    describe_duplicates,
    parse_line,
    read_progress,
    shard_duplicates,
    shard_of,
)


def parsed(input_format, raw):
    return [parse_line(input_format, "a.txt", 7, raw)]


def test_a_line_is_a_record_or_a_dead_letter_with_its_reason():
    assert parsed("lines", b"Der Hund.") == [(VALID, ("a.txt:7", "Der Hund.", "a.txt:7"))]
    assert parsed("tsv", b"doc-1\tThe dog.") == [(VALID, ("doc-1", "The dog.", "a.txt:7"))]
    assert parsed("pairs", b"Der Hund.\tThe dog.") == [(VALID, {
        "file": "a.txt", "line": 7, "source": "Der Hund.", "target": "The dog."})]
    for input_format, raw, reason in [
            ("lines", b"  ", "empty"), ("lines", b"\xff", "invalid_utf8"),
            ("tsv", b"no tab", "no_tab"), ("pairs", b"\tx", "empty_field")]:
        ((kind, letter),) = parsed(input_format, raw)
        assert kind == DEAD and json.loads(letter) == {
            "file": "a.txt", "line": 7, "reason": reason,
            "raw": raw.decode("utf-8", "backslashreplace")}


def test_timings_become_each_stages_span_and_busy_seconds():
    timings = [("embed", 10.0, 14.0), ("read", 1.0, 2.0), ("embed", 11.0, 13.0),
               ("model", 3.0, 10.0)]
    spans = corpus_steps.stage_spans(timings)
    assert list(spans) == ["read", "model", "embed"]  # the stages' order, not the events'
    assert spans["embed"] == {"start": 10.0, "end": 14.0, "busy": 6.0}  # two shards overlap
    assert corpus_steps.timeline(spans, since=0.5)["model"] == {"from": 2.5, "to": 9.5,
                                                                 "busy": 7.0}


def test_a_line_is_read_parsed_and_keyed_to_its_shard_in_one_step(tmp_path):
    """Valid lines come out keyed for the shards' GroupByKey, dead letters beside
    them, then the file's counts and the read's timing."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.tsv").write_bytes(b"doc-1\tThe dog.\nno tab\n")
    events = list(ReadLines(str(tmp_path / "in"), input_format="tsv", num_shards=4).process(
        (str(tmp_path / "in" / "a.tsv"), 0, 1)))
    assert events[0] == (VALID, (("embeddings", shard_of("doc-1", 4)),
                                 ("doc-1", "The dog.", "a.tsv:1")))
    assert events[1][0] == DEAD and json.loads(events[1][1])["reason"] == "no_tab"
    assert events[2:4] == [(COUNT, ("lines_read", 2)), (COUNT, ("dead_lettered", 1))]
    kind, (timing, (stage, start, end)) = events[4]
    assert (kind, timing, stage) == (COUNT, TIMING, "read") and start <= end
    (tmp_path / "in" / "p.tsv").write_bytes(b"Der Hund.\tThe dog.\n")
    ((kind, (key, value)), *_) = ReadLines(str(tmp_path / "in"), input_format="pairs",
                                           num_shards=4).process(
        (str(tmp_path / "in" / "p.tsv"), 0, 1))
    assert key == ("p", shard_of("p.tsv:1", 4)) and value[0] == "000000000001"
    assert value[1] == {"file": "p.tsv", "line": 1, "source": "Der Hund.", "target": "The dog."}


def test_a_file_read_in_parts_gives_each_line_to_one_part_with_its_own_number(tmp_path):
    """Part p of N parses the lines whose 0-based index is p modulo N, keeping the
    line numbers of the whole file; the parts' counts add up to the file's."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(b"one\n\ntwo\nthree\nfour\n")
    seen, counts = [], {"lines_read": 0, "dead_lettered": 0}
    for part in range(2):
        for kind, value in ReadLines(str(tmp_path / "in")).process(
                (str(tmp_path / "in" / "a.txt"), part, 2)):
            if kind == VALID:
                seen.append(value[1][2])
            elif kind == DEAD:
                seen.append(json.loads(value)["line"])
            elif value[0] in counts:
                counts[value[0]] += value[1]
    assert seen == ["a.txt:1", "a.txt:3", "a.txt:5", 2, "a.txt:4"]
    assert counts == {"lines_read": 5, "dead_lettered": 1}


def test_duplicated_ids_are_counted_with_their_first_places():
    items = sorted([("a", "x", "x:3"), ("b", "y", "x:1"), ("a", "x", "x:1"), ("a", "z", "y:9"),
                    ("a", "x", "x:2")])
    assert list(shard_duplicates(items)) == [
        ("duplicate_ids", 1), ("duplicate_example", ("a", 4, ["x:1", "x:2", "x:3"]))]
    assert list(shard_duplicates([("a", "x", "x:1"), ("b", "y", "x:2")])) == []
    assert describe_duplicates([("a", 4, ["x:1", "x:2", "x:3"]), ("b", 2, ["x:1", "y:2"])]) == (
        "'a' (4x: x:1, x:2, x:3, ...), 'b' (2x: x:1, y:2)")


def test_the_shard_step_hands_the_token_cap_to_the_model(corpus_model, tmp_path, monkeypatch):
    from lealla_tf.inference import embedder as embedder_lib

    calls, encode = [], embedder_lib.Embedder.encode

    def recorded(self, sentences, batch_size=64, show_progress_bar=False,
                 description="embedding", max_tokens=None):
        calls.append((len(sentences), batch_size, max_tokens))
        return encode(self, sentences, batch_size, show_progress_bar, description, max_tokens)

    monkeypatch.setattr(embedder_lib.Embedder, "encode", recorded)
    shard = EmbedShard(corpus_model[0], str(tmp_path), 1, False, False, 16, None, 8)
    events = list(shard.process((("embeddings", 0), [(f"k{i}", s, f"a.txt:{i}") for i, s in
                                                     enumerate(CORPUS_SENTENCES)])))
    assert ("embedded", len(CORPUS_SENTENCES)) in events
    assert calls == [(len(CORPUS_SENTENCES), 16, 8)]


def test_a_worker_caps_its_tensorflow_threads_before_it_loads_the_model(corpus_model):
    """In a fresh process, as a multi-processing worker is; once TensorFlow runs
    there, the pools stay as they are (False)."""
    code = ("import tensorflow as tf\n"
            "from lealla_tf.pipelines import corpus_steps as e\n"
            f"e._embedder({corpus_model[0]!r}, None, 1).encode(['a dog'])\n"
            "print(tf.config.threading.get_intra_op_parallelism_threads(),"
            " tf.config.threading.get_inter_op_parallelism_threads(), e.limit_threads(2))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["1", "1", "False"]
    assert "already started" in done.stderr


def test_the_steps_before_the_shards_load_the_worker_s_model_ahead_once(corpus_model,
                                                                        monkeypatch):
    """ReadLines starts the load in its setup; the shard then finds
    the model loaded, and one load serves every step and every later setup. A
    load that fails ahead is retried, its error raised, by the step that needs it."""
    monkeypatch.setattr(corpus_steps, "_MODELS", {})
    monkeypatch.setattr(corpus_steps, "_LOADS", {})
    monkeypatch.setattr(corpus_steps, "_WARMING", set())
    loads, real = [], corpus_steps.load_embedder

    def counted(model, max_seq_length=None):
        loads.append(model)
        return real(model, max_seq_length)

    monkeypatch.setattr(corpus_steps, "load_embedder", counted)
    warm = (corpus_model[0], None, None)
    thread = corpus_steps.warm_embedder(*warm)
    ReadLines("", None, warm).setup()  # already loading: nothing more
    ReadLines("", None, warm).setup()
    thread.join(timeout=120)
    assert loads == [corpus_model[0]] and (corpus_model[0], None) in corpus_steps._MODELS
    assert corpus_steps.warm_embedder(*warm) is None
    assert corpus_steps._embedder(*warm) is corpus_steps._MODELS[corpus_model[0], None]
    assert loads == [corpus_model[0]]

    def broken(model, max_seq_length=None):
        raise FileNotFoundError(f"{model} is gone")

    monkeypatch.setattr(corpus_steps, "load_embedder", broken)
    corpus_steps.warm_embedder("/nowhere", None, None).join(timeout=60)
    assert ("/nowhere", None) not in corpus_steps._MODELS
    with pytest.raises(FileNotFoundError, match="/nowhere is gone"):
        corpus_steps._embedder("/nowhere")


def test_a_read_s_setup_never_waits_for_the_load_in_flight(monkeypatch):
    """The DaskRunner sets ReadLines up again for every bundle: a second read on
    a worker whose model is loading must read at once, not stall behind the
    load (and the shuffle behind it); the shard that needs the model waits for
    that same load, and one load serves both."""
    monkeypatch.setattr(corpus_steps, "_MODELS", {})
    monkeypatch.setattr(corpus_steps, "_LOADS", {})
    monkeypatch.setattr(corpus_steps, "_WARMING", set())
    started, release, loads = threading.Event(), threading.Event(), []

    def slow(model, max_seq_length=None):
        loads.append(model)
        started.set()
        assert release.wait(timeout=60)
        return f"embedder of {model}"

    monkeypatch.setattr(corpus_steps, "load_embedder", slow)
    warm = ("/a/model", None, 1)
    monkeypatch.setattr(corpus_steps, "limit_threads", lambda threads: True)
    thread = corpus_steps.warm_embedder(*warm)
    shard, threads = [], [thread]
    try:  # the load is released whatever fails, so no thread outlives the test
        assert started.wait(timeout=60)
        setup = threading.Thread(target=ReadLines("", None, warm).setup, daemon=True)
        threads.append(setup)
        setup.start()
        setup.join(timeout=5)
        assert not setup.is_alive()  # returned while the load is still blocked
        waiting = threading.Thread(target=lambda: shard.append(corpus_steps._embedder(*warm)),
                                   daemon=True)
        threads.append(waiting)
        waiting.start()
        waiting.join(timeout=0.5)
        assert waiting.is_alive() and not shard  # the shard waits for the load in flight
    finally:
        release.set()
        for each in threads:
            each.join(timeout=60)
    assert shard == ["embedder of /a/model"] and loads == ["/a/model"]


def test_progress_files_report_lines_read_and_sentences_embedded(corpus_model, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setattr(corpus_steps, "READ_REPORT_LINES", 4)
    monkeypatch.setattr(corpus_steps, "SHARD_CHUNK", 3)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("".join(f"line {i}\n" for i in range(9)))
    progress_dir = str(tmp_path / "progress")
    reader = ReadLines(str(tmp_path / "in"), progress_dir)
    lines = iter(reader.process((str(tmp_path / "in" / "a.txt"), 0, 1)))
    for _ in range(5):
        next(lines)
    assert read_progress(progress_dir)["lines_read"] == 4  # a report every 4 lines
    assert len(list(lines)) == 7  # 4 more lines, the two counts, the timing
    shard = EmbedShard(corpus_model[0], str(tmp_path / "run"), 1, False, False, 16,
                       progress_dir=progress_dir)
    list(shard.process((("embeddings", 0), [(f"k{i}", s, f"a.txt:{i}")
                                            for i, s in enumerate(CORPUS_SENTENCES)])))
    assert read_progress(progress_dir) == {"files_read": 1, "lines_read": 9,
                                           "embedded": len(CORPUS_SENTENCES)}
    reader = ReadLines(str(tmp_path / "in"), str(tmp_path / "halves"))
    list(reader.process((str(tmp_path / "in" / "a.txt"), 0, 2)))
    assert read_progress(str(tmp_path / "halves")) == {"files_read": 0, "lines_read": 5,
                                                       "embedded": 0}
    (tmp_path / "in" / "b.txt").write_text("one\ntwo\n")
    list(reader.process((str(tmp_path / "in" / "b.txt"), 0, 2)))  # two halves of two files
    assert read_progress(str(tmp_path / "halves"))["files_read"] == 0
    list(reader.process((str(tmp_path / "in" / "a.txt"), 1, 2)))
    assert read_progress(str(tmp_path / "halves")) == {"files_read": 1, "lines_read": 10,
                                                       "embedded": 0}
    assert read_progress(str(tmp_path / "absent")) == {
        "files_read": 0, "lines_read": 0, "embedded": 0}
