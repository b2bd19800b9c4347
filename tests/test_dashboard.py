"""The dashboard at ``/`` in a real headless browser (Debian's chromium through selenium): its
numbers match ``/v1/stats``, its charts are drawn, hostile text stays text, and a screenshot is kept
in docs/. The browser comes from tests/install-browser.sh (the README's test command runs it)."""

from __future__ import annotations

import dataclasses
import os
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from schedhub.registry import REFINE, LocalRegistry, Principal, Record, RegistryClient, ServerThread, canonical_target

from .conftest import FINGERPRINT, TOKEN, make_record

#: docs/dashboard.png is tracked: a test run writes its screenshot there only when asked (SCHEDHUB_UPDATE_DOCS=1)
DOCS_SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "dashboard.png"
OTHER_TARGET = canonical_target({"kind": "llvm", "mcpu": "skylake", "num-cores": 2, "keys": ["cpu"]})


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,2200"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"))
    try:
        yield driver
    finally:
        driver.quit()


def tuned(workload: int, secs: float, untuned: float, variant: int = 0, **kw) -> Record:  # type: ignore[no-untyped-def]
    return make_record(workload, secs, variant, provenance={"host_cpu": "test", "untuned_secs": untuned}, **kw)


def test_the_dashboard_shows_what_the_stats_say(tmp_path: Path, browser: webdriver.Chrome) -> None:
    tokens = {TOKEN: "admin-tester", "pusher-token": Principal("mallory <script>", "push")}
    with ServerThread(tmp_path / "served", tokens=tokens, sync=False) as srv, RegistryClient(srv.url, token=TOKEN) as admin:
        admin.put_many([tuned(w, 1e-4 * (1 + w % 3), 4e-3, op=f"fused_conv2d_add_relu{w % 4}") for w in range(1, 13)])
        admin.put_many([tuned(w, 2e-4, 1e-3, target=OTHER_TARGET) for w in range(20, 25)])
        admin.put(dataclasses.replace(tuned(26, 1e-3, 1e-3), trace="[[],[]]"))  # nothing beat the default: served, and said
        with RegistryClient(srv.url, token="pusher-token") as pusher:
            hostile = make_record(30, 1e-6, op="fused_claim", provenance={"untuned_secs": 1e3})
            pusher.put(hostile)  # a claim: shown, never counted as a speedup
        admin.quarantine(hostile.key, hostile.trace_id, "the claim was <img src=x onerror=alert(1)> too good")
        missed = [make_record(w, 1e-3).identity for w in range(40, 46)]
        admin.report_misses(missed + missed[:2])  # two of them in demand twice
        first = admin.lease("a worker", 1)[0]  # the most demanded: its first pass pushed, its search left for after every other first pass
        assert first.key == missed[0].key and admin.ack(first.key, first.lease_id, refine=True) == REFINE
        with RegistryClient(srv.url, token="pusher-token") as pusher:
            pusher.report_misses([missed[5]])  # asked for by a second caller
        admin.lookup([make_record(w, 1e-4).key for w in (1, 2, 3)] + [m.key for m in missed])
        admin.report_network([(make_record(w, 1e-4).key, 1 + w % 2) for w in range(1, 7)] + [(missed[0].key, 1)], name="resnet50 (example)",
                             goal={"label": "onnxruntime", "secs": 0.0025})  # fmt: skip
        stats = httpx.get(f"{srv.url}/v1/stats").json()

        browser.get(srv.url + "/")
        text = {el.get_attribute("id"): el.text for el in browser.find_elements(By.CSS_SELECTOR, "[id]")}

        def number(ident: str) -> int:
            return int(text[ident].replace(",", ""))

        assert number("keys") == stats["keys"] == 18
        assert (number("ops"), number("targets"), number("fingerprints")) == (stats["coverage"]["ops"], stats["coverage"]["targets"], 1)
        assert number("targets") == 2 and number("ops") == 4 + 3  # four conv ops, three fused_op* ops
        assert number("served-defaults") == 1
        assert number("quarantined") == stats["quarantined"] == 1 and number("measurements") == stats["measurements"]
        assert all(number(f"queue-{state}") == n for state, n in stats["queue"].items()) and number("queue-pending") == 6 + 1  # six misses, one claim to verify
        assert number("lookups-hits") == stats["since_start"]["hits"] == 3 and number("lookups-misses") == stats["since_start"]["misses"] == 6
        assert number("misses-reported") == 9 and number("lookups-weighed") == 0
        assert [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#networks td")][:3] == ["resnet50 (example)", "7", "6 (86%)"]
        assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-ops rect")) == 7
        assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-speedups rect")) == 12  # a bar a served key, the claim's not among them
        assert "(the first 12 of 18)" in browser.page_source  # 18 keys serve a verified record: the cut is said
        assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-lookups rect")) == 3
        wanted = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in browser.find_elements(By.CSS_SELECTOR, "#wanted tr")[1:]]
        assert [w[0] for w in wanted] == ["verify"] + ["tune"] * 5 + ["tune (refine)"]  # lease order: first passes before searches,
        assert [w[4] for w in wanted[1:4]] == ["2", "1", "1"] and [w[3] for w in wanted[1:4]] == ["2", "2", "1"]  # then most callers,
        assert wanted[1][-1] == missed[5].key and wanted[-1][3] == "2"  # then most demand first
        assert "<img src=x onerror=alert(1)>" in browser.find_element(By.ID, "quarantine").text  # text, not an element
        assert browser.find_elements(By.CSS_SELECTOR, "img, script") == []
        assert str(tmp_path) not in browser.page_source  # where the store lives is the server's business
        assert "mallory <script>" in browser.find_element(By.ID, "recent").text
        holders = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in browser.find_elements(By.CSS_SELECTOR, "#callers tr")[1:]]
        listed = {item["name"]: item for item in httpx.get(f"{srv.url}/v1/callers").json()["items"]}
        assert [h[0] for h in holders] == ["admin-tester", "mallory <script>"]  # most bytes held first; a name is text
        assert holders[0][1] == f"{listed['admin-tester']['records_bytes'] / 2**10:,.2f} KiB" and holders[0][3] == "6"  # records; misses awaiting
        assert holders[1][2] == "1" and holders[1][5] == f"{listed['mallory <script>']['kept_bytes']} B" != "0 B"  # a claim awaiting; one quarantined
        screenshot = DOCS_SCREENSHOT if os.environ.get("SCHEDHUB_UPDATE_DOCS") == "1" else tmp_path / "dashboard.png"
        browser.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 10_000


def test_a_store_from_before_the_aggregates_gets_them_when_opened(tmp_path: Path) -> None:
    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put_many([tuned(w, 1e-4, 1e-3) for w in range(1, 6)])
        before = reg.store.aggregates()
        with reg.store.write() as txn:  # what a store written before the aggregates looks like
            txn.drop(reg.store.dbs["agg"], delete=False)
            txn.delete(b"index:agg", db=reg.store.dbs["meta"])
        assert reg.store.aggregates()["op"] == {}
    with LocalRegistry(tmp_path, sync=False) as reg:
        after = reg.store.aggregates()
    assert after == before and sum(after["op"].values()) == 5 and after["speedup"]
    assert json.dumps(after)  # plain values


def test_the_dashboard_reads_each_rankings_top_and_kept_counts_not_every_name(tmp_path: Path) -> None:
    """Ops, targets, fingerprints and pushers grow with the store (a pusher may name a new op with every
    record): the dashboard reads each ranking's first rows and /v1/stats the kept counts of names."""
    from schedhub.registry import _aggregates, _store

    long_target = canonical_target({"kind": "llvm", "mcpu": "znver5", "num-cores": 2, "keys": ["cpu"], "libs": ["x" * 60] * 60})
    with LocalRegistry(tmp_path, sync=False) as reg:
        for w in range(1, 31):  # op k has k keys (k = 1..7), one target of 3,700 characters (an LMDB key holds 511 bytes)
            reg.put(tuned(w, 1e-4, 1e-3 * w, op=f"fused_op_{min(w % 8, 7) or 1}", **({"target": long_target} if w == 30 else {})), f"p{w % 4}")
        everything = reg.store.aggregates()
        top = reg.store.aggregates(top=3)
        for dimension, counts in everything.items():
            weight = (lambda kv: (-kv[1]["n"], kv[0])) if dimension == "speedup" else (lambda kv: (-kv[1], kv[0]))
            assert top[dimension] == dict(sorted(counts.items(), key=weight)[:3]), dimension
        assert len(everything["target"]) == 2 and any(len(name.encode()) <= _aggregates.MAX_AGG_NAME and "…" in name for name in everything["target"])
        assert reg.stats()["coverage"] == {"ops": len(everything["op"]), "targets": 2, "fingerprints": 1}
        (lone,) = [s for s in reg.summaries() if s.target == long_target]
        reg.quarantine(lone.key, reg.get(lone.key)[0].trace_id, "a test")  # the target's last key leaves
        assert reg.stats()["coverage"]["targets"] == 1 and len(reg.store.aggregates()["target"]) == 1
        with reg.store.write() as txn:  # a store from before the ranking
            txn.drop(reg.store.dbs["agg_rank"], delete=False)
            txn.delete(_store.AGG_RANK, db=reg.store.dbs["meta"])
        assert reg.stats()["coverage"]["targets"] == 1  # counted from the aggregates themselves
        expected = reg.store.aggregates()
    with LocalRegistry(tmp_path, sync=False) as reg:
        assert reg.store.aggregates(top=100) == expected and reg.stats()["coverage"]["ops"] == len(expected["op"])


def test_the_served_speedup_is_each_keys_served_record_not_an_ops_every_push(tmp_path: Path) -> None:
    """An op's aggregate averaged every verified push, runners-up included (12.4x shown where the served records gave
    1x and 36.9x): the dashboard shows each key's served record, by op and shape."""
    from schedhub.registry import _dashboard

    with LocalRegistry(tmp_path, sync=False) as reg:
        reg.put(tuned(50, 1e-4, 5e-3, op="fused_dense"))  # served: 50x
        reg.put(tuned(50, 2.5e-3, 5e-3, variant=1, op="fused_dense"))  # a runner-up of the same key: 2x
        reg.put(tuned(51, 1e-3, 1e-3, op="fused_dense"))  # another kernel under the same op name: 1x
        data = reg.dashboard_data(top=_dashboard.TOP)
        mean = 1.005  # make_record's run_secs: [secs, 1.01 secs]
        assert sorted(s["speedup"] for s in data["served"]) == pytest.approx([1 / mean, 50 / mean])
        assert data["aggregates"]["speedup"]["fused_dense"]["geomean"] == pytest.approx((50 * 2 * 1) ** (1 / 3) / mean)  # what it showed
        page = _dashboard.render(reg.stats() | {"coverage": reg.store.stats()["coverage"]}, data, [], {})
    assert f"fused_dense 50x64: {50 / mean:g}×" in page and f"fused_dense 51x64: {1 / mean:g}×" in page
    assert f"<code>{FINGERPRINT}</code>" in page  # the compiler build whole, where a bar's label cut it at 28 characters


def test_the_dashboard_names_each_network_how_much_of_it_is_held_and_its_estimate_against_its_goal(tmp_path: Path, browser: webdriver.Chrome) -> None:
    """The networks compiles (and ``schedhub tune --until``) reported, newest first: kernels, how many hold a verified
    record, Σ calls × their best time (a lower bound until all are held) against the goal; keys a compile asked only to
    weigh a rewrite are counted apart from its misses; a long op name is not cut."""
    long_op = "fused_conv2d_transpose_add_relu_concatenate_conv2d"  # 50 characters: whole (the page cut at 28)
    secs = {w: 1e-4 * w for w in range(1, 7)}
    mean = {w: (s + s * 1.01) / 2 for w, s in secs.items()}  # a verified record's time: the mean of its runs
    key = {w: make_record(w, 1e-4).key for w in range(1, 9)}
    tokens = {TOKEN: "admin-tester", "reader-token": Principal("bob", "read")}
    with ServerThread(tmp_path / "served", tokens=tokens, sync=False) as srv, RegistryClient(srv.url, token=TOKEN) as admin:
        admin.put_many([tuned(w, s, 4e-3, op=long_op if w == 6 else None) for w, s in secs.items()])
        admin.report_network([(key[1], 1), (key[2], 2), (key[3], 3), (key[7], 1)], name="resnet <b>50</b>", goal={"label": "onnxruntime", "secs": 0.01})
        admin.report_network([(key[4], 1), (key[5], 2)], name="encoder", goal={"label": "openvino", "secs": 2e-3})
        admin.report_network([(key[6], 4)])
        with RegistryClient(srv.url, token="reader-token") as bob:
            bob.report_network([(key[4], 1), (key[5], 2)], name="renamed by bob", goal={"label": "mine", "secs": 1.0})  # the first reporter's stay
        admin.report_network([(key[4], 1), (key[5], 2)])  # reported again, last
        admin.lookup([key[1], key[8], key[2], key[7]], weighing=[key[2], key[7]])
        for weighing in ([key[3]], [{"a": 1}], "x"):  # a key not asked, an unhashable item, not a list: refused whole
            refused = httpx.post(f"{srv.url}/v1/lookup", json={"keys": [key[1]], "weighing": weighing}, headers={"authorization": f"Bearer {TOKEN}"})
            assert refused.status_code == 400 and "weighing" in refused.json()["message"], refused.text
        listed = admin.recent_networks()

        browser.get(srv.url + "/")
        rows = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in browser.find_elements(By.CSS_SELECTOR, "#networks tr")[1:]]
        text = {el.get_attribute("id"): el.text for el in browser.find_elements(By.CSS_SELECTOR, "[id]")}
        labels = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#chart-ops text")]

    assert [n["name"] for n in listed] == ["encoder", None, "resnet <b>50</b>"]  # the last reported first
    encoder, unnamed, resnet = listed
    assert (encoder["kernels"], encoder["held"], encoder["complete"]) == (2, 2, True)
    assert encoder["estimate_secs"] == pytest.approx(mean[4] + 2 * mean[5])
    assert (resnet["kernels"], resnet["held"], resnet["complete"]) == (4, 3, False)
    assert resnet["estimate_secs"] == pytest.approx(mean[1] + 2 * mean[2] + 3 * mean[3])
    assert [r[0] for r in rows] == ["encoder", f"unnamed {unnamed['network'][:12]}", "resnet <b>50</b>"]  # a name is text
    assert rows[0][1:5] == ["2", "2 (100%)", f"{encoder['estimate_secs'] * 1e3:.3g} ms", f"openvino 2 ms ({2e-3 / encoder['estimate_secs']:.2f}×)"]
    assert rows[2][1:5] == ["4", "3 (75%)", f"≥ {resnet['estimate_secs'] * 1e3:.3g} ms", "onnxruntime 10 ms"]  # no ratio to a lower bound
    assert rows[1][4] == "–"
    assert (text["lookups-hits"], text["lookups-misses"], text["lookups-weighed"]) == ("1", "1", "2")
    assert long_op in labels
