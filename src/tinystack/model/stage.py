"""The model layer's pipeline stage: a pretrained model imported as a model directory (`tinystack run`, with
`[run] pretrained`; `tinystack model import` by hand)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tinystack.config import Config
from tinystack.progress import console


def stage_import(cfg: Config, out: Path) -> dict[str, Any]:
    """Import `[run] pretrained` (a known name, a .gguf file or a Hugging Face directory) into `out`."""
    from tinystack.model.importer import describe, import_model

    lineage = import_model(cfg.run.pretrained, out)
    console.print(f"pretrained: {describe(lineage, out)}")
    return {"source": cfg.run.pretrained, "sha256": lineage.get("sha256")}


def pretrained_key(source: str) -> str:
    """What the import depends on: the source file's or directory's identity. A source that cannot be found
    (e.g. the package that ships it is not installed) is a one-line error, not a skipped stage: `[run]
    pretrained` names a model the run was asked to import (`""` asks for none)."""
    from tinystack.atomic import file_sha256
    from tinystack.errors import UserError
    from tinystack.model.importer import resolve_source
    from tinystack.model.io import ModelFormatError

    try:
        path, _ = resolve_source(source)
    except ModelFormatError as e:
        raise UserError(f"run.pretrained: {e} (or --set run.pretrained='\"\"' to run without it)") from None
    return file_sha256(path) if path.is_file() else str(path.resolve())
