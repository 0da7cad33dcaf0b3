"""The streaming safetensors writer: what `safetensors` reads back is what was streamed; a stream that
disagrees with its header is an error."""
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tinystack.model.stream_safetensors import write_streaming


def test_round_trip_through_the_library(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"a.weight": rng.standard_normal((3, 5)).astype(np.float32), "b": rng.standard_normal(7),  # float64 in
              "scalar_row": np.arange(1, dtype=np.float32), "c.bias": rng.standard_normal((2, 3, 4)).astype(np.float16)}
    write_streaming(tmp_path / "m.safetensors", [(k, v.shape) for k, v in arrays.items()], iter(arrays.items()),
                    metadata={"format": "pt"})
    back = load_file(tmp_path / "m.safetensors")
    assert set(back) == set(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == torch.float32 and torch.equal(back[k], torch.from_numpy(v.astype(np.float32)))
    with safe_open(str(tmp_path / "m.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    header_len = int.from_bytes((tmp_path / "m.safetensors").read_bytes()[:8], "little")
    assert header_len % 8 == 0


@pytest.mark.parametrize("stream, message", [
    ([("a", np.zeros((2, 2), np.float32)), ("b", np.zeros(4, np.float32))], "does not match"),  # wrong shape
    ([("b", np.zeros(3, np.float32))], "does not match"),  # wrong order
    ([("a", np.zeros((2, 3), np.float32))], "fewer tensors"),
    ([("a", np.zeros((2, 3), np.float32)), ("b", np.zeros(3, np.float32)), ("c", np.zeros(1, np.float32))],
     "does not match"),  # one too many
])
def test_a_stream_that_disagrees_with_the_header_fails(tmp_path, stream, message):
    with pytest.raises(ValueError, match=message):
        write_streaming(tmp_path / "m.safetensors", [("a", (2, 3)), ("b", (3,))], iter(stream))
