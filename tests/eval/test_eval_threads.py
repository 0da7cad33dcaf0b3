"""`torch_threads` sets the intra-op thread count inside the block and always restores it."""
import pytest
import torch

from tinystack.eval.threads import torch_threads


def test_sets_and_restores_even_on_error():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError):
        with torch_threads(1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with torch_threads(0):  # 0 = leave alone
        assert torch.get_num_threads() == before
