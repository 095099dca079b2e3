"""lealla_tf.folder_lock: one writer a folder (or an output file's lock), refused
in one line naming the holder's pid; a dead holder's lock never blocks."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO_ROOT

from lealla_tf.folder_lock import (
    LOCK_FILE,
    FolderInUseError,
    check_folder,
    hold_folder,
    one_writer,
    release_folder,
)

HOLDER = """
import sys, time
from lealla_tf.folder_lock import hold_folder
hold_folder(sys.argv[1], lock_name=sys.argv[2])
print("held", flush=True)
time.sleep(600)
"""


def start_holder(folder, lock_name=LOCK_FILE):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), lock_name],
                              cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_writer_is_refused_naming_the_first_and_a_killed_ones_lock_blocks_nobody(
        tmp_path):
    folder = tmp_path / "out"
    holder = start_holder(folder)
    try:
        with pytest.raises(FolderInUseError) as refused:
            hold_folder(str(folder), "--output=out")
        message = str(refused.value)
        assert message.startswith("--output=out is being written by another run "
                                  f"(pid {holder.pid})") and "\n" not in message
        assert "one run writes a folder at a time" in message
    finally:
        holder.send_signal(signal.SIGKILL)  # no chance to let go: the kernel does
        holder.wait()
        holder.stdout.close()
    assert (folder / LOCK_FILE).read_text().strip() == str(holder.pid)  # what it left
    descriptor = hold_folder(str(folder))
    try:
        assert (folder / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    finally:
        release_folder(descriptor)
    assert (folder / LOCK_FILE).read_text() == ""  # emptied; the file itself stays


def test_one_process_is_refused_its_own_folder_twice_and_gets_it_back_after_release(tmp_path):
    with one_writer(str(tmp_path)):
        with pytest.raises(FolderInUseError, match=f"pid {os.getpid()}"):
            hold_folder(str(tmp_path))
    with pytest.raises(KeyError):  # released when the block raises, too
        with one_writer(str(tmp_path)):
            raise KeyError("the run failed")
    release_folder(hold_folder(str(tmp_path)))


def test_an_output_files_lock_leaves_the_folder_to_other_outputs(tmp_path):
    holder = start_holder(tmp_path, "mined.tsv.lock")
    try:
        with pytest.raises(FolderInUseError, match="one run writes an output at a time"):
            hold_folder(str(tmp_path), "--output=mined.tsv", lock_name="mined.tsv.lock")
        with one_writer(str(tmp_path), lock_name="other.tsv.lock"):
            pass
        with one_writer(str(tmp_path)):  # the folder's own lock is another file
            pass
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


@pytest.mark.parametrize("stale", [False, True], ids=["free", "killed_holders_lock"])
def test_racing_threads_have_one_winner(tmp_path, stale):
    """Threads (one pid) race for one folder, free or holding a killed run's
    lock file: exactly one wins each round, every other one is refused."""
    contenders = 8
    for round_number in range(10):
        folder = tmp_path / f"round{round_number}"
        folder.mkdir()
        if stale:
            (folder / LOCK_FILE).write_text("999999999\n")
        start, outcomes = threading.Barrier(contenders), []

        def contend(folder=str(folder), start=start, outcomes=outcomes):
            start.wait()
            try:
                with one_writer(folder):
                    outcomes.append("won")
                    deadline = time.time() + 20  # hold until every other one has tried
                    while len(outcomes) < contenders and time.time() < deadline:
                        time.sleep(0.001)
            except FolderInUseError as error:
                outcomes.append(str(error))

        threads = [threading.Thread(target=contend) for _ in range(contenders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(outcomes) == contenders and outcomes.count("won") == 1, outcomes
        assert all(f"being written by another run (pid {os.getpid()})" in outcome
                   for outcome in outcomes if outcome != "won"), outcomes
        assert os.listdir(folder) == [LOCK_FILE]  # nothing else left behind


CONTENDER = """
import os, sys, time
from lealla_tf.folder_lock import FolderInUseError, one_writer
folder, signals, contenders = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(os.path.join(signals, f"ready-{os.getpid()}"), "w").close()
while not os.path.exists(os.path.join(signals, "go")):
    time.sleep(0.001)
def report(outcome):
    with open(os.path.join(signals, f"result-{os.getpid()}"), "w") as f:
        f.write(outcome)
try:
    with one_writer(folder):
        report("won")
        deadline = time.time() + 60  # hold until every other one has tried
        while (sum(n.startswith("result-") for n in os.listdir(signals)) < contenders
               and time.time() < deadline):
            time.sleep(0.01)
except FolderInUseError as error:
    report(str(error))
"""


def test_racing_processes_have_one_winner_whom_the_others_name(tmp_path):
    folder, signals, contenders = tmp_path / "out", tmp_path / "signals", 4
    folder.mkdir()
    signals.mkdir()
    processes = [subprocess.Popen([sys.executable, "-c", CONTENDER, str(folder), str(signals),
                                   str(contenders)], cwd=REPO_ROOT)
                 for _ in range(contenders)]
    try:
        deadline = time.time() + 120
        while (sum(name.startswith("ready-") for name in os.listdir(signals)) < contenders
               and time.time() < deadline):
            time.sleep(0.01)
        (signals / "go").touch()
        for process in processes:
            assert process.wait(timeout=120) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    outcomes = {int(path.name.split("-")[1]): path.read_text()
                for path in signals.glob("result-*")}
    winners = [pid for pid, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == contenders and len(winners) == 1, outcomes
    for pid, outcome in outcomes.items():
        if pid != winners[0]:
            assert f"another run (pid {winners[0]})" in outcome, outcome


def test_remote_folders_are_not_locked_and_bad_places_are_named(tmp_path):
    assert hold_folder("gs://no-bucket/out") is None
    with one_writer("gs://no-bucket/out"):
        pass
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="--output=x: cannot lock .*a_file"):
        hold_folder(str(tmp_path / "a_file" / "below"), "--output=x")
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="cannot lock"):  # a symlink is never followed
        hold_folder(str(tmp_path / "planted"))
    assert not (tmp_path / "elsewhere").exists()


def test_check_folder_names_a_path_that_cannot_be_a_folder(tmp_path):
    check_folder(str(tmp_path / "new" / "deeper"), "--model_dir=new")  # can be made
    check_folder("gs://bucket/x", "--model_dir=gs")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="--model_dir=f is a file, not a directory"):
        check_folder(str(tmp_path / "a_file"), "--model_dir=f")
    with pytest.raises(ValueError, match="cannot be created: .*a_file is a file"):
        check_folder(str(tmp_path / "a_file" / "below"), "--model_dir=b")
    (tmp_path / "broken").symlink_to(tmp_path / "missing")
    with pytest.raises(ValueError, match="is a symlink to .*missing, which does not exist"):
        check_folder(str(tmp_path / "broken"), "--model_dir=l")
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "locked").mkdir(mode=0o500)
        with pytest.raises(ValueError, match="is not writable"):
            check_folder(str(tmp_path / "locked" / "run"), "--model_dir=r")
