"""Runs documentation examples, each in a process of its own, quickly: this process imports
torch and shardify once, then forks a child per example (JSON requests on stdin, one per line:
``{"code", "name", "cwd", "log", "timeout"}``; one JSON answer per line: ``{"rc"}``). A child
runs the code as ``__main__`` in ``cwd`` with stdout and stderr in ``log``; one past its timeout
is killed (``rc`` -9)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

import numpy  # noqa: F401  (imported once here, so each forked example starts warm)
import PIL.Image  # noqa: F401
import torch  # noqa: F401

import shardify.convert  # noqa: F401
import shardify.reader  # noqa: F401


def _child(req: dict) -> None:
    """In the forked child: run the example, then exit through the interpreter's normal shutdown."""
    os.chdir(req["cwd"])
    os.environ["HOME"] = os.path.join(req["cwd"], "home")  # so ~/data/... in an example is the example data
    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = [req["name"]]
    sys.path.insert(0, req["cwd"])
    rc = 0
    try:
        exec(compile(req["code"], req["name"], "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 (anything the example raises is its failure, reported)
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(rc)


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        deadline = time.monotonic() + req["timeout"]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                rc = -9
                break
            time.sleep(0.02)
        print(json.dumps({"rc": rc}), flush=True)


if __name__ == "__main__":
    main()
