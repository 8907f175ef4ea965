#!/usr/bin/env python3
"""Independent correctness checker for the benchmark contenders' outputs.

Shares nothing with the contenders: its own Kafka client (confluent-kafka), JSON parsing
and reference model, built from the input topic. Reads the output with
isolation.level=read_committed and checks one of five output contracts:

  passthrough  the output holds every input record's (key, value) exactly once, unchanged;
  json         every input event exactly once, as equal JSON, keyed by its user_id;
  workload     the S workload (bench/rules.json; Kafka Streams and Quix emit the same
               records): per key, `count` outputs with counts 1..n once each; one `dedup`
               output per distinct (key, event_id); per (key, type) `sum-<type>` outputs
               with counts 1..m once each and the last value equal to the model's sum
               (or, from bench/rules-grouped.json, `sum-by-type` outputs whose
               `group.value` names the type, checked the same way);
  dedup        workload D (bench/rules-d.json): exactly one `dedup` output per distinct
               (key, event_id), its `value` equal to the event, and nothing else;
  window       workload W (bench/rules-w.json): per key, tumbling 10 s windows on the
               event's `ts`, aligned to the epoch; a window closes when the watermark
               (newest event time - 2 s) passes its end. Four outputs per window
               (`window-count`, `-sum`, `-min`, `-max`, with `window.start`/`end`), each
               equal to the model's value over every input event in the window (a window
               emitted before all its events arrived fails). Every window closed by the
               whole input's watermark must be there once: the ones whose end + 2 s is at
               or below the lowest partition's newest event time (Flink's and streamstate's
               watermark is the slowest partition's; Kafka Streams' and Quix's are per
               partition and close more, which may be there too but must be right).

--at-least-once relaxes "once" to "at least once" and reports the duplicates.
Prints a JSON report; exits 1 on a violation, 2 on a usage/connection error.
"""

import argparse
import collections
import json
import sys
import time
import uuid

from confluent_kafka import Consumer, TopicPartition, OFFSET_BEGINNING


WINDOW_MS = 10_000
OUT_OF_ORDERNESS_MS = 2_000
WINDOW_FNS = ("count", "sum", "min", "max")


def read_topic(bootstrap, topic, timeout_s=600, partitions=False):
    """(key, value) of every committed record, or (key, value, partition) with `partitions`."""
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-checker-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 32 * 1024 * 1024,
    })
    try:
        md = c.list_topics(topic, timeout=30).topics.get(topic)
        if md is None or md.error is not None:
            raise ValueError(f"topic {topic}: {md.error if md else 'missing'}")
        parts = sorted(md.partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out = []
        deadline = time.monotonic() + timeout_s
        while True:
            pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in parts])}
            if all(ends[p] == 0 or pos.get(p, -1) >= ends[p] for p in parts):
                return out
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: end offsets {ends} not reached, at {pos}")
            for m in c.consume(num_messages=10000, timeout=0.5):
                if m.error() is None:
                    out.append((m.key(), m.value(), m.partition()) if partitions else (m.key(), m.value()))
    finally:
        c.close()


def close(got, want):
    return abs(got - want) <= 1e-6 * max(1.0, abs(want))


def check(args):
    inputs = read_topic(args.bootstrap, args.input, partitions=True)
    outputs = read_topic(args.bootstrap, args.output)
    problems = collections.Counter()
    examples = []

    def violation(kind, detail):
        problems[kind] += 1
        if len(examples) < 10:
            examples.append({"kind": kind, "detail": detail})

    duplicates = 0
    extra = {}
    if args.contract == "passthrough":
        want = collections.Counter((k, v) for k, v, _ in inputs)
        got = collections.Counter(outputs)
        for rec, n in want.items():
            if got[rec] < n:
                violation("missing", repr(rec)[:200])
            elif got[rec] > n:
                duplicates += got[rec] - n
        for rec in got.keys() - want.keys():
            violation("unexpected", repr(rec)[:200])
    elif args.contract == "json":
        def canon(k, v):
            return (k, json.dumps(json.loads(v), sort_keys=True))
        want = collections.Counter(canon(json.loads(v)["user_id"].encode(), v) for _, v, _ in inputs)
        got = collections.Counter(canon(k, v) for k, v in outputs)
        for rec, n in want.items():
            if got[rec] < n:
                violation("missing", repr(rec)[:200])
            elif got[rec] > n:
                duplicates += got[rec] - n
        for rec in got.keys() - want.keys():
            violation("unexpected", repr(rec)[:200])
    elif args.contract == "dedup":
        first = {}
        for _, v, _ in inputs:
            e = json.loads(v)
            first.setdefault((e["user_id"], e["event_id"]), e)
        seen = collections.Counter()
        for _, v in outputs:
            o = json.loads(v)
            if o.get("rule_id") != "dedup" or not isinstance(o.get("value"), dict):
                violation("unexpected", str(o)[:200])
                continue
            k = (o.get("key"), o["value"].get("event_id"))
            if k not in first:
                violation("dedup_unexpected", str(k))
                continue
            seen[k] += 1
            if seen[k] == 1 and o["value"] != first[k]:
                violation("dedup_value_wrong", f"{k}: {str(o['value'])[:120]}")
        for k in first:
            if seen[k] == 0:
                violation("dedup_missing", str(k))
        duplicates = sum(n - 1 for n in seen.values() if n > 1)
        extra["distinct"] = len(first)
    elif args.contract == "window":
        model = {}
        newest = {}
        for _, v, p in inputs:
            e = json.loads(v)
            ts, amount = int(e["ts"]), float(e["amount"])
            newest[p] = max(newest.get(p, ts), ts)
            w = (e["user_id"], ts - ts % WINDOW_MS)
            c = model.get(w)
            model[w] = [1, amount, amount, amount] if c is None else [
                c[0] + 1, c[1] + amount, min(c[2], amount), max(c[3], amount)]
        bound = min(newest.values()) if newest else 0
        required = {w for w in model if w[1] + WINDOW_MS + OUT_OF_ORDERNESS_MS <= bound}
        seen = collections.Counter()
        for _, v in outputs:
            o = json.loads(v)
            rid = o.get("rule_id")
            fn = rid[7:] if isinstance(rid, str) and rid.startswith("window-") else None
            win = o.get("window") if isinstance(o.get("window"), dict) else {}
            if fn not in WINDOW_FNS or "start" not in win:
                violation("unexpected", str(o)[:200])
                continue
            w = (o.get("key"), int(win["start"]))
            if w not in model:
                violation("window_unexpected", str(o)[:200])
                continue
            seen[(w, fn)] += 1
            want = model[w][WINDOW_FNS.index(fn)]
            if int(win.get("end", -1)) != w[1] + WINDOW_MS or not close(float(o.get("value")), want):
                violation("window_wrong", f"{w} {fn}: {o.get('value')} != {want} ({str(o)[:120]})")
        for w in required:
            for fn in WINDOW_FNS:
                if seen[(w, fn)] == 0:
                    violation("window_missing", f"{w} {fn} of {model[w]}")
        duplicates = sum(n - 1 for n in seen.values() if n > 1)
        extra.update({"windows": len(model), "windows_required": len(required),
                      "windows_emitted": len({w for w, _ in seen}),
                      "watermark_bound_ms": bound - OUT_OF_ORDERNESS_MS})
    else:
        per_key = collections.Counter()
        distinct = set()
        sums = collections.defaultdict(float)
        per_type = collections.Counter()
        for _, v, _ in inputs:
            e = json.loads(v)
            k = e["user_id"]
            per_key[k] += 1
            distinct.add((k, e["event_id"]))
            sums[(k, e["type"])] += float(e["amount"])
            per_type[(k, e["type"])] += 1
        counts = collections.defaultdict(collections.Counter)
        dedups = collections.Counter()
        sum_counts = collections.defaultdict(collections.Counter)
        last_sum = {}
        for _, v in outputs:
            o = json.loads(v)
            rid, k = o.get("rule_id"), o.get("key")
            if rid == "count":
                counts[k][int(o["value"])] += 1
            elif rid == "dedup":
                dedups[(k, o["value"]["event_id"])] += 1
            elif rid == "sum-by-type" or (isinstance(rid, str) and rid.startswith("sum-")):
                # bench/rules-grouped.json: one rule, the type in the output's group.
                t = o["group"]["value"] if rid == "sum-by-type" else rid[4:]
                n = int(o["count"])
                sum_counts[(k, t)][n] += 1
                if n == per_type[(k, t)]:
                    last_sum[(k, t)] = float(o["value"])
            else:
                violation("unexpected", str(o)[:200])
        for k, n in per_key.items():
            seen = counts.get(k, collections.Counter())
            for i in range(1, n + 1):
                if seen[i] == 0:
                    violation("count_missing", f"{k} count {i} of {n}")
                    break
            duplicates += sum(c - 1 for c in seen.values() if c > 1)
            if any(i > n or i < 1 for i in seen):
                violation("count_beyond_model", f"{k}: {max(seen)} > {n}")
        for key in distinct:
            if dedups[key] == 0:
                violation("dedup_missing", str(key))
            duplicates += max(0, dedups[key] - 1)
        for key in dedups.keys() - distinct:
            violation("dedup_unexpected", str(key))
        for key, m in per_type.items():
            seen = sum_counts.get(key, collections.Counter())
            if any(seen[i] == 0 for i in range(1, m + 1)):
                violation("sum_missing", f"{key} of {m}")
                continue
            duplicates += sum(c - 1 for c in seen.values() if c > 1)
            got = last_sum.get(key)
            if got is None or not close(got, sums[key]):
                violation("sum_wrong", f"{key}: {got} != {sums[key]}")
    if duplicates and not args.at_least_once:
        violation("duplicates", f"{duplicates} outputs more than once")
    report = {"contract": args.contract, "inputs": len(inputs), "outputs": len(outputs),
              "duplicates": duplicates, **extra, "violations": dict(problems), "examples": examples,
              "ok": not problems}
    print(json.dumps(report))
    return 0 if not problems else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--contract", choices=["passthrough", "json", "workload", "dedup", "window"], required=True)
    ap.add_argument("--at-least-once", action="store_true")
    try:
        sys.exit(check(ap.parse_args()))
    except (TimeoutError, KeyError, ValueError) as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        sys.exit(2)


if __name__ == "__main__":
    main()
