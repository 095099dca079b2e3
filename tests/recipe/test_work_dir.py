"""The main job's --work_dir (`lealla_tf.recipe.work_dir`): a folder becomes a job's
by its marker, --fresh deletes only what a job wrote and only where the marker
proves the folder, a symlink is never followed, and a claimed folder has one
writer. (The same refusals on the command line: tests/recipe/test_job.py.)"""

import os
import shutil

import pytest

from lealla_tf.folder_lock import LOCK_FILE, FolderInUseError, release_folder
from lealla_tf.recipe.work_dir import JOB_MARKER, WORK_DIR_ENTRIES, claim_work_dir


def claim(path, fresh):
    release_folder(claim_work_dir(str(path), fresh))


def foreign(tmp_path, name, *job_entries):
    """A folder with a file no job writes, and `job_entries` (empty folders)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    for entry in job_entries:
        (folder / entry).mkdir()
    return folder


def test_fresh_deletes_only_a_work_dir_a_job_made(tmp_path):
    folder = foreign(tmp_path, "foreign")
    for fresh in (False, True):
        with pytest.raises(ValueError, match="holds files that no main job made"):
            claim(folder, fresh)
    assert (folder / "thesis.tex").read_text() == "years of work"
    ours = tmp_path / "ours"
    claim(ours, False)  # new: made and marked
    (ours / "stages").mkdir()
    (ours / "stages" / "teacher.json").write_text("{}")
    claim(ours, True)
    assert set(os.listdir(ours)) == {JOB_MARKER, LOCK_FILE}
    empty = tmp_path / "empty"
    empty.mkdir()
    claim(empty, True)
    assert set(os.listdir(empty)) == {JOB_MARKER, LOCK_FILE}


def test_fresh_deletes_a_folder_only_when_its_marker_proves_it_and_only_what_it_wrote(
        tmp_path):
    """An empty or copied marker, or an empty stages/, proves nothing: --fresh
    refuses such a folder, naming it, and deletes nothing. In a folder a job made
    (its marker records that very folder), --fresh deletes what the job writes,
    and refuses if anything else is there."""
    job = tmp_path / "job"
    claim(job, False)
    copied_marker = foreign(tmp_path, "copied_marker")
    shutil.copy(job / JOB_MARKER, copied_marker / JOB_MARKER)
    empty_marker = foreign(tmp_path, "empty_marker")
    (empty_marker / JOB_MARKER).write_text("")
    for folder in (empty_marker, copied_marker, foreign(tmp_path, "empty_stages", "stages"),
                   foreign(tmp_path, "stages_and_teacher", "stages", "teacher")):
        with pytest.raises(ValueError, match=f"--work_dir={folder}"):
            claim(folder, True)
        assert (folder / "thesis.tex").read_text() == "years of work", folder
    # A copy of a job's folder resumes (its marker is rewritten for the copy), but
    # --fresh needs the marker the folder itself was given first.
    for stage in ("stages", "teacher", "report", "student"):
        (job / stage).mkdir()
        (job / stage / "out.json").write_text("{}")
    (job / "vocab.model").write_text("pieces")
    copy = tmp_path / "copy"
    shutil.copytree(job, copy)
    with pytest.raises(ValueError, match=f"--work_dir={copy}.*another folder"):
        claim(copy, True)
    assert (copy / "teacher" / "out.json").exists()
    claim(copy, False)
    claim(copy, True)
    assert set(os.listdir(copy)) <= {JOB_MARKER, LOCK_FILE}
    # The job's own folder: anything it does not write stops --fresh, named.
    (job / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt"):
        claim(job, True)
    assert (job / "teacher" / "out.json").exists() and (job / "notes.txt").exists()
    (job / "notes.txt").unlink()
    claim(job, True)
    assert set(os.listdir(job)) <= {JOB_MARKER, LOCK_FILE}
    assert {"stages", "teacher", "report", "student", "vocab.model"} <= set(WORK_DIR_ENTRIES)


def test_a_symlink_is_never_followed(tmp_path):
    job = tmp_path / "job"
    claim(job, False)
    (job / "stages").mkdir()
    link = tmp_path / "link"
    link.symlink_to(job)
    with pytest.raises(ValueError, match=f"--work_dir={link} is a symlink .*--work_dir={job}"):
        claim(link, True)
    assert (job / "stages").is_dir()
    # A stage folder replaced by a symlink: refused with --fresh or without.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep")
    (job / "teacher").symlink_to(elsewhere)
    for fresh in (False, True):
        with pytest.raises(ValueError, match="teacher is a symlink"):
            claim(job, fresh)
        assert os.listdir(elsewhere) == ["precious.txt"]


def test_a_work_dir_below_a_file_is_named(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for work in (a_file / "work", a_file / "deeper" / "work"):
        with pytest.raises(ValueError, match=f"--work_dir={work}.*{a_file}"):
            claim(work, False)


def test_a_claimed_work_dir_has_one_writer_until_it_is_released(tmp_path):
    work = tmp_path / "w"
    descriptor = claim_work_dir(str(work), False)
    with pytest.raises(FolderInUseError, match=f"--work_dir={work}.*pid {os.getpid()}"):
        claim_work_dir(str(work), True)
    release_folder(descriptor)
    claim(work, False)  # released: the next job claims it


def test_a_plain_run_refuses_a_folder_holding_stages_but_no_marker(tmp_path):
    """A folder with a stages/ but no marker is no job's (the marker came with the
    stages that record their flags, so no job's stages without one could be
    resumed): a plain run refuses it in one line naming the folder and writes
    nothing there, so no later --fresh can take it for a job's and delete the
    user's export/my_model."""
    folder = tmp_path / "project"
    (folder / "stages").mkdir(parents=True)
    (folder / "export" / "my_model").mkdir(parents=True)
    (folder / "export" / "my_model" / "weights.txt").write_text("months of training")
    for fresh in (False, True):
        with pytest.raises(ValueError, match=f"--work_dir={folder} holds stages/") as refused:
            claim(folder, fresh)
        assert "\n" not in str(refused.value)
    assert sorted(os.listdir(folder)) == ["export", "stages"]  # no marker, no lock file
    assert (folder / "export" / "my_model" / "weights.txt").read_text() == "months of training"


def test_fresh_deletes_the_jobs_export_and_names_a_model_of_the_users_beside_it(tmp_path):
    """The job writes export/lealla_small, not the whole export/: in a job's own
    folder, a model the user put in export/ stops --fresh, named, and stays; a
    symlink in the export's place is never followed."""
    job = tmp_path / "job"
    claim(job, False)
    (job / "export" / "lealla_small").mkdir(parents=True)
    (job / "export" / "lealla_small" / "saved_model.pb").write_text("the job's")
    (job / "export" / "my_model").mkdir()
    (job / "export" / "my_model" / "weights.txt").write_text("months of training")
    with pytest.raises(ValueError, match=f"--work_dir={job} holds export/my_model, which no "
                                         "main job writes"):
        claim(job, True)
    assert (job / "export" / "my_model" / "weights.txt").read_text() == "months of training"
    assert (job / "export" / "lealla_small" / "saved_model.pb").exists()
    shutil.move(job / "export" / "my_model", tmp_path / "my_model")
    shutil.rmtree(job / "export" / "lealla_small")
    (job / "export" / "lealla_small").symlink_to(tmp_path / "my_model")
    for fresh in (False, True):
        with pytest.raises(ValueError, match="export/lealla_small is a symlink"):
            claim(job, fresh)
    assert (tmp_path / "my_model" / "weights.txt").exists()
    (job / "export" / "lealla_small").unlink()
    (job / "export" / "lealla_small").mkdir()
    claim(job, True)
    assert set(os.listdir(job)) <= {JOB_MARKER, LOCK_FILE}
    assert "export/lealla_small" in WORK_DIR_ENTRIES and "export" not in WORK_DIR_ENTRIES
