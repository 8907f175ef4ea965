#!/usr/bin/env python3
"""The benchmark's workloads in Quix Streams, emitting what streamstate's rules emit
(bench/rules*.json). Exactly-once.

  S: per event a running count per key, a dedup of event_id within 10 minutes, and a
     running sum and count per key and event type (bench/rules.json);
  D: the dedup alone (bench/rules-d.json);
  W: per key a tumbling 10 s window on the event's `ts` with a 2 s grace (closed when the
     partition's newest event time passes end + 2 s), count/sum/min/max of `amount`,
     emitted as four records when it closes (bench/rules-w.json).

  app.py BOOTSTRAP CONSUMER_GROUP INPUT OUTPUT STATE_DIR COMMIT_INTERVAL_S [S|D|W]

Quix state is scoped to the message key, which the generator sets to user_id. Quix has
no state TTL here, so first-seen times of event ids are kept and compared, never expired.
"""

import sys
import time
from datetime import timedelta

from quixstreams import Application
from quixstreams.dataframe.windows import Count, Max, Min, Sum

TTL_MS = 10 * 60 * 1000


def rules(value, key, timestamp, headers, state):
    user = value["user_id"]
    n = (state.get("count") or 0) + 1
    state.set("count", n)
    outs = [{"rule_id": "count", "key": user, "value": n, "count": n}]
    now = int(time.time() * 1000)
    seen_key = "d:" + value["event_id"]
    first = state.get(seen_key)
    if first is None or now - first > TTL_MS:
        state.set(seen_key, now)
        outs.append({"rule_id": "dedup", "key": user, "value": value})
    sum_key = "s:" + value["type"]
    m, total = state.get(sum_key) or (0, 0.0)
    m, total = m + 1, total + float(value["amount"])
    state.set(sum_key, (m, total))
    outs.append({"rule_id": "sum-" + value["type"], "key": user, "value": total, "count": m})
    return outs


def first_sighting(value, state):
    """The dedup of S alone: the first sighting of an event id per key within the TTL."""
    now = int(time.time() * 1000)
    seen_key = "d:" + value["event_id"]
    first = state.get(seen_key)
    if first is None or now - first > TTL_MS:
        state.set(seen_key, now)
        return [{"rule_id": "dedup", "key": value["user_id"], "value": value}]
    return []


def window_records(value, key, timestamp, headers):
    """A closed window as the four records of bench/rules-w.json."""
    window = {"start": value["start"], "end": value["end"]}
    n = value["count"]
    return [{"rule_id": "window-" + fn, "key": key, "window": window,
             "value": value[fn] if fn == "count" else float(value[fn]), "count": n}
            for fn in ("count", "sum", "min", "max")]


def event_time(value, headers, timestamp, timestamp_type):
    return int(value["ts"])


def main():
    bootstrap, group, input_topic, output_topic, state_dir, interval = sys.argv[1:7]
    workload = sys.argv[7] if len(sys.argv) > 7 else "S"
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=state_dir,
        commit_interval=float(interval),
        loglevel="WARNING",
    )
    inp = app.topic(input_topic, key_deserializer="string", value_deserializer="json",
                    timestamp_extractor=event_time if workload == "W" else None)
    out = app.topic(output_topic, key_serializer="string", value_serializer="json")
    sdf = app.dataframe(inp)
    if workload == "S":
        sdf = sdf.apply(rules, stateful=True, expand=True, metadata=True)
    elif workload == "D":
        sdf = sdf.apply(first_sighting, stateful=True, expand=True)
    elif workload == "W":
        sdf = (sdf.tumbling_window(timedelta(seconds=10), grace_ms=timedelta(seconds=2))
               .agg(count=Count(), sum=Sum("amount"), min=Min("amount"), max=Max("amount"))
               .final(closing_strategy="partition"))
        sdf = sdf.apply(window_records, expand=True, metadata=True)
    else:
        sys.exit(f"unknown workload {workload} (S|D|W)")
    sdf.to_topic(out)
    app.run()


if __name__ == "__main__":
    main()
