"""The bookkeeping of a long matrix run: which scenarios a slice holds, which are done, the
results file they accumulate in, and the report of where the run stands. Nothing here launches.

The full cross product takes many hours, so `python -m bench scenarios --design full` runs it in
pieces that add up:

- **units**: the scenarios of one training configuration run together (they share one
  uninterrupted reference); `units` orders them cheapest layout first;
- **slices**: `--only` keeps the ids that hold every given part, `--shard i/n` keeps every n-th
  unit from the i-th (1-based): the n shards partition the design exactly;
- **the ledger**: one JSON file of rows keyed by scenario id, each with its result, time, the
  `code_hash` and git commit it ran at; `--resume` skips the rows done at today's code hash
  (a row from other code counts as not done: it is never reused across a code change);
- **the report**: one line per scenario (result and time) and the totals: ran, passed, failed,
  remaining, and the hours the remaining ones should take at the measured seconds per scenario.

Example:
    >>> ledger = load("bench/results/scenarios_full.json")
    >>> todo = pending(shard(all_scenarios(), 1, 4), ledger, code_hash())
    >>> totals(all_scenarios(), ledger, code_hash())["remaining"]
    29376
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterable, Mapping, Sequence

from scenario_axes import Scenario

# Cheapest first (seconds per scenario measured by the strength-3 run): a budget-bounded run
# finishes the most scenarios, and a layout's rows complete before the next layout's start.
LAYOUT_ORDER = ("single", "two_nodes", "ddp", "fsdp_offload", "fsdp", "fsdp_raf")
FORMAT = 1
DONE = ("pass", "xfail", "XPASS", "FAIL")
# Wall seconds a scenario takes, per layout, for the estimate before a layout has rows of its own:
# measured with the warm fork server on the 2-core machine (single and two_nodes by the full
# run, ddp and fsdp by one configuration each; the fsdp variants scaled by the strength-3 run's
# ratios to fsdp).
PRIOR_SECONDS = {
    "single": 0.6,
    "two_nodes": 6.6,
    "ddp": 6.9,
    "fsdp_offload": 8.6,
    "fsdp": 9.5,
    "fsdp_raf": 10.5,
}


def matches(scenario: Scenario, parts: Sequence[str]) -> bool:
    """True when the id holds every part: a part without a dot is one whole axis value
    (`fsdp` is not `fsdp_raf`; `mb-on` names microbatching), one with a dot a piece of the id
    (`none.fp32`)."""
    pieces = scenario.id.split(".")
    return all((p in scenario.id) if "." in p else (p in pieces) for p in parts)


def units(scenarios: Iterable[Scenario]) -> list[list[Scenario]]:
    """The scenarios grouped by training configuration, cheapest layout first, each group in
    its given order (groups keep the order their first scenario had within a layout)."""
    groups: dict[str, list[Scenario]] = {}
    for s in scenarios:
        groups.setdefault(s.config_id, []).append(s)
    rank = {layout: i for i, layout in enumerate(LAYOUT_ORDER)}
    ordered = sorted(enumerate(groups.values()), key=lambda g: (rank[g[1][0].layout], g[0]))
    return [group for _, group in ordered]


def parse_shard(text: str) -> tuple[int, int]:
    """`"i/n"` (1 <= i <= n) as `(i, n)`; a clear error otherwise."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: want i/n, e.g. 1/4 for the first of 4") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text!r}: i must be between 1 and n ({count})")
    return index, count


def shard(scenarios: Iterable[Scenario], index: int, count: int) -> list[Scenario]:
    """The `index`-th of `count` shards (1-based): every `count`-th unit from the `index`-th,
    so a configuration's scenarios stay together with their shared reference."""
    chosen = units(scenarios)[index - 1 :: count]
    return [s for group in chosen for s in group]


# -- the ledger ----------------------------------------------------------------------------------


def empty(design: str = "full") -> dict:
    return {"suite": "scenarios", "format": FORMAT, "design": design, "rows": {}, "runs": []}


def load(path: str, design: str = "full") -> dict:
    """The ledger at `path` (an empty one when there is none yet)."""
    if not os.path.exists(path):
        return empty(design)
    with open(path) as f:
        ledger = json.load(f)
    if ledger.get("format") != FORMAT or not isinstance(ledger.get("rows"), dict):
        raise ValueError(f"{path} is not a scenario ledger of format {FORMAT}")
    return ledger


def save(path: str, ledger: Mapping) -> str:
    """Write the ledger atomically (a run killed while saving leaves the previous file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    staging = f"{path}.tmp{os.getpid()}"
    with open(staging, "w") as f:
        json.dump(ledger, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(staging, path)
    return path


def is_done(row: Mapping | None, code: str) -> bool:
    return bool(row) and row.get("code_hash") == code and row.get("result") in DONE


def pending(
    scenarios: Iterable[Scenario], ledger: Mapping, code: str, retry_failed: bool = False
) -> list[Scenario]:
    """The scenarios without a result at `code` (with `retry_failed`, failures count as not
    done either)."""
    rows = ledger["rows"]
    out = []
    for s in scenarios:
        row = rows.get(s.id)
        if not is_done(row, code) or (retry_failed and row["result"] == "FAIL"):
            out.append(s)
    return out


def record(ledger: dict, rows: Iterable[Mapping]) -> None:
    """Add (or replace) result rows, keyed by their `id`."""
    for row in rows:
        for field in ("id", "scenario", "result", "seconds", "code_hash", "git_commit"):
            if field not in row:
                raise ValueError(f"a ledger row needs {field!r}: {dict(row)}")
        ledger["rows"][row["id"]] = dict(row)


# -- the report ----------------------------------------------------------------------------------


def seconds_per_scenario(ledger: Mapping, code: str) -> dict[str, float]:
    """The mean wall seconds a scenario took, per layout, over the rows done at `code` (all rows
    when none is; each row's `seconds` is its share of its unit's wall time)."""
    rows = [r for r in ledger["rows"].values() if r.get("result") in DONE]
    current = [r for r in rows if r.get("code_hash") == code] or rows
    per: dict[str, list[float]] = collections.defaultdict(list)
    for r in current:
        per[r["scenario"]["layout"]].append(float(r["seconds"]))
    return {layout: sum(v) / len(v) for layout, v in per.items()}


def totals(scenarios: Iterable[Scenario], ledger: Mapping, code: str) -> dict:
    """Where the slice stands: counts by result, what is left, and its estimated hours (at each
    layout's measured seconds per scenario, or `PRIOR_SECONDS` before it has rows)."""
    scenarios = list(scenarios)
    rows = ledger["rows"]
    counts = collections.Counter()
    left: dict[str, int] = collections.Counter()
    for s in scenarios:
        row = rows.get(s.id)
        if is_done(row, code):
            counts[row["result"]] += 1
        else:
            left[s.layout] += 1
    speed = seconds_per_scenario(ledger, code)
    rate = {**PRIOR_SECONDS, **speed}  # measured where there are rows, the prior elsewhere
    hours = sum(n * rate[layout] for layout, n in left.items()) / 3600
    ran = sum(counts[k] for k in DONE)
    return {
        "scenarios": len(scenarios),
        "ran": ran,
        "pass": counts["pass"],
        "xfail": counts["xfail"],
        "fail": counts["FAIL"] + counts["XPASS"],
        "remaining": sum(left.values()),
        "remaining_by_layout": {k: left[k] for k in LAYOUT_ORDER if left[k]},
        "seconds_per_scenario": {k: round(v, 2) for k, v in speed.items()},
        "hours_left": round(hours, 2),
    }


def table_rows(scenarios: Iterable[Scenario], ledger: Mapping, code: str) -> list[list]:
    """One row per scenario: id, result (`not run`, or `stale` for a result at other code),
    seconds, and the first problem."""
    out = []
    for s in scenarios:
        row = ledger["rows"].get(s.id)
        if row is None:
            out.append([s.id, "not run", None, ""])
        elif not is_done(row, code):
            out.append([s.id, "stale", row.get("seconds"), f"ran at code {row.get('code_hash')}"])
        else:
            first = (row.get("problems") or [""])[0]
            out.append([s.id, row["result"], row["seconds"], first[:120]])
    return out


def by_layout(scenarios: Iterable[Scenario], ledger: Mapping, code: str) -> list[list]:
    """Per layout: scenarios, ran, pass, fail, remaining (rows done at `code`)."""
    out = []
    scenarios = list(scenarios)
    for layout in LAYOUT_ORDER:
        chosen = [s for s in scenarios if s.layout == layout]
        if chosen:
            t = totals(chosen, ledger, code)
            out.append([layout, t["scenarios"], t["ran"], t["pass"], t["fail"], t["remaining"]])
    return out
