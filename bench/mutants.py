"""Mutation testing: how many small deliberate bugs in a core module its tests catch.

`python -m bench mutants` runs cosmic-ray (the `mutation` extra: `pip install -e ".[mutation]"`)
on a copy of this checkout, never on the working tree: for each mutant (an operator swapped, a
comparison flipped, a number changed, a `not` added, ...) it runs the tests that cover the module
and records whether they failed (killed) or passed (survived). It prints the kill rate per module
and every surviving mutant as a diff, and writes the whole as JSON under bench/results/.

A module has hundreds of mutants and each costs one pytest run (seconds: torch's import), so by
default one mutant is kept per source position and operator family (e.g. of the eleven ways to
replace a `+`, one, chosen by the seed), and at most `--max` of those, sampled with the seed.
`--max 0` keeps them all. Not part of `.ci/run` (minutes per module on 2 cores).

Example:
    python -m bench mutants --module functrain/units.py --max 40
    python -m bench mutants --module functrain/schedules/base.py --tests tests/schedules
    python -m bench mutants --catalogue        # every core module below (long)
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS_DIR, write_json

ROOT = Path(__file__).resolve().parent.parent

# core module -> the narrowest tests that cover it (what `--catalogue` runs; issue 17's list).
# Each mutant costs one run of its module's tests, so these are the module's own test file(s),
# not the package's (`--baseline` times one run of each).
CATALOGUE = {
    "functrain/units.py": ["tests/test_units.py"],
    "functrain/schedules/base.py": ["tests/schedules/test_schedules_base.py",
                                    "tests/schedules/test_schedules_scaling.py"],
    "functrain/schedules/decay.py": ["tests/schedules/test_schedules_decay.py"],
    "functrain/schedules/warmup.py": ["tests/schedules/test_schedules_warmup.py"],
    "functrain/schedules/scaling.py": ["tests/schedules/test_schedules_scaling.py"],
    "functrain/schedules/one_cycle.py": ["tests/schedules/test_schedules_one_cycle.py"],
    # the DTensor global norm: 2 spawned ranks, ~2 min here, run last (fastest first)
    "functrain/optim/base.py": ["tests/optim/test_optim_base.py",
                                "tests/optim/test_optim_laws.py",
                                "tests/optim/test_optim_distributed.py"],
    "functrain/optim/clipping.py": ["tests/optim/test_optim_clipping.py"],
    "functrain/optim/adam.py": ["tests/optim/test_optim_adam.py"],
    "functrain/optim/sgd.py": ["tests/optim/test_optim_sgd.py"],
    "functrain/optim/lion.py": ["tests/optim/test_optim_lion.py"],
    "functrain/optim/scale.py": ["tests/optim/test_optim_scale.py"],
    "functrain/optim/masking.py": ["tests/optim/test_optim_masking.py"],
    "functrain/optim/hyperparams.py": ["tests/optim/test_optim_hyperparams.py"],
    "functrain/optim/accumulation.py": ["tests/optim/test_optim_accumulation.py"],
    # the fused single-kernel path (its plan, cache, recipes) and the pure step's buffer pool
    "functrain/optim/fused.py": ["tests/optim/test_optim_fused.py"],
    "functrain/optim/fused_cache.py": ["tests/optim/test_optim_fused.py"],
    "functrain/optim/fused_groups.py": ["tests/optim/test_optim_fused.py"],
    "functrain/optim/keeping.py": ["tests/optim/test_optim_skip_on_device.py"],
    "functrain/optim/recipe.py": ["tests/optim/test_optim_fused.py"],
    "functrain/optim/executor.py": ["tests/optim/test_optim_fused.py", "tests/test_step.py"],
    "functrain/optim/kernels.py": ["tests/optim/test_optim_fused.py"],
    "functrain/optim/buffers.py": ["tests/optim/test_optim_pure_step.py"],
    "functrain/optim/_foreach.py": ["tests/optim/test_optim_sgd.py",
                                   "tests/optim/test_optim_adam.py",
                                   "tests/optim/test_optim_accumulation.py",
                                   "tests/optim/test_optim_masking.py",
                                   "tests/optim/test_optim_distributed.py"],
    "functrain/optim/spec.py": ["tests/optim/test_optim_fused.py"],
    "functrain/functional/mixup.py": ["tests/functional/test_fn_mixup.py"],
    "functrain/functional/label_smoothing.py": ["tests/functional/test_fn_label_smoothing.py"],
    "functrain/functional/cutmix.py": ["tests/functional/test_fn_cutmix.py"],
    # the rest of functional/ (issue 17: every module of the package)
    "functrain/functional/alibi.py": ["tests/functional/test_fn_alibi.py"],
    "functrain/functional/alibi_hf.py": ["tests/functional/test_fn_alibi_hf.py"],
    "functrain/functional/augmentation_chains.py": ["tests/functional/test_fn_augmentation_chains.py"],
    "functrain/functional/augmentation_primitives.py": ["tests/functional/test_fn_augmentation_primitives.py", "tests/functional/test_fn_augmentation_pairs.py"],
    "functrain/functional/augmix.py": ["tests/functional/test_fn_augmix.py"],
    "functrain/functional/batch.py": ["tests/functional/test_fn_batch.py"],
    "functrain/functional/blurpool.py": ["tests/functional/test_fn_blurpool.py"],
    "functrain/functional/channels_last.py": ["tests/functional/test_fn_channels_last.py"],
    "functrain/functional/colout.py": ["tests/functional/test_fn_colout.py"],
    "functrain/functional/cutout.py": ["tests/functional/test_fn_cutout.py"],
    "functrain/functional/ema.py": ["tests/functional/test_fn_ema.py"],
    "functrain/functional/factorize.py": ["tests/functional/test_fn_factorize.py"],
    "functrain/functional/factorize_solvers.py": ["tests/functional/test_fn_factorize_solvers.py"],
    "functrain/functional/fused_layernorm.py": ["tests/functional/test_fn_fused_layernorm.py"],
    "functrain/functional/gated_linear_units.py": ["tests/functional/test_fn_gated_linear_units.py"],
    "functrain/functional/gated_linear_units_hf.py": ["tests/functional/test_fn_gated_linear_units_hf.py"],
    "functrain/functional/ghost_batchnorm.py": ["tests/functional/test_fn_ghost_batchnorm.py"],
    "functrain/functional/gradient_clipping.py": ["tests/functional/test_fn_gradient_clipping.py"],
    "functrain/functional/gyro_dropout.py": ["tests/functional/test_fn_gyro_dropout.py"],
    "functrain/functional/layer_freezing.py": ["tests/functional/test_fn_layer_freezing.py"],
    "functrain/functional/low_precision_norm.py": ["tests/functional/test_fn_low_precision_norm.py"],
    "functrain/functional/module_surgery.py": ["tests/functional/test_fn_module_surgery.py"],
    "functrain/functional/progressive_resizing.py": ["tests/functional/test_fn_progressive_resizing.py"],
    "functrain/functional/randaugment.py": ["tests/functional/test_fn_randaugment.py"],
    "functrain/functional/sam.py": ["tests/functional/test_fn_sam.py"],
    "functrain/functional/sampling.py": ["tests/functional/test_fn_sampling.py"],
    "functrain/functional/selective_backprop.py": ["tests/functional/test_fn_selective_backprop.py"],
    "functrain/functional/seq_length_warmup.py": ["tests/functional/test_fn_seq_length_warmup.py"],
    "functrain/functional/squeeze_excite.py": ["tests/functional/test_fn_squeeze_excite.py"],
    "functrain/functional/stochastic_depth.py": ["tests/functional/test_fn_stochastic_depth.py"],
    "functrain/functional/surgery.py": ["tests/functional/test_fn_surgery.py"],
    "functrain/functional/swa.py": ["tests/functional/test_fn_swa.py"],
    "functrain/functional/targets.py": ["tests/functional/test_fn_targets.py"],
    "functrain/functional/weight_standardization.py": ["tests/functional/test_fn_weight_standardization.py"],
    "functrain/functional/weights.py": ["tests/functional/test_fn_weights.py"],
    "functrain/data/batches.py": ["tests/test_batching.py", "tests/functional/test_fn_batch.py"],
    "functrain/data/order.py": ["tests/test_data.py"],
    "functrain/data/loader.py": ["tests/test_data.py"],
    "functrain/data/source.py": ["tests/test_data.py"],
    "functrain/step/pieces.py": ["tests/test_step.py"],
    # the fused kernel inside the step: only the optim file counts the kernels that run
    "functrain/step/make.py": ["tests/test_step.py", "tests/optim/test_optim_fused.py"],
    "functrain/step/grads.py": ["tests/test_step.py"],
    "functrain/step/plan.py": ["tests/test_step_plan.py", "tests/test_step.py"],
    "functrain/checkpoint/writer.py": ["tests/checkpoint/test_checkpoint_writer.py",
                                       "tests/checkpoint/test_checkpoint_commit_phases.py",
                                       "tests/parallel/test_parallel_two_ranks.py"],
    # orbax-written checkpoints (0-d scalar arrays, OCDBT): the layout tests, ~3 s
    "functrain/checkpoint/reader.py": ["tests/checkpoint/test_checkpoint_reader.py",
                                       "tests/checkpoint/test_checkpoint_layout.py"],
    # one spawned pair of ranks (~6 s) for what only several ranks show (broadcast, metric mean)
    "functrain/parallel/compute.py": ["tests/parallel/test_parallel_compute.py",
                                      "tests/parallel/test_parallel_two_ranks.py"],
    "functrain/parallel/plans.py": ["tests/parallel/test_parallel_plans.py",
                                    "tests/parallel/test_parallel_two_ranks.py"],
}  # fmt: skip


def _copy_checkout(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of this checkout, copied to `dest`."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _config(module: str, command: list[str], timeout: float) -> str:
    return (
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {float(timeout)}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(shlex.join(command))}\n\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )


def _family(operator: str) -> str:
    """`core/ReplaceBinaryOperator_Add_Sub` -> `core/ReplaceBinaryOperator_Add` (the site's op)."""
    parts = operator.split("_")
    return "_".join(parts[:2]) if len(parts) > 2 else operator


def _annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) (row, col) of every type annotation: under `from __future__ import
    annotations` (every core module) they are never evaluated, so a mutant there is equivalent."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        notes = []
        if isinstance(node, ast.arg | ast.AnnAssign):
            notes.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            notes.append(node.returns)
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in notes if n]
    return spans


def _change(diff: str | None) -> tuple[str, ...]:
    """The removed and added lines of a mutant's diff: what identifies it across sessions."""
    text = diff if isinstance(diff, str) or diff is None else "\n".join(diff)  # str or lines
    return tuple(ln.rstrip() for ln in (text or "").splitlines()
                 if ln[:1] in "+-" and ln[:3] not in ("+++", "---"))  # fmt: skip


def _thin(
    db: Path, module: Path, max_mutants: int, seed: int, only: set | None = None
) -> tuple[int, int]:
    """Drop the mutants inside annotations; keep one per (position, operator family), then at most
    `max_mutants` (the same ones for the same module source and seed). With `only` (the (line,
    `_change`) of earlier survivors), keep exactly the mutants that make those changes. Returns
    (kept, dropped as annotations)."""
    rng = random.Random(seed)
    source = module.read_text()
    spans = _annotation_spans(source) if "from __future__ import annotations" in source else []
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT job_id, operator_name, start_pos_row, start_pos_col, occurrence, "
            "operator_args FROM mutation_specs"
        ).fetchall()
        # job ids are random per `init`: order by what the mutant is, so the draw repeats
        rows.sort(key=lambda r: (r[2], r[3], r[1], r[4], r[5] or ""))
        groups: dict[tuple, list[str]] = {}
        annotations = 0
        for job, operator, row, col, *_ in rows:
            if any(lo <= (row, col) < hi for lo, hi in spans):
                annotations += 1
                continue
            groups.setdefault((row, col, _family(operator)), []).append(job)
        keep = [rng.choice(jobs) for _, jobs in sorted(groups.items())]
        if max_mutants and len(keep) > max_mutants:
            keep = sorted(rng.sample(keep, max_mutants), key=keep.index)
        if only is not None:
            keep = _matching(rows, source, module, only)
        drop = {job for job, *_ in rows} - set(keep)
        for table in ("mutation_specs", "work_items"):
            conn.executemany(f"DELETE FROM {table} WHERE job_id = ?", [(j,) for j in drop])
    return len(keep), annotations


def _patch_cosmic_ray() -> None:
    """cosmic-ray 8.7's ExceptionReplacer fails on an `except` whose exception is an expression
    (`except _LOOKUP_ERRORS + (RuntimeError,):` in step_plan.py): `init` stops with an
    AttributeError. Such a clause names no exception to replace, so it gets no mutant."""
    from cosmic_ray.operators import exception_replacer

    cls = exception_replacer.ExceptionReplacer
    names = cls._name_nodes
    if getattr(names, "patched", False):
        return

    def _name_nodes(node):
        try:
            return names(node)
        except AttributeError:
            return ()

    _name_nodes.patched = True  # type: ignore[attr-defined]
    cls._name_nodes = staticmethod(_name_nodes)


# cosmic-ray's command line (`init`, `exec`), with the patch above.
_COSMIC_RAY = (
    "import sys; from bench.mutants import _patch_cosmic_ray as p; p(); "
    "from cosmic_ray.cli import main; sys.exit(main())"
)


def _matching(rows: list, source: str, module: Path, only: set) -> list[str]:
    """The jobs among `rows` whose (line, change) is in `only`."""
    import cosmic_ray.plugins

    _patch_cosmic_ray()
    from cosmic_ray.mutating import _make_diff, mutate_code

    keep = []
    for job, operator, row, _col, occurrence, args in rows:
        if not any(row == line for line, _ in only):
            continue
        while isinstance(args, str):  # the JSON column may hold encoded JSON text
            args = json.loads(args)
        op = cosmic_ray.plugins.get_operator(operator)(**(args or {}))
        mutated = mutate_code(source, op, occurrence)
        if mutated is not None and (row, _change(_make_diff(source, mutated, module))) in only:
            keep.append(job)
    return keep


def _results(db: Path) -> list[dict]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT s.operator_name, s.start_pos_row, s.definition_name, r.worker_outcome, "
            "r.test_outcome, r.diff, r.output FROM mutation_specs s JOIN work_results r USING (job_id) "
            "ORDER BY s.start_pos_row, s.operator_name"
        ).fetchall()
    keys = ("operator", "line", "function", "worker_outcome", "test_outcome", "diff", "output")
    out = [dict(zip(keys, row)) for row in rows]
    for r in out:  # cosmic-ray stores the enums' names ("KILLED", "NORMAL")
        r["test_outcome"] = (r["test_outcome"] or "").lower()
        r["worker_outcome"] = (r["worker_outcome"] or "").lower()
    return out


# What the fork server imports once (bench/mutant_server.py): everything `functrain` and pytest
# import that is not functrain or the tests themselves.
_LIST_MODULES = """
import sys, pytest, hypothesis, functrain
print("\\n".join(m for m in sys.modules if not m.split(".")[0] in ("functrain", "tests", "bench")))
"""


def _outcome(r: dict) -> str:
    """killed, timeout (killed by cosmic-ray's timeout), survived, equivalent or incompetent."""
    if r["test_outcome"] == "killed" and r.get("timed_out"):
        return "timeout"
    if r["test_outcome"] == "survived" and _equivalent(r):
        return "equivalent"
    return r["test_outcome"]


def _equivalent(r: dict) -> str | None:
    """The reason a surviving mutant is equivalent (EQUIVALENT in bench/mutants_equivalent.py)."""
    from bench.mutants_equivalent import EQUIVALENT

    return EQUIVALENT.get((r["module"], r["line"], r["operator"]))


class Session:
    """A scratch copy of this checkout and a fork server running tests in it (a context manager).

    Every module of one `python -m bench mutants` call is mutated in the same copy (cosmic-ray
    restores each file after its mutant), so the copy, its bytecode and the server's imports are
    paid once.
    """

    def __enter__(self) -> Session:
        self._scratch = tempfile.TemporaryDirectory(prefix="functrain-mutants-")
        self.dir = Path(self._scratch.name)
        self.tree = self.dir / "tree"
        _copy_checkout(self.tree)
        # bytecode for the unmutated tree, so each run compiles only the mutated module
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(self.tree / "functrain"),
                        str(self.tree / "tests")], check=True, capture_output=True)  # fmt: skip
        # the scratch copy first, so the mutated module is the one imported
        paths = [str(self.tree), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths),
                        FUNCTRAIN_HYPOTHESIS_PROFILE="mutants")  # fmt: skip
        modules = self.dir / "modules.txt"
        listed = subprocess.run([sys.executable, "-c", _LIST_MODULES], cwd=self.tree, env=self.env,
                                check=True, capture_output=True, text=True)  # fmt: skip
        modules.write_text(listed.stdout)
        self.sock, self.log = self.dir / "server.sock", self.dir / "pytest.log"
        self.server_py = str(self.tree / "bench" / "mutant_server.py")
        self.server = subprocess.Popen(
            [sys.executable, self.server_py, "serve", str(self.sock), str(self.tree), str(modules)],
            cwd=self.tree, env=self.env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        if self.server.stdout.readline().strip() != "ready":
            self.__exit__()
            raise RuntimeError("the mutant fork server did not start")
        return self

    def __exit__(self, *exc) -> None:
        if self.server.poll() is None:
            subprocess.run([sys.executable, self.server_py, "stop", str(self.sock)],
                           capture_output=True)  # fmt: skip
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
        self._scratch.cleanup()

    def command(self, tests: list[str], durations: Path) -> list[str]:
        """The test command of one run: the fork server's client, with pytest's arguments.
        `durations`: the tests' seconds, written by the first (unmutated) run; later runs take
        the fastest first (tests/conftest.py)."""
        # -W: the server imported hypothesis (a pytest plugin) before pytest could rewrite it
        pytest_args = ["-x", "-q", "-p", "no:cacheprovider", f"--mutant-durations={durations}",
                       "-W", "ignore::pytest.PytestAssertRewriteWarning", *tests]  # fmt: skip
        return [sys.executable, self.server_py, "run", str(self.sock), str(self.log), "--",
                *pytest_args]  # fmt: skip


def _not_killed(r: dict) -> str | None:
    """Why a (non-equivalent) survivor is not killed yet (NOT_KILLED in mutants_equivalent)."""
    from bench.mutants_equivalent import NOT_KILLED

    return NOT_KILLED.get((r["module"], r["line"], r["operator"]))


def mutate(
    session: Session,
    module: str,
    tests: list[str],
    *,
    max_mutants: int,
    seed: int,
    timeout: float | None,
    previous: dict | None = None,
) -> dict:
    """Run the mutants of `module` against `tests` in the session's copy; the summary.

    `timeout`: seconds per mutant's test run; None: 4x the unmutated run plus 10 s. A mutant that
    runs past it (an endless loop) counts as killed, by timeout. `previous`: the module's summary
    from an earlier run with the same seed; only its survivors run again (after tests were added),
    and their new outcomes replace the old ones.
    """
    start = time.perf_counter()
    name = module.replace("/", "_")
    config, db = session.dir / f"{name}.toml", session.dir / f"{name}.sqlite"
    command = session.command(tests, session.dir / f"{name}.durations.json")
    # the unmutated tests must pass, or every mutant would look killed
    t0 = time.perf_counter()
    baseline = subprocess.run(
        command, cwd=session.tree, env=session.env, capture_output=True, text=True
    )
    baseline_s = time.perf_counter() - t0
    if baseline.returncode != 0:
        raise RuntimeError(f"{tests} fail before any mutation:\n{baseline.stdout[-3000:]}")
    if timeout is None:
        timeout = 4 * baseline_s + 10
    if max_mutants < 0:  # --baseline: only the cost of one run
        return {"module": module, "tests": tests, "baseline_seconds": round(baseline_s, 1)}
    only = None
    if previous is not None:
        only = {(r["line"], _change(r["diff"])) for r in previous["results"]
                if _outcome(r) == "survived"}  # fmt: skip
    config.write_text(_config(module, command, timeout))
    for step in ("init", "exec"):
        if step == "exec" and only == set():
            break  # nothing survived: only re-judge the equivalents
        subprocess.run([sys.executable, "-c", _COSMIC_RAY, step, str(config), str(db)],
                       cwd=session.tree, env=session.env, check=True,
                       capture_output=True)  # fmt: skip
        if step == "init":
            total, annotations = _thin(db, session.tree / module, max_mutants, seed, only)
    results = _results(db) if only != set() else []
    for r in results:
        r["timed_out"] = (r.pop("output") or "").strip() == "timeout"
        r["tests"] = tests  # what judged it (a rerun's selection may differ from the first's)
    seconds = round(time.perf_counter() - start, 1)
    if previous is not None:
        _check_rerun(module, only, results)
        for r in results:
            r["rerun"] = "after tests were added"
        redone = {(r["line"], _change(r["diff"])) for r in results}
        kept = [r for r in previous["results"] if (r["line"], _change(r["diff"])) not in redone]
        results = sorted(kept + results, key=lambda r: (r["line"], r["operator"]))
        total, annotations = previous["mutants"], previous["annotation_mutants_skipped"]
        seconds = round(previous["seconds"] + seconds, 1)
        baseline_s = previous["baseline_seconds"]
        timeout = previous["timeout_seconds"]
    return summarize(module, tests, results, {
        "max": max_mutants, "seed": seed, "mutants": total,
        "annotation_mutants_skipped": annotations, "baseline_seconds": round(baseline_s, 1),
        "timeout_seconds": round(timeout, 1), "seconds": seconds,
    })  # fmt: skip


def _check_rerun(module: str, only: set, results: list[dict]) -> None:
    """Raise unless every recorded survivor in `only` was found again and run.

    A survivor not found again would keep its old verdict, reported under the new test
    selection: how `optim/base.py:204` and `:213` were once listed as surviving a 2-rank test
    they had never run against (their first run's selection had no such test, and the
    `--survivors` rerun silently matched nothing).
    """
    lost = only - {(r["line"], _change(r["diff"])) for r in results}
    if lost:
        listed = "; ".join(f"line {line}: {' / '.join(change)}" for line, change in sorted(lost))
        raise RuntimeError(
            f"--survivors: {len(lost)} recorded survivor(s) of {module} were not found again "
            f"in its source ({listed}); the module changed since they were recorded: measure "
            "it anew, without --survivors"
        )


def summarize(module: str, tests: list[str], results: list[dict], meta: dict) -> dict:
    """Counts and kill rate of one module's results, each judged (equivalent or not) anew."""
    for r in results:
        r["module"] = module
        r["outcome"] = _outcome(r)
        r.pop("why", None)
        if r["outcome"] == "equivalent":
            r["why"] = _equivalent(r)
    count = {k: sum(r["outcome"] == k for r in results)
             for k in ("killed", "timeout", "survived", "equivalent", "incompetent")}  # fmt: skip
    killed = count["killed"] + count["timeout"]
    ran = killed + count["survived"]
    return {
        "module": module,
        "tests": tests,
        **meta,
        "killed": killed,
        "killed_by_timeout": count["timeout"],
        "survived": count["survived"],
        "equivalent": count["equivalent"],
        "incompetent": count["incompetent"],  # the mutant could not even run
        "kill_rate": killed / ran if ran else None,  # of the non-equivalent mutants
        # of those killed, how many only by tests added after a first run (`--survivors`)
        "killed_after_tests_added": sum(
            bool(r.get("rerun")) and r["outcome"] in ("killed", "timeout") for r in results
        ),
        "survivors": [r for r in results if r["outcome"] in ("survived", "equivalent")],
        "results": results,
    }


def _rate(s: dict) -> str:
    return "-" if s["kill_rate"] is None else f"{100 * s['kill_rate']:.1f}%"


def _print(summaries: list[dict]) -> None:
    head = ("module", "mutants", "killed", "timeout", "survived", "equiv.", "rate", "seconds")
    print(f"{head[0]:36s}" + "".join(f"{h:>9s}" for h in head[1:]))
    for s in summaries:
        cells = (s["mutants"], s["killed"], s["killed_by_timeout"], s["survived"],
                 s["equivalent"], _rate(s), round(s["seconds"], 1))  # fmt: skip
        print(f"{s['module']:36s}" + "".join(f"{c!s:>9s}" for c in cells))
    for s in summaries:
        for r in s["survivors"]:
            print(f"\n--- {r['outcome']}: {s['module']}:{r['line']} in {r['function']} "
                  f"({r['operator']}){' -- ' + r['why'] if r.get('why') else ''}")  # fmt: skip
            print("\n".join(line for line in (r["diff"] or "").splitlines() if line[:1] in "+-"))


def markdown(summaries: list[dict]) -> str:
    """The per-module table and every surviving (or equivalent) mutant, as markdown."""
    lines = [
        "| module | mutants | killed (by timeout; by tests added) | survived | equivalent | "
        "kill rate of non-equivalent | seconds | tests |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in summaries:
        lines.append(
            f"| `{s['module']}` | {s['mutants']} | {s['killed']} ({s['killed_by_timeout']}; "
            f"{s.get('killed_after_tests_added', 0)}) | "
            f"{s['survived']} | {s['equivalent']} | {_rate(s)} | {s['seconds']:.0f} | "
            f"{', '.join(f'`{t}`' for t in s['tests'])} |"
        )
    for s in summaries:
        for r in s["survivors"]:
            change = [ln for ln in (r["diff"] or "").splitlines()
                      if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]  # fmt: skip
            note = r.get("why") or _not_killed(r)
            lines += ["", f"- `{s['module']}:{r['line']}` in `{r['function']}` "
                      f"({r['operator']}): **{r['outcome']}**" + (f" -- {note}" if note else ""),
                      "  ```diff", *("  " + ln for ln in change), "  ```"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _merge(path: str, summaries: list[dict]) -> list[dict]:
    """The modules already in `path`, with those measured now replacing theirs (catalogue order)."""
    try:
        with open(path) as f:
            old = {s["module"]: s for s in json.load(f).get("modules", []) if "max" in s}
    except (OSError, ValueError):
        old = {}
    old.update({s["module"]: s for s in summaries})
    order = {m: i for i, m in enumerate(CATALOGUE)}
    return sorted(old.values(), key=lambda s: (order.get(s["module"], len(order)), s["module"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench mutants", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--module", action="append", help="a module path (repeatable)")
    parser.add_argument("--tests", nargs="+", help="the tests to run (default: the catalogue's)")
    parser.add_argument("--catalogue", action="store_true", help="every module of the catalogue")
    parser.add_argument("--max", type=int, default=25, help="mutants per module (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per mutant's test run (default: 4x the unmutated run + 10)")  # fmt: skip
    parser.add_argument("--survivors", action="store_true",
                        help="rerun only the survivors recorded in the results (same seed), "
                        "e.g. after adding tests; equivalents are judged anew")  # fmt: skip
    parser.add_argument("--baseline", action="store_true",
                        help="only time one unmutated run of each module's tests")  # fmt: skip
    parser.add_argument("--markdown", help="also write the merged table as markdown here")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: judge the recorded results anew, write --markdown")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        import cosmic_ray  # noqa: F401
    except ImportError:
        print('bench mutants needs cosmic-ray: pip install -e ".[mutation]"', file=sys.stderr)
        return 2
    modules = list(CATALOGUE) if args.catalogue else (args.module or ["functrain/units.py"])
    for module in modules:
        if not (args.tests or CATALOGUE.get(module)):
            parser.error(f"no tests known for {module}: pass --tests")
    path = os.path.join(RESULTS_DIR, "mutants.json")
    if args.report:
        meta_keys = ("max", "seed", "mutants", "annotation_mutants_skipped", "baseline_seconds",
                     "timeout_seconds", "seconds")  # fmt: skip
        merged = [summarize(s["module"], s["tests"], s["results"], {k: s[k] for k in meta_keys})
                  for s in _merge(path, [])]  # fmt: skip
        write_json(path, {"modules": merged})
        _print(merged)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown(merged))
        return 0
    if args.baseline:
        with Session() as session:
            for module in modules:
                tests = args.tests or CATALOGUE[module]
                s = mutate(session, module, tests, max_mutants=-1, seed=0, timeout=None)
                print(f"{module:40s} {s['baseline_seconds']:6.1f} s  {' '.join(tests)}", flush=True)
        return 0
    summaries = []
    recorded = {s["module"]: s for s in _merge(path, [])}
    with Session() as session:
        for module in modules:
            tests = args.tests or CATALOGUE[module]
            previous = recorded.get(module) if args.survivors else None
            if args.survivors and previous is None:
                parser.error(f"--survivors: no results recorded for {module}")
            summaries.append(mutate(session, module, tests, max_mutants=previous["max"] if previous
                                    else args.max, seed=previous["seed"] if previous else args.seed,
                                    timeout=args.timeout, previous=previous))  # fmt: skip
            # after every module, so an interrupted catalogue keeps what it measured
            write_json(path, {"modules": _merge(path, summaries)})
            _print(summaries[-1:])
    print()
    _print(summaries)
    merged = _merge(path, [])
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(merged))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
