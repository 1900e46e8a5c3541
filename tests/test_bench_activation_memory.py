"""`python -m bench memory --activations` on a tiny GPT: every row is there, and functrain's full
checkpointing holds exactly what torch.utils.checkpoint applied by hand holds."""

from bench import activation_memory


def test_activation_rows_and_the_hand_written_checkpoint_agree(tmp_path, capsys):
    report = activation_memory.main(
        ["--layers", "2", "--width", "16", "--heads", "2", "--length", "32", "--batch", "2",
         "--reps", "1", "--steps", "1", "--out", str(tmp_path / "a.json")]
    )  # fmt: skip
    rows = report["rows"]
    assert list(rows) == list(activation_memory.VARIANTS)
    assert rows["full"]["held_bytes"] == rows["by_hand"]["held_bytes"]
    assert rows["full"]["held_bytes"] < rows["every2"]["held_bytes"] < rows["none"]["held_bytes"]
    assert rows["full"]["held_bytes"] < rows["selective"]["held_bytes"] < rows["none"]["held_bytes"]
    assert all(row["peak_bytes"] > 0 and row["step_ms"] > 0 for row in rows.values())
    assert [g["goal"].split(":")[0] for g in report["goals"]] == ["full", "selective"]
    assert "held MiB" in capsys.readouterr().out
