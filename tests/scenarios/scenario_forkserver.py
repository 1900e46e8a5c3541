"""A warm fork server for the matrix's one-process launches: each launch is a fresh forked child
of a process that already imported torch and functrain, instead of a new interpreter.

Why: a one-process launch of the matrix trains one or two tiny jobs in about a second, but a new
interpreter first spends ~3 s importing (torch, functrain, DTensor, tensorstore) and ~1 s in
finalization at exit; the full matrix makes about a thousand such launches. A forked child is
still a real process of its own, in its own session: the `kill_step` / `kill_save` SIGKILLs,
SIGTERM and SIGINT reach it exactly as they reach `python scenario_worker.py`, and it runs the
worker's `main` with the same arguments, environment and working directory. What it skips is the
interpreter's start and its finalization (it ends with `os._exit` after what a normal exit runs
first: joining non-daemon threads, then the atexit callbacks such as functrain's teardown).

The server must not run torch code before forking (a forked child inherits no threads: a thread
pool started in the server would be missing in the child); it only imports, with one thread
(`OMP_NUM_THREADS=1`), and refuses to start otherwise.

The launcher of a multi-rank launch (`python -m functrain.launch ...`, which the harness signals)
forks from it too: it is the same real process running `functrain.launch.main`, and its torchrun
still starts every rank as a new interpreter, so what reaches the ranks is unchanged.

Protocol (JSON lines): the harness writes `{"argv": [...], "out": path, "target": "worker" |
"launch"}` on the server's stdin; the server answers `{"forked": pid}` once the child is forked
and `{"exited": pid, "rc": code, "cpu": seconds}` when it ended (`rc` as `Popen.returncode`: negative
for a signal). Children may run at once; each exit is seen through a pidfd.

Example:
    >>> server = ForkServer(env=clean_env(), cwd=REPO)
    >>> proc = server.launch(["scenario_worker.py", "batch.json"], "launch0.out")
    >>> proc.wait(timeout=240)
    0
    >>> server.close()
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))


class ForkServerError(RuntimeError):
    """The fork server did not start, or died."""


class ForkedProcess:
    """A launched child, with the part of `subprocess.Popen` the harness uses."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server._exit_code(self.pid, timeout=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server._exit_code(self.pid, timeout=timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(["forked", str(self.pid)], timeout or 0.0)
        return self.returncode


class ForkServer:
    """Starts the server process (it imports the worker and the launcher once) and launches
    children through it; several may run at once (the two launchers of a two-node launch)."""

    def __init__(self, env: dict, cwd: str, start_timeout: float = 120.0):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=cwd,
        )  # fmt: skip
        self._lock = threading.Lock()  # one fork request at a time
        self._changed = threading.Condition()
        self._forked: list[dict] = []
        self._exited: dict[int, int] = {}
        self._gone: str | None = None
        self.cpu_seconds = 0.0  # of every child that ended (user + system, its ranks included)
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True, name="forkserver-reader")
        self._reader.start()
        with self._changed:
            self._changed.wait_for(lambda: self._forked or self._gone, timeout=start_timeout)
            first = self._forked.pop(0) if self._forked else None
        if not first or "ready" not in first:
            self.close()
            raise ForkServerError(f"the fork server did not start: {first or self._gone}")

    def launch(self, argv: list[str], out: str, target: str = "worker") -> ForkedProcess:
        """Fork a child with output to `out` running `scenario_worker.main(argv[1:])`
        (`target="worker"`) or `functrain.launch.main(argv[1:])` (`target="launch"`)."""
        if target not in ("worker", "launch"):
            raise ValueError(f"target must be 'worker' or 'launch', not {target!r}")
        with self._lock:
            self._send({"argv": argv, "out": out, "target": target})
            with self._changed:
                self._changed.wait_for(lambda: self._forked or self._gone, timeout=60.0)
                reply = self._forked.pop(0) if self._forked else None
            if reply is None or "forked" not in reply:
                raise ForkServerError(f"the fork server did not fork: {reply or self._gone}")
            return ForkedProcess(self, int(reply["forked"]))

    def close(self) -> None:
        """End the server (it reaps any child still running first)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=10)
        self.proc.stdout.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exited or self._gone, timeout=timeout)
            if pid in self._exited:
                return self._exited.pop(pid)
            if self._gone:
                raise ForkServerError(f"the fork server is gone: {self._gone}")
            return None

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as error:
            raise ForkServerError(f"the fork server is gone: {error}") from error

    def _read(self) -> None:
        """The reader thread: files each reply line where the waiting side finds it."""
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._changed:
                if "exited" in message:
                    self._exited[int(message["exited"])] = int(message["rc"])
                    self.cpu_seconds += float(message.get("cpu", 0.0))
                else:
                    self._forked.append(message)
                self._changed.notify_all()
        with self._changed:
            self._gone = f"it exited (rc={self.proc.wait()})"
            self._changed.notify_all()


# -- the server process --------------------------------------------------------------------------


def _child(request: dict) -> None:
    """In the forked child: become a fresh-looking process and run the worker; never returns."""
    os.setsid()  # its own session, as the harness's `start_new_session=True`
    code = 1
    try:
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        sys.argv = list(request["argv"])
        if request.get("target") == "launch":
            from functrain.launch import main
        else:
            from scenario_worker import main
        try:
            code = main(sys.argv[1:]) or 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except KeyboardInterrupt:
            import traceback

            traceback.print_exc()
            code = -signal.SIGINT
        except BaseException:  # noqa: BLE001 - printed as the interpreter would, then exit 1
            import traceback

            traceback.print_exc()
            code = 1
        # what a normal interpreter exit runs before finalization, in its order
        threading._shutdown()  # type: ignore[attr-defined]
        import atexit

        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if code == -signal.SIGINT:  # as Python ends on an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)


def _serve() -> int:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    # What the worker and the launcher import, and what a first job would import lazily
    # (DTensor, the checkpoint writer and reader, safetensors): paid once here, not per launch.
    import safetensors.torch  # noqa: F401
    import scenario_worker  # noqa: F401
    import torch.distributed.elastic.multiprocessing.errors  # noqa: F401
    import torch.distributed.run  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

    import functrain.checkpoint  # noqa: F401
    import functrain.launch  # noqa: F401
    import functrain.parallel.plans  # noqa: F401

    out = sys.stdout.buffer

    def reply(message: dict) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        reply({"error": f"{threads} threads after the imports (set OMP_NUM_THREADS=1)"})
        return 1
    reply({"ready": True})
    requests = sys.stdin.buffer.raw  # unbuffered: select() must see every pending request
    children: dict[int, int] = {}  # pidfd -> pid
    pending = b""
    while True:
        readable, _, _ = select.select([requests, *children], [], [])
        for fd in readable:
            if fd in children:
                pid = children.pop(fd)
                _, status, usage = os.wait4(pid, 0)  # its CPU, and its waited-for children's
                os.close(fd)
                cpu = usage.ru_utime + usage.ru_stime
                reply({"exited": pid, "rc": os.waitstatus_to_exitcode(status), "cpu": cpu})
                continue
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                for pid in children.values():  # the harness is gone: reap, then end
                    os.waitpid(pid, 0)
                return 0
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                out.flush()
                pid = os.fork()
                if pid == 0:
                    for fd_ in children:
                        os.close(fd_)
                    _child(request)
                children[os.pidfd_open(pid)] = pid
                reply({"forked": pid})


if __name__ == "__main__":
    sys.exit(_serve())
