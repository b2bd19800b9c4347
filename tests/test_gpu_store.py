"""The GPU table's registry kept in the repository between leases (bench.gpu_store): real LMDB stores, real xz files."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from bench import gpu_store
from schedhub.registry import LocalRegistry, RegistryError, Trial, TrialLog

from .conftest import make_record


def _tuned_store(root: Path) -> tuple[list, TrialLog]:
    records = [make_record(w, 1e-3 * w) for w in (1, 2, 3)]
    log = TrialLog(records[0].identity, [Trial(records[0].trace, 1e-3), Trial(make_record(1, 2e-3, variant=1).trace, 2e-3)])
    with LocalRegistry(root, sync=False) as reg:
        for record in records:
            reg.put(record, "worker-gpu")
        reg.push_trials(log, "worker-gpu")
        reg.put(make_record(9, 1e-3), "stranger", verified=False)  # a claim stays a claim
    return records, log


def test_a_saved_store_loads_as_a_seed_store_with_its_records_log_and_trust(tmp_path: Path) -> None:
    records, log = _tuned_store(tmp_path / "tuned")
    got = gpu_store.save(tmp_path / "tuned", tmp_path / "kept" / "store.mdb.xz")
    assert got["keys"] == 4 and got["trial_logs"] == 1
    assert got["archive_bytes"] < got["store_bytes"]  # compressed, not copied

    assert gpu_store.load(tmp_path / "kept" / "store.mdb.xz", tmp_path / "seed") == {"keys": 4, "trial_logs": 1}
    with LocalRegistry(tmp_path / "seed", sync=False) as seed:  # writable: bench.models tunes on into its copy
        served = seed.lookup([r.key for r in records])
        assert {k: [r.trace for r in v] for k, v in served.items()} == {r.key: [r.trace] for r in records}
        assert [[t.trace for t in e.trials] for e in seed.iter_trial_logs(verified_only=True)] == [[t.trace for t in log.trials]]
        verifiers = {k: [meta["vby"] for _, meta in v] for k, v in seed.lookup_entries([*served, make_record(9, 1e-3).key]).items()}
    assert verifiers == {**{r.key: ["worker-gpu"] for r in records}, make_record(9, 1e-3).key: [""]}  # the claim is still a claim


def test_loading_refuses_what_is_not_a_kept_store_and_writes_nothing(tmp_path: Path) -> None:
    _tuned_store(tmp_path / "tuned")
    gpu_store.save(tmp_path / "tuned", tmp_path / "store.mdb.xz")
    whole = (tmp_path / "store.mdb.xz").read_bytes()
    bad = {
        "truncated": whole[: len(whole) // 2],
        "not xz": b"data.mdb" * 100,
        "xz of something else": lzma.compress(b"\0" * 4096 + b"not an lmdb file" * 1000),
    }
    for name, content in bad.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(RegistryError, match="not a kept store"):
            gpu_store.load(tmp_path / name, tmp_path / f"into {name}")
        assert list((tmp_path / f"into {name}").iterdir()) == [], name

    gpu_store.load(tmp_path / "store.mdb.xz", tmp_path / "seed")
    with pytest.raises(RegistryError, match="already holds a store"):  # a store is never written over
        gpu_store.load(tmp_path / "store.mdb.xz", tmp_path / "seed")


def test_a_file_that_inflates_past_the_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bomb.xz").write_bytes(lzma.compress(b"\0" * (3 << 20)))
    monkeypatch.setattr(gpu_store, "MAX_STORE_BYTES", 1 << 20)
    with pytest.raises(RegistryError, match="inflates past 1 MiB"):
        gpu_store.load(tmp_path / "bomb.xz", tmp_path / "seed")
    assert list((tmp_path / "seed").iterdir()) == []
