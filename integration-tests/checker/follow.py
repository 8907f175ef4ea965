#!/usr/bin/env python3
"""The independent checker (check.py) for runs too long to hold in memory: follows the
input and output topics while the job runs and judges once the job has stopped.

check.py keeps every record it reads as a Python object (about 2 KB each with its five
passes), which is fine for tests and impossible for a soak's tens of millions of records.
This follower keeps per input partition one slot per offset in typed arrays (key id, count
expected, count seen in the output, times seen), reads while the job runs so the end costs
only the tail, and applies the same model and the same bad-record classification
(`check.classify`): every input record below the committed offsets is either exactly one
output `{"key", "count", "source"}` with the per-key count in offset order, or exactly one
dead letter with the checker's own reason. It does not count aborted attempts (no
read_uncommitted pass); check.py does. Keys must stay within one input partition (they do
when the producer partitions by key); a key seen in two partitions is a violation here.

  follow.py --bootstrap HOST:PORT --group APP_ID --input T --output T --dlq T
            --stop-file PATH [--expect-all] [check.py's limits]

Reads until PATH exists, then up to the topics' end offsets (read_committed: the last
stable offset), and prints the same JSON report as check.py; exit 1 on any violation.
"""

import argparse
import json
import os
import sys
import time
import uuid
from array import array

from confluent_kafka import Consumer, KafkaException, TopicPartition, OFFSET_BEGINNING

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check import classify, committed_offsets, consumer, headers_of, partitions_of  # noqa: E402

NONE = 0xFFFFFFFF  # an offset with no record (yet), or no key


class Follower:
    """One read_committed consumer over all partitions of a topic, from the beginning."""

    def __init__(self, bootstrap, topic):
        self.c = consumer(bootstrap, "read_committed")
        self.topic = topic
        self.parts = partitions_of(self.c, topic)
        self.c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self.parts])

    def poll(self, handle, timeout=0.2):
        n = 0
        for m in self.c.consume(num_messages=5000, timeout=timeout):
            if m.error():
                continue
            handle(m)
            n += 1
        return n

    def drain(self, handle, timeout_s=300):
        """Reads up to the end offsets as of now (LSO for read_committed)."""
        ends = {p: self.c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30)[1] for p in self.parts}
        deadline = time.monotonic() + timeout_s
        while True:
            pos = {tp.partition: tp.offset for tp in self.c.position([TopicPartition(self.topic, p) for p in self.parts])}
            if all(ends[p] == 0 or pos.get(p, -1) >= ends[p] for p in self.parts):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.topic}: end offsets {ends} not reached, at {pos} (open transaction?)")
            self.poll(handle, timeout=0.5)

    def close(self):
        self.c.close()


def grow(arr, size, fill):
    if len(arr) < size:
        arr.extend([fill] * (size - len(arr)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--dlq", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--key-field", default="user_id")
    ap.add_argument("--expect-all", action="store_true")
    ap.add_argument("--max-record-bytes", type=int, default=1 << 20)
    ap.add_argument("--max-key-bytes", type=int, default=4096)
    ap.add_argument("--timestamp-field", default=None)
    ap.add_argument("--max-skew-ms", type=int, default=None)
    args = ap.parse_args()

    violations = {}
    examples = []

    def violation(kind, detail):
        violations[kind] = violations.get(kind, 0) + 1
        if len(examples) < 20:
            examples.append({"kind": kind, **detail})

    key_ids, key_names = {}, []
    key_partition = []  # key id -> the input partition it was first seen in
    running = []  # key id -> count so far
    # Per input partition, indexed by offset.
    exp_key, exp_count = {}, {}  # expected output (NONE key = no good record there)
    bad = {}  # (p, o) -> (reason, bytes): bad records are few
    out_times = {}  # bytearray: outputs seen (saturating at 255)
    out_key, out_count = {}, {}  # what the (first) output said
    inputs = [0]

    def on_input(m):
        p, o = m.partition(), m.offset()
        if p not in exp_key:
            exp_key[p], exp_count[p] = array("I"), array("I")
        grow(exp_key[p], o + 1, NONE)
        grow(exp_count[p], o + 1, 0)
        inputs[0] += 1
        key, reason = classify(m.value(), args)
        if key is None:
            bad[(p, o)] = (reason, m.value() or b"")
            return
        kid = key_ids.get(key)
        if kid is None:
            kid = key_ids[key] = len(key_names)
            key_names.append(key)
            key_partition.append(p)
            running.append(0)
        elif key_partition[kid] != p:
            violation("key_in_several_partitions", {"key": key, "partitions": [key_partition[kid], p]})
        running[kid] += 1
        exp_key[p][o] = kid
        exp_count[p][o] = running[kid]

    outputs = [0]

    def on_output(m):
        outputs[0] += 1
        where = f"{m.partition()}:{m.offset()}"
        try:
            v = json.loads(m.value())
            src = v["source"]
            p, o = int(src["partition"]), int(src["offset"])
            if src["topic"] != args.input:
                raise ValueError(f"source topic {src['topic']}")
            key, count = v["key"], int(v["count"])
        except (ValueError, KeyError, TypeError) as e:
            violation("wrong", {"output": where, "error": str(e)})
            return
        if (m.key() or b"").decode("utf-8", "replace") != key:
            violation("wrong", {"output": where, "error": "record key differs from the value's key"})
        if p not in out_times:
            out_times[p], out_key[p], out_count[p] = bytearray(), array("I"), array("I")
        t = out_times[p]
        if len(t) <= o:
            t.extend(bytes(o + 1 - len(t)))
            grow(out_key[p], o + 1, NONE)
            grow(out_count[p], o + 1, 0)
        if t[o] < 255:
            t[o] += 1
        if t[o] == 1:
            kid = key_ids.get(key)
            if kid is None:
                # Not seen in the input yet: remember the name.
                kid = key_ids[key] = len(key_names)
                key_names.append(key)
                key_partition.append(p)
                running.append(0)
            out_key[p][o], out_count[p][o] = kid, count

    fin = Follower(args.bootstrap, args.input)
    fout = Follower(args.bootstrap, args.output)
    started = time.monotonic()
    while not os.path.exists(args.stop_file):
        a = fin.poll(on_input)
        b = fout.poll(on_output)
        if a == 0 and b == 0:
            time.sleep(0.2)
    committed = committed_offsets(args.bootstrap, args.group, args.input)
    fin.drain(on_input)
    fout.drain(on_output)
    fin.close()
    fout.close()

    # Judge: every input below the committed offsets, in partition and offset order.
    expected = missing = duplicated = beyond = 0
    for p in sorted(exp_key):
        ek, ec = exp_key[p], exp_count[p]
        t = out_times.get(p, bytearray())
        ok_, oc = out_key.get(p, array("I")), out_count.get(p, array("I"))
        limit = committed.get(p, 0)
        for o in range(len(ek)):
            seen = t[o] if o < len(t) else 0
            if o >= limit:
                if ek[o] != NONE or (p, o) in bad:
                    beyond += 1
                if seen:
                    violation("output_beyond_committed_or_unknown", {"input": [p, o]})
                continue
            if ek[o] == NONE:
                if seen and (p, o) in bad:
                    violation("output_for_bad_record", {"input": [p, o]})
                elif seen:
                    violation("output_beyond_committed_or_unknown", {"input": [p, o]})
                continue
            expected += 1
            if not seen:
                missing += 1
                violation("missing", {"input": [p, o]})
                continue
            if seen > 1:
                duplicated += 1
                violation("duplicated", {"input": [p, o], "times": seen})
            if ok_[o] != ek[o] or oc[o] != ec[o]:
                violation("wrong", {"input": [p, o], "expected": {"key": key_names[ek[o]], "count": ec[o]},
                                    "got": {"key": key_names[ok_[o]] if ok_[o] != NONE else None, "count": oc[o]}})
    for p, t in out_times.items():
        known = len(exp_key.get(p, ()))
        for o in range(known, len(t)):
            if t[o]:
                violation("output_beyond_committed_or_unknown", {"input": [p, o]})
    if args.expect_all and beyond:
        violation("input_not_committed", {"records": beyond, "committed": committed})

    # Dead letters: few, read whole as check.py does.
    dead_seen = {}
    fdead = Follower(args.bootstrap, args.dlq)
    dead = []
    fdead.drain(dead.append)
    fdead.close()
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
            violation("dead_letter_beyond_committed_or_unknown" if at[1] >= committed.get(at[0], 0) or at[0] not in exp_key
                      else "good_record_dead_lettered", {"input": at, "reason": reason})
            continue
        want, original = bad[at]
        if reason != want:
            violation("dead_letter_wrong_reason", {"input": at, "expected": want, "got": reason})
        got = m.value() or b""
        cut = len(got) < len(original) and original.startswith(got) and h.get("streamstate.source.size") == str(len(original))
        if not (got == original or cut):
            violation("dead_letter_wrong_bytes", {"input": at, "len": len(got), "original_len": len(original)})
    for at, n in dead_seen.items():
        if n > 1:
            violation("dead_letter_duplicated", {"input": at, "times": n})
    below = {at: v for at, v in bad.items() if at[1] < committed.get(at[0], 0)}
    for at in below:
        if at not in dead_seen:
            violation("dead_letter_missing", {"input": at, "reason": below[at][0]})

    report = {
        "ok": not violations,
        "mode": "follow",
        "input_records": inputs[0],
        "input_below_committed": expected + len(below),
        "input_beyond_committed": beyond,
        "committed_offsets": {str(p): o for p, o in sorted(committed.items())},
        "expected_outputs": expected,
        "outputs": outputs[0],
        "missing": missing,
        "duplicated": duplicated,
        "wrong": violations.get("wrong", 0),
        "bad_records": len(below),
        "dead_letters": sum(dead_seen.values()),
        "aborted_attempts": "not counted in follow mode",
        "violations": violations,
        "examples": examples,
        "seconds": round(time.monotonic() - started),
    }
    print(json.dumps(report, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (KafkaException, TimeoutError) as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        sys.exit(2)
