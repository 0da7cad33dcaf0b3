"""The KV storage's first pages are faulted in off the caller's thread, and doing so never changes a value."""
from __future__ import annotations

import os
import resource
import sys
import threading

import pytest
import torch

from tinystack.infer import paged_cache
from tinystack.infer.paged_cache import KVStorage
from tinystack.infer.weight_arena import HUGE_PAGE, hugepage_empty, hugepages_available, populate


def _populate_supported() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    major, minor = (int(p) for p in os.uname().release.split(".")[:2])
    return (major, minor) >= (5, 14)  # MADV_POPULATE_WRITE


def _faults(fn) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _write_rows(rows: torch.Tensor, base: int, done: threading.Event) -> None:
    for i in range(rows.shape[0]):
        rows[i].fill_(base + i)
    done.set()


def test_populate_changes_nothing_while_another_thread_writes():
    for rep in range(30):
        buf = hugepage_empty(4 * HUGE_PAGE).view(torch.int32)
        chunks = buf.view(64, -1)
        done = threading.Event()
        t = threading.Thread(target=_write_rows, args=(chunks, rep * 1000, done))
        t.start()
        results = []
        while not done.is_set():
            results.append(populate(buf, buf.numel() * 4))
        t.join()
        results.append(populate(buf, buf.numel() * 4))
        assert all(results) == _populate_supported()
        expected = (torch.arange(64, dtype=torch.int32) + rep * 1000)[:, None].expand_as(chunks)
        assert torch.equal(chunks, expected), f"repetition {rep}: populate changed what another thread wrote"


def _write_first_blocks(storage: KVStorage) -> None:
    storage.k[:, :, :4] = 1.0
    storage.v[:, :, :4] = 1.0


@pytest.mark.parametrize("hugepages", [True, False])
def test_a_new_storage_has_each_slabs_first_page_faulted_in(hugepages, monkeypatch):
    shape = dict(n_layer=3, num_blocks=1024, block_size=16, n_kv_head=2, head_dim=64)  # 4 MiB slabs, 12 of them
    slabs = 2 * 3 * 2  # K and V, per layer and head
    storage = KVStorage(**shape, hugepages=hugepages)
    storage.prefault.join()
    assert _faults(lambda: _write_first_blocks(storage)) < slabs // 2  # a few of the calls' own, not one a slab
    assert torch.count_nonzero(storage.k[:, :, 4:]) == 0 and torch.count_nonzero(storage.v[:, :, 4:]) == 0

    lazily_mapped = hugepages_available()  # elsewhere the storage is plain zeroed memory, every page present
    if lazily_mapped:
        monkeypatch.setattr(paged_cache, "_prefault_first_pages", lambda *stores: None)
        cold = KVStorage(**shape, hugepages=hugepages)
        cold.prefault.join()
        assert _faults(lambda: _write_first_blocks(cold)) >= slabs  # one page at least per slab


def test_the_prefault_thread_does_not_outlive_its_work():
    storage = KVStorage(n_layer=2, num_blocks=64, block_size=16, n_kv_head=1, head_dim=64)
    storage.prefault.join(timeout=30)
    assert not storage.prefault.is_alive() and storage.prefault.daemon
