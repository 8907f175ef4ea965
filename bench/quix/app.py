#!/usr/bin/env python3
"""The benchmark's S workload in Quix Streams, emitting what streamstate's rules emit
(bench/rules.json): per event a running count per key, a dedup of event_id within 10
minutes, and a running sum and count per key and event type. Exactly-once.

  app.py BOOTSTRAP CONSUMER_GROUP INPUT OUTPUT STATE_DIR COMMIT_INTERVAL_S

Quix state is scoped to the message key, which the generator sets to user_id. Quix has
no state TTL here, so first-seen times of event ids are kept and compared, never expired.
"""

import sys
import time

from quixstreams import Application

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


def main():
    bootstrap, group, input_topic, output_topic, state_dir, interval = sys.argv[1:7]
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=state_dir,
        commit_interval=float(interval),
        loglevel="WARNING",
    )
    inp = app.topic(input_topic, key_deserializer="string", value_deserializer="json")
    out = app.topic(output_topic, key_serializer="string", value_serializer="json")
    sdf = app.dataframe(inp)
    sdf = sdf.apply(rules, stateful=True, expand=True, metadata=True)
    sdf.to_topic(out)
    app.run()


if __name__ == "__main__":
    main()
