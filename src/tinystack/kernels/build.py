"""The one build/load rule of the project's C++ extensions (all under tinystack/kernels/): compiled at first use,
cached, or None where they cannot be built.

    build(name, sources, headers, cflags, ldflags) -> the loaded module, or None with one RuntimeWarning
    build(..., ops="ns")                             -> torch.ops.ns, for sources that register operators
                                                        (TORCH_LIBRARY: no pybind11, far lighter headers)

torch.utils.cpp_extension compiles the sources (needs a C++ compiler and ninja) and caches the library under
~/.cache/torch_extensions; the module's name carries a hash of the sources and headers, so two versions (two
checkouts, an edited kernel) never load or rebuild over each other. Callers keep a float path for None.
A load that takes longer than NOTICE_AFTER_S (a compile, not a cached library) says so on stderr while it
runs, so the first fine-tune or quantised model on a machine does not sit silent for half a minute.
"""
from __future__ import annotations

import hashlib
import sys
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

NOTICE_AFTER_S = 2.0  # a cached library loads in well under this; a compile takes far longer


def build(name: str, sources: Sequence[Path], headers: Sequence[Path] = (), cflags: Sequence[str] = (),
          ldflags: Sequence[str] = (), ops: str | None = None):
    """The compiled module `name` (with `ops`, the operator namespace it registers), or None (with one warning
    naming the cause) when it cannot be built."""
    import torch
    from torch.utils import cpp_extension

    digest = hashlib.sha256(b"".join(Path(p).read_bytes() for p in [*sources, *headers])).hexdigest()[:10]
    notice = threading.Timer(NOTICE_AFTER_S, lambda: print(
        f"tinystack: compiling the C++ extension {name} (first use with these sources; cached afterwards)",
        file=sys.stderr, flush=True))
    notice.daemon = True
    notice.start()
    try:
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
