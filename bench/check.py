#!/usr/bin/env python3
"""Independent correctness checker for the benchmark contenders' outputs.

Shares nothing with the contenders: its own Kafka client (confluent-kafka), JSON parsing
and reference model, built from the input topic. Reads the output with
isolation.level=read_committed and checks one of seven output contracts:

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
  sequence     workload SEQ (bench/rules-seq.json): per key, non-overlapping matches of
               view -> cart -> purchase (within 24 h), each the model's exactly: the same
               input records (`sequence.sources`, partition and offset), the same events
               in `value`, in the same order, and nothing else. The model follows
               docs/rules.md: at most one partial per number of steps matched, the
               later-started one kept (an equal start keeps the one already there); an
               event matching no step leaves the partials; a completed match clears them.
               Processing time (default): each key's events in partition (arrival) order.
               Their times are the engine's wall clock, unknown here: two consecutive
               events of a key at most TIE_OFFSETS apart in their partition may share a
               millisecond, so the output must be the model's for one assignment of equal
               or increasing times (a tie only changes which of two same-level partials
               is kept); `within` is wall-clock, 24 h, and cannot bite in a run.
  sequence-et  the same in event time: late events (below the watermark when they arrive) are
               dead-lettered; the model's watermark is the slowest partition's newest
               event time - 2 s over the whole input, and the events it passed (ts + 1 <=
               watermark: their timer fired) are matched per key in ts order, ties in
               arrival order, with `within` on ts; `started`/`ended` are the first and
               last event's ts. With --dead-letter, its records must be the late events:
               none when no event is more than 2 s older than one before it in its
               partition (the generator's re-sends reach back ~1 s); otherwise each must
               be such an event (which of them were late depends on how partitions
               interleaved) and they are left out.

--events-from TOPIC: the input is another encoding of TOPIC's JSON events (the Avro twin
the generator writes, record for record at the same partition and offset, same key): the
model is computed from TOPIC, and the check first requires --input to hold exactly
TOPIC's keys at TOPIC's partitions and offsets, each value in the Confluent wire format
(byte 0 and a 4-byte schema id). Every output's `source`, where it has one, must then
name --input, a record of it and that record's key; the workload contract requires one
on every output and that it be the record the output is for: a `count` of n the key's
n-th event, a `sum-<type>` of count m the (key, type)'s m-th, a `dedup` the first
sighting of its event_id, its `value` equal to that JSON event (what streamstate's rule
outputs carry; no other contender reads such a twin).

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
SEQ_RULE = "seq-view-cart-purchase"
SEQ_STEPS = ("view", "cart", "purchase")
SEQ_WITHIN_MS = 24 * 3600 * 1000
# Most events a contender handles in one millisecond (wall clock), as a distance in a
# partition's offsets: two events of a key closer than this may share a processing time.
TIE_OFFSETS = 1000
# Most tie assignments followed at once for one key before giving up on it.
MAX_BRANCHES = 4096


def read_topic(bootstrap, topic, timeout_s=600, partitions=False, full=False):
    """(key, value) of every committed record, or (key, value, partition) with `partitions`,
    or (key, value, partition, offset, headers) with `full`; in offset order per partition."""
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
                    out.append((m.key(), m.value(), m.partition(), m.offset(), m.headers()) if full else
                               (m.key(), m.value(), m.partition()) if partitions else (m.key(), m.value()))
    finally:
        c.close()


def topic_partitions(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-checker-{uuid.uuid4()}"})
    try:
        md = c.list_topics(topic, timeout=30).topics.get(topic)
        if md is None or md.error is not None:
            raise ValueError(f"topic {topic}: {md.error if md else 'missing'}")
        return sorted(md.partitions)
    finally:
        c.close()


def seq_advance(partials, t, etype, ident, bounded):
    """One event (type `etype`, input record `ident`, time `t`) against one key's partials
    (a tuple of (start, steps matched, idents), at most one per steps matched): the new
    partials and the completed match (idents) or None. `bounded`: `within` is checked on
    `t` (event time); in processing time the times are ranks and `within` cannot bite."""
    kept = []

    def keep(p):
        for i, q in enumerate(kept):
            if q[1] == p[1]:
                if q[0] < p[0]:  # the later-started dominates; an equal start keeps q
                    kept[i] = p
                return
        kept.append(p)

    done = None

    def moved(p):
        nonlocal done
        if p[1] == len(SEQ_STEPS):
            if done is None or done[0] > p[0]:
                done = p
        else:
            keep(p)

    for p in partials:
        in_bound = t >= p[0] and (not bounded or t - p[0] <= SEQ_WITHIN_MS)
        if in_bound and etype == SEQ_STEPS[p[1]]:
            moved((p[0], p[1] + 1, p[2] + (ident,)))
        else:
            keep(p)  # an event that cannot advance it leaves it as it was
    if etype == SEQ_STEPS[0]:
        moved((t, 1, (ident,)))
    if done is not None:
        return (), done[2]  # skip past last event: a match clears every partial
    return tuple(kept), None


def seq_processing_time(events, got):
    """Whether some assignment of processing times to one key's events (arrival order;
    (type, ident, partition offset)) gives exactly the matches `got` (lists of idents):
    times never decrease and two consecutive events share one only when at most
    TIE_OFFSETS apart. Branches are followed together, merged when equal (times as ranks
    among the partials' starts and the current time), and dropped at the first match that
    is not the output's next one. Returns (ok, the matches with strictly increasing times,
    branches at most); ok is None when more than MAX_BRANCHES were needed (not decided)."""
    strict, partials = [], ()
    for n, (etype, ident, _) in enumerate(events):
        partials, m = seq_advance(partials, n, etype, ident, False)
        if m is not None:
            strict.append(m)
    if strict == got:
        return True, strict, 1
    branches = {((), 0, 0)}  # (partials, current time, matches so far)
    widest, prev = 1, None
    for etype, ident, offset in events:
        tie = prev is not None and offset - prev <= TIE_OFFSETS
        prev = offset
        nxt = set()
        for partials, now, k in branches:
            for t in ((now, now + 1) if tie else (now + 1,)):
                ps, m = seq_advance(partials, t, etype, ident, False)
                if m is not None:
                    if k >= len(got) or m != got[k]:
                        continue
                    k2 = k + 1
                else:
                    k2 = k
                ranks = {v: i for i, v in enumerate(sorted({p[0] for p in ps} | {t}))}
                nxt.add((tuple((ranks[p[0]], p[1], p[2]) for p in ps), ranks[t], k2))
        branches = nxt
        widest = max(widest, len(branches))
        if len(branches) > MAX_BRANCHES:
            return None, strict, widest
        if not branches:
            break
    return any(k == len(got) for _, _, k in branches), strict, widest


def close(got, want):
    return abs(got - want) <= 1e-6 * max(1.0, abs(want))


def check_twin(twin, rows, violation):
    """--events-from: `twin` (every record of --input, full) must hold `rows`' keys (the
    JSON topic's, full) at the same partitions and offsets, nothing more, each value in
    the Confluent wire format. Returns the schema ids seen."""
    want = {(p, off): k for k, _, p, off, _ in rows}
    got, ids = {}, collections.Counter()
    for k, v, p, off, _ in twin:
        got[(p, off)] = k
        if v is None or len(v) < 5 or v[0] != 0:
            violation("twin_not_wire_format", f"{p}/{off}: {(v or b'')[:8]!r}")
        else:
            ids[int.from_bytes(v[1:5], "big")] += 1
    for pos in want.keys() - got.keys():
        violation("twin_missing", f"{pos}: no record where the JSON topic has one")
    for pos in got.keys() - want.keys():
        violation("twin_unexpected", f"{pos}: a record where the JSON topic has none")
    for pos in want.keys() & got.keys():
        if want[pos] != got[pos]:
            violation("twin_key_wrong", f"{pos}: key {got[pos]!r}, the JSON twin's {want[pos]!r}")
    return dict(ids)


def check(args):
    sequence = args.contract.startswith("sequence")
    full = sequence or args.events_from is not None
    rows = read_topic(args.bootstrap, args.events_from or args.input, partitions=True, full=full)
    inputs = rows if sequence or not full else [(k, v, p) for k, v, p, _, _ in rows]
    outputs = read_topic(args.bootstrap, args.output)
    problems = collections.Counter()
    examples = []

    def violation(kind, detail):
        problems[kind] += 1
        if len(examples) < 10:
            examples.append({"kind": kind, "detail": detail})

    duplicates = 0
    extra = {}
    # --events-from: the input records by (partition, offset), as decoded JSON, for the
    # outputs' `source`; the twin checked record for record first.
    events_at = None
    if args.events_from:
        extra["events_from"] = args.events_from
        extra["twin_schema_ids"] = check_twin(read_topic(args.bootstrap, args.input, full=True), rows, violation)
        events_at = {(p, off): json.loads(v) for _, v, p, off, _ in rows}

    def source_of(o):
        """(partition, offset) of the input record an output names, checked against the
        input, or None (no source, or a wrong one: a violation)."""
        src = o.get("source") if isinstance(o, dict) else None
        if not isinstance(src, dict):
            return None
        try:
            pos = (int(src["partition"]), int(src["offset"]))
        except (KeyError, TypeError, ValueError):
            violation("source_wrong", str(src)[:200])
            return None
        if src.get("topic") != args.input:
            violation("source_topic_wrong", f"{src.get('topic')!r}, not {args.input!r}")
        elif pos not in events_at:
            violation("source_unknown", f"{pos}: no such input record")
        elif events_at[pos].get("user_id") != o.get("key"):
            violation("source_key_wrong", f"{pos} is {events_at[pos].get('user_id')!r}'s, not {o.get('key')!r}'s")
        else:
            return pos
        return None

    if events_at is not None and args.contract != "workload":
        for _, v in outputs:
            try:
                source_of(json.loads(v))
            except ValueError:
                pass  # the contract's own check reports it
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
    elif args.contract.startswith("sequence"):
        event_time = args.contract == "sequence-et"
        # Input records by (partition, offset); each key's events in arrival order.
        by_id, arrival, newest = {}, collections.defaultdict(list), {}
        late_candidates, may_be_late = set(), 0
        for _, v, p, off, _ in inputs:
            e = json.loads(v)
            ts = int(e["ts"])
            by_id[(p, off)] = (e, ts)
            # Late means below the watermark on arrival, and the watermark is at most this
            # partition's newest event time so far - 2 s.
            if p in newest and ts < newest[p] - OUT_OF_ORDERNESS_MS:
                late_candidates.add((p, off))
            newest[p] = max(newest.get(p, ts), ts)
            arrival[e["user_id"]].append((e["type"], (p, off), off, ts))
        late = set()
        if args.dead_letter:
            for _, _, _, _, headers in read_topic(args.bootstrap, args.dead_letter, full=True):
                h = {k: (x or b"").decode() for k, x in headers or []}
                ident = (int(h.get("streamstate.source.partition", -1)), int(h.get("streamstate.source.offset", -1)))
                if h.get("streamstate.error.reason") != "late_event" or not event_time:
                    violation("dead_letter_unexpected", str(h)[:200])
                elif ident not in late_candidates:
                    violation("late_wrong", f"{ident} dead-lettered as late, never 2 s behind its partition")
                elif ident in late:
                    violation("duplicates", f"{ident} dead-lettered twice")
                else:
                    late.add(ident)
            extra.update({"dead_lettered": len(late), "late_candidates": len(late_candidates)})
        watermark = None
        if event_time:
            # The final watermark: every partition's newest non-late event time, the
            # slowest one, - 2 s (a partition that delivered nothing holds it at none).
            newest = {}
            for ident, (_, ts) in by_id.items():
                if ident not in late:
                    newest[ident[0]] = max(newest.get(ident[0], ts), ts)
            parts = topic_partitions(args.bootstrap, args.input)
            if all(p in newest for p in parts):
                watermark = min(newest[p] for p in parts) - OUT_OF_ORDERNESS_MS
            extra["watermark_ms"] = watermark
        got = collections.defaultdict(list)
        for _, v in outputs:
            o = json.loads(v)
            seq = o.get("sequence") if isinstance(o.get("sequence"), dict) else {}
            try:
                ids = tuple((int(s["partition"]), int(s["offset"])) for s in seq.get("sources"))
            except (TypeError, KeyError, ValueError):
                ids = None
            if (o.get("rule_id") != SEQ_RULE or o.get("kind") != "sequence" or ids is None
                    or not isinstance(o.get("value"), list)):
                violation("unexpected", str(o)[:200])
                continue
            k = o.get("key")
            if len(ids) != len(SEQ_STEPS) or any(i not in by_id or by_id[i][0]["user_id"] != k for i in ids):
                violation("sequence_unexpected", f"{k}: sources {ids}")
                continue
            if o["value"] != [by_id[i][0] for i in ids]:
                violation("sequence_value_wrong", f"{k}: {str(o['value'])[:160]}")
            if event_time and (seq.get("started"), seq.get("ended")) != (by_id[ids[0]][1], by_id[ids[-1]][1]):
                violation("sequence_time_wrong", f"{k}: {seq.get('started')}..{seq.get('ended')} for {ids}")
            got[k].append(ids)
        matches = widest = tied = 0
        for k, evs in arrival.items():
            if event_time:
                passed = [x for x in evs if x[1] not in late and watermark is not None and x[3] + 1 <= watermark]
                want, partials = [], ()
                for etype, ident, _, ts in sorted(passed, key=lambda x: x[3]):  # stable: ties in arrival order
                    partials, m = seq_advance(partials, ts, etype, ident, True)
                    if m is not None:
                        want.append(m)
                ok = got.get(k, []) == want
            else:
                ok, want, branches = seq_processing_time([x[:3] for x in evs], got.get(k, []))
                widest = max(widest, branches)
                tied += ok and branches > 1
            matches += len(want)
            if ok is None:
                violation("sequence_undecided", f"{k}: over {MAX_BRANCHES} tie assignments ({len(evs)} events)")
            elif not ok:
                kind = "sequence_missing" if len(got.get(k, [])) < len(want) else "sequence_wrong"
                violation(kind, f"{k}: got {got.get(k, [])}, model {want}")
        for k in got.keys() - arrival.keys():
            violation("sequence_unexpected", f"{k}: no input for this key")
        extra.update({"matches_model": matches, "matches_output": sum(map(len, got.values())),
                      "keys_matching_with_a_tie": tied, "tie_branches_max": widest, "event_time": event_time})
    else:
        per_key = collections.Counter()
        distinct = set()
        sums = collections.defaultdict(float)
        per_type = collections.Counter()
        # --events-from: each input record's rank among its key's and its (key, type)'s
        # events, and the first sighting of each (key, event_id). A key's events are in one
        # partition, so offset order is their order.
        rank, first_at = {}, {}
        for k, v, p, off, _ in sorted(rows, key=lambda r: (r[2], r[3])) if events_at is not None else ():
            e = events_at[(p, off)]
            k = e["user_id"]
            rank[(p, off)] = (per_key[k] + 1, per_type[(k, e["type"])] + 1)
            per_key[k] += 1
            per_type[(k, e["type"])] += 1
            first_at.setdefault((k, e["event_id"]), (p, off))
        per_key.clear()
        per_type.clear()
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
            pos = None
            if events_at is not None:
                pos = source_of(o)
                if pos is None and not isinstance(o.get("source"), dict):
                    violation("source_missing", str(o)[:200])
            if rid == "count":
                counts[k][int(o["value"])] += 1
                if pos is not None and rank[pos][0] != int(o["value"]):
                    violation("source_wrong", f"count {o['value']} of {k} from its event {rank[pos][0]} {pos}")
            elif rid == "dedup":
                dedups[(k, o["value"]["event_id"])] += 1
                if pos is not None and first_at.get((k, o["value"]["event_id"])) != pos:
                    violation("source_wrong", f"dedup of {(k, o['value']['event_id'])} from {pos}, first "
                              f"sighting {first_at.get((k, o['value']['event_id']))}")
                elif pos is not None and o["value"] != events_at[pos]:
                    violation("dedup_value_wrong", f"{pos}: {str(o['value'])[:160]}")
            elif rid == "sum-by-type" or (isinstance(rid, str) and rid.startswith("sum-")):
                # bench/rules-grouped.json: one rule, the type in the output's group.
                t = o["group"]["value"] if rid == "sum-by-type" else rid[4:]
                n = int(o["count"])
                sum_counts[(k, t)][n] += 1
                if n == per_type[(k, t)]:
                    last_sum[(k, t)] = float(o["value"])
                if pos is not None and (events_at[pos].get("type") != t or rank[pos][1] != n):
                    violation("source_wrong", f"sum-{t} count {n} of {k} from a {events_at[pos].get('type')} "
                              f"event, its {rank[pos][1]}th {pos}")
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
    ap.add_argument("--contract", choices=["passthrough", "json", "workload", "dedup", "window", "sequence",
                                           "sequence-et"], required=True)
    ap.add_argument("--dead-letter", default=None, help="sequence, sequence-et: the contender's dead-letter topic, checked too")
    ap.add_argument("--events-from", default=None, metavar="TOPIC",
                    help="the input is TOPIC's events in another encoding (same partitions, offsets and keys): "
                    "the model comes from TOPIC, the twin and the outputs' sources are checked (see above)")
    ap.add_argument("--at-least-once", action="store_true")
    args = ap.parse_args()
    if args.events_from and args.contract == "passthrough":
        ap.error("--events-from: passthrough compares bytes, which differ between encodings")
    try:
        sys.exit(check(args))
    except (TimeoutError, KeyError, ValueError) as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        sys.exit(2)


if __name__ == "__main__":
    main()
