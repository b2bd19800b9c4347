"""The operator's page at ``/``: server-rendered HTML with inline SVG charts, no script, no CDN.

Everything on it comes from kept aggregates (``Store.aggregates``), bounded range scans (the newest
log entries, the most wanted jobs, the first quarantined records) and the server's own lookup
activity, so it costs the same on a store of 100 keys or 100,000. Every number a test or a person
may check against ``/v1/stats`` carries an ``id``.
"""

from __future__ import annotations

import html
import math
import time
from collections import Counter, deque
from typing import Any

from ._keys import target_kind
from ._queue import task_label
from ._usage import SCANNED_CALLERS, size_text

BUCKET_SECS = 600  # lookup activity in 10-minute buckets
BUCKETS = 144  # the last 24 hours
TOP = 12  # rows per ranking (ops, targets, pushers, speedups)
CHAR_PX = 7  # a 12 px label's character, wide enough for most fonts' average
LABEL_MAX_PX = 420  # a bar chart's labels take at most this; a longer one is cut in its middle, and its bar's tooltip says it whole


class Activity:
    """What the compile hooks asked this server since it started: per bucket, keys found, missed, and
    missed keys answered with transfer candidates."""

    def __init__(self) -> None:
        self.buckets: deque[tuple[int, Counter[str]]] = deque(maxlen=BUCKETS)

    def add(self, **counts: int) -> None:
        bucket = int(time.time() // BUCKET_SECS)
        if not self.buckets or self.buckets[-1][0] != bucket:
            self.buckets.append((bucket, Counter()))
        self.buckets[-1][1].update(counts)

    def series(self) -> list[tuple[int, Counter[str]]]:
        return list(self.buckets)


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _ago(at: float | None, now: float) -> str:
    if not at:
        return "–"
    secs = max(0.0, now - at)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if secs >= size:
            return f"{secs / size:.1f} {unit}"
    return f"{secs:.0f} s"


def target_label(target: str) -> str:
    """A canonical target text, short: its kind and CPU or architecture."""
    import json

    try:
        obj = json.loads(target)
    except ValueError:
        return target[:40]
    detail = obj.get("mcpu") or obj.get("arch") or ""
    return f"{target_kind(target)} {detail}".strip()


def bars(items: list[tuple[str, float]], *, unit: str = "", log: bool = False, width: int = 520, ident: str = "") -> str:
    """Horizontal bars (log scale when asked), one row per item, values printed at the bar's end."""
    if not items:
        return "<p class=muted>nothing yet</p>"
    row = 20
    label_w = min(LABEL_MAX_PX, max(60, CHAR_PX * max(len(label) for label, _ in items) + 12))  # the longest label whole, as far as it fits
    width = max(width, label_w + 200)
    top = max(v for _, v in items) or 1.0
    scale = (lambda v: math.log10(max(v, 1.0)) / max(math.log10(top), 1e-9)) if log and top > 1 else (lambda v: v / top)
    parts = [f'<svg role="img" id="{e(ident)}" width="{width}" height="{row * len(items) + 4}" xmlns="http://www.w3.org/2000/svg">']
    for i, (label, value) in enumerate(items):
        length = max(1.0, (width - label_w - 70) * scale(value))
        y = i * row + 2
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end" font-size="12">{e(_fitted(label, label_w))}</text>'
                     f'<rect x="{label_w}" y="{y + 3}" width="{length:.1f}" height="{row - 6}" fill="#4a7ab5"><title>{e(label)}: {value:g}{unit}</title></rect>'
                     f'<text x="{label_w + length + 4:.1f}" y="{y + 14}" font-size="12">{value:.3g}{e(unit)}</text>')  # fmt: skip
    return "".join(parts) + "</svg>"


def _fitted(label: str, label_w: int) -> str:
    """``label`` whole where it fits ``label_w`` pixels, else its start and end around an ellipsis (two labels that
    differ only at their ends, as kernels' names do, stay apart)."""
    fits = (label_w - 12) // CHAR_PX
    if len(label) <= fits:
        return label
    head = (fits - 1) // 2
    return label[:head] + "…" + label[len(label) - (fits - 1 - head) :]


def timeline(series: list[tuple[int, Counter[str]]], width: int = 720, height: int = 140) -> str:
    """Stacked columns per bucket: hits, transfers offered, other misses."""
    if not series:
        return "<p class=muted>no lookups since the server started</p>"
    colours = (("hits", "#3b8f4f"), ("transfers", "#e0a030"), ("misses", "#c0463c"))
    top = max(c["hits"] + c["misses"] for _, c in series) or 1
    step = width / max(len(series), 1)
    parts = [f'<svg role="img" id="chart-lookups" width="{width}" height="{height + 18}" xmlns="http://www.w3.org/2000/svg">']
    for i, (bucket, c) in enumerate(series):
        y = float(height)
        values = {"hits": c["hits"], "transfers": c["transfers"], "misses": c["misses"] - c["transfers"]}
        for name, colour in colours:
            h = height * values[name] / top
            y -= h
            parts.append(f'<rect x="{i * step + 1:.1f}" y="{y:.1f}" width="{max(step - 2, 1):.1f}" height="{h:.1f}" fill="{colour}">'
                         f'<title>{time.strftime("%H:%M", time.gmtime(bucket * BUCKET_SECS))} UTC: {values[name]} {name}</title></rect>')  # fmt: skip
    first, last = series[0][0], series[-1][0]
    parts.append(f'<text x="0" y="{height + 14}" font-size="11">{time.strftime("%H:%M", time.gmtime(first * BUCKET_SECS))} UTC</text>'
                 f'<text x="{width}" y="{height + 14}" font-size="11" text-anchor="end">{time.strftime("%H:%M", time.gmtime(last * BUCKET_SECS))} UTC</text>')  # fmt: skip
    legend = " ".join(f'<span style="color:{c}">■</span> {n}' for n, c in colours)
    return "".join(parts) + f"</svg><div class=muted>{legend} (keys per 10 minutes)</div>"


def table(header: list[str], rows: list[list[str]], ident: str) -> str:
    if not rows:
        return "<p class=muted>none</p>"
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table id="{e(ident)}"><tr>{head}</tr>{body}</table>'


def _cut(total: int) -> str:
    """A ranking's heading says when it shows only its first :data:`TOP` rows."""
    return f" (the first {TOP} of {total:,})" if total > TOP else ""


def _top(counts: dict[str, int], label: Any = str) -> list[tuple[str, float]]:
    return [(label(k), float(v)) for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]]


STYLE = """body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}h1{margin:0 0 4px}
h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd}.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #ccc;border-radius:6px;padding:8px 14px;min-width:110px}.card b{display:block;font-size:22px}
.muted{color:#777}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
code{font-size:12px;word-break:break-all}.grid{display:grid;grid-template-columns:1fr 1fr;gap:16px}"""


def _ms(secs: float) -> str:
    return f"{secs * 1e3:.3g} ms"


def networks_section(networks: list[dict[str, Any]], now: float) -> str:
    """The networks compiles reported last: each one's kernels, how many the registry holds a verified record of, the
    estimate those give (Σ calls × best time; a lower bound until every kernel is held) against its goal."""
    rows = []
    for n in networks:
        name = e(n["name"]) if n.get("name") else f"<span class=muted>unnamed</span> <code>{e(n['network'][:12])}</code>"
        share = n["held"] / n["kernels"] if n["kernels"] else 0.0
        estimate = _ms(n["estimate_secs"]) if n["complete"] else (f"≥ {_ms(n['estimate_secs'])}" if n["held"] else "–")
        goal = n.get("goal")
        against = "–"
        if goal:
            against = f"{e(goal['label'])} {_ms(goal['secs'])}"
            if n["complete"] and n["estimate_secs"] > 0:
                against += f" ({goal['secs'] / n['estimate_secs']:.2f}×)"
        rows.append([name, f"{n['kernels']:,}", f"{n['held']:,} ({share:.0%})", estimate, against, f"{n['reports']:,}", e(n.get("by") or "local"),
                     e(_ago(n.get("last_seen"), now))])  # fmt: skip
    return ("<h2>Networks</h2><p class=muted>the networks compiles reported last; a kernel is held when the registry has a verified record of "
            "it; the estimate is Σ calls × each held kernel's best time (≥: a lower bound until every kernel is held), and the goal's "
            "ratio is its latency over that estimate (above 1: faster than the goal)</p>"
            + table(["network", "kernels", "held", "estimate", "goal", "reports", "reported by", "last seen"], rows, "networks"))  # fmt: skip


def render(stats: dict[str, Any], data: dict[str, Any], activity: list[tuple[int, Counter[str]]], since_start: dict[str, int]) -> str:
    """The whole page."""
    now = time.time()
    agg, cov = data["aggregates"], stats["coverage"]
    cards = [("keys", stats["keys"], "keys"), ("ops", cov["ops"], "ops"), ("targets", cov["targets"], "targets"),
             ("fingerprints", cov["fingerprints"], "compiler builds"), ("measurements", stats["measurements"], "log entries"),
             ("quarantined", stats["quarantined"], "quarantined")]  # fmt: skip
    queue = stats["queue"]
    totals = Counter({k: since_start.get(k, 0) for k in ("hits", "misses", "transfers")})
    out = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>schedhub registry</title><style>{STYLE}</style></head><body>",
           f"<h1>schedhub registry</h1><div class=muted>change cursor "
           f"<span id=cursor>{stats['cursor']}</span>; API <a href='/openapi.json'>/openapi.json</a>, figures <a href='/v1/stats'>/v1/stats</a></div>",
           networks_section(data.get("networks") or [], now), "<h2>Coverage</h2><div class=cards>"]  # fmt: skip
    out += [f'<div class=card><b id="{ident}">{value:,}</b>{e(label)}</div>' for ident, value, label in cards]
    out.append(f"</div><div class=grid><div><h3>Keys per op{_cut(cov['ops'])}</h3>" + bars(_top(agg["op"]), ident="chart-ops") + "</div>")
    out.append(f"<div><h3>Keys per target{_cut(cov['targets'])}</h3>" + bars(_top(agg["target"], target_label), ident="chart-targets") + "</div>")
    builds = [[f"<code>{e(name)}</code>", f"{int(count):,}"] for name, count in _top(agg["fingerprint"])]  # a fingerprint whole: a bar's label cuts it
    out.append(f"<div><h3>Keys per compiler build{_cut(cov['fingerprints'])}</h3>" + table(["compiler build", "keys"], builds, "fingerprints-table") + "</div>")
    served = sorted(data["served"], key=lambda s: -s["speedup"])
    kept = sum(bool(s.get("keeps_default")) for s in served)
    out.append(f"<div><h3>What a compile is served: each kernel's served record against TVM's default{_cut(len(served))}</h3>"
               f"<p class=muted>of the {data['served_read']:,} keys changed last, those whose served record is verified; one bar a key "
               "(op and first argument's shape: one op name may be different kernels in two models). "
               f"<span id=served-defaults>{kept:,}</span> of them keep the default schedule: nothing tuned beat it, timed twice "
               "(marked \u201cdefault kept\u201d)</p>"
               + bars([(f"{s['op']} {s['shape']}" + (" (default kept)" if s.get("keeps_default") else ""), s["speedup"]) for s in served[:TOP]],
                      unit="×", log=True, ident="chart-speedups") + "</div></div>")  # fmt: skip
    out.append(f"<h2>Compiles: lookups since the server started</h2><p><span id=lookups-hits>{totals['hits']:,}</span> keys found, "
               f"<span id=lookups-misses>{totals['misses']:,}</span> missed, of which <span id=lookups-transfers>{totals['transfers']:,}</span> "
               f"got transfer candidates; <span id=misses-reported>{since_start.get('reported', 0):,}</span> misses reported to the queue. "
               f"<span id=lookups-weighed>{since_start.get('weighed', 0):,}</span> more keys were asked only to weigh rewrites a compile "
               "did not take (another layout or packing of the same network) and are counted in neither (one found while weighing stays counted here where the compile then takes it).</p>")  # fmt: skip
    out.append(timeline(activity))
    out.append("<h2>Queue</h2><div class=cards>" + "".join(f'<div class=card><b id="queue-{e(s)}">{n:,}</b>{e(s)}</div>' for s, n in queue.items()) + "</div>")
    wanted = [[e(task_label(j)), e(j.get("op", "")), e(target_label(j.get("target", ""))), f"{j.get('demand', 0):,}",
               f"{j['callers']:,}" if isinstance(j.get("callers"), int) else "–", e(_ago(j.get("first_seen"), now)), f"<code>{e(j['key'])}</code>"]
              for j in data["wanted"]]  # fmt: skip
    out.append("<h3>Next to be leased</h3>" + table(["task", "op", "target", "demand", "callers", "waiting", "key"], wanted, "wanted"))
    recent = []
    for ev in data["recent"]:
        what = ev.get("event", "push" + (" (verified)" if ev.get("verified") else " (claim)"))
        secs = ev.get("run_secs") or []
        mean = f"{sum(secs) / len(secs) * 1e6:.3g} µs" if secs else "–"
        recent.append([e(_ago(ev.get("at"), now)), e(what), e(ev.get("by") or "local"), e(ev.get("op", "")), mean, f"<code>{e(ev.get('key', ''))}</code>"])
    out.append("<h2>Recent pushes and verdicts</h2>" + table(["ago", "what", "pushed by", "op", "mean", "key"], recent, "recent"))
    out.append("<div class=grid><div><h3>Pushes per pusher</h3>" + bars(_top(agg["pusher"]), ident="chart-pushers") + "</div><div>")
    quarantined = [[e(_ago(q["at"], now)), e(q["by"] or "local"), e(q["reason"][:160]), f"<code>{e(q['key'])}</code>"] for q in data["quarantined"]]
    out.append("<h3>Quarantine and complaints</h3>" + table(["ago", "pushed by", "reason", "key"], quarantined, "quarantine"))
    out.append(f"<p><span id=complaints>{since_start.get('complaints', 0):,}</span> complaints since the server started.</p></div></div>")
    held = [[e(c["name"] or "local"), size_text(c["records_bytes"]), f"{c['claims_awaiting']:,}", f"{c['misses_awaiting']:,}", size_text(c["claimed_log_bytes"]),
             size_text(c["kept_bytes"])] for c in data["callers"]]  # fmt: skip
    out.append("<h2>Callers holding the most</h2>" + table(["caller", "records in service", "claims awaiting", "misses awaiting", "unverified log",
                                                            "kept history"], held, "callers"))  # fmt: skip
    out.append(f"<p>Of the first {SCANNED_CALLERS:,} callers by name; <code>schedhub callers</code> lists them all.</p>" if data["more_callers"] else "")
    out.append("</body></html>")
    return "".join(out)
