"""A stand-in tuning process for the hook tests: leases queued misses, builds a few real schedule
candidates per kernel (splits of the first block's innermost loop), times them on this CPU,
pushes the fastest with provenance and acks the job.

Usage: python -m tests.hand_tuner URL TOKEN
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms

from schedhub.hooks.kernels.identity import plain_json, target_from_text, workload_module
from schedhub.registry import Identity, Record, RegistryClient

FACTORS = (2, 4, 8, 16)


def measure(mod: tvm.IRModule, target: tvm.target.Target) -> list[float]:
    rt = tvm.tirx.build(mod, target)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.random.rand(*a.shape).astype(a.dtype), dev) for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])]
    return list(rt.time_evaluator("main", dev, number=20, repeat=3)(*args).results)


def tune(identity: Identity) -> Record:
    base = workload_module(identity.workload)
    target = target_from_text(identity.target)
    first = [b for b in re.findall(r'T\.sblock\("([^"]+)"\)', base.script()) if b != "root"][0]
    best: tuple[float, str, list[float]] | None = None
    for factor in FACTORS:
        sch = tvm.s_tir.Schedule(base)
        loops = sch.get_loops(sch.get_sblock(first))
        sch.split(loops[-1], factors=[None, factor])
        secs = measure(sch.mod, target)
        mean = sum(secs) / len(secs)
        if best is None or mean < best[0]:
            best = (mean, json.dumps(plain_json(sch.trace.as_json()), separators=(",", ":")), secs)
    assert best is not None
    return Record(identity, best[1], best[2], {"tuner": "tests.hand_tuner", "trials": len(FACTORS)})


def main(url: str, token: str) -> None:
    with RegistryClient(url, token=token) as client:
        while leases := client.lease("hand-tuner", max_jobs=8, lease_secs=120):
            for lease in leases:
                identity = Identity.from_obj(lease.job)
                client.put(tune(identity))
                client.ack(lease.key, lease.lease_id)
                print(f"tuned {identity.op}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
