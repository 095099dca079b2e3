"""benchmarks/main_job.py on a tiny git repository whose Makefile's main target
writes a report where the main job writes its own: cloned, run, copied unchanged."""

import json
import subprocess

import pytest

from benchmarks import main_job

MAKEFILE = """main:
\tmkdir -p runs/recipe/report
\tprintf '{"total_seconds": 60, "flags": "%s"}' "$(MAIN_FLAGS)" > runs/recipe/report/report.json
"""


@pytest.fixture()
def repository(tmp_path):
    root = tmp_path / "repository"
    root.mkdir()
    (root / "Makefile").write_text(MAKEFILE)
    for command in (["init", "-q"], ["add", "Makefile"],
                    ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny"]):
        subprocess.run(["git", *command], cwd=root, check=True)
    (root / "uncommitted.txt").write_text("not in the clone")
    return root


def test_the_job_runs_in_a_clean_clone_and_its_report_is_copied(repository, tmp_path, capsys):
    output, clone = tmp_path / "main_job.json", tmp_path / "clone"
    assert main_job.main([f"--output_json={output}", f"--repository={repository}",
                          f"--clone_dir={clone}", "--main_flags=--train_steps=4"]) == 0
    assert json.loads(output.read_text()) == {"total_seconds": 60, "flags": "--train_steps=4"}
    assert "min wall with the install" in capsys.readouterr().out
    assert not clone.exists()


def test_a_failed_job_keeps_its_clone_and_gives_its_status(repository, tmp_path, capsys):
    (repository / "Makefile").write_text("main:\n\texit 3\n")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "x"],
                   cwd=repository, check=True)
    clone = tmp_path / "clone"
    assert main_job.main([f"--output_json={tmp_path / 'r.json'}", f"--repository={repository}",
                          f"--clone_dir={clone}"]) != 0
    assert "make main exited with status" in capsys.readouterr().err
    assert (clone / "Makefile").exists() and not (clone / "uncommitted.txt").exists()
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("flags, message", [
    (["--main_flags=--work_dir=runs/x"], "may not move the job's --work_dir"),
])
def test_bad_flags_are_refused_with_a_message(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit):
        main_job.main([f"--output_json={tmp_path / 'r.json'}",
                       f"--clone_dir={tmp_path / 'clone'}", *flags])
    assert message in capsys.readouterr().err
