"""The GPT equals Hugging Face's GPT-2, and the model directory round-trips both ways."""
import json

import pytest
import torch

from tinystack.model import GPT, GPTConfig, ModelFormatError, load_model, save_model

transformers = pytest.importorskip("transformers")


def _tiny(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=97, block_size=32, n_layer=2, n_head=4, n_embd=32)).eval()


def test_saved_model_loads_in_transformers_with_equal_logits(tmp_path):
    model = _tiny()
    save_model(model, tmp_path, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, 97, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()


def test_hf_gpt2_checkpoint_loads_here(tmp_path):
    torch.manual_seed(3)
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=24, n_layer=2, n_head=3)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = load_model(tmp_path)
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(ours(idx)[0], hf(idx).logits, atol=1e-4)


def test_round_trip_is_exact(tmp_path):
    model = _tiny(5)
    save_model(model, tmp_path, lineage={"x": 1})
    again = load_model(tmp_path)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_clear_errors_for_bad_directories(tmp_path):
    with pytest.raises(ModelFormatError, match="missing config.json"):
        load_model(tmp_path)
    save_model(_tiny(), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    with pytest.raises(ModelFormatError, match="unsupported model_type 'bert'"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "n_layer": 3}))
    with pytest.raises(ModelFormatError, match=r"missing tensors \['transformer.h.2"):
        load_model(tmp_path)


def test_forward_refuses_positions_past_block_size():
    model = _tiny()
    with pytest.raises(ValueError, match="exceeds block_size=32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_a_loaded_model_owns_its_tensors_and_its_head_is_tied(tmp_path):
    save_model(_tiny(6), tmp_path)
    model = load_model(tmp_path)
    assert model.lm_head.weight is model.transformer.wte.weight  # one Parameter, as a freshly built GPT
    for name, p in model.named_parameters():
        assert p.device.type == "cpu" and p.is_contiguous() and p.requires_grad, name
    # written weights change the model only, not the file (the parameters are copies, not the file's mapping)
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.weight.add_(1.0)
        model.lm_head.weight.mul_(2.0)
    assert torch.equal(load_model(tmp_path).state_dict()["transformer.wte.weight"],
                       _tiny(6).state_dict()["transformer.wte.weight"])


def test_building_an_empty_model_leaves_other_threads_initialisation_alone():
    """empty_model skips torch.nn.init on meta tensors only: a model built at the same time in another thread is
    initialised as usual (repeated: the two overlap in many different places)."""
    import threading

    from tinystack.model.io import empty_model

    cfg = GPTConfig(vocab_size=97, block_size=32, n_layer=2, n_head=4, n_embd=32)
    expected = _tiny(7).state_dict()
    def skeletons(stop, empties):
        while not stop.is_set():
            empties.append(all(p.is_meta for p in empty_model(cfg).parameters()))

    for _ in range(12):
        built, empties, stop = [], [], threading.Event()
        t = threading.Thread(target=skeletons, args=(stop, empties))
        t.start()
        try:
            for _ in range(3):
                built.append(_tiny(7).state_dict())
        finally:
            stop.set()
            t.join()
        assert empties and all(empties)
        for state in built:
            for name, value in expected.items():
                assert torch.equal(state[name], value), name
