"""`python -m functrain.launch -n N script.py args...`: a thin front over torchrun.

Runs N copies of a script (or `-m module`) with torchrun's rendezvous, restarts and multi-node
flags, prefixes every output line with its rank, and when one rank fails stops all of them and ends
with one line naming the rank and its error. A script written for one process runs unchanged:
`functrain.parallel.init_mesh()` reads the environment torchrun sets.

    python -m functrain.launch -n 4 train.py --lr 3e-4
    python -m functrain.launch -n 2 -m pytest tests/parallel -q
    # two nodes (run on each, with --node-rank 0 and 1):
    python -m functrain.launch -n 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 \\
        --master-port 29500 train.py

Each rank runs inside a small wrapper (this module's `--worker` mode) that records an uncaught
exception for torchrun (so the launcher can report it) and destroys the process group on the way
out (a rank that exits with a live group can abort at shutdown).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"


def build_parser() -> argparse.ArgumentParser:
    """The launcher's command line (flags after the script belong to the script)."""
    parser = argparse.ArgumentParser(
        prog="python -m functrain.launch",
        description="Run a training script on N processes per node (torchrun underneath).",
    )
    parser.add_argument(
        "-n",
        "--nproc-per-node",
        dest="nproc",
        default="1",
        help="processes on this node: a number, or 'gpu'/'cpu'/'auto'",
    )
    parser.add_argument("--nnodes", default="1", help="nodes, or MIN:MAX for elastic runs")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank (static rdzv)")
    parser.add_argument("--master-addr", default=None, help="address of the rank-0 node")
    parser.add_argument("--master-port", type=int, default=None, help="port on the rank-0 node")
    parser.add_argument("--rdzv-backend", default=None, help="rendezvous backend (e.g. c10d)")
    parser.add_argument("--rdzv-endpoint", default=None, help="rendezvous host:port")
    parser.add_argument("--rdzv-id", default=None, help="rendezvous (job) id")
    parser.add_argument("--rdzv-conf", default=None, help="extra rendezvous key=value,...")
    parser.add_argument("--max-restarts", type=int, default=0, help="restarts before failing")
    parser.add_argument("--no-prefix", action="store_true", help="no [rankN] line prefixes")
    parser.add_argument(
        "-m", "--module", action="store_true", help="run TARGET as a module (python -m TARGET)"
    )
    parser.add_argument("target", help="the script (or module with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def torchrun_argv(opts: argparse.Namespace) -> list[str]:
    """torchrun's arguments for the parsed launcher options (the worker wrapper included)."""
    argv = [f"--nproc-per-node={opts.nproc}", f"--nnodes={opts.nnodes}"]
    multi_node = opts.nnodes not in ("1", "1:1")
    explicit = opts.master_addr or opts.master_port or opts.rdzv_backend or opts.rdzv_endpoint
    if not multi_node and not explicit:
        argv.append("--standalone")  # a free port on localhost: concurrent jobs never collide
    if opts.master_addr:
        argv.append(f"--master-addr={opts.master_addr}")
    if opts.master_port is not None:
        argv.append(f"--master-port={opts.master_port}")
    argv.append(f"--node-rank={opts.node_rank}")
    for flag in ("rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf"):
        value = getattr(opts, flag)
        if value is not None:
            argv.append(f"--{flag.replace('_', '-')}={value}")
    argv.append(f"--max-restarts={opts.max_restarts}")
    if not opts.no_prefix:
        argv.append("--tee=3")  # the agent copies each rank's output, line by line, prefixed
    argv += ["--module", "functrain.launch", "--worker"]
    if opts.module:
        argv.append("-m")
    return argv + [opts.target, *opts.args]


# Errors a rank gets because *another* rank died: never the one to report.
_SECONDARY = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker",  # gloo: "... remote worker crashing" / "check the logs of the remote worker"
    "Broken pipe",
    "NCCL communicator was aborted",
    "DistNetworkError",
)


def _message(failure) -> str:
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    return str(message or "").strip()


def root_failure(failures: dict) -> int:
    """The rank that failed first for its own reason (not because a peer vanished).

    Args:
        failures: torchrun's `{rank: ProcessFailure}`.
    Returns:
        the rank to report.
    """

    def secondary(failure) -> bool:
        message = _message(failure)
        if any(s in message for s in _SECONDARY):
            return True
        # Killed by the launcher while tearing down, with no error of its own recorded. (A rank
        # that raised and was then killed keeps its message, so it stays primary.)
        return failure.exitcode in (-15, -9) and (not message or "To enable traceback" in message)

    primary = {r: f for r, f in failures.items() if not secondary(f)}
    pool = primary or failures
    return min(pool, key=lambda r: (pool[r].timestamp, r))


def _failure_text(failure) -> str:
    message = _message(failure)
    if not message or "To enable traceback" in message:
        signal = failure.signal_name() if failure.exitcode < 0 else None
        return f"killed by {signal}" if signal else f"exit code {failure.exitcode}"
    last = [line for line in message.splitlines() if line.strip()]
    return last[-1].strip() if last else message


def main(argv: list[str] | None = None) -> int:
    """Launch (or, with `--worker` first, run one rank); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker(argv[1:])
    opts = build_parser().parse_args(argv)
    if opts.args[:1] == ["--"]:
        opts.args = opts.args[1:]
    if not opts.module and not os.path.exists(opts.target):
        print(
            f"functrain.launch: no such script {opts.target!r} (use -m for a module)",
            file=sys.stderr,
        )
        return 2
    if not opts.no_prefix:
        os.environ.setdefault(_PREFIX_ENV, "[rank${rank}]: ")
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        torchrun.run(torchrun.parse_args(torchrun_argv(opts)))
    except ChildFailedError as error:
        rank = root_failure(error.failures)
        failure = error.failures[rank]
        others = sorted(r for r in error.failures if r != rank)
        print(
            f"functrain.launch: rank {rank} failed ({_failure_text(failure)}); all ranks were "
            f"stopped" + (f" (also failed: ranks {others})" if others else "") + ".",
            file=sys.stderr,
        )
        return failure.exitcode if failure.exitcode > 0 else 1
    return 0


def _worker(argv: list[str]) -> int:
    """One rank: run the script or module as `__main__`, recording an uncaught error."""
    from torch.distributed.elastic.multiprocessing.errors import record

    as_module = argv[:1] == ["-m"]
    if as_module:
        argv = argv[1:]
    if not argv:
        raise SystemExit("functrain.launch --worker needs a script or -m module")
    target, args = argv[0], argv[1:]

    @record
    def run() -> None:
        if as_module:
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")

    try:
        run()
    finally:
        _destroy_process_group()
    return 0


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
