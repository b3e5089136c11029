"""Processes as Linux's /proc shows them: who listens on a TCP port, a process's name, state, parent, command line,
children and resident memory. Where /proc is missing or a process is gone the answer is None, [] or False.
The standard library only: the Triton server module and the benchmarks both use it."""

from __future__ import annotations

import os
from pathlib import Path

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def process_stat(pid: int) -> tuple[str, str, int] | None:
    """(comm, state, parent pid) from /proc/PID/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        close = text.rfind(")")  # comm may hold spaces and parentheses
        rest = text[close + 2:].split()
        return text[text.find("(") + 1:close], rest[0], int(rest[1])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """The process exists and is neither a zombie nor dead."""
    stat = process_stat(pid)
    return stat is not None and stat[1] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def rss_kib(pid: int) -> int | None:
    """Resident set size in KiB (/proc/PID/statm)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KIB
    except (OSError, ValueError, IndexError):
        return None


def process_tree(root: int) -> list[int]:
    """`root` and every live process below it, root first, breadth first."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        stat = process_stat(pid)
        if stat is not None and stat[1] not in ("Z", "X"):
            children.setdefault(stat[2], []).append(pid)
    if not alive(root):
        return []
    tree, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return tree


def listening_pids(port: int) -> list[int]:
    """Processes holding a listening TCP socket (IPv4 or IPv6) on `port`, among those whose descriptors we may read."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            try:
                if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":  # 0A: LISTEN
                    inodes.add(f"socket:[{parts[9]}]")
            except (IndexError, ValueError):
                continue
    if not inodes:
        return []
    pids = []
    for pid in _pids():
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                pids.append(pid)
        except OSError:
            continue
    return pids


def port_owner(port: int) -> int | None:
    """The process serving a TCP port: of those listening on it (children may inherit the socket), the one none of
    the others is an ancestor of."""
    pids = listening_pids(port)
    for pid in pids:
        ancestors, p = set(), pid
        while p > 1:
            stat = process_stat(p)
            if stat is None:
                break
            p = stat[2]
            ancestors.add(p)
        if not ancestors & set(pids):
            return pid
    return pids[0] if pids else None
