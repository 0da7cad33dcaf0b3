"""The one build/load rule of the project's C++ extensions (all under tinystack/kernels/): compiled at first use,
cached, or None where they cannot be built.

    build(name, sources, headers, cflags, ldflags) -> the loaded module, or None with one RuntimeWarning
    build(..., ops="ns")                             -> torch.ops.ns, for sources that register operators
                                                        (TORCH_LIBRARY: no pybind11, far lighter headers)

torch.utils.cpp_extension compiles the sources (needs a C++ compiler and ninja) and caches the library under
~/.cache/torch_extensions; the module's name carries a hash of the sources and headers, and of where they are,
so two versions (two checkouts, an edited kernel) never load or rebuild over each other. Callers keep a float
path for None.
A load that takes longer than NOTICE_AFTER_S (a compile, not a cached library) says so on stderr while it
runs, so the first fine-tune or quantised model on a machine does not sit silent for half a minute.
"""
from __future__ import annotations

import hashlib
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

NOTICE_AFTER_S = 2.0  # a cached library loads in well under this; a compile takes far longer
STALE_LOCK_S = 600.0  # a build holds its lock for a compile's length; one this old was left by a killed build


def wait_for_build_lock(lib: str) -> None:
    """Wait while another process builds `lib`. torch's build lock is a bare file with no owner and no
    timeout: a build killed mid-compile (a timed-out test, Ctrl-C) leaves it, and every later load of that
    library waited forever. A lock older than STALE_LOCK_S is that, and is removed with a warning."""
    # deferred: the compiler toolchain's module only when a kernel is built or loaded
    from torch.utils import cpp_extension

    try:
        lock = Path(cpp_extension._get_build_directory(lib, verbose=False)) / "lock"
    except Exception:  # the private helper moved: torch's own wait still applies
        return
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > STALE_LOCK_S:
            warnings.warn(f"tinystack: removing {lock}, left {age:.0f} s ago by a build that did not finish",
                          RuntimeWarning, stacklevel=3)
            lock.unlink(missing_ok=True)
            return
        time.sleep(0.2)


def build(name: str, sources: Sequence[Path], headers: Sequence[Path] = (), cflags: Sequence[str] = (),
          ldflags: Sequence[str] = (), ops: str | None = None):
    """The compiled module `name` (with `ops`, the operator namespace it registers), or None (with one warning
    naming the cause) when it cannot be built."""
    # deferred: the compiler toolchain's module only when a kernel is built or loaded
    import torch

    # deferred: the compiler toolchain's module only when a kernel is built or loaded
    from torch.utils import cpp_extension

    # the paths too: torch rebuilds a library whose source paths changed, so two checkouts of the same sources
    # under one name would rebuild over each other at every load (seen with git worktrees: minutes per load)
    files = [Path(p).resolve() for p in [*sources, *headers]]
    digest = hashlib.sha256(b"".join(str(p).encode() + b"\0" + p.read_bytes() for p in files)).hexdigest()[:10]
    notice = threading.Timer(NOTICE_AFTER_S, lambda: print(
        f"tinystack: compiling the C++ extension {name} (first use with these sources; cached afterwards)",
        file=sys.stderr, flush=True))
    notice.daemon = True
    notice.start()
    try:
        wait_for_build_lock(f"{name}_{digest}")
        module = cpp_extension.load(name=f"{name}_{digest}", sources=[str(p) for p in sources],
                                    extra_cflags=list(cflags), extra_ldflags=list(ldflags),
                                    is_python_module=ops is None)
        return module if ops is None else getattr(torch.ops, ops)
    except Exception as e:  # no compiler / ninja / headers: the caller's float path still gives right answers
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        warnings.warn(f"tinystack: C++ extension {name} unavailable ({first[:160]}); using the slower torch path",
                      RuntimeWarning, stacklevel=3)
        return None
    finally:
        notice.cancel()
