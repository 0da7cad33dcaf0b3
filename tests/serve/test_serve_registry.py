"""`--model registry:NAME` serves the registry's current model, and /v1/models carries its lineage."""
import httpx

from tinystack.atomic import write_json
from tinystack.config import InferConfig, ServeConfig
from tinystack.eval.registry import ModelRegistry, resolve_model
from tinystack.serve import create_app, run_in_background
from tinystack.serve.engine.adapter import load_engine


def test_the_registry_model_is_served_with_its_lineage(model_dir, tmp_path):
    write_json(model_dir / "tinystack.json", {"data_manifest_hash": "d" * 64, "tokenizer_hash": "t" * 64})
    reg = ModelRegistry(tmp_path / "registry")
    reg.promote("tiny", reg.add("tiny", model_dir, {}))
    reg.promote("tiny", v2 := reg.add("tiny", model_dir, {}))
    served = resolve_model("registry:tiny", reg.root)
    assert served == reg.model_dir("tiny", v2)
    engine = load_engine(served, InferConfig(max_num_seqs=2, memory_limit_mb=256))
    try:
        with run_in_background(create_app(engine, ServeConfig(model_name="tiny"), model_dir=served)) as url:
            model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
            assert model["id"] == "tiny"
            lineage = model["lineage"]
            assert lineage["data_manifest_hash"] == "d" * 64 and lineage["tokenizer_hash"] == "t" * 64
            assert lineage["registry"]["name"] == "tiny" and lineage["registry"]["version"] == v2
            assert lineage["registry"]["model_sha256"] == reg.record("tiny")["model_sha256"]
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "return the", "max_tokens": 3}, timeout=30)
            assert r.status_code == 200, r.text
    finally:
        engine.shutdown()
