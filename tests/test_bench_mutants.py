"""bench mutants' harness: a mutant's test run, and every process it starts, sees the mutant.

The fork server (bench/mutant_server.py) runs each mutant's tests in a fork that imports
functrain from the mutated scratch copy. Multi-rank tests start more interpreters (`mp.spawn`,
a worker script under torchrun); if those imported an unmutated functrain (an editable install,
PYTHONPATH), a mutant only a 2-rank test can kill would be reported surviving.
"""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "bench" / "mutant_server.py"

# The test the server runs in the "mutated" tree: the fork itself, an `mp.spawn`-style child
# (the start method torch.multiprocessing.spawn uses) and a worker script started as its own
# interpreter (as torchrun starts ranks) must all import the tree's functrain.
CHILD_TEST = """
import multiprocessing
import subprocess
import sys
from pathlib import Path

import functrain

HERE = Path(__file__).resolve().parent


def _mark(queue):
    import functrain

    queue.put(functrain.MARK)


def test_every_process_imports_the_mutated_tree():
    assert functrain.MARK == "mutated"
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_mark, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == "mutated"
    child.join()
    script = subprocess.run([sys.executable, str(HERE / "rank_script.py")],
                            capture_output=True, text=True, timeout=60)
    assert script.stdout.strip() == "mutated", script.stderr
"""


def _package(root: Path, mark: str) -> None:
    (root / "functrain").mkdir(parents=True)
    (root / "functrain" / "__init__.py").write_text(f"MARK = {mark!r}\n")


@pytest.mark.slow
def test_fork_server_children_and_their_processes_import_the_mutated_tree(tmp_path):
    tree, decoy = tmp_path / "tree", tmp_path / "installed"
    _package(tree, "mutated")
    _package(decoy, "original")  # stands for main's editable install of functrain
    (tree / "tests").mkdir()
    (tree / "tests" / "test_child.py").write_text(textwrap.dedent(CHILD_TEST))
    (tree / "tests" / "rank_script.py").write_text("import functrain\nprint(functrain.MARK)\n")
    modules = tmp_path / "modules.txt"
    modules.write_text("")  # nothing to pre-import: the test needs no torch
    sock, log = tmp_path / "server.sock", tmp_path / "pytest.log"
    # the server's own environment resolves `functrain` to the unmutated decoy
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(decoy), "HOME": str(tmp_path)}
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "serve", str(sock), str(tree), str(modules)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout.readline().strip() == "ready"
        run = subprocess.run(
            [sys.executable, str(SERVER), "run", str(sock), str(log), "--",
             "-q", "-p", "no:cacheprovider", "tests/test_child.py"],
            env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert run.returncode == 0, log.read_text()
        assert "1 passed" in log.read_text()
    finally:
        subprocess.run([sys.executable, str(SERVER), "stop", str(sock)], capture_output=True)
        deadline = time.monotonic() + 10
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if server.poll() is None:
            server.kill()
        server.wait()
        server.stdout.close()


def test_survivors_rerun_refuses_to_keep_a_survivor_it_did_not_find_again():
    from bench import mutants

    diff = "--- a/m.py\n+++ b/m.py\n-x = a > 1\n+x = a == 1\n"
    recorded = {(204, ("-x = a > 1", "+x = a == 1")), (213, ("-t = t + u", "+t = t >> u"))}
    # the rerun found line 204 (its diff stored as lines, as cosmic-ray's JSON sometimes holds it)
    rerun = [{"line": 204, "diff": diff.splitlines()}]
    with pytest.raises(RuntimeError, match=r"1 recorded survivor.*line 213: -t = t \+ u"):
        mutants._check_rerun("m.py", recorded, rerun)
    rerun.append({"line": 213, "diff": json.loads(json.dumps("-t = t + u\n+t = t >> u\n"))})
    mutants._check_rerun("m.py", recorded, rerun)  # every survivor found again: no error


def test_the_catalogue_covers_every_core_module_with_existing_tests():
    """Issue 17's core: optim/, schedules/, functional/ whole, and the named modules. A module
    added there without an entry would never be measured; an entry whose test file was renamed
    would make every mutant "killed" by a collection error."""
    sys.path.insert(0, str(ROOT))
    try:
        from bench.mutants import CATALOGUE
    finally:
        sys.path.remove(str(ROOT))
    core = {
        p.relative_to(ROOT).as_posix()
        for package in ("optim", "schedules", "functional")
        for p in (ROOT / "functrain" / package).glob("*.py")
        if p.name != "__init__.py"
    }
    core |= {f"functrain/{m}.py" for m in ("step/make", "step/grads", "step/plan", "step/pieces",
                                           "data/loader", "units", "checkpoint/writer",
                                           "checkpoint/reader", "parallel/compute",
                                           "parallel/plans")}  # fmt: skip
    assert sorted(core - set(CATALOGUE)) == []
    for module, tests in CATALOGUE.items():
        assert (ROOT / module).is_file(), module
        assert tests and all((ROOT / t).is_file() for t in tests), (module, tests)
