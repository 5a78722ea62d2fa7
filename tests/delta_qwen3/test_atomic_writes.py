"""Outputs written beside their target and renamed into place (`delta_qwen3.atomic`): flushed to the disk before
the rename, written through a symbolic link, and never moved over what another process wrote meanwhile."""

import errno
import os

import pytest

from delta_qwen3 import atomic
from delta_qwen3.atomic import atomic_output, staged_directory


@pytest.fixture
def disk_events(monkeypatch) -> list[tuple[str, str]]:
    """("fsync", path) and ("rename", target) in the order they happen."""
    events = []
    fsync, rename, replace = os.fsync, os.rename, os.replace

    def recorded_fsync(descriptor):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        fsync(descriptor)

    def recorded(move):
        def moved(source, target):
            move(source, target)
            events.append(("rename", str(target)))

        return moved

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "rename", recorded(rename))
    monkeypatch.setattr(os, "replace", recorded(replace))
    return events


def test_a_staged_directory_reaches_the_disk_before_its_rename_and_the_rename_after(tmp_path, disk_events):
    target = tmp_path / "model"
    with staged_directory(target) as staging:
        (staging / "weights").write_bytes(b"w")
        (staging / "sub").mkdir()
        (staging / "sub" / "config").write_text("{}")
    rename = disk_events.index(("rename", str(target)))
    assert sorted(path.replace(str(staging), "STAGING") for kind, path in disk_events[:rename]) == [
        "STAGING", "STAGING/sub", "STAGING/sub/config", "STAGING/weights"]
    assert disk_events[rename + 1 :] == [("fsync", str(tmp_path))]
    assert (target / "sub" / "config").read_text() == "{}"


def test_an_atomic_file_reaches_the_disk_before_its_rename_and_the_rename_after(tmp_path, disk_events):
    target = tmp_path / "results.json"
    with atomic_output(target) as temporary:
        temporary.write_text("{}")
    assert disk_events == [("fsync", str(temporary)), ("rename", str(target)), ("fsync", str(tmp_path))]


def test_a_symbolic_link_is_written_through_and_kept(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "old.txt").write_text("old")
    (tmp_path / "link").symlink_to("real")
    with staged_directory(tmp_path / "link") as staging:
        (staging / "new.txt").write_text("new")
    assert (tmp_path / "link").is_symlink() and os.readlink(tmp_path / "link") == "real"
    assert [p.name for p in (tmp_path / "real").iterdir()] == ["new.txt"]

    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to("real.json")
    atomic.write_json(tmp_path / "link.json", {"a": 1})
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "real.json").read_text() == '{\n  "a": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "link.json", "real", "real.json"]


def test_an_old_directory_that_cannot_be_removed_is_reported_after_the_new_one_is_in_place(tmp_path, monkeypatch,
                                                                                           caplog):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    rmtree = atomic.shutil.rmtree

    def refused(path, *args, **kwargs):
        if atomic.RETIRED_MARK in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(atomic.shutil, "rmtree", refused)
    with staged_directory(target) as staging:
        (staging / "new.txt").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert "could not remove" in caplog.text and "Permission denied" in caplog.text


@pytest.mark.parametrize("meanwhile", ["a directory with files", "a file"])
def test_without_replace_what_another_process_wrote_meanwhile_is_kept(tmp_path, meanwhile):
    target = tmp_path / "out"
    with pytest.raises(FileExistsError) as raised:
        with staged_directory(target, replace=False) as staging:
            (staging / "mine.txt").write_text("mine")
            if meanwhile == "a file":
                target.write_text("theirs")
            else:
                target.mkdir()
                (target / "theirs.txt").write_text("theirs")
    assert raised.value.strerror == "it was written by another process meanwhile, and is left as it is"
    assert raised.value.filename == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (target.read_text() if meanwhile == "a file" else (target / "theirs.txt").read_text()) == "theirs"

    # An empty directory holds nothing to keep.
    target.unlink() if meanwhile == "a file" else [p.unlink() for p in target.iterdir()]
    target.mkdir(exist_ok=True)
    with staged_directory(target, replace=False) as staging:
        (staging / "mine.txt").write_text("mine")
    assert [p.name for p in target.iterdir()] == ["mine.txt"]
