"""`python -m functrain.launch -n N script.py args...`: a thin front over torchrun.

Runs N copies of a script (or `-m module`) with torchrun's rendezvous, restarts and multi-node
flags, prefixes every output line with its rank, and when one rank fails stops all of them and ends
with one line naming the rank that failed first and its error (a rank stopped because of it is
never the one named). A script written for one process runs unchanged:
`functrain.parallel.init_mesh()` reads the environment torchrun sets.

    python -m functrain.launch -n 4 train.py --lr 3e-4
    python -m functrain.launch -n 2 -m pytest tests/parallel -q
    # two nodes (run on each, with --node-rank 0 and 1):
    python -m functrain.launch -n 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 \\
        --master-port 29500 train.py

Stopping (docs/events.md): SIGTERM to the launcher, or a first Ctrl-C, sends SIGTERM to every
rank, which `fit` understands as "finish the step, checkpoint, return"; the launcher waits up to
`--stop-timeout` seconds, then ends with one line such as `functrain.launch: stopped by SIGTERM;
all 2 ranks checkpointed at step 7 and exited.` A second Ctrl-C kills every rank at once.

Threads: each rank gets `OMP_NUM_THREADS=1` unless the variable is set (then it is kept), so N
ranks never start N times torch's default of one thread per core.

SIGHUP and SIGQUIT (a closed terminal, a dropped ssh session) stop the run as SIGTERM does. If the
launcher itself is killed (SIGKILL), the kernel kills every rank with it.

Exit codes: the table in docs/events.md (0 finished; a failed rank's own code, never 143 for a
crash; 143/130/129/131 after SIGTERM/Ctrl-C/SIGHUP/SIGQUIT unless the ranks' own code, 75, is
kept; 124 after a hang: no rank progress for `--hang-timeout`, functrain.launch.watchdog).

Each rank runs inside a small wrapper (this module's `--worker` mode) that records an uncaught
exception for torchrun, and its exit code and stop signals for the launcher (`status.py`).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import runpy
import shutil
import signal
import sys
import tempfile
import threading
import time

from . import status, watchdog

_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
_LAUNCHER_ENV = "FUNCTRAIN_LAUNCHER_PID"  # the ranks die with this process
# Signals that stop a launch as SIGTERM does: a closed terminal or a dropped ssh session (SIGHUP),
# Ctrl-\ (SIGQUIT). torchrun forwards them to the ranks, whose wrapper turns them into SIGTERM.
_HANGUPS = (signal.SIGHUP, signal.SIGQUIT)


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
    parser.add_argument(
        "--stop-timeout",
        type=int,
        default=120,
        help="seconds the ranks get to checkpoint and exit after SIGTERM or Ctrl-C (then killed)",
    )
    parser.add_argument(
        "--hang-timeout",
        type=watchdog.parse_timeout,
        default="600s",
        help="a rank that makes no progress this long is a hang: stacks, one line, stop (0: off)",
    )
    parser.add_argument(
        "--hang-dir", default=None, help="where hang stacks go (default: run_dir or ./)"
    )
    parser.add_argument("--no-prefix", action="store_true", help="no [rankN] line prefixes")
    parser.add_argument(
        "-m", "--module", action="store_true", help="run TARGET as a module (python -m TARGET)"
    )
    parser.add_argument("target", help="the script (or module with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def _torchrun_accepts(flag: str) -> bool:
    """Whether this torch's torchrun has the command-line flag `flag`."""
    from torch.distributed.run import get_args_parser

    return flag in get_args_parser().format_help()


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
    # SIGTERM and SIGINT are the launcher's own (see _Stop); torchrun forwards the others. Older
    # torchruns (torch 2.6) know neither flag and forward only SIGTERM/SIGINT themselves.
    if _torchrun_accepts("--signals-to-handle"):
        argv.append("--signals-to-handle=SIGHUP,SIGQUIT")
    if _torchrun_accepts("--shutdown-timeout"):
        argv.append(f"--shutdown-timeout={opts.stop_timeout}")
    if not opts.no_prefix:
        argv.append("--tee=3")  # the agent copies each rank's output, line by line, prefixed
    argv += ["--module", "functrain.launch", "--worker"]
    if opts.module:
        argv.append("-m")
    return argv + [opts.target, *opts.args]


class _Stop:
    """The launcher's SIGTERM and SIGINT: the first asks every rank to stop gracefully, a second
    Ctrl-C kills them at once.

    A graceful stop raises torchrun's `SignalException(SIGTERM)` in the agent, which sends SIGTERM
    to every rank (`fit` then checkpoints at the step boundary and returns) and waits for them up
    to `--stop-timeout` seconds. The ranks live in their own sessions, so a terminal's Ctrl-C
    reaches the launcher only and each rank is asked exactly once.
    """

    def __init__(self):
        self.reason: str | None = None
        self.since: float | None = None
        self.aborted = False
        self._old: dict = {}

    def install(self) -> None:
        # torchrun replaces the SIGHUP/SIGQUIT handlers once the ranks start (`forwarded` then
        # hears of them); before that, during the rendezvous, they are this class's.
        for sig in (signal.SIGTERM, signal.SIGINT, *_HANGUPS):
            self._old[sig] = signal.signal(sig, self._handle)

    def forwarded(self, sigval: int) -> None:
        """torchrun stopped the ranks for signal `sigval` (SIGHUP or SIGQUIT): a stop too."""
        if self.reason is None and sigval in _HANGUPS:
            self.reason = signal.Signals(sigval).name

    @property
    def code(self) -> int:
        """The exit code of a stop with no code of the ranks' own: 128 + the signal number."""
        if self.reason is None:
            return 0
        if "SIGINT" in self.reason:
            return 128 + signal.SIGINT
        for sig in _HANGUPS:
            if self.reason.startswith(sig.name):
                return 128 + sig
        return 128 + signal.SIGTERM

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handle(self, signum: int, frame) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        if self.reason is None:
            names = {signal.SIGINT: "Ctrl-C (SIGINT)"}
            self.reason = names.get(signum, signal.Signals(signum).name)
            self.since = time.time()
            status.print_line(
                f"functrain.launch: {self.reason}: asking every rank to checkpoint at its next "
                "step boundary and exit"
                + (" (Ctrl-C again to abort at once)" if signum == signal.SIGINT else "")
            )
            raise SignalException(f"stopped by {self.reason}", sigval=signal.SIGTERM)
        if signum == signal.SIGINT and not self.aborted:
            self.aborted = True
            status.print_line("functrain.launch: second Ctrl-C: killing every rank now")
            _kill_children()
        # A repeated SIGTERM changes nothing: the ranks are already stopping.


def _kill_children() -> None:
    """SIGKILL each child process of the launcher (a rank) and its process group (Linux)."""
    pids = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
    except OSError:
        status.print_line("functrain.launch: cannot list the ranks here; they stop at the timeout")
        return
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)  # a rank leads its own session (torchrun's Popen)
        except OSError:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    """Launch (or, with `--worker` first, run one rank); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker(argv[1:])
    opts = build_parser().parse_args(argv)
    if opts.args[:1] == ["--"]:
        opts.args = opts.args[1:]
    if not opts.module and not os.path.exists(opts.target):
        status.print_line(f"functrain.launch: no such script {opts.target!r} (use -m for a module)")
        return 2
    if not opts.no_prefix:
        os.environ.setdefault(_PREFIX_ENV, "[rank${rank}]: ")
    # One intra-op thread per rank unless the user chose: N ranks with torch's default (every
    # core each) oversubscribe the machine. torchrun does this only for more than one rank, with
    # a banner; here it is the same for any N, and the ranks inherit it.
    own_threads = "OMP_NUM_THREADS" not in os.environ
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    folder = tempfile.mkdtemp(prefix="functrain-launch-")
    os.environ[status.STATUS_ENV] = folder
    os.environ[_LAUNCHER_ENV] = str(os.getpid())
    stop = _Stop()
    stop.install()
    failures = None
    watch = watchdog.Watchdog(folder, opts.hang_timeout, opts.hang_dir).start()
    try:
        torchrun.run(torchrun.parse_args(torchrun_argv(opts)))
    except ChildFailedError as error:
        failures = error.failures
    except SignalException as error:
        stop.forwarded(error.sigval)  # a stop (by _Stop, or a hangup torchrun forwarded)
    finally:
        watch.stop()
        stop.restore()
        os.environ.pop(status.STATUS_ENV, None)
        os.environ.pop(_LAUNCHER_ENV, None)
        if own_threads:
            os.environ.pop("OMP_NUM_THREADS", None)
        records = status.read_records(folder)
        shutil.rmtree(folder, ignore_errors=True)
    if failures and watch.hang is not None:  # the watchdog stopped the ranks
        status.print_line(f"{watch.hang}; all ranks were stopped.")
        return watchdog.HANG_CODE
    return _report(opts, stop, status.with_recorded_errors(failures, records), records)


def _report(opts, stop: _Stop, failures: dict | None, records: dict) -> int:
    """Print the launcher's last line (if any) and return its exit code."""
    ranks = status.node_ranks(records, _local_ranks(opts, records), opts.node_rank)
    caught = sorted({s for r in records.values() for s in r.signals})
    if stop.reason is None and caught and (failures is None or _all_stops(failures, records)):
        stop.reason = " and ".join(caught) + " (sent to the ranks)"
    if stop.reason is not None and (failures is None or _all_stops(failures, records)):
        note = "a second Ctrl-C" if stop.aborted else ""
        where = "" if opts.nnodes in ("1", "1:1") else " on this node"
        since = stop.since if stop.since is not None else status.first_stop(records)
        line = status.stop_line(stop.reason, records, ranks, since, note, where)
        status.print_line(line)
        # the ranks' own nonzero code (`sys.exit(75)`: "run me again") wins over 128 + signal
        own = [f.exitcode for _, f in sorted((failures or {}).items()) if f.exitcode > 0]
        own += status.own_codes(records)
        return own[0] if own else stop.code
    if failures:
        rank = status.root_failure(failures, records)
        rank = min(failures) if rank is None else rank
        status.print_line(status.failure_line(failures, rank, records))
        return status.exit_code_of(failures[rank], records.get(rank))
    return 0


def _all_stops(failures: dict, records: dict) -> bool:
    return status.root_failure(failures, records) is None


def _local_ranks(opts, records: dict) -> int:
    try:
        return int(opts.nproc)
    except ValueError:  # "gpu"/"cpu"/"auto": count what the ranks recorded
        return max(len(records), 1)


def _worker(argv: list[str]) -> int:
    """One rank: run the script or module as `__main__`, recording an uncaught error."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from ..parallel import teardown

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

    _die_with_launcher()
    stacks = watchdog.arm_stack_dump()  # noqa: F841 -- kept open: the hang watchdog's SIGUSR1
    hangup = _Hangup()
    for sig in _HANGUPS:  # torchrun forwards the launcher's hangup: stop as for SIGTERM
        signal.signal(sig, hangup.handle)
    signals = status.SignalLog()
    code = 1  # an uncaught exception unless the script returns or exits
    try:
        run()
        code = 0
    except SystemExit as exit_:
        code = _system_exit_code(exit_)
        raise
    finally:
        teardown.set_exit_code(code)  # the exit watchdog, if it fires, keeps the run's code
        status.write_exit_record(code, signals.received(), hangup.since, status.raised_error())
    return 0


def _system_exit_code(exit_: SystemExit) -> int:
    if exit_.code is None:
        return 0
    return exit_.code if isinstance(exit_.code, int) else 1


class _Hangup:
    """A rank's SIGHUP/SIGQUIT (torchrun forwards the launcher's): SIGTERM instead, so `fit`
    checkpoints at its step boundary and returns (a script without a SIGTERM handler ends)."""

    def __init__(self):
        self.since: float | None = None  # when the first one came (the launcher's stop line)

    def handle(self, signum: int, frame) -> None:
        if self.since is None:
            self.since = time.time()
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_launcher() -> None:
    """End this rank when its launcher dies, even by SIGKILL (which no handler sees).

    On Linux the kernel sends the rank SIGKILL when its parent (the launcher, which started it)
    exits (`prctl(PR_SET_PDEATHSIG)`); elsewhere a daemon thread checks the parent every second.
    A launcher that died before this ran is caught by comparing the parent's PID.
    """
    launcher = os.environ.get(_LAUNCHER_ENV)
    if not launcher or not launcher.isdigit():
        return  # not started by functrain.launch (torchrun itself, a test)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    else:
        armed = False
    if os.getppid() != int(launcher):
        os.kill(os.getpid(), signal.SIGKILL)  # orphaned already
    if not armed:
        threading.Thread(target=_watch_parent, args=(int(launcher),), daemon=True).start()


def _watch_parent(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)
