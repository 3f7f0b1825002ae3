"""Memory of a process and its children, read from ``/proc`` (Linux): what ``shardify bench``
reports after each epoch, and what the tools' memory figures read (``tools/benchlib/memory.py``).
Outside :mod:`shardify.cli.bench` so that reading memory does not import torch."""

from __future__ import annotations

import os

__all__ = ["process_memory", "child_pids", "memory_kib"]


def process_memory(pid: int | None = None) -> int:
    """Bytes of memory of ``pid`` (default: this process) and its children: PSS, else RSS."""
    root = os.getpid() if pid is None else pid
    pids = [root] + child_pids(root)
    total = 0
    for p in pids:
        kib = memory_kib(p)
        total += kib.get("Pss", kib.get("VmRSS", 0)) * 1024
    return total


def child_pids(pid: int | None = None) -> list[int]:
    """Pids of the child processes of ``pid`` (default: this process), sorted, from /proc."""
    pid = os.getpid() if pid is None else pid
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return sorted(out)


_SMAPS = ("Rss", "Pss", "Private_Clean", "Private_Dirty")
_STATUS = ("VmRSS", "VmHWM")


def memory_kib(pid: int | str = "self") -> dict[str, int]:
    """KiB of ``pid``'s memory: ``VmRSS`` and ``VmHWM`` (peak RSS) from ``status``; ``Rss``, ``Pss``
    and ``Uss`` (private clean + dirty) from ``smaps_rollup`` where the kernel has it. Empty when
    the process is gone."""
    out: dict[str, int] = {}
    for name, wanted in (("status", _STATUS), ("smaps_rollup", _SMAPS)):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                for line in f:
                    label, _, value = line.partition(b":")
                    key = label.decode()
                    if key in wanted:
                        out[key] = int(value.split()[0])
        except OSError:
            continue
    if "Private_Clean" in out and "Private_Dirty" in out:
        out["Uss"] = out.pop("Private_Clean") + out.pop("Private_Dirty")
    return out
