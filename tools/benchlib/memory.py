"""Memory and descriptors of a process and its children, one reader for every tool.

The ``/proc`` reading itself is the library's (:mod:`shardify.cli.procmem`, what
``shardify bench`` reports); this adds what the tools also watch: open descriptors (shared
memory apart), threads, and the peak resident memory of this process or its finished children.
"""

from __future__ import annotations

import os
import resource

from shardify.cli.procmem import child_pids, memory_kib, process_memory

__all__ = ["child_pids", "memory_kib", "process_memory", "rss_mib", "fd_counts", "threads", "peak_mib", "cpu_s"]


def rss_mib(pid: int | str = "self") -> float:
    """Resident memory (``VmRSS``) of ``pid`` in MiB; 0 when it is gone."""
    return float(memory_kib(pid).get("VmRSS", 0)) / 1024


def fd_counts(pid: int | str = "self") -> tuple[int, int]:
    """(open file descriptors other than shared memory, shared-memory segments: a loader's
    batch slots and a few shared cells)."""
    other = shm = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            is_shm = os.readlink(f"/proc/{pid}/fd/{fd}").startswith(("/dev/shm/", "/memfd:"))
        except OSError:  # gone already, or the one listdir itself held
            is_shm = False
        shm += is_shm
        other += not is_shm
    return other, shm


def threads(pid: int | str = "self") -> int:
    """Threads of ``pid``."""
    return len(os.listdir(f"/proc/{pid}/task"))


def peak_mib(*, children: bool = False) -> float:
    """Peak resident memory in MiB of this process, or (``children``) of the largest of its
    finished, waited-for children (``ru_maxrss``)."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return resource.getrusage(who).ru_maxrss / 1024


def cpu_s() -> tuple[float, float]:
    """CPU seconds so far of this process, and of it with its finished children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    own = me.ru_utime + me.ru_stime
    return own, own + kids.ru_utime + kids.ru_stime
