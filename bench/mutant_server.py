"""A fork server for mutation testing: import torch once, run each mutant's tests in a fork.

Each mutant's test run is a fresh pytest, and on this machine most of its cost is importing
third-party libraries (torch, torch.distributed.tensor, tensorstore: 10-15 s under load) before a
test that takes a second. The server imports those libraries once -- never `functrain` or the
tests, which a mutant changes -- and forks a child per request; the child imports functrain from
the (mutated) source and runs `pytest.main`. cosmic-ray's test command is the client, a bare
Python process that sends the pytest arguments over a unix socket and exits with the child's
status; when cosmic-ray's timeout kills the client, the server kills the child's process group.

Bytecode is never written (`sys.dont_write_bytecode`): two mutants of one file written within the
same second with the same size would otherwise share a stale `.pyc`.

Usage (what bench/mutants.py does):
    python bench/mutant_server.py serve SOCKET TREE MODULES_FILE   # MODULES_FILE: one name a line
    python bench/mutant_server.py run SOCKET LOG -- -x -q tests/test_time.py   # LOG: pytest's output
    python bench/mutant_server.py stop SOCKET
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import sys


def _preimport(modules_file: str) -> None:
    """Import the third-party modules named in `modules_file` (failures are skipped: a module
    that cannot be imported out of its natural order is imported by the child instead)."""
    with open(modules_file) as f:
        names = [line.strip() for line in f if line.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- best effort; the child imports what is missing
            pass


def _child(tree: str, args: list[str], log: str) -> None:
    os.setpgid(0, 0)  # its own group, so a timeout kills the processes a test starts too
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(tree)
    sys.path.insert(0, tree)  # as `python -m pytest` puts the working directory first
    # The processes a test starts must import the mutated tree too. A rank started by
    # `mp.spawn` inherits this sys.path, but one started as a script (torchrun, `subprocess` of a
    # worker file, `python -m functrain.launch`) builds its own from the script's folder and
    # PYTHONPATH, and would otherwise find the unmutated functrain of an editable install.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != tree]
    os.environ["PYTHONPATH"] = os.pathsep.join([tree, *paths])
    sys.argv = ["pytest", *args]
    try:
        import pytest

        code = int(pytest.main(args))
    except BaseException:  # noqa: BLE001 -- any failure to run is a failed run
        import traceback

        traceback.print_exc()
        code = 99
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def serve(path: str, tree: str, modules_file: str) -> None:
    sys.dont_write_bytecode = True
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # and the processes a test starts (ranks)
    _preimport(modules_file)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            request = json.loads(conn.makefile().readline())
            if request.get("stop"):
                return
            pid = os.fork()
            if pid == 0:
                server.close()
                conn.close()
                _child(tree, request["args"], request["log"])
            code = None
            while code is None:
                ready, _, _ = select.select([conn], [], [], 0.05)
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    code = os.waitstatus_to_exitcode(status)
                    code = code if code >= 0 else 128 - code
                elif ready and not conn.recv(1):  # the client is gone (cosmic-ray's timeout)
                    _kill(pid)
                    os.waitpid(pid, 0)
                    code = -1
            _kill(pid)  # whatever the tests left running in the child's group
            if code >= 0:
                try:
                    conn.sendall(f"{code}\n".encode())
                except OSError:
                    pass


def run(path: str, args: list[str], log: str) -> int:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    client.sendall((json.dumps({"args": args, "log": log}) + "\n").encode())
    reply = client.makefile().readline()
    with open(log, errors="replace") as f:  # cosmic-ray keeps the client's output per mutant
        print(f.read()[-2000:])
    return int(reply) if reply.strip() else 98


def stop(path: str) -> None:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    client.sendall(b'{"stop": true}\n')


def main(argv: list[str]) -> int:
    if argv[0] == "serve":
        serve(*argv[1:4])
        return 0
    if argv[0] == "run":  # run SOCKET LOG -- pytest args
        rest = argv[3:]
        return run(argv[1], rest[1:] if rest[:1] == ["--"] else rest, argv[2])
    if argv[0] == "stop":
        stop(argv[1])
        return 0
    raise SystemExit(f"unknown command {argv[0]!r}: serve, run or stop")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
