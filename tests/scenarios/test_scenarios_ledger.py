"""The full matrix's bookkeeping (scenario_ledger.py, the reference cache in scenario_jobs.py,
`python -m bench scenarios --design full`): slices, resume, code hashes, the report. Nothing
here launches a run."""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import pytest
import scenario_jobs
import scenario_ledger as ledger
from scenario_axes import Scenario
from scenario_designs import all_scenarios
from scenario_jobs import Job, code_hash, reference_key, restore_reference, store_reference

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench import scenarios as bench_scenarios  # noqa: E402

FULL = all_scenarios()


def row(s: Scenario, result: str = "pass", code: str = "A", seconds: float = 2.0) -> dict:
    return {"id": s.id, "scenario": s.row, "result": result, "seconds": seconds,
            "code_hash": code, "git_commit": "abc1234"}  # fmt: skip


def test_the_full_design_is_the_cross_product_minus_the_forbidden_pairs():
    # 8 algorithms x 3 precisions x 2 microbatch x 3 schedules x 2 optimizers x 3 recoveries =
    # 864 trainings per layout; interruptions: 4 on one process (no restart, no rank change), 6 on
    # the 5 others.
    assert len(FULL) == 864 * (4 + 5 * 6) == 29376
    assert len({s.id for s in FULL}) == len(FULL)


@pytest.mark.parametrize("count", [1, 2, 5, 7])
def test_shards_partition_the_design_exactly_and_keep_a_configuration_together(count):
    shards = [ledger.shard(FULL, i, count) for i in range(1, count + 1)]
    ids = [s.id for part in shards for s in part]
    assert sorted(ids) == sorted(s.id for s in FULL)  # every scenario once: no gap, no overlap
    owner = {}
    for i, part in enumerate(shards):
        for s in part:
            assert owner.setdefault(s.config_id, i) == i, f"{s.config_id} split across shards"
    sizes = [len({s.config_id for s in part}) for part in shards]
    assert max(sizes) - min(sizes) <= 1  # balanced by configurations


def test_units_run_the_cheapest_layout_first_and_group_by_configuration():
    units = ledger.units(FULL)
    assert len(units) == 864 * 6
    layouts = [u[0].layout for u in units]
    firsts = [layouts.index(layout) for layout in ledger.LAYOUT_ORDER]
    assert firsts == sorted(firsts) and layouts[0] == "single"
    for unit in units:
        assert len({s.config_id for s in unit}) == 1
        assert len(unit) == (4 if unit[0].layout == "single" else 6)


def test_a_shard_is_given_as_i_of_n():
    assert ledger.parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "2", "a/b"):
        with pytest.raises(ValueError, match="--shard"):
            ledger.parse_shard(bad)


def test_only_matches_whole_axis_values():
    fsdp = Scenario("none", "fp32", "fsdp", "off", "ba", "plain", "sigterm")
    raf = Scenario("none", "fp32", "fsdp_raf", "off", "ba", "plain", "sigterm")
    assert ledger.matches(fsdp, ["fsdp"]) and not ledger.matches(raf, ["fsdp"])
    assert ledger.matches(raf, ["fsdp_raf", "sigterm"]) and not ledger.matches(raf, ["sigint"])
    assert ledger.matches(raf, ["none.fp32"]) and not ledger.matches(raf, ["fp32.none"])
    assert len([s for s in FULL if ledger.matches(s, ["single"])]) == 864 * 4


def test_resume_skips_rows_done_at_the_same_code_and_reruns_everything_else():
    chosen = FULL[:10]
    data = ledger.empty()
    ledger.record(data, [row(s, "pass") for s in chosen[:4]])
    ledger.record(data, [row(chosen[4], "FAIL")])
    ledger.record(data, [row(chosen[5], "pass", code="B")])  # ran at other code
    todo = ledger.pending(chosen, data, "A")
    assert [s.id for s in todo] == [s.id for s in chosen[5:]]
    assert [s.id for s in ledger.pending(chosen, data, "A", retry_failed=True)] == [
        s.id for s in chosen[4:]
    ]
    # a code-hash change invalidates every row
    assert [s.id for s in ledger.pending(chosen, data, "C")] == [s.id for s in chosen]


def test_a_row_without_its_bookkeeping_is_refused():
    data = ledger.empty()
    incomplete = row(FULL[0])
    del incomplete["code_hash"]
    with pytest.raises(ValueError, match="code_hash"):
        ledger.record(data, [incomplete])


def test_the_ledger_round_trips_and_refuses_other_files(tmp_path):
    path = str(tmp_path / "full.json")
    assert ledger.load(path)["rows"] == {}
    data = ledger.empty()
    ledger.record(data, [row(FULL[0])])
    ledger.save(path, data)
    assert ledger.load(path)["rows"][FULL[0].id]["code_hash"] == "A"
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]
    (tmp_path / "other.json").write_text(json.dumps({"suite": "scenarios", "scenarios": []}))
    with pytest.raises(ValueError, match="not a scenario ledger"):
        ledger.load(str(tmp_path / "other.json"))


def test_totals_count_results_and_estimate_the_hours_left_per_layout():
    single = [s for s in FULL if s.layout == "single"][:8]
    ddp = [s for s in FULL if s.layout == "ddp"][:6]
    data = ledger.empty()
    ledger.record(data, [row(s, "pass", seconds=1.0) for s in single[:3]])
    ledger.record(data, [row(single[3], "FAIL", seconds=3.0)])
    ledger.record(data, [row(ddp[0], "pass", seconds=10.0), row(ddp[1], "pass", seconds=20.0)])
    ledger.record(data, [row(ddp[2], "pass", code="old", seconds=99.0)])  # stale: not counted
    t = ledger.totals(single + ddp, data, "A")
    assert (t["scenarios"], t["ran"], t["pass"], t["fail"]) == (14, 6, 5, 1)
    assert t["remaining"] == 8 and t["remaining_by_layout"] == {"single": 4, "ddp": 4}
    # single: mean of 1, 1, 1, 3 = 1.5 s; ddp: mean of 10, 20 = 15 s
    assert t["hours_left"] == round((4 * 1.5 + 4 * 15.0) / 3600, 2)
    fsdp = [s for s in FULL if s.layout == "fsdp"][:30]  # no rows yet: the prior rate
    later = ledger.totals(single + fsdp, data, "A")
    assert later["hours_left"] == round((4 * 1.5 + 30 * ledger.PRIOR_SECONDS["fsdp"]) / 3600, 2)
    table = {r[0]: r[1] for r in ledger.table_rows(single + ddp, data, "A")}
    assert table[single[3].id] == "FAIL" and table[ddp[2].id] == "stale"
    assert table[ddp[5].id] == "not run"
    assert ledger.by_layout(single + ddp, data, "A") == [["single", 8, 4, 3, 1, 4], ["ddp", 6, 2, 2, 0, 4]]  # fmt: skip


def _fake_repo(root) -> str:
    """A tree holding what `code_hash` reads: a functrain package and the harness files."""
    os.makedirs(os.path.join(root, "functrain", "sub"))
    os.makedirs(os.path.join(root, "tests", "scenarios"))
    for name in ("__init__.py", "loop.py", "sub/x.py"):
        with open(os.path.join(root, "functrain", name), "w") as f:
            f.write(f"# {name}\n")
    for name in (*scenario_jobs.HARNESS_FILES, "scenario_designs.py", "scenario_ledger.py"):
        with open(os.path.join(root, "tests", "scenarios", name), "w") as f:
            f.write(f"# {name}\n")
    return str(root)


def test_the_code_hash_follows_the_library_and_the_harness_not_the_bookkeeping(tmp_path):
    repo = _fake_repo(tmp_path)
    digest = code_hash.__wrapped__
    first = digest(repo)
    assert digest(repo) == first
    with open(os.path.join(repo, "tests", "scenarios", "scenario_designs.py"), "a") as f:
        f.write("# a new design does not change what a scenario runs\n")
    assert digest(repo) == first
    for changed in ("functrain/sub/x.py", "tests/scenarios/scenario_worker.py"):
        path = os.path.join(repo, changed)
        original = Path(path).read_text()
        with open(path, "a") as f:
            f.write("x = 1\n")
        assert digest(repo) != first, changed
        with open(path, "w") as f:
            f.write(original)
        assert digest(repo) == first
    os.rename(os.path.join(repo, "functrain", "loop.py"), os.path.join(repo, "functrain", "l2.py"))
    assert digest(repo) != first  # a renamed file is a change


def _reference(tmp_path, config: dict) -> Job:
    job = Job("ref.x", str(tmp_path / "jobs" / "ref.x"), config, [], config["layout"])
    os.makedirs(job.dir)
    for name in scenario_jobs.REFERENCE_FILES:
        with open(os.path.join(job.dir, name), "w") as f:
            f.write(f"{name} of {sorted(config.items())}")
    return job


def test_the_reference_cache_is_keyed_by_configuration_and_code(tmp_path, monkeypatch):
    a = Scenario("swa", "amp_bf16", "ddp", "on", "ep", "decoupled", "sigterm")
    b = Scenario("swa", "amp_bf16", "ddp", "on", "ep", "decoupled", "kill_step")
    c = Scenario("swa", "amp_bf16", "fsdp", "on", "ep", "decoupled", "sigterm")
    job_a = Job("ref.a", "/nowhere", a.config, [], a.layout)
    job_b = Job("ref.b", "/nowhere", b.config, [], b.layout)
    job_c = Job("ref.c", "/nowhere", c.config, [], c.layout)
    assert reference_key(job_a) == reference_key(job_b)  # the interruption does not enter
    assert reference_key(job_a) != reference_key(job_c)
    with pytest.raises(ValueError, match="not an uninterrupted reference"):
        reference_key(Job("x", "/nowhere", a.config, [{"kind": "sigterm", "at": 9}], a.layout))
    before = reference_key(job_a)
    monkeypatch.setattr(scenario_jobs, "code_hash", lambda: "other code")
    assert reference_key(job_a) != before  # never reused across a code change
    monkeypatch.undo()

    cache = str(tmp_path / "cache")
    trained = _reference(tmp_path / "run1", a.config)
    open(os.path.join(trained.dir, "done"), "w").close()
    store_reference(trained, cache)
    fresh = Job("ref.x", str(tmp_path / "run2" / "ref.x"), a.config, [], a.layout)
    assert restore_reference(fresh, cache)
    for name in scenario_jobs.REFERENCE_FILES:
        with open(os.path.join(fresh.dir, name)) as f, open(os.path.join(trained.dir, name)) as g:
            assert f.read() == g.read()
    other = Job("ref.y", str(tmp_path / "run3" / "ref.y"), c.config, [], c.layout)
    assert not restore_reference(other, cache)
    monkeypatch.setattr(scenario_jobs, "code_hash", lambda: "edited")  # a code change: a miss
    assert not restore_reference(Job("ref.z", str(tmp_path / "z"), a.config, [], a.layout), cache)


def test_an_unfinished_reference_is_not_cached(tmp_path):
    config = Scenario("sam", "fp32", "single", "off", "ba", "plain", "sigint").config
    job = _reference(tmp_path, config)
    os.remove(os.path.join(job.dir, "done"))
    store_reference(job, str(tmp_path / "cache"))
    assert not os.path.exists(str(tmp_path / "cache")) or os.listdir(tmp_path / "cache") == []


def test_the_report_runs_nothing_and_counts_what_is_left(tmp_path, capsys):
    path = str(tmp_path / "full.json")
    single = [s for s in FULL if s.layout == "single"]
    data = ledger.empty()
    ledger.record(data, [row(s, "pass", code=code_hash(), seconds=0.5) for s in single[:40]])
    ledger.save(path, data)
    rc = bench_scenarios.main(["--design", "full", "--only", "single", "--results", path, "--report"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert f"3456 scenarios at code {code_hash()}: 40 ran, 40 pass" in out
    assert "3416 remaining" in out and f"{3416 * 0.5 / 3600:.1f} h left" in out
    assert ledger.load(path)["rows"].keys() == data["rows"].keys()


def test_resume_with_everything_done_launches_nothing(tmp_path, capsys, monkeypatch):
    path = str(tmp_path / "full.json")
    unit = ledger.units(FULL)[0]
    data = ledger.empty()
    ledger.record(data, [row(s, "pass", code=code_hash()) for s in unit])
    ledger.save(path, data)

    def no_runs(*args, **kwargs):
        raise AssertionError("a done scenario was run again")

    import scenario_harness

    monkeypatch.setattr(scenario_harness, "run_matrix", no_runs)
    config = ".".join(unit[0].id.split(".")[:7])  # the id without its interruption
    argv = ["--design", "full", "--only", config, "--results", path, "--resume", "--cache", ""]
    assert bench_scenarios.main(argv) == 0
    assert "0 of 4 chosen scenarios to run" in capsys.readouterr().err
    saved = ledger.load(path)
    assert saved["runs"][-1]["scenarios"] == 0 and saved["rows"] == data["rows"]


def test_counts_of_the_full_design_per_layout():
    per = collections.Counter(s.layout for s in FULL)
    assert per == {"single": 3456, **{k: 5184 for k in ("ddp", "fsdp", "fsdp_raf", "fsdp_offload", "two_nodes")}}  # fmt: skip
