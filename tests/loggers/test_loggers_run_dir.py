"""RunDirLogger: an explicit location, else one inside the loop's run directory, per rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from functrain.loggers.run_dir import RunDirLogger


class _NotesLogger(RunDirLogger):
    default_name = "notes.txt"
    location_arg = "path"
    location_kind = "file to write"

    def write_metrics(self, values, step):
        self.location().parent.mkdir(parents=True, exist_ok=True)
        with open(self.location(), "a", encoding="utf-8") as file:
            file.write(f"{step} {values}\n")


def test_an_explicit_location_wins_over_the_run_dir(make_ctx, tmp_path):
    logger = _NotesLogger(tmp_path / "mine.txt")
    logger.fit_start(make_ctx(run_dir=str(tmp_path / "run")))
    assert logger.location() == tmp_path / "mine.txt"


def test_the_run_dir_comes_from_the_first_context(make_ctx, tmp_path):
    logger = _NotesLogger()
    logger.fit_start(make_ctx(run_dir=str(tmp_path / "a")))
    logger.observe(make_ctx(run_dir=str(tmp_path / "b")))  # later contexts do not move it
    logger.log_metrics({"loss": 0.5}, step=3)
    assert (tmp_path / "a" / "notes.txt").read_text() == "3 {'loss': 0.5}\n"


def test_other_ranks_get_their_own_location(make_ctx, tmp_path):
    logger = _NotesLogger(all_ranks=True)
    logger.fit_start(make_ctx(run_dir=str(tmp_path), rank=2))
    assert logger.location() == tmp_path / "notes.txt" / "rank2"  # the default: a subdirectory

    class _Suffixed(_NotesLogger):
        def for_rank(self, path: Path, rank: int) -> Path:
            return path.with_suffix(f".{rank}.txt")

    other = _Suffixed(tmp_path / "n.txt", all_ranks=True)
    other.observe(make_ctx(rank=1))
    assert other.location() == tmp_path / "n.1.txt"


def test_no_location_fails_at_fit_start_naming_the_fix(make_ctx):
    with pytest.raises(
        ValueError, match=r"_NotesLogger has no file to write: pass _NotesLogger\(path=\.\.\.\)"
    ):
        _NotesLogger().fit_start(make_ctx())


def test_inactive_ranks_do_not_need_a_location(make_ctx):
    logger = _NotesLogger()
    logger.fit_start(make_ctx(rank=1))  # rank 1 writes nothing, so it needs no location
    logger.log_metrics({"loss": 1.0}, step=1)
