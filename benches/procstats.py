"""This process's peak RSS and open descriptors, for benchmarks (Linux /proc)."""

from __future__ import annotations

import os


def peak_reset() -> None:
    """Reset VmHWM (the peak RSS) to the current RSS, where the kernel allows it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_kib() -> int:
    """Return the peak RSS (VmHWM) in KiB since the start or the last :func:`peak_reset`."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def fds() -> int:
    """Return the number of descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))
