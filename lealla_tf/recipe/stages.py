"""The main job's stage runner: `Stages` runs each stage (a library call that
returns a dict) once, reuses a finished stage's output when the flags it was made
with are the same, refuses it naming the flags when they are not, and times
every stage for the summary; `Models` loads each model once for every stage.

The job's stages, in order, with the flags each depends on: the table
`lealla_tf.recipe.job.STAGES`. Their library functions, by subject:
`lealla_tf.recipe.teacher_stages` (the teacher and its vectors),
`lealla_tf.recipe.corpus` (vocabulary, sample, news set),
`lealla_tf.recipe.training` (the students' training) and
`lealla_tf.recipe.evaluations` (the export and the evaluations after training).
"""

import json
import os
import time
from collections.abc import Callable

from lealla_tf.inference.loaders import load_embedder


class Stages:
    """Runs stages in order: reuses a finished stage's marker, times the others,
    and keeps every result for the summary.

    A stage's marker records the settings it was made with (`settings`: flag
    -> value, its own and every earlier stage's); a rerun with other values
    is refused naming the flags, rather than reusing an output that does not
    match the flags the report would then state.
    """

    def __init__(self, work_dir: str, log: Callable[[str], None] = print):
        self.directory = os.path.join(work_dir, "stages")
        os.makedirs(self.directory, exist_ok=True)
        self.log = log
        self.results: dict[str, dict] = {}
        self.seconds: dict[str, float] = {}
        self.reused = []
        self.started = self._stage_started = time.time()

    def marker(self, name: str) -> str:
        return os.path.join(self.directory, f"{name}.json")

    def check_settings(self, settings: dict[str, dict]) -> None:
        """Before any stage runs: every finished stage's marker against the
        flags now, all differing flags named in one line (`ValueError`)."""
        stored, wanted = {}, {}
        for name, values in settings.items():
            if os.path.exists(self.marker(name)):
                with open(self.marker(name)) as f:
                    recorded = json.load(f).get("settings")
                if recorded is None:  # an older job's marker
                    check_same_settings(name, None, values)
                stored.update(recorded)
                wanted.update(_comparable(values))
        check_same_settings("finished", stored, wanted)

    def elapsed(self) -> float:
        """Seconds the job has spent: finished stages (reused ones at the time
        they took) and the stage running now."""
        return sum(self.seconds.values()) + time.time() - self._stage_started

    def run(self, name: str, function: Callable[[], dict],
            settings: dict | None = None) -> dict:
        marker = self.marker(name)
        self.log(f"\n=== {name} ===")
        if os.path.exists(marker):
            with open(marker) as f:
                stored = json.load(f)
            check_same_settings(name, stored.get("settings"), settings)
            self.results[name], self.seconds[name] = stored["result"], stored["seconds"]
            self.reused.append(name)
            self.log(f"reusing {name} (finished earlier in {stored['seconds']:.0f} s)")
            return self.results[name]
        self._stage_started = time.time()
        start = time.time()
        try:
            result = function()
        except KeyboardInterrupt:
            raise StageInterrupted(f"{name} interrupted (Ctrl-C) before it finished; rerun "
                                   "the same command: finished stages are reused") from None
        seconds = time.time() - start
        temporary = marker + ".tmp"
        with open(temporary, "w") as f:
            json.dump({"result": result, "seconds": seconds, "settings": settings}, f,
                      indent=2, default=str)
        os.replace(temporary, marker)  # the marker appears only for a finished stage
        self.results[name], self.seconds[name] = result, seconds
        self.log(f"--- {name}: {seconds:.0f} s")
        return result

    def summary(self) -> dict:
        return {"stage_seconds": dict(self.seconds), "reused": list(self.reused),
                "total_seconds": time.time() - self.started}


def _comparable(value):
    return json.loads(json.dumps(value, default=str))


# Flags added after stages recorded their settings, with the value every stage
# made before them trained with: a marker without one matches that value.
ADDED_FLAGS = {"decay_fraction": 1.0, "clip_norm": 1.0, "scale": 100.0, "margin": 0.3,
               "progressive_depth": 0.0, "one_language_batches": False,
               "cooldown_distilled_rows": 0.0, "cooldown_margin": None}


def with_added_flags(stored: dict, wanted) -> dict:
    """`stored` settings with each flag of `wanted` added since they were
    recorded at the value they were made with (`ADDED_FLAGS`)."""
    return {**{flag: value for flag, value in ADDED_FLAGS.items() if flag in wanted}, **stored}


def check_same_settings(name: str, stored: dict | None, wanted: dict | None) -> None:
    """ValueError in one line naming every flag whose value differs from the one
    a finished stage was made with. A marker without settings (an older job's,
    which recorded none) cannot be shown to match, and is refused too."""
    if wanted is None:
        return
    if stored is None:
        raise ValueError(f"the work dir's {name} stages were made by an older lealla_tf that "
                         "recorded no flags: pass --fresh or another --work_dir")
    wanted = _comparable(wanted)
    stored = with_added_flags(stored, wanted)
    differing = [f"--{flag}={stored.get(flag)!r} (now {wanted.get(flag)!r})"
                 for flag in sorted(set(stored) | set(wanted))
                 if stored.get(flag) != wanted.get(flag)]
    if differing:
        raise ValueError(f"the work dir's {name} stages were made with " + ", ".join(differing)
                         + ": rerun with the same flags, or pass --fresh or another --work_dir")


class Models:
    """Each model is loaded once (`load_embedder`, or the loader `register`ed
    for its path) and shared between stages."""

    def __init__(self):
        self._loaded = {}
        self._loaders = {}

    def register(self, path: str, loader: Callable[[], object]) -> None:
        """Loads `path` with `loader()` from now on (the teacher in its precision)."""
        self._loaders[path] = loader

    def get(self, path: str):
        if path not in self._loaded:
            self._loaded[path] = self._loaders.get(path, lambda: load_embedder(path))()
        return self._loaded[path]

    def clear(self) -> None:
        """Forgets every model: training seeds TensorFlow, which clears the kernel
        cache, and a SentencePiece model in an export made before the tokenizer kept
        it by name (commit 580ab1f) is deleted with it."""
        self._loaded.clear()


class StageInterrupted(Exception):
    """A stage stopped by a signal before it finished: no marker is written, so
    the same command resumes it."""
