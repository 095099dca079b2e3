"""benchmarks/training_step.py: a quick run on a tiny main job's work directory
(the job's own student config with tiny recipe flags), its profile's op
accounting, and its refusals."""

import json
import os

import pytest
from conftest import write_pairs

from benchmarks import training_step
from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE

TINY_RECIPE = ["--global_batch_size=4", "--max_seq_length=16", "--length_buckets=2",
               "--no_mixed_precision", "--encoder_overrides=num_layers=4,num_heads=4,"
               "hidden_dim=8,intermediate_dim=16,max_sequence_length=24"]


@pytest.fixture(scope="module")
def tiny_job(teacher, tiny_tatoeba_dir, tmp_path_factory):
    """A finished main job's work dir as training_step reads it (the tiny teacher, its
    pieces as the student's vocabulary, a sample), and a data dir."""
    root = tmp_path_factory.mktemp("tiny_job")
    work = root / "job"
    (work / "stages").mkdir(parents=True)
    (work / "teacher").symlink_to(teacher[0])
    (work / "vocab.model").symlink_to(os.path.join(teacher[0], SENTENCEPIECE_FILE))
    # Not Tatoeba's sentences, which the training stream leaves out.
    write_pairs(work / "sample", "deu", [(f"Der Hund {i} ist nett.", f"The dog {i} is nice.")
                                         for i in range(24)])
    (work / "stages" / "teacher.json").write_text(json.dumps(
        {"result": {"tokenizer": "sentencepiece", "multilingual": True}}))
    (root / "data" / "parallel").mkdir(parents=True)
    (root / "data" / "tatoeba_dev").symlink_to(tiny_tatoeba_dir)
    return work, root / "data"


def test_a_quick_run_times_the_jobs_step_and_profiles_it(tiny_job, tmp_path):
    work, data = tiny_job
    output = tmp_path / "step.json"
    assert training_step.main([f"--work_dir={work}", f"--data_dir={data}", "--rows=job",
                               "--steps=3", "--warmup=1", "--profile", "--profile_steps=1",
                               f"--output_json={output}", "--", *TINY_RECIPE]) == 0
    result = json.loads(output.read_text())
    job = result["rows"]["job"]
    assert result["benchmark"] == "training_step" and result["steps"] == 3
    assert len(job["step_seconds"]) == 3 and job["pairs_per_second"] > 0
    assert job["bfloat16"] is False and job["median_step_seconds"] > 0
    groups = job["profile"]["groups"]
    assert job["profile"]["op_thread_ms"] > 0 and "dense_matmul" in groups
    assert abs(sum(g["share"] for g in groups.values()) - 1) < 1e-6
    assert not [path for path in work.iterdir() if path.name.startswith("training_step-")]


def test_the_job_is_timed_against_its_step_with_the_teacher_on_every_row(tiny_job,
                                                                         tmp_path):
    """One run times the job's step (the teacher on a quarter of the pairs), the
    same step with the teacher on every pair, and AMS alone, and states their
    ratios: the step's speed-up, and its teacher-free share."""
    work, data = tiny_job
    output = tmp_path / "step.json"
    assert training_step.main([f"--work_dir={work}", f"--data_dir={data}",
                               "--rows=job,teacher_every_row,ams_alone", "--steps=3",
                               "--warmup=1", f"--output_json={output}", "--",
                               *TINY_RECIPE]) == 0
    result = json.loads(output.read_text())
    rows = result["rows"]
    assert rows["teacher_every_row"]["distilled_rows"] == 1.0
    assert "distilled_rows" not in rows["job"]
    assert result["job_speedup_over_teacher_every_row"] == pytest.approx(
        rows["teacher_every_row"]["seconds_per_step"] / rows["job"]["seconds_per_step"])
    assert result["teacher_free_share"] == pytest.approx(
        rows["ams_alone"]["seconds_per_step"] / rows["teacher_every_row"]["seconds_per_step"])


def test_the_profile_counts_each_op_once_and_groups_it(tmp_path):
    """An op's own event counts, not the executor's wrapper around it nor a
    kernel's events nested inside it; python is left out."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    names = ["Process", "dense/MatMul:_MklMatMul", "ParallelFor", "ln/mul:Mul",
             "adam:ResourceApplyAdam", "lambda", "Process:Process"]
    for index, name in enumerate(names, start=1):
        plane.event_metadata[index].name = name
    compute = plane.lines.add(name="tf_Compute/1")
    # the executor's wrapper event, as some TensorFlow builds name it: "Process:Process"
    for metadata, start, duration in [(1, 0, 100), (2, 1, 49), (3, 2, 40), (7, 100, 60),
                                      (4, 101, 39), (5, 150, 5)]:
        compute.events.add(metadata_id=metadata, offset_ps=start * 10**9,
                           duration_ps=duration * 10**9)
    python = plane.lines.add(name="python")
    python.events.add(metadata_id=6, offset_ps=0, duration_ps=10**12)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "host.xplane.pb").write_bytes(space.SerializeToString())
    assert training_step.op_times(str(tmp_path), calls=1) == {
        "_MklMatMul": 49.0, "Mul": 39.0, "ResourceApplyAdam": 5.0}
    assert [training_step.group_of(op) for op in (
        "_MklNativeFusedMatMul", "_MklBatchMatMulV2", "Mul", "TanhGrad", "ResourceApplyAdam",
        "_MklSoftmax", "Unpack", "GatherV2", "_XlaRun", "LeallaAttention", "NoOp")] == [
        "dense_matmul", "attention", "elementwise", "elementwise", "optimizer", "attention",
        "attention", "embedding_lookup", "compiled", "fused_kernels", "other"]


@pytest.mark.parametrize("flags, message", [
    (["--steps=3", "--warmup=3"], "--warmup must be at least 1 and below --steps"),
    (["--rows=job,bogus"], "unknown --rows ['bogus']"),
    (["--rows=ams_alone", "--profile"], "--profile and --jit_compile go with the job row"),
    (["--batch_sizes=32,big"], "--batch_sizes takes comma-separated integers"),
    (["--", "--lerning_rate=1"], "the recipe flags after -- must be the main job's"),
    (["--", "--encoder_overrides=layers"], "the recipe flags after --"),
])
def test_bad_flags_are_refused_with_a_message(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as stopped:
        training_step.main([f"--output_json={tmp_path / 'r.json'}", *flags])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_a_work_dir_without_a_main_job_is_named(tmp_path, capsys):
    assert training_step.main([f"--work_dir={tmp_path}", f"--output_json={tmp_path / 'r.json'}"
                               ]) == 2
    assert "run the main job (make main) first" in capsys.readouterr().err
