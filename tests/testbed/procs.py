"""Process helpers shared by the test beds (tests/testbed/slurm.py, tests/k8s/kube.py).

Logging with a tag, log tails, bounded waits, pid files, liveness of a pid by its command
name, reaping, stopping a daemon through its pid file and port checks. Errors are raised as
the caller's own exception class (``error=``), so each test bed keeps its ``TestbedError``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path


def log(tag: str, msg: str) -> None:
    print(f"[{tag}] {msg}", file=sys.stderr, flush=True)


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return f"--- last {lines} lines of {path} ---\n" + "\n".join(text[-lines:])


def wait(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    logs: Sequence[Path],
    *,
    error: type[Exception],
    interval: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll ``check`` until true; after ``timeout`` raise ``error`` with the tails of ``logs``."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            tails = "\n".join(tail(p) for p in logs)
            last = f"\nlast answer: {detail()}" if detail else ""
            raise error(f"timed out after {timeout:.0f} s waiting for {what}{last}\n{tails}")
        time.sleep(interval)


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int, comm: str) -> bool:
    """True if pid is a live (non-zombie) process whose command name starts with comm."""
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    name = stat_text[stat_text.find("(") + 1 : stat_text.rfind(")")]
    state = stat_text[stat_text.rfind(")") + 2 :].split()[0]
    return state not in ("Z", "X") and name.startswith(comm[:15])


def running(comm: str, pid_file: Path) -> bool:
    """True if ``pid_file`` names a live process called ``comm``."""
    pid = read_pid(pid_file)
    return pid is not None and pid_alive(pid, comm)


def all_running(daemons: Iterable[tuple[str, Path]]) -> bool:
    """True if every (command name, pid file) names a live process."""
    return all(running(comm, pid_file) for comm, pid_file in daemons)


def states(daemons: Iterable[tuple[str, Path]]) -> list[str]:
    """``comm=up`` or ``comm=down`` for each (command name, pid file)."""
    return [f"{comm}={'up' if running(comm, pid_file) else 'down'}" for comm, pid_file in daemons]


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def reap_child(child: subprocess.Popen[bytes] | None) -> None:
    """Collect a daemon this process spawned (no zombie, no ResourceWarning)."""
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=5)


def stop_pid(comm: str, pid_file: Path, *, log: Callable[[str], None], timeout: float) -> None:
    """SIGTERM the process in ``pid_file`` if it is a live ``comm``; SIGKILL it after
    ``timeout`` seconds and wait until it is gone; then remove the pid file."""
    pid = read_pid(pid_file)
    if pid is not None and pid_alive(pid, comm):
        log(f"stopping {comm} (pid {pid})")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(pid, comm) and time.monotonic() < deadline:
            reap(pid)
            time.sleep(0.05)
        if pid_alive(pid, comm):
            log(f"{comm} (pid {pid}) ignored SIGTERM for {timeout:.0f} s; killing it")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while pid_alive(pid, comm):
                reap(pid)
                time.sleep(0.05)
        reap(pid)
    pid_file.unlink(missing_ok=True)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_owner(port: int) -> str:
    out = subprocess.run(
        ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=False
    ).stdout
    return out.strip() or "(unknown process)"


#: Set by tests/lanes.py for its pytest processes: the daemons are the runner's.
SHARED_ENV = "SLURMJOB_TESTBED_SHARED"


def shared_requested() -> bool:
    """True in a pytest process of tests/lanes.py: attach to the running daemons, never start,
    restart or stop one (another lane is using them)."""
    return os.environ.get(SHARED_ENV, "") not in ("", "0", "false", "no")


def attach(what: str, healthy: Callable[[], bool], *, error: type[Exception]) -> None:
    """Wait (60 s at most: a loaded host answers slowly) until the shared ``what`` is healthy;
    raise ``error`` otherwise, leaving it alone."""
    deadline = time.monotonic() + 60
    while not healthy():
        if time.monotonic() > deadline:
            raise error(
                f"the shared {what} is not healthy: tests/lanes.py started it and a lane never "
                "restarts it (see its log under the test bed's log directory)"
            )
        time.sleep(1)
