r"""Benchmark: killed at any moment and rerun, does a job end as if it had never
been killed?

    python -m benchmarks.kill_anywhere --kills=20 --train_kills=10 --seed=0 \
        --output_json=benchmarks/results/kill_anywhere.json

Runs a tiny main job (`python -m lealla_tf.recipe` on a tiny data directory
written here, the real teacher converted, a tiny student, fixed --train_steps so
that nothing is planned from timings) and a tiny `python -m lealla_tf.train`,
each once uninterrupted: the reference, and its timeline (when each stage of
the job started, read from its output as it runs). Then each command runs again
in new folders and is killed with SIGKILL (its whole process group, as a crash
takes the job and every process it started) at seeded random moments of the
reference's run, and the same command is rerun after each kill until it
completes.

Each kill falls in a window of the reference run (the main job's start-up, each
stage, the report after the last stage; the train command's start-up, its first
step after the step-0 evaluation, its steps, its summary), the windows in a
seeded random order, each once before any twice, at a uniform offset into the
window's length; a rerun is killed at that offset into the same window of its
own run. Up to --kills_per_run kills, in order, fall on one run before it is let
finish.

At the end of each run its figures must equal the reference's, timings aside:
the report's Tatoeba, news and mining scores, the student's training log and
its final weights, bit for bit (the main job), the training log (the train
command); and so must the evaluations along training (the report's,
eval_log.jsonl). The result records every kill (its window and moment, the
stage the output shows it landed in, the exit status of the rerun after it: -9
when that rerun was killed too) and each run's differences; the script exits 1
when a run differed or a rerun failed.
"""

import argparse
import gzip
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.common import machine, stop_signals_passed_to, write_result

ROOT = pathlib.Path(__file__).resolve().parents[1]
START, REPORT, TRAINING = "startup", "report", "training"
STAGE_LINE = re.compile(r"=== (\w+) ===$")
# The main job: tiny settings, bfloat16 and length buckets as the real job trains.
JOB_FLAGS = ["--vocab_size=400", "--sample_pairs=120", "--train_steps=6", "--eval_every=3",
             "--eval_max_pairs=4",
             "--encoder_overrides=num_layers=2,hidden_dim=16,num_heads=2,intermediate_dim=32",
             "--bucc_languages=deu", "--bucc_gold=5", "--bucc_distractors=5",
             "--news_languages=deu", "--global_batch_size=8", "--mixed_precision",
             "--length_buckets=4", "--beam_workers=1"]
TRAIN_FLAGS = ["--preset=lealla_small",
               "--encoder_overrides=num_layers=2,hidden_dim=16,num_heads=2,intermediate_dim=32",
               "--objective=ams", "--global_batch_size=4", "--train_steps=200",
               "--checkpoint_every=30", "--keep_checkpoints=3", "--eval_every=75",
               "--eval_max_pairs=4", "--max_seq_length=16", "--scale=20",
               "--length_buckets=4", "--mixed_precision", "--no_progress"]
WORDS = {"deu": ("Der Hund Nummer {} ist nett.", "Die Katze {} schläft."),
         "fra": ("Le chien numéro {} est gentil.", "Le chat {} dort.")}
ENGLISH = ("The dog number {} is nice.", "The cat {} sleeps.")


def write_tiny_data(root) -> str:
    """The tiny data directory of tests/recipe/test_job.py: parallel/ (pairs and
    an NTREX-like news set) and tatoeba_dev/ of two languages."""
    root = pathlib.Path(root)
    for language, (first, second) in WORDS.items():
        pairs = [(first.format(i), ENGLISH[0].format(i)) for i in range(40)]
        pairs += [(second.format(i), ENGLISH[1].format(i)) for i in range(40)]
        news = [(f"{first.format(200 + i)} {second.format(300 + i)}",
                 f"{ENGLISH[0].format(200 + i)} {ENGLISH[1].format(300 + i)}")
                for i in range(60)]
        for folder, rows in (("corpus", pairs), ("ntrex", news)):
            path = root / "parallel" / folder / f"{language}-eng.tsv.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(gzip.compress("".join(f"{a}\t{b}\n" for a, b in rows).encode()))
        held_out = [(first.format(100 + i), ENGLISH[0].format(100 + i)) for i in range(8)]
        tatoeba = root / "tatoeba_dev"
        tatoeba.mkdir(parents=True, exist_ok=True)
        for side, index in ((language, 0), ("eng", 1)):
            (tatoeba / f"tatoeba.{language}-eng.{side}").write_text(
                "".join(pair[index] + "\n" for pair in held_out), encoding="utf-8")
    return str(root)


def without_timings(value):
    """`value` less every entry whose key names seconds (times and speeds)."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if "second" not in k}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def read_jsonl(path) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def encoder_weights(checkpoints: str) -> dict:
    """{name: sha256 of its bytes} of each encoder weight in the newest checkpoint
    of `checkpoints`: equal digests, the same weights bit for bit."""
    import hashlib

    import tensorflow as tf

    reader = tf.train.load_checkpoint(checkpoints)
    return {name: hashlib.sha256(reader.get_tensor(name).tobytes()).hexdigest()
            for name, _ in tf.train.list_variables(checkpoints) if name.startswith("encoder/")}


def training_position(model_dir: str) -> str:
    """Where a training's files were: its last logged step and evaluation, and
    its newest checkpoint; "" before it logged anything."""
    rows = {}
    for name in ("train_log", "eval_log"):
        path = os.path.join(model_dir, f"{name}.jsonl")
        try:
            rows[name] = read_jsonl(path) if os.path.exists(path) else []
        except ValueError:  # a line cut short by the kill
            rows[name] = [{"step": "a cut line"}]
    if not rows["train_log"] and not rows["eval_log"]:
        return ""
    state, checkpoint = os.path.join(model_dir, "checkpoints", "checkpoint"), None
    if os.path.exists(state):
        with open(state) as f:
            checkpoint = re.search(r'^model_checkpoint_path: "(.*)"', f.read(), re.M)
    parts = [f"step {rows['train_log'][-1]['step']} logged" if rows["train_log"]
             else "no step logged"]
    if rows["eval_log"]:
        parts.append(f"evaluated at step {rows['eval_log'][-1]['step']}")
    return ", ".join(parts + [f"checkpoint {checkpoint.group(1) if checkpoint else 'none'}"])


class TrainRun:
    """A tiny `python -m lealla_tf.train`; its windows are its start (data, model),
    the first step after the step-0 evaluation, its steps, its summary."""

    name = "train"
    WINDOWS = {"eval_log": "evaluated", "train_log": TRAINING}

    def __init__(self, data: str, vocab: str, tatoeba_dir: str, code: str = str(ROOT)):
        self.data, self.vocab, self.tatoeba_dir, self.code = data, vocab, tatoeba_dir, code
        self.before = {}

    def command(self, work: str) -> list:
        return [sys.executable, "-m", "lealla_tf.train", f"--model_dir={work}",
                f"--train_data={self.data}", f"--vocab_file={self.vocab}",
                f"--tatoeba_dir={self.tatoeba_dir}", *TRAIN_FLAGS]

    def prepare(self, work: str, reference: str = "") -> None:
        """What a run's folder holds before its first attempt: nothing."""

    def begin(self, work: str) -> None:
        """An attempt starts: the log lines earlier attempts left are not its own."""
        self.before = {name: self._lines(work, name) for name in self.WINDOWS}

    @staticmethod
    def _lines(work: str, name: str) -> set:
        path = os.path.join(work, f"{name}.jsonl")
        if not os.path.exists(path):
            return set()
        with open(path, errors="replace") as f:
            return set(f)

    def windows(self, work: str, output: str) -> list:
        """Start-up; `evaluated` and `training` once this attempt has logged an
        evaluation, a step; `summary` once it has printed its end."""
        seen = [START] + [window for name, window in self.WINDOWS.items()
                          if self._lines(work, name) - self.before.get(name, set())]
        return seen + ["summary"] * ("training train_steps reached" in output)

    def stage(self, work: str, output: str) -> str:
        """The last window the attempt was in, and where the logs were."""
        position = training_position(work)
        window = self.windows(work, output)[-1]
        return f"{window}: {position}" if position else window

    @staticmethod
    def figures(work: str) -> dict:
        return without_timings({"train_log": read_jsonl(os.path.join(work, "train_log.jsonl"))})

    @staticmethod
    def logs(work: str) -> dict:
        return without_timings({"eval_log": read_jsonl(os.path.join(work, "eval_log.jsonl"))})


class MainJob:
    """The main job on a tiny data directory; its windows are its stages."""

    name = "main_job"

    def __init__(self, data_dir: str, share_teacher: bool = False, code: str = str(ROOT)):
        self.data_dir, self.share_teacher, self.code = data_dir, share_teacher, code

    def command(self, work: str) -> list:
        return [sys.executable, "-m", "lealla_tf.recipe", f"--work_dir={work}",
                f"--data_dir={self.data_dir}", *JOB_FLAGS]

    def begin(self, work: str) -> None:
        """An attempt starts: its output tells its stages."""

    def prepare(self, work: str, reference: str = "") -> None:
        """With `share_teacher`, a killed run starts as a copy of the `reference`
        job's folder holding only its converted teacher (hard links): its teacher
        stage finds the conversion, and the kills land in the later stages."""
        if self.share_teacher and reference:
            from lealla_tf.recipe.work_dir import JOB_MARKER

            os.makedirs(work)
            shutil.copy2(os.path.join(reference, JOB_MARKER), work)
            shutil.copytree(os.path.join(reference, "teacher"), os.path.join(work, "teacher"),
                            copy_function=os.link)

    @staticmethod
    def windows(work: str, output: str) -> list:
        """The windows whose start the output shows: start-up, each stage's
        `=== name ===` line, the report once the mine stage has ended."""
        seen = [START]
        for line in output.splitlines():
            match = STAGE_LINE.match(line.strip())
            if match:
                seen.append(match.group(1))
            elif line.startswith(("--- mine:", "reusing mine ")):
                seen.append(REPORT)
        return seen

    @staticmethod
    def stage(work: str, output: str) -> str:
        """The stage the output was in: its last `=== name ===`, or `after name`
        once that stage had ended; in training, where the student's logs were."""
        current = START
        for line in output.splitlines():
            match = STAGE_LINE.match(line.strip())
            if match:
                current = match.group(1)
            elif line.startswith((f"--- {current}:", f"reusing {current} ")):
                current = f"after {current}"
        position = training_position(os.path.join(work, "student"))
        return f"{current}: {position}" if current == "train_student" and position else current

    @staticmethod
    def figures(work: str) -> dict:
        """The report's scores, the student's training log and final weights."""
        with open(os.path.join(work, "report", "report.json")) as f:
            report = json.load(f)
        return without_timings({
            "tatoeba": report["tatoeba"], "news": report["news"],
            "mining": report["mining"]["results"],
            "train_log": read_jsonl(os.path.join(work, "student", "train_log.jsonl")),
            "weights": encoder_weights(os.path.join(work, "student", "checkpoints"))})

    @staticmethod
    def logs(work: str) -> dict:
        """The student's evaluations along training, as the report gives them."""
        with open(os.path.join(work, "report", "report.json")) as f:
            report = json.load(f)
        return without_timings({"evaluations": report["training"]["student"]["evaluations"]})


def run_once(job, work: str, log: str, target=None, timeout: float = 1800.0) -> dict:
    """Runs `job`'s command in `work` to its end, or kills its process group at
    `target` = (window, offset): `offset` seconds after its output shows the
    window's start. Returns {"exit", "killed", "timed_out", "seconds", "marks"
    (window -> seconds at its start), "output", "stage" (where a kill landed)}."""
    job.begin(work)
    with open(log, "w") as out:
        child = subprocess.Popen(job.command(work), cwd=job.code, env=environment(job.code),
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    start, marks, killed, stage = time.time(), {}, False, None
    with stop_signals_passed_to(child.pid, group=True) as stopped:
        while child.poll() is None:
            now = time.time() - start
            with open(log, errors="replace") as f:
                output = f.read()
            for window in job.windows(work, output):
                marks.setdefault(window, now)
            killed = bool(target and target[0] in marks and now >= marks[target[0]] + target[1])
            if killed or now > timeout:
                os.killpg(child.pid, signal.SIGKILL)
                # a kill that came as the run ended is no kill
                killed = killed and child.wait() == -signal.SIGKILL
                stage = job.stage(work, output)
                break
            time.sleep(0.02)
        try:  # what is left of the group: a worker the run left behind
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if stopped:
        raise SystemExit(128 + stopped[0])
    seconds = time.time() - start
    with open(log, errors="replace") as f:
        output = f.read()
    for window in job.windows(work, output):
        marks.setdefault(window, seconds)
    return {"exit": child.returncode, "killed": killed, "timed_out": seconds > timeout,
            "seconds": seconds, "marks": marks, "output": output, "stage": stage}


def environment(code: str) -> dict:
    """A run's environment: lealla_tf from `code`, quiet, CPU only, deterministic
    ops, unbuffered output (the stage lines are read as they are printed)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [code, os.environ.get("PYTHONPATH")])), TF_CPP_MIN_LOG_LEVEL="3",
                CUDA_VISIBLE_DEVICES="-1", TF_DETERMINISTIC_OPS="1", PYTHONUNBUFFERED="1")


def snapshot_code(root: str) -> str:
    """A copy of the package in `root`/code, which every run imports: all of
    them run the same code while the working tree changes."""
    code = os.path.join(root, "code")
    shutil.copytree(ROOT / "lealla_tf", os.path.join(code, "lealla_tf"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return code


def reference_run(job, work: str) -> dict:
    """The uninterrupted run: its seconds, its timeline ({window: [start,
    length]}), its figures and logs."""
    job.prepare(work)
    done = run_once(job, work, work + ".log")
    if done["exit"]:
        raise RuntimeError(f"the reference {job.name} run exited with {done['exit']}:\n"
                           + done["output"][-3000:])
    ordered = sorted(done["marks"].items(), key=lambda item: item[1])
    ends = [start for _, start in ordered[1:]] + [done["seconds"]]
    timeline = {window: [start, end - start] for (window, start), end in zip(ordered, ends)}
    return {"work": work, "seconds": done["seconds"], "timeline": timeline,
            "figures": job.figures(work), "logs": job.logs(work)}


def draw_kills(timeline: dict, count: int, rng: random.Random, windows=None) -> list:
    """`count` kills: windows in a seeded random order (each once before any
    twice), each at a uniform offset into its length in the reference."""
    names = [w for w in timeline if not windows or w in windows]
    order = []
    while len(order) < count:
        order += rng.sample(names, len(names))
    kills = []
    for window in order[:count]:
        start, length = timeline[window]
        offset = rng.uniform(0.0, length)
        kills.append({"window": window, "offset_seconds": round(offset, 3),
                      "reference_moment_seconds": round(start + offset, 3)})
    return kills


def differences(reference, other, key: str = "", limit: int = 20) -> list:
    """[{"key", "reference", "rerun"}] where `other` differs from `reference`."""
    found = []
    if isinstance(reference, dict) and isinstance(other, dict):
        for name in list(reference) + [k for k in other if k not in reference]:
            found += differences(reference.get(name), other.get(name), f"{key}/{name}", limit)
    elif isinstance(reference, list) and isinstance(other, list) and len(reference) == len(
            other):
        for index, (a, b) in enumerate(zip(reference, other)):
            found += differences(a, b, f"{key}[{index}]", limit)
    elif reference != other:
        found.append({"key": key, "reference": reference, "rerun": other})
    return found[:limit]


def killed_run(job, work: str, kills: list, reference: dict, failures_allowed: int = 3) -> dict:
    """One run of `job` in `work` killed at each of `kills` in order, rerun after
    each until it completes: its kills (those that landed), the kills left (the
    run completed before their moment), failed reruns and differences."""
    job.prepare(work, reference["work"])
    pending, landed, failed = list(kills), [], []
    while True:
        target = (pending[0]["window"], pending[0]["offset_seconds"]) if pending else None
        log = os.path.join(os.path.dirname(work), f"attempt_{len(landed) + len(failed)}.log")
        done = run_once(job, work, log, target, timeout=10 * reference["seconds"] + 300)
        if landed and "rerun_exit" not in landed[-1]:
            landed[-1]["rerun_exit"] = done["exit"]
        if done["killed"]:
            landed.append(dict(pending.pop(0), moment_seconds=round(done["seconds"], 3),
                               stage=done["stage"]))
            print(f"{job.name}: killed at {done['seconds']:.1f} s in {done['stage']} (window "
                  f"{target[0]} + {target[1]:.1f} s)", flush=True)
            continue
        if done["exit"] == 0:
            break
        failed.append({"exit": done["exit"], "timed_out": done["timed_out"],
                       "after_kills": len(landed), "output_tail": done["output"][-2000:]})
        print(f"{job.name}: the rerun exited with {done['exit']}", flush=True)
        if len(failed) >= failures_allowed:
            return {"kills": landed, "left": pending, "failed_reruns": failed,
                    "completed": False, "equal": False, "logs_equal": False,
                    "differences": [], "log_differences": []}
    found = differences(reference["figures"], job.figures(work))
    in_logs = differences(reference["logs"], job.logs(work))
    return {"kills": landed, "left": pending, "failed_reruns": failed, "completed": True,
            "equal": not found, "logs_equal": not in_logs, "differences": found,
            "log_differences": in_logs}


def kill_anywhere(job, root: str, count: int, per_run: int, rng: random.Random,
                  windows=None, keep: bool = False) -> dict:
    """The reference of `job` in `root`, then `count` kills over runs of at most
    `per_run` kills each: kills a run completed before go to the next run, and a
    run that completed before its first kill gets a new moment in that window.
    A run's folder is removed once its figures and logs equal the reference's,
    unless `keep`."""
    os.makedirs(root, exist_ok=True)
    print(f"{job.name}: the reference run", flush=True)
    reference = reference_run(job, os.path.join(root, "reference"))
    print(f"{job.name}: reference {reference['seconds']:.0f} s", flush=True)
    queue = draw_kills(reference["timeline"], count, rng, windows)
    runs, missed = [], 0
    while queue:
        chosen = sorted(queue[:per_run], key=lambda k: k["reference_moment_seconds"])
        queue = queue[per_run:]
        folder = os.path.join(root, f"run_{len(runs)}")
        os.makedirs(folder)
        run = killed_run(job, os.path.join(folder, "work"), chosen, reference)
        if not run["kills"]:  # completed before its first moment: another moment
            missed += 1
            first, run["left"] = run["left"][0], run["left"][1:]
            if missed <= count:
                queue += draw_kills(reference["timeline"], 1, rng, (first["window"],))
        queue = run.pop("left") + queue
        kept = keep or not (run["equal"] and run["logs_equal"] and not run["failed_reruns"])
        runs.append(dict(run, folder=folder if kept else None))
        if not kept:
            shutil.rmtree(folder, ignore_errors=True)
        if not run["completed"]:
            break  # it would not complete: the kills left wait for a fix
    stages = {}
    for kill in (kill for run in runs for kill in run["kills"]):
        stages[kill["stage"].split(":")[0]] = stages.get(kill["stage"].split(":")[0], 0) + 1
    return {"command": " ".join(job.command("WORK")[1:]),
            "reference_seconds": round(reference["seconds"], 1),
            "timeline": {w: [round(s, 2), round(n, 2)] for w, (s, n) in
                         reference["timeline"].items()},
            "kills": sum(stages.values()), "stages_hit": stages, "missed_moments": missed,
            "equal": all(run["equal"] for run in runs),
            "logs_equal": all(run["logs_equal"] for run in runs),
            "failed_reruns": sum(len(run["failed_reruns"]) for run in runs), "runs": runs}


def train_inputs(root: str, data_dir: str) -> tuple:
    """The train command's pairs, WordPiece vocabulary (learned here) and Tatoeba dev."""
    from lealla_tf.tokenizers.vocabulary import build_vocabulary

    pairs, vocab = os.path.join(data_dir, "parallel", "corpus"), os.path.join(root, "vocab.txt")
    if not os.path.exists(vocab):
        build_vocabulary([pairs], vocab_size=300, output=vocab, progress=False)
    return pairs, vocab, os.path.join(data_dir, "tatoeba_dev")


def code_version() -> dict:
    """The commit of the code the runs ran, and the library files changed since it."""
    def git(*arguments):
        return subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"),
            "changed": git("status", "--porcelain", "--", "lealla_tf").splitlines()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20, help="kills of the main job")
    parser.add_argument("--train_kills", type=int, default=10,
                        help="kills of the train command (0: none)")
    parser.add_argument("--kills_per_run", type=int, default=4,
                        help="kills on one run of a command before it is let finish")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work_dir", default="",
                        help="a new folder for the runs (default: a temporary one, removed "
                        "when every run passed)")
    parser.add_argument("--keep", action="store_true", help="keep every run's folder")
    parser.add_argument("--output_json", default="benchmarks/results/kill_anywhere.json")
    args = parser.parse_args(argv)
    if args.kills < 0 or args.train_kills < 0 or args.kills + args.train_kills == 0:
        parser.error("--kills and --train_kills must be 0 or positive, and not both 0")
    if args.kills_per_run < 1:
        parser.error("--kills_per_run must be a positive integer")
    if args.work_dir and os.path.exists(args.work_dir):
        parser.error(f"--work_dir={args.work_dir} exists; give a new folder")
    root = args.work_dir or tempfile.mkdtemp(prefix="kill_anywhere_")
    os.makedirs(root, exist_ok=True)
    rng, start = random.Random(args.seed), time.time()
    data_dir, version = write_tiny_data(os.path.join(root, "data")), code_version()
    code = snapshot_code(root)
    jobs = {}
    if args.kills:
        jobs["main_job"] = kill_anywhere(MainJob(data_dir, code=code),
                                         os.path.join(root, "main_job"), args.kills,
                                         args.kills_per_run, rng, keep=args.keep)
    if args.train_kills:
        jobs["train"] = kill_anywhere(TrainRun(*train_inputs(root, data_dir), code=code),
                                      os.path.join(root, "train"), args.train_kills,
                                      args.kills_per_run, rng, keep=args.keep)
    passed = all(job["equal"] and job["logs_equal"] and not job["failed_reruns"]
                 for job in jobs.values())
    result = {"benchmark": "kill_anywhere", "machine": machine(), "code": version,
              "command": "python -m benchmarks.kill_anywhere " + " ".join(
                  argv if argv is not None else sys.argv[1:]),
              "seed": args.seed, "signal": "SIGKILL to the run's process group",
              "kills": sum(job["kills"] for job in jobs.values()),
              "equal": all(job["equal"] for job in jobs.values()),
              "logs_equal": all(job["logs_equal"] for job in jobs.values()),
              "failed_reruns": sum(job["failed_reruns"] for job in jobs.values()),
              "passed": passed, "minutes": round((time.time() - start) / 60, 1), **jobs}
    write_result(args.output_json, result)
    for name, job in jobs.items():
        print(f"{name}: {job['kills']} kills in {job['stages_hit']}; figures "
              f"{'equal' if job['equal'] else 'DIFFER'}, logs "
              f"{'equal' if job['logs_equal'] else 'DIFFER'}, {job['failed_reruns']} failed "
              "reruns", flush=True)
    if passed and not (args.work_dir or args.keep):
        shutil.rmtree(root, ignore_errors=True)
    elif not passed:
        print(f"the runs that differed or failed are kept in {root}", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
