"""Smoke test of the benchmark entry point `python -m bench`: it runs and writes well-formed JSON.

Minimal sizes and repetitions; no timing thresholds (speed is measured in bench/, never asserted).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ["torch", "torch_fused", "functrain", "functrain_fit", "lightning"]
# 64*128 + 128 + 128*128 + 128 + 128*10 + 10 float32 parameters of the tiny MLP
TINY_MLP_PARAMETER_BYTES = 4 * (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10)


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def check_variant_entry(entry: dict) -> None:
    assert entry["status"] in ("ok", "skipped", "failed")
    if entry["status"] != "ok":
        assert entry["reason"]  # a missing peer or a failure always says why


def test_overhead_suite_writes_json_with_medians_ratios_and_goals(tmp_path):
    out = tmp_path / "overhead.json"
    proc = run_bench(
        "overhead",
        "--models=tiny_mlp",
        f"--variants={','.join(VARIANTS)}",
        "--reps=2",
        "--steps-scale=0.02",
        "--warmup=1",
        "--only=steps",
        f"--out={out}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["suite"] == "overhead" and "import" not in report
    assert report["config"]["reps"] == 2 and report["config"]["clock"] == "cpu"
    assert {"python", "torch", "cpu_count", "torch_threads"} <= set(report["environment"])
    model = report["models"]["tiny_mlp"]
    assert model["parameters"] * 4 == TINY_MLP_PARAMETER_BYTES
    assert list(model["variants"]) == VARIANTS
    for name, entry in model["variants"].items():
        check_variant_entry(entry)
        if name != "lightning":  # a peer may be missing from this environment
            assert entry["status"] == "ok", entry
        if entry["status"] == "ok":
            assert len(entry["times_ms"]) == len(entry["ratios"]) == 2
            assert entry["median_ms"] > 0 and entry["ratio"] > 0
    # The floor is the hand-written loop with the lower median: its own ratios are exactly 1.
    floor = model["baseline"]
    assert floor in ("torch", "torch_fused")
    assert model["variants"][floor]["ratios"] == [1.0, 1.0]
    other = "torch" if floor == "torch_fused" else "torch_fused"
    assert model["variants"][other]["median_ms"] >= model["variants"][floor]["median_ms"]
    goal = next(g for g in report["goals"] if g["goal"] == "functrain time")
    assert goal["limit"] == 1.15 and goal["met"] == (goal["value"] <= goal["limit"])
    assert "| variant" in proc.stdout and "functrain_fit" in proc.stdout


def test_overhead_start_up_row_pairs_torch_and_functrain_imports(tmp_path):
    out = tmp_path / "overhead.json"
    proc = run_bench("overhead", "--only=import", "--import-reps=2", f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    row = report["import"]
    assert report["models"] == {} and row["reps"] == 2 and row["clock"] == "cpu"
    assert [len(row["samples"][m]) for m in ("torch", "functrain")] == [2, 2]
    pairs = [
        f["cpu_s"] - t["cpu_s"]
        for f, t in zip(*(row["samples"][m] for m in ("functrain", "torch")))
    ]
    assert row["over_torch_s"] == pytest.approx(sum(pairs) / 2)  # median of two differences
    assert row["heavy"] == []  # a bare `import functrain` loads none of them
    assert row["after_torch_cpu_s"] > 0  # functrain imported alone, after torch and a gc
    assert row["modules"]["functrain"] > row["modules"]["torch"]  # it did import functrain
    goal = report["goals"][0]
    assert goal["model"] == "import" and goal["limit"] == 0.3
    assert "| start-up" in proc.stdout and "import functrain" in proc.stdout


def test_memory_suite_counts_at_least_the_parameters(tmp_path):
    out = tmp_path / "memory.json"
    proc = run_bench(
        "memory",
        "--models=tiny_mlp",
        "--variants=torch_fused,functrain",
        "--warmup=1",
        f"--out={out}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["suite"] == "memory" and "profiler" in report["method"]
    for entry in report["models"]["tiny_mlp"]["variants"].values():
        assert entry["status"] == "ok"
        # parameters, their gradients and AdamW's two moments are all alive at the peak
        assert entry["peak_bytes"] >= 4 * TINY_MLP_PARAMETER_BYTES
        assert entry["peak_bytes"] >= entry["steady_bytes"] > 0


def test_entry_point_rejects_unknown_suites_and_reports_missing_ones(monkeypatch, capsys):
    proc = run_bench("no_such_suite")
    assert proc.returncode == 2 and "unknown suite 'no_such_suite'" in proc.stderr
    monkeypatch.syspath_prepend(str(ROOT))
    from bench import __main__ as entry

    monkeypatch.setitem(entry.SUITES, "absent", ("bench.absent_suite", "main"))
    assert entry.run_suite("absent", []) == 3
    assert "bench/absent_suite.py does not exist" in capsys.readouterr().err


def test_mutants_keeps_one_mutant_per_position_and_operator_family(tmp_path):
    import sqlite3

    from bench import mutants

    assert mutants._family("core/ReplaceBinaryOperator_Add_Sub") == "core/ReplaceBinaryOperator_Add"
    assert mutants._family("core/NumberReplacer") == "core/NumberReplacer"
    db = tmp_path / "session.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE work_items (job_id VARCHAR PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE mutation_specs (job_id VARCHAR PRIMARY KEY, operator_name VARCHAR, "
            "start_pos_row INTEGER, start_pos_col INTEGER, occurrence INTEGER, "
            "operator_args VARCHAR)"
        )
        rows = [  # two sites of a `+` (3 replacements each) and one number
            *[
                (f"a{i}", f"core/ReplaceBinaryOperator_Add_{op}", 1, 4)
                for i, op in enumerate("XYZ")
            ],
            *[
                (f"b{i}", f"core/ReplaceBinaryOperator_Add_{op}", 2, 4)
                for i, op in enumerate("XYZ")
            ],
            ("c0", "core/NumberReplacer", 3, 0),
        ]
        rows = [(*r, 0, None) for r in rows]
        conn.executemany("INSERT INTO mutation_specs VALUES (?, ?, ?, ?, ?, ?)", rows)
        conn.executemany("INSERT INTO work_items VALUES (?)", [(r[0],) for r in rows])
    module = tmp_path / "module.py"  # the mutated source (no annotations to skip here)
    module.write_text("a = 1 + 2\nb = 3 + 4\nc = 5\n")
    assert mutants._thin(db, module, max_mutants=0, seed=0) == (3, 0)
    with sqlite3.connect(db) as conn:
        kept = [r[0] for r in conn.execute("SELECT job_id FROM work_items ORDER BY job_id")]
    assert [k[0] for k in kept] == ["a", "b", "c"]
    assert mutants._thin(db, module, max_mutants=2, seed=0) == (2, 0)
