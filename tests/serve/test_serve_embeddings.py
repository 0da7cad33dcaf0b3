"""POST /v1/embeddings through the real server and the official `openai` client: each vector is the model's own
final-norm state pooled as configured (last token or mean) and L2-normalised, for strings, lists, token ids and
both encodings; bad inputs are 400s naming `input`; the route sits behind the key and the rate limits like the
rest, and runs beside a generation without breaking it."""
import asyncio
import base64

import httpx
import numpy as np
import openai
import pytest
import torch
from serve_helpers import PROMPT


def _reference(engine, ids: list[int], pooling: str) -> np.ndarray:
    """What the model itself says: its final norm's output for `ids`, pooled and normalised."""
    with torch.no_grad():
        hidden, _ = engine.engine.model(torch.tensor([ids]), apply_head=False)
    states = hidden[0].float()
    v = states[-1] if pooling == "last" else states.mean(0)
    return torch.nn.functional.normalize(v, dim=0).numpy()


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_vectors_are_the_models_pooled_states_for_every_input_form(serve, engine, pooling):
    served = serve(engine, embedding_pooling=pooling)
    tok = engine.engine.tokenizer
    texts = [PROMPT, "the other text"]
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0, timeout=30) as client:
        one = client.embeddings.create(model="m", input=texts[0])  # the client asks for base64 and decodes it
        many = client.embeddings.create(model="m", input=texts)
        by_ids = client.embeddings.create(model="m", input=[tok.encode_ordinary(t) for t in texts])
        floats = client.embeddings.create(model="m", input=texts[1], encoding_format="float")
    want = [_reference(engine, tok.encode_ordinary(t), pooling) for t in texts]
    assert np.allclose(one.data[0].embedding, want[0], atol=1e-5)
    assert [d.index for d in many.data] == [0, 1] and len(many.data[0].embedding) == engine.engine.model.config.n_embd
    for got, ref in zip(many.data, want):
        assert np.allclose(got.embedding, ref, atol=1e-5) and abs(np.linalg.norm(got.embedding) - 1) < 1e-5
    assert all(np.allclose(a.embedding, b.embedding, atol=1e-6) for a, b in zip(by_ids.data, many.data))
    assert np.allclose(floats.data[0].embedding, want[1], atol=1e-5)
    assert many.usage.prompt_tokens == many.usage.total_tokens == sum(len(tok.encode_ordinary(t)) for t in texts)
    r = httpx.post(f"{served.url}/v1/embeddings", json={"input": texts[0], "encoding_format": "base64"}, timeout=30)
    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert r.json()["object"] == "list" and np.allclose(raw, want[0], atol=1e-5)


def test_bad_inputs_are_400s_naming_input(serve, engine):
    served = serve(engine)
    vocab = engine.engine.tokenizer.vocab_size
    too_long = "word " * (engine.engine.max_seq_len * 2)
    for body in ({"input": ""}, {"input": []}, {"input": [[]]}, {"input": too_long}, {"input": [vocab]},
                 {"input": [[1, 2], [-1]]}, {"input": ["x"] * 2049}, {"input": "x", "dimensions": 8},
                 {"input": "x", "encoding_format": "int8"}):
        r = httpx.post(f"{served.url}/v1/embeddings", json=body, timeout=30)
        assert r.status_code == 400, (str(body)[:80], r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["param"].split(".")[0].split("[")[0] in (
            "input", "dimensions", "encoding_format"), err


def test_embeddings_need_the_key_and_count_against_the_rate_limits(serve, engine, monkeypatch):
    monkeypatch.setenv("TEST_KEYS", "k1")
    served = serve(engine, api_key_env="TEST_KEYS", rate_limit_rpm=2)
    url = f"{served.url}/v1/embeddings"
    assert httpx.post(url, json={"input": "x"}, timeout=30).status_code == 401
    auth = {"Authorization": "Bearer k1"}
    codes = [httpx.post(url, json={"input": "x"}, headers=auth, timeout=30).status_code for _ in range(3)]
    assert codes[:2] == [200, 200] and codes[2] == 429
    metrics = httpx.get(f"{served.url}/metrics", timeout=10).text
    assert 'route="/v1/embeddings"' in metrics


def test_an_embedding_beside_a_running_generation_leaves_both_whole(serve, engine):
    served = serve(engine)

    async def both() -> tuple[httpx.Response, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=served.url, timeout=60) as c:
            gen = asyncio.create_task(c.post("/v1/completions", json={
                "prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "temperature": 0}))
            embs = await asyncio.gather(*(c.post("/v1/embeddings", json={"input": [PROMPT, "b"]}) for _ in range(5)))
            return await gen, list(embs)

    for _ in range(3):
        gen, embs = asyncio.run(both())
        assert gen.status_code == 200 and gen.json()["usage"]["completion_tokens"] == 40
        assert all(e.status_code == 200 and len(e.json()["data"]) == 2 for e in embs)
