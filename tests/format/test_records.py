"""Records and Repeats: the same answers in memory and spilled to disk, and a spilled store
holds no more than its budget in memory."""

from __future__ import annotations

import pickle
from array import array
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardify.records import Records, Repeats, repeated

_BATCHES = st.lists(st.lists(st.binary(max_size=12), max_size=6), max_size=12)


def _fill(batches: list[list[bytes]], spill_bytes: int) -> Records:
    store = Records(spill_bytes=spill_bytes)
    for n, batch in enumerate(batches):
        if n % 2:
            for record in batch:
                store.append(record)
        else:
            store.extend(b"".join(batch), np.cumsum([len(r) for r in batch], dtype=np.int64))
    return store


@given(_BATCHES, st.sampled_from([0, 1, 7, 40, 1 << 20]), st.data())
@settings(max_examples=100, deadline=None)
def test_records_read_back_what_was_appended_whatever_the_spill_budget(batches, spill_bytes, data) -> None:
    want = [r for batch in batches for r in batch]
    store = _fill(batches, spill_bytes)
    assert len(store) == len(want)
    assert [bytes(r) for r in store] == want
    assert [bytes(store[i]) for i in range(len(want))] == want
    if want:
        picks = data.draw(st.lists(st.integers(0, len(want) - 1), max_size=20))
        assert [bytes(r) for r in store.take(picks)] == [want[i] for i in picks]
        assert bytes(store[-1]) == want[-1]
        lo = data.draw(st.integers(0, len(want)))
        hi = data.draw(st.integers(lo, len(want)))
        chunk = data.draw(st.integers(1, 5))
        got = []
        for span, ends in store.spans(lo, hi, chunk=chunk):
            got += [bytes(span[a:b]) for a, b in zip([0, *ends.tolist()], ends.tolist())]
        assert got == want[lo:hi]
    assert store.nbytes == sum(map(len, want)) + 8 * len(want)
    assert [bytes(r) for r in pickle.loads(pickle.dumps(store))] == want


def test_a_spilled_store_holds_its_budget_in_memory_and_the_rest_on_disk() -> None:
    store = Records(spill_bytes=1000)
    for i in range(10_000):
        store.append(b"record %d" % i)
    assert store.spilled
    assert store.resident_bytes <= 1000 + 20
    assert store.nbytes > 100_000
    assert bytes(store[1234]) == b"record 1234" and bytes(store[9999]) == b"record 9999"
    unspilled = Records()
    unspilled.append(b"x")
    assert not unspilled.spilled


@given(
    st.lists(
        st.integers(min_value=-3, max_value=3) | st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=60
    ),
    st.sampled_from([0, 16, 80, 1 << 20]),
    st.integers(1, 7),
)
@settings(max_examples=40, deadline=None)
def test_repeats_finds_the_values_seen_twice_in_memory_or_in_buckets(values, spill_bytes, chunk) -> None:
    counts = Counter(values)
    found = Repeats(spill_bytes=spill_bytes)
    for lo in range(0, len(values), chunk):
        found.extend(values[lo : lo + chunk])
    want = [j for j, v in enumerate(values) if counts[v] > 1]
    assert found.repeated() == want == repeated(array("q", values))
    assert len(found) == len(values)


def test_repeats_spills_what_it_held_in_slices_with_the_right_indices(monkeypatch) -> None:
    import shardify.records as records

    monkeypatch.setattr(records, "_SLICE", 7)
    values = [i % 97 if i % 5 == 0 else 1000 + i for i in range(1000)]
    counts = Counter(values)
    found = Repeats(spill_bytes=8 * 300)
    for lo in range(0, 1000, 64):
        found.extend(values[lo : lo + 64])
    assert found.repeated() == [j for j, v in enumerate(values) if counts[v] > 1]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc to see where the files are")
def test_spilled_files_go_to_the_spill_dir_and_a_full_disk_names_it(tmp_path, monkeypatch) -> None:
    import os

    import shardify.records as records
    from shardify.errors import OutputError

    monkeypatch.setenv("SHARDIFY_SPILL_DIR", str(tmp_path))
    store = Records(spill_bytes=10)
    store.append(b"x" * 20)
    fds = [os.readlink(f"/proc/self/fd/{f.fileno()}") for f in store._files]
    assert all(link.startswith(str(tmp_path)) and link.endswith("(deleted)") for link in fds)
    assert os.listdir(tmp_path) == []  # unlinked from the start: nothing to clean up

    def full(*a):  # noqa: ANN002, ANN202
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records.os, "pwrite", full)
    with pytest.raises(OutputError, match=f"No space left on device.*{tmp_path}|{tmp_path}.*No space left"):
        store.append(b"y" * 20)
    monkeypatch.setenv("SHARDIFY_SPILL_DIR", str(tmp_path / "missing"))
    with pytest.raises(OutputError, match="SHARDIFY_SPILL_DIR"):
        Repeats(spill_bytes=8).extend(range(5))
