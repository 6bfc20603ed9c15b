"""The run-folder lock (`artifacts.lock_run_folder`): one writing process per folder, another one refused
with the holder's PID, the lock gone with its holder (even after `kill -9`), re-entry in one process."""

from __future__ import annotations

import os
import signal

import pytest

from sqlrl.artifacts import RUN_LOCK_FILE, RunFolderLocked, lock_run_folder


def test_a_second_process_is_refused_with_the_folder_and_the_holders_pid(tmp_path, hold_run_lock):
    run = tmp_path / "run"
    holder = hold_run_lock(run)
    try:
        assert (run / RUN_LOCK_FILE).read_text() == f"{holder.pid}\n"
        with pytest.raises(RunFolderLocked) as e:
            with lock_run_folder(run):
                pass
        msg = str(e.value)
        assert f"run folder {run} " in msg and f"(PID {holder.pid}," in msg and "\n" not in msg
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert not (run / RUN_LOCK_FILE).exists()  # removed by its holder on release
    with lock_run_folder(run):  # free again
        assert (run / RUN_LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_kill_minus_9_of_the_holder_releases_the_lock(tmp_path, hold_run_lock):
    run = tmp_path / "run"
    holder = hold_run_lock(run)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    assert (run / RUN_LOCK_FILE).read_text() == f"{holder.pid}\n"  # left behind, but not locked
    with lock_run_folder(run):
        assert (run / RUN_LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert not (run / RUN_LOCK_FILE).exists()


def test_one_process_reenters_its_folder_and_locks_nested_folders(tmp_path):
    run = tmp_path / "exp"
    with lock_run_folder(run):
        with lock_run_folder(run):  # a runner calling another runner on the same folder
            (run / "experiment.json").write_text("{}")
        assert (run / RUN_LOCK_FILE).exists()  # still held by the outer block
        with lock_run_folder(run / "arms" / "grpo" / "train") as arm:  # an arm trained in-process
            (arm / "run.json").write_text("{}")
            with lock_run_folder(run / "arms" / "grpo" / "eval"):
                pass
    assert sorted(p.name for p in run.iterdir()) == ["arms", "experiment.json"]
    assert sorted(p.name for p in (run / "arms" / "grpo").iterdir()) == [
        "train"
    ]  # eval/ was made and left empty
    assert sorted(p.name for p in (run / "arms" / "grpo" / "train").iterdir()) == ["run.json"]


def test_a_folder_created_only_for_the_lock_is_removed(tmp_path):
    with pytest.raises(ValueError):
        with lock_run_folder(tmp_path / "new"):
            raise ValueError("the run failed its checks")
    assert not (tmp_path / "new").exists()


def test_a_left_lock_file_does_not_make_a_new_run_folder_non_empty(tmp_path):
    from sqlrl.training.runfolder import check_run_folder

    (tmp_path / RUN_LOCK_FILE).write_text("12345\n")  # from a process killed before writing anything
    assert check_run_folder(tmp_path, {}, resume=False, command="train") == []
