#!/usr/bin/env python3
"""Independent exactly-once checker for streamstate's `count` function.

Shares nothing with the service (or its Rust test rig): its own Kafka client
(confluent-kafka from PyPI), its own JSON parsing and its own reference model.

After a run it reads
  * the input topic below the consumer group's committed offsets,
  * the output and dead-letter topics with isolation.level=read_committed,
and compares them with the model: per key, its good records in (partition, offset) order
get counts 1..n; every good record below the committed offsets has exactly one output
`{"key", "count", "source": {"topic", "partition", "offset"}}` keyed by the state key;
every bad record exactly one dead letter carrying its original bytes (cut to the record
limit) and a `streamstate.error.reason` header naming the checker's own classification.
A second, read_uncommitted pass counts aborted attempts: records visible uncommitted that
no committed reader sees.

Prints a JSON report on stdout; exits 1 on any violation, 2 on a usage/connection error.

  check.py --bootstrap HOST:PORT --group APP_ID --input T --output T --dlq T
           [--ignore-value MARKER] [--expect-all] [--max-record-bytes N] [--max-key-bytes N]
           [--timestamp-field NAME --max-skew-ms N] [--key-field user_id]
"""

import argparse
import json
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition, OFFSET_BEGINNING

MAX_DEPTH = 64  # documented in docs/reliability.md; the service refuses deeper documents


def consumer(bootstrap, isolation, group=None):
    return Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group or f"independent-checker-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 32 * 1024 * 1024,
        "receive.message.max.bytes": 100 * 1024 * 1024,
    })


def partitions_of(c, topic):
    md = c.list_topics(topic, timeout=30)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        raise SystemExit(f"topic {topic}: {t.error if t else 'missing'}")
    return sorted(t.partitions)


def read_topic(bootstrap, topic, isolation, timeout_s=180):
    """Every record of `topic` up to the end offsets seen at the start (LSO for read_committed)."""
    c = consumer(bootstrap, isolation)
    try:
        parts = partitions_of(c, topic)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out = []
        deadline = time.monotonic() + timeout_s
        while True:
            pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in parts])}
            if all(ends[p] == 0 or pos.get(p, -1) >= ends[p] for p in parts):
                return out
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} ({isolation}): end offsets {ends} not reached, at {pos} (open transaction?)")
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    continue
                out.append(m)
    finally:
        c.close()


def committed_offsets(bootstrap, group, topic):
    c = consumer(bootstrap, "read_uncommitted", group=group)
    try:
        parts = partitions_of(c, topic)
        got = c.committed([TopicPartition(topic, p) for p in parts], timeout=30)
        return {tp.partition: max(tp.offset, 0) for tp in got}
    finally:
        c.close()


def headers_of(m):
    return {k: (v.decode("utf-8", "replace") if v is not None else "") for k, v in (m.headers() or [])}


def depth(text):
    d = mx = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "[{":
            d += 1
            mx = max(mx, d)
        elif ch in "]}":
            d = max(d - 1, 0)
    return mx


def parse_time_ms(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    if isinstance(v, str):
        from datetime import datetime
        try:
            dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            return None
        if dt.tzinfo is None:
            return None
        return int(dt.timestamp() * 1000)
    return None


def classify(value, args):
    """(key, None) for a good record, (None, reason) for a bad one; the checker's own rules."""
    if not value:
        return None, "empty"
    if len(value) > args.max_record_bytes:
        return None, "too_large"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not_utf8"
    if depth(text) > MAX_DEPTH:
        return None, "too_deep"
    try:
        doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (ValueError, RecursionError):
        return None, "invalid_json"
    field = doc.get(args.key_field) if isinstance(doc, dict) else None
    if field is None:
        return None, "missing_key"
    if isinstance(field, bool) or not isinstance(field, (str, int, float)):
        return None, "key_not_scalar"
    key = field if isinstance(field, str) else str(field)
    if len(key.encode("utf-8")) > args.max_key_bytes:
        return None, "key_too_large"
    if args.timestamp_field:
        t = doc.get(args.timestamp_field)
        if t is None:
            return None, "missing_timestamp"
        ms = parse_time_ms(t)
        if ms is None:
            return None, "bad_timestamp"
        if args.max_skew_ms is not None and abs(ms - int(time.time() * 1000)) > args.max_skew_ms:
            return None, "event_time_out_of_range"
    return key, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True, help="the job's app_id (its consumer group)")
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--dlq", required=True)
    ap.add_argument("--key-field", default="user_id")
    ap.add_argument("--ignore-value", default=None, help="output values to leave out (markers a test wrote)")
    ap.add_argument("--expect-all", action="store_true", help="every input record must be below the committed offsets")
    ap.add_argument("--max-record-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-key-bytes", type=int, default=4096)
    ap.add_argument("--timestamp-field", default=None)
    ap.add_argument("--max-skew-ms", type=int, default=None)
    args = ap.parse_args()

    violations = []
    examples = []

    def violation(kind, detail):
        violations.append(kind)
        if len(examples) < 20:
            examples.append({"kind": kind, **detail})

    committed = committed_offsets(args.bootstrap, args.group, args.input)
    inputs = read_topic(args.bootstrap, args.input, "read_committed")
    outputs = read_topic(args.bootstrap, args.output, "read_committed")
    dead = read_topic(args.bootstrap, args.dlq, "read_committed")
    outputs_all = read_topic(args.bootstrap, args.output, "read_uncommitted")
    dead_all = read_topic(args.bootstrap, args.dlq, "read_uncommitted")
    ignore = args.ignore_value.encode() if args.ignore_value is not None else None

    # Reference model over the input below the committed offsets.
    inputs.sort(key=lambda m: (m.partition(), m.offset()))
    running = {}
    expected = {}  # (p, o) -> (key, count)
    bad = {}  # (p, o) -> (reason, original bytes)
    beyond = 0
    for m in inputs:
        at = (m.partition(), m.offset())
        if m.offset() >= committed.get(m.partition(), 0):
            beyond += 1
            continue
        key, reason = classify(m.value(), args)
        if key is None:
            bad[at] = (reason, m.value() or b"")
        else:
            running[key] = running.get(key, 0) + 1
            expected[at] = (key, running[key])
    if args.expect_all and beyond:
        violation("input_not_committed", {"records": beyond, "committed": committed})

    seen = {}
    for m in outputs:
        if ignore is not None and m.value() == ignore:
            continue
        where = f"{m.partition()}:{m.offset()}"
        try:
            v = json.loads(m.value())
            src = v["source"]
            at = (int(src["partition"]), int(src["offset"]))
            if src["topic"] != args.input:
                raise ValueError(f"source topic {src['topic']}")
        except (ValueError, KeyError, TypeError) as e:
            violation("wrong", {"output": where, "error": str(e)})
            continue
        seen[at] = seen.get(at, 0) + 1
        if at not in expected:
            if at in bad:
                violation("output_for_bad_record", {"input": at, "output": where})
            else:
                violation("output_beyond_committed_or_unknown", {"input": at, "output": where})
            continue
        key, count = expected[at]
        if v.get("key") != key or v.get("count") != count or (m.key() or b"").decode("utf-8", "replace") != key:
            violation("wrong", {"input": at, "output": where, "expected": {"key": key, "count": count}, "got": v})
    duplicated = [at for at, n in seen.items() if n > 1]
    for at in duplicated:
        violation("duplicated", {"input": at, "times": seen[at]})
    missing = [at for at in expected if at not in seen]
    for at in missing:
        violation("missing", {"input": at})

    dead_seen = {}
    for m in dead:
        h = headers_of(m)
        if h.get("streamstate.source.topic") != args.input:
            continue
        try:
            at = (int(h["streamstate.source.partition"]), int(h["streamstate.source.offset"]))
        except (KeyError, ValueError):
            violation("dead_letter_without_source", {"dead_letter": f"{m.partition()}:{m.offset()}"})
            continue
        dead_seen[at] = dead_seen.get(at, 0) + 1
        reason = h.get("streamstate.error.reason", "")
        if at not in bad:
            kind = "good_record_dead_lettered" if at in expected else "dead_letter_beyond_committed_or_unknown"
            violation(kind, {"input": at, "reason": reason})
            continue
        want_reason, original = bad[at]
        if reason != want_reason:
            violation("dead_letter_wrong_reason", {"input": at, "expected": want_reason, "got": reason})
        # The original bytes, or (too big for a dead letter) a prefix with the original
        # size in `streamstate.source.size`.
        got = m.value() or b""
        whole = got == original
        cut = len(got) < len(original) and original.startswith(got) and h.get("streamstate.source.size") == str(len(original))
        if not (whole or cut):
            violation("dead_letter_wrong_bytes", {"input": at, "len": len(got), "original_len": len(original)})
    for at, n in dead_seen.items():
        if n > 1:
            violation("dead_letter_duplicated", {"input": at, "times": n})
    for at in bad:
        if at not in dead_seen:
            violation("dead_letter_missing", {"input": at, "reason": bad[at][0]})

    # Aborted attempts: visible read_uncommitted, absent read_committed.
    committed_out = {(m.partition(), m.offset()) for m in outputs}
    committed_dead = {(m.partition(), m.offset()) for m in dead}
    aborted_out = sum(1 for m in outputs_all if (m.partition(), m.offset()) not in committed_out)
    aborted_dead = sum(1 for m in dead_all if (m.partition(), m.offset()) not in committed_dead)

    counts = {}
    for v in violations:
        counts[v] = counts.get(v, 0) + 1
    report = {
        "ok": not violations,
        "input_records": len(inputs),
        "input_below_committed": len(expected) + len(bad),
        "input_beyond_committed": beyond,
        "committed_offsets": {str(p): o for p, o in sorted(committed.items())},
        "expected_outputs": len(expected),
        "outputs": sum(seen.values()),
        "missing": len(missing),
        "duplicated": len(duplicated),
        "wrong": counts.get("wrong", 0),
        "bad_records": len(bad),
        "dead_letters": sum(dead_seen.values()),
        "dead_letter_reasons": {r: sum(1 for (rr, _) in bad.values() if rr == r) for r in sorted({r for r, _ in bad.values()})},
        "aborted_attempts": {"output_records": aborted_out, "dead_letter_records": aborted_dead},
        "violations": counts,
        "examples": examples,
    }
    print(json.dumps(report, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (KafkaException, TimeoutError) as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        sys.exit(2)
