#!/usr/bin/env python3
"""Independent reader of Confluent-wire-format Avro records, for streamstate's tests.

    read_avro.py --bootstrap HOST:PORT --topic T --registry URL [--timeout-s 60] [--expect N]

Reads every partition of topic T from the beginning with isolation.level=read_committed
(a fresh random group id, no offset commits) and, for each record, checks the wire format
(magic byte 0, then a 4-byte big-endian schema id), fetches that writer schema from the
Confluent-compatible registry API (URL/schemas/ids/<id>, cached per id; schema references
are resolved through URL/subjects/<subject>/versions/<version>) and decodes the rest with
fastavro. It prints one JSON line per record, in the order consumed:

    {"partition": p, "offset": o, "key": k, "schema_id": id, "value": v}

k is the key as a UTF-8 string, null when absent, or a list of ints when the key is not
valid UTF-8. In v, Avro bytes/fixed are lists of ints; decimals, UUIDs and dates/times
(fastavro decodes Avro's logical types) are strings. A record with a null value (a
tombstone) is printed with "schema_id": null and "value": null.

Stopping:
  with --expect N  once N records were read and no further record came within 2 s
                   (more than N are all printed, with a note on stderr); exit 1 when fewer
                   than N were read within --timeout-s.
  without          once every partition is at its end (for read_committed: at the last
                   stable offset, i.e. what is committed now), or at --timeout-s.

Exit status: 0 done; 1 fewer than --expect, topic missing, or Kafka/registry unusable;
2 a record that is not valid wire format or does not decode with its schema (the message
names the partition and offset); 3 bad arguments.

Needs confluent-kafka and fastavro: integration-tests/s3/moto.sh python prints a venv's
interpreter that has both.
"""

import argparse
import datetime
import decimal
import io
import json
import struct
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

try:
    import fastavro
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
except ImportError as e:  # pragma: no cover - environment problem
    sys.stderr.write(
        f"read_avro.py: {e}: run it with the interpreter `integration-tests/s3/moto.sh python` prints\n"
    )
    sys.exit(1)

QUIET_AFTER_EXPECT_S = 2.0


class WireError(Exception):
    """A record that is not valid Confluent wire format / Avro for its schema."""


class EnvError(Exception):
    """Kafka or the registry is unusable (not a problem of the data)."""


def log(msg):
    sys.stderr.write(f"read_avro.py: {msg}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------- registry


class Registry:
    def __init__(self, url, timeout_s=10.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.by_id = {}  # schema id -> parsed fastavro schema

    def _get(self, path):
        """GET a registry path; returns (status, parsed JSON or None)."""
        last = None
        for attempt in range(4):
            req = urllib.request.Request(
                self.url + path,
                headers={"Accept": "application/vnd.schemaregistry.v1+json, application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    return r.status, json.loads(r.read().decode("utf-8"))
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    return e.code, None
                last = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError, ValueError) as e:
                last = str(e)
            time.sleep(0.5 * (attempt + 1))
        raise EnvError(f"registry GET {self.url}{path} failed: {last}")

    def _parse(self, doc, named, what, depth=0):
        if depth > 32:
            raise WireError(f"{what}: schema references nest deeper than 32")
        stype = doc.get("schemaType") or "AVRO"
        if stype.upper() != "AVRO":
            raise WireError(f"{what} is a {stype} schema, not Avro")
        for ref in doc.get("references") or []:
            subject, version = ref.get("subject"), ref.get("version")
            path = "/subjects/{}/versions/{}".format(
                urllib.parse.quote(str(subject), safe=""), urllib.parse.quote(str(version), safe="")
            )
            status, rdoc = self._get(path)
            if status != 200 or not isinstance(rdoc, dict) or "schema" not in rdoc:
                raise WireError(
                    f"{what} references {ref.get('name')!r} (subject {subject!r} version {version!r}), "
                    f"which the registry does not have (HTTP {status})"
                )
            self._parse(rdoc, named, f"reference {subject!r} v{version}", depth + 1)
        try:
            return fastavro.parse_schema(json.loads(doc["schema"]), named_schemas=named)
        except Exception as e:  # fastavro raises several types for a bad schema
            raise WireError(f"{what} is not a valid Avro schema: {e}") from e

    def schema(self, schema_id):
        if schema_id in self.by_id:
            return self.by_id[schema_id]
        status, doc = self._get(f"/schemas/ids/{schema_id}")
        if status == 404:
            raise WireError(f"schema id {schema_id} is unknown to the registry (HTTP 404)")
        if status != 200 or not isinstance(doc, dict) or "schema" not in doc:
            raise EnvError(f"registry GET /schemas/ids/{schema_id}: HTTP {status}, body {doc!r}")
        parsed = self._parse(doc, {}, f"schema id {schema_id}")
        self.by_id[schema_id] = parsed
        return parsed


# ---------------------------------------------------------------- decoding


def decode(registry, payload):
    """Returns (schema_id, value) of one wire-format payload, or raises WireError."""
    if len(payload) < 5:
        raise WireError(f"{len(payload)} bytes, shorter than the 5-byte wire-format header")
    if payload[0] != 0:
        raise WireError(f"magic byte is {payload[0]}, not 0")
    (schema_id,) = struct.unpack(">I", payload[1:5])
    schema = registry.schema(schema_id)
    bio = io.BytesIO(payload[5:])
    try:
        value = fastavro.schemaless_reader(bio, schema)
    except Exception as e:  # EOFError, ValueError, UnicodeDecodeError, ...
        raise WireError(f"Avro body does not decode with schema id {schema_id}: {type(e).__name__}: {e}") from e
    rest = len(payload) - 5 - bio.tell()
    if rest != 0:
        raise WireError(f"{rest} trailing bytes after the Avro body (schema id {schema_id})")
    return schema_id, value


def key_json(key):
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return list(key)


def to_json(o):
    if isinstance(o, (bytes, bytearray, memoryview)):
        return list(bytes(o))
    if isinstance(o, decimal.Decimal):
        return str(o)
    if isinstance(o, uuid.UUID):
        return str(o)
    if isinstance(o, (datetime.datetime, datetime.date, datetime.time)):
        return o.isoformat()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    # Last resort, so one odd value never loses the record.
    return str(o)


# ---------------------------------------------------------------- kafka


def partitions_of(consumer, topic, deadline):
    """Partition ids of topic, waiting (until deadline) for it to exist."""
    last = None
    while True:
        try:
            md = consumer.list_topics(topic, timeout=max(1.0, min(5.0, deadline - time.monotonic())))
            t = md.topics.get(topic)
            if t is not None and t.error is None and t.partitions:
                return sorted(t.partitions)
            last = t.error if t is not None else "no metadata"
        except Exception as e:  # KafkaException on broker unreachable
            last = e
        if time.monotonic() >= deadline:
            raise EnvError(f"topic {topic!r} not available: {last}")
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser(
        description="Read a topic's Confluent-wire-format Avro records (read_committed) as JSON lines."
    )
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, HOST:PORT")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--registry", required=True, help="Confluent-compatible registry base URL")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="overall deadline (default 60)")
    ap.add_argument("--expect", type=int, default=None, help="records to wait for")
    try:
        args = ap.parse_args()
    except SystemExit as e:
        sys.exit(0 if e.code == 0 else 3)
    if args.expect is not None and args.expect < 0:
        log("--expect must be >= 0")
        sys.exit(3)

    deadline = time.monotonic() + args.timeout_s
    registry = Registry(args.registry)
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"streamstate-read-avro-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    count = 0
    try:
        parts = partitions_of(consumer, args.topic, deadline)
        # assign, not subscribe: no group rebalance to wait for, every partition from offset 0.
        consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in parts])
        at_eof = set()
        last_record = time.monotonic()
        out = sys.stdout
        while True:
            now = time.monotonic()
            if args.expect is not None:
                if count >= args.expect and now - last_record >= QUIET_AFTER_EXPECT_S:
                    break
            elif len(at_eof) == len(parts):
                break
            if now >= deadline:
                break
            msg = consumer.poll(max(0.05, min(0.5, deadline - now)))
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_eof.add(msg.partition())
                    continue
                if err.fatal():
                    raise EnvError(f"Kafka: {err}")
                log(f"Kafka (retrying): {err}")
                continue
            p, o = msg.partition(), msg.offset()
            at_eof.discard(p)
            payload = msg.value()
            if payload is None:
                schema_id, value = None, None
            else:
                try:
                    schema_id, value = decode(registry, payload)
                except WireError as e:
                    out.flush()
                    log(f"partition {p} offset {o}: not a valid Avro wire-format record: {e}")
                    sys.exit(2)
            line = json.dumps(
                {"partition": p, "offset": o, "key": key_json(msg.key()), "schema_id": schema_id, "value": value},
                default=to_json,
            )
            out.write(line + "\n")
            count += 1
            last_record = time.monotonic()
        out.flush()
    except EnvError as e:
        sys.stdout.flush()
        log(str(e))
        sys.exit(1)
    finally:
        consumer.close()

    if args.expect is not None:
        if count < args.expect:
            log(f"read {count} records from {args.topic!r}, expected {args.expect} (timeout {args.timeout_s:g}s)")
            sys.exit(1)
        if count > args.expect:
            log(f"note: read {count} records from {args.topic!r}, more than the {args.expect} expected")
    elif len(at_eof) != len(parts):
        log(f"timeout {args.timeout_s:g}s before the end of every partition; read {count} records")
    sys.exit(0)


if __name__ == "__main__":
    main()
