"""Process memory, for checks that a server gives back what a burst of requests used."""
from __future__ import annotations

import resource
import sys


def rss_bytes() -> int:
    """Resident set size of this process now (Linux: /proc/self/statm); elsewhere the peak RSS."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
