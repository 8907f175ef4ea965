#!/usr/bin/env python3
"""Soak run of streamstate's `count` function on the real broker (docs/reliability.md).

  soak.py run --bin PATH --bootstrap HOST:PORT --out DIR [--minutes 60] [--prefill 300000]
              [--rate-fraction 0.6] [--rate EVENTS_PER_S] [--partitions 4]
  soak.py produce ...   (internal: the open-loop producer, a child process)
  soak.py read ...      (internal: the read_committed latency reader, a child process)

`run`:
 1. max throughput, the lower of: the drain rate of a topic pre-filled with `--prefill`
    events (events/s from `streamstate_records_consumed_total` between 10% and 90% of the
    input), and the rate the service consumes for 20 s while the soak's rig runs beside it
    (the producer sending as fast as it can, the follower checker, the latency reader),
    which share the machine during the soak too (skipped with `--prefill 0`);
 2. soak: a fresh job with `checkpoint.interval = 10s` and an open-loop producer at
    `--rate-fraction` of that maximum for `--minutes`, sampling once a minute: the
    service's VmRSS, end-to-end latency (intended send time -> output visible to a
    read_committed reader), checkpoint durations and consumer lag from /metrics;
 3. drains (lag 0), stops the service with SIGTERM; the independent checker
    (integration-tests/checker/follow.py, following the topics from the start) judges the
    whole soak, and check.py --expect-all as well when it is small enough;
 4. writes DIR/summary.json and DIR/summary.txt (and DIR/samples.jsonl).

Latency probes: 10 events a second carry the key `probe-<intended send ms>-<n>`; the
reader sees the output record's key (the state key) and needs no lookup. Open loop: each
event has an intended send time on a fixed schedule; a producer that falls behind sends
late and the delay counts as latency.

Exit status: 0 when the checker found no violation, 1 otherwise, 2 on a setup error.
Speed is reported, never asserted.
"""

import argparse
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition, OFFSET_END
from confluent_kafka.admin import AdminClient, NewTopic

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "..", "checker", "check.py")
FOLLOWER = os.path.join(HERE, "..", "checker", "follow.py")
# Up to this many events the whole-history checker (check.py) runs too, besides the
# follower: it holds every record in memory (~2 KB each).
FULL_CHECK_MAX_EVENTS = 2_000_000
SUSTAINED_SECONDS = 20
KEYS = 10_000
PROBES_PER_S = 10


def log(msg):
    print(f"soak: {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ service and topics

def create_topics(bootstrap, names, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=p, replication_factor=1) for n, p in names])
    for f in futures.values():
        f.result(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=10)
        if all(n in md.topics and md.topics[n].error is None and len(md.topics[n].partitions) == p
               for n, p in names):
            return
        time.sleep(0.2)
    raise SystemExit(f"topics {names} not ready after 60 s")


def delete_topics(bootstrap, names):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_topics(names).values():
        f.result(timeout=60)


class Job:
    def __init__(self, bootstrap, out_dir, name, partitions, interval, admin_extra="", input_topic=None):
        """`input_topic`: an existing input (shared by several jobs); else a new one."""
        self.app_id = f"{name}-{uuid.uuid4().hex[:8]}"
        self.input, self.output = input_topic or f"{self.app_id}-in", f"{self.app_id}-out"
        self.dlq, self.control = f"{self.app_id}-dlq", f"{self.app_id}-rules"
        self.partitions = partitions
        self.dir = os.path.join(out_dir, name)
        os.makedirs(self.dir, exist_ok=True)
        topics = [(self.output, partitions), (self.dlq, 1), (self.control, 1)]
        create_topics(bootstrap, topics + ([] if input_topic else [(self.input, partitions)]), partitions)
        self.bootstrap = bootstrap
        with socket_free() as port:
            self.admin = f"127.0.0.1:{port}"
        self.config = os.path.join(self.dir, "streamstate.toml")
        with open(self.config, "w") as f:
            f.write(f"""[kafka]
bootstrap_servers = "{bootstrap}"
app_id = "{self.app_id}"
input_topics = ["{self.input}"]
output_topic = "{self.output}"
dead_letter_topic = "{self.dlq}"
control_topic = "{self.control}"
transaction_timeout = "60s"

[kafka.producer_properties]
"compression.type" = "lz4"

[job]
key = "/user_id"
function = "count"

[state]
backend = "rocksdb"
dir = "{os.path.join(self.dir, 'state')}"

[checkpoint]
interval = "{interval}"
timeout = "30s"
storage = "file://{os.path.join(self.dir, 'checkpoints')}"

[admin]
listen = "{self.admin}"
{admin_extra}""")
        self.proc = None

    def start(self, binary):
        self.log = open(os.path.join(self.dir, "service.log"), "w")
        self.started_at = time.monotonic()  # nothing consumed yet: a lower bracket for rates
        self.proc = child(subprocess.Popen([binary, "run", "--config", self.config],
                                           stdout=self.log, stderr=subprocess.STDOUT))
        wait_for("service ready", 120, lambda: http_status(self.admin, "/readyz") == 200, self)

    def delete_topics(self, with_input=False):
        """Frees the broker's disk after a benchmark run."""
        names = [self.output, self.dlq, self.control] + ([self.input] if with_input else [])
        delete_topics(self.bootstrap, names)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def metrics(self):
        with urllib.request.urlopen(f"http://{self.admin}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self):
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise SystemExit("service did not stop within 120 s of SIGTERM")


class socket_free:
    def __enter__(self):
        import socket
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        return self.s.getsockname()[1]

    def __exit__(self, *a):
        self.s.close()


def http_status(addr, path):
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def wait_for(what, seconds, cond, job=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if job is not None and job.proc is not None and not job.alive():
            raise SystemExit(f"service exited ({job.proc.returncode}) while waiting for {what}; see {job.dir}/service.log")
        if cond():
            return
        time.sleep(0.5)
    raise SystemExit(f"timed out after {seconds} s waiting for {what}")


def metric_sum(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def histogram(text, name):
    """Cumulative buckets {le: count} of a histogram without labels."""
    out = {}
    prefix = f"{name}_bucket{{le=\""
    for line in text.splitlines():
        if line.startswith(prefix):
            le = line[len(prefix):line.index('"', len(prefix))]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def histogram_quantile(buckets, q):
    """Upper bound of the bucket holding quantile q (Prometheus-style, no interpolation)."""
    total = buckets.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for le in sorted(buckets):
        if buckets[le] >= q * total:
            return le
    return None


def committed_total(bootstrap, group, topic, partitions):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return sum(max(tp.offset, 0) for tp in got)
    finally:
        c.close()


def end_total(bootstrap, topic, partitions):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"soak-{uuid.uuid4()}"})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions))
    finally:
        c.close()


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[i]


def rss_kib(pid, field="VmRSS"):
    """VmRSS (all resident pages) or RssAnon (heap and stacks, without the mapped binary)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


# ------------------------------------------------------------------ producer and reader

def event(i, intended_ms):
    if i % PROBE_EVERY[0] == 0:
        user = f"probe-{intended_ms}-{i}"
    else:
        user = f"user-{(i * 7919) % KEYS}"
    return user, json.dumps({"user_id": user, "seq": i, "sent_ms": intended_ms}).encode()


PROBE_EVERY = [1]


def cmd_produce(args):
    """Open loop: event i is due at start + i/rate; sends everything due, then sleeps."""
    # lz4, as the service's producer in the soak: an hour's records must fit the disk.
    p = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5, "acks": "all",
                  "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000,
                  "compression.type": "lz4"})
    failed = [0]

    def on_delivery(err, _msg):
        if err is not None:
            failed[0] += 1

    # No probes in a pre-fill (rate 0): its send times are not a schedule.
    PROBE_EVERY[0] = max(1, int(args.rate // PROBES_PER_S)) if args.rate > 0 else 1 << 62
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    start = time.time()
    end = start + args.seconds if args.seconds > 0 else None
    i = 0
    while not stop[0]:
        now = time.time()
        if args.rate > 0:
            due = int((now - start) * args.rate)
        else:  # as fast as possible: everything (--count), or batches until --seconds
            due = args.count or i + 10_000
        if args.count and due > args.count:
            due = args.count
        while i < due:
            intended = int((start + (i / args.rate if args.rate > 0 else 0)) * 1000) if args.rate > 0 else int(now * 1000)
            user, value = event(i, intended)
            try:
                p.produce(args.topic, value, key=user.encode(), on_delivery=on_delivery)
            except BufferError:
                p.poll(0.05)
                continue
            i += 1
            if i % 10_000 == 0:
                p.poll(0)
        p.poll(0)
        if (args.count and i >= args.count) or (end is not None and now >= end):
            break
        time.sleep(0.005)
    p.flush(120)
    print(json.dumps({"produced": i, "failed": failed[0], "seconds": time.time() - start}), flush=True)
    return 0 if failed[0] == 0 and len(p) == 0 else 1


def cmd_read(args):
    """Appends `<receive ms> <latency ms>` for every probe output seen read_committed."""
    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": f"soak-reader-{uuid.uuid4()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    md = c.list_topics(args.topic, timeout=30)
    c.assign([TopicPartition(args.topic, p, 0) for p in md.topics[args.topic].partitions])
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    with open(args.latencies, "a", buffering=1) as out:
        while not stop[0]:
            for m in c.consume(num_messages=2000, timeout=0.5):
                if m.error():
                    continue
                k = m.key() or b""
                if k.startswith(b"probe-"):
                    now = int(time.time() * 1000)
                    out.write(f"{now} {now - int(k.split(b'-')[1])}\n")
    c.close()
    return 0


# ------------------------------------------------------------------ the run

# Every process this run starts; whatever is still running when it ends, also by an error
# (SystemExit, a traceback), is killed, so a failed soak leaves no producer, reader,
# checker or service behind (a failed CI run once left a checker writing for minutes).
CHILDREN = []


@atexit.register
def _kill_children():
    for p in CHILDREN:
        if p.poll() is None:
            p.kill()


def child(p):
    CHILDREN.append(p)
    return p


def spawn_self(*argv):
    return child(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv],
                                  stdout=subprocess.PIPE, text=True))


def prefill(bootstrap, topic, count):
    pr = spawn_self("produce", "--bootstrap", bootstrap, "--topic", topic, "--count", str(count), "--rate", "0")
    out, _ = pr.communicate()
    if pr.returncode != 0:
        raise SystemExit(f"pre-fill failed: {out}")


def consume_rate(job, count, bootstrap):
    """events/s of `job` over a pre-filled input of `count` events, from the last sample
    below 10% of it to the first at or above 90% (start-up and the tail left out). The
    window is bracketed by samples on both sides, so it is never empty even when the
    whole middle is consumed between two samples; the rate is then an underestimate,
    never a division by zero. Waits until all is committed."""
    lo, hi = 0.1 * count, 0.9 * count
    # (time, consumed) of the last sample below `lo`; the process start if no sample was
    # (a small input can be drained before the service reports ready; start-up then
    # counts against the rate)
    before = (job.started_at, 0.0)
    start = end = None
    deadline = time.monotonic() + max(600, count / 200)
    while end is None:
        if time.monotonic() > deadline or not job.alive():
            raise SystemExit(f"throughput run did not finish; see {job.dir}/service.log")
        n = metric_sum(job.metrics(), "streamstate_records_consumed_total")
        now = time.monotonic()
        if n < lo:
            before = (now, n)
        elif start is None:
            start = before
        if start is not None and n >= hi and now > start[0]:
            end = (now, n)
        time.sleep(0.2)
    wait_for("the job to commit everything", 300,
             lambda: committed_total(bootstrap, job.app_id, job.input, job.partitions) >= count, job)
    return (end[1] - start[1]) / (end[0] - start[0])


def start_rig(args, job, out):
    """The independent checker following `job`'s topics from the start (a soak's records
    do not fit in check.py's memory; it judges once `out`/checker.stop appears) and the
    latency reader writing `out`/latencies.txt: (follower, reader)."""
    os.makedirs(out, exist_ok=True)
    stop_file = os.path.join(out, "checker.stop")
    if os.path.exists(stop_file):
        os.remove(stop_file)
    follower = child(subprocess.Popen([sys.executable, FOLLOWER, "--bootstrap", args.bootstrap, "--group", job.app_id,
                                       "--input", job.input, "--output", job.output, "--dlq", job.dlq,
                                       "--stop-file", stop_file, "--expect-all"], stdout=subprocess.PIPE, text=True))
    latencies = os.path.join(out, "latencies.txt")
    open(latencies, "w").close()
    reader = spawn_self("read", "--bootstrap", args.bootstrap, "--topic", job.output, "--latencies", latencies)
    return follower, reader


def measure_max(args):
    """(drain rate of a pre-filled topic, rate sustained while the producer runs)."""
    job = Job(args.bootstrap, args.out, "max", args.partitions, "10s")
    log(f"max throughput: pre-filling {args.prefill} events into {job.input}")
    prefill(args.bootstrap, job.input, args.prefill)
    job.start(args.bin)
    drain = consume_rate(job, args.prefill, args.bootstrap)
    job.stop()
    job.delete_topics(with_input=True)
    log(f"max throughput, pre-filled topic: {drain:.0f} events/s")
    # The soak's rig shares the machine with the service; draining a backlog in big
    # fetches with nobody producing overstates what the service keeps up with during the
    # soak. So also: run the soak's rig (producer as fast as possible, the follower and the
    # latency reader) and measure what the service consumes meanwhile.
    job = Job(args.bootstrap, args.out, "max-live", args.partitions, "10s")
    job.start(args.bin)
    rig = start_rig(args, job, os.path.join(job.dir, "rig"))
    pr = spawn_self("produce", "--bootstrap", args.bootstrap, "--topic", job.input,
                    "--rate", "0", "--seconds", str(SUSTAINED_SECONDS))
    time.sleep(SUSTAINED_SECONDS / 4)  # a measuring pause, not a wait for a condition
    n0, t0 = metric_sum(job.metrics(), "streamstate_records_consumed_total"), time.monotonic()
    time.sleep(SUSTAINED_SECONDS * 3 / 4 - 1)
    n1, t1 = metric_sum(job.metrics(), "streamstate_records_consumed_total"), time.monotonic()
    pr.communicate()
    for p in rig:
        p.kill()  # their verdicts do not matter here
        p.wait()
    job.proc.kill()  # its backlog does not matter
    job.proc.wait()
    job.delete_topics(with_input=True)
    live = (n1 - n0) / (t1 - t0)
    log(f"max throughput, producing as fast as possible meanwhile: {live:.0f} events/s")
    return drain, live


def run(args):
    os.makedirs(args.out, exist_ok=True)
    drain_rate, live_rate = measure_max(args) if args.prefill > 0 else (None, None)
    max_rate = min(drain_rate, live_rate) if drain_rate is not None else None
    if args.rate is None and max_rate is None:
        raise SystemExit("give --rate, or --prefill > 0 to measure the maximum")
    rate = args.rate if args.rate is not None else max_rate * args.rate_fraction
    seconds = int(args.minutes * 60)
    job = Job(args.bootstrap, args.out, "soak", args.partitions, "10s")
    job.start(args.bin)
    pid = job.proc.pid
    rss_at_ready = rss_kib(pid)
    # The independent checker follows the topics from the start (a soak's records do not
    # fit in check.py's memory) and judges after the service has stopped.
    follower, reader = start_rig(args, job, args.out)
    stop_file = os.path.join(args.out, "checker.stop")
    latencies = os.path.join(args.out, "latencies.txt")
    log(f"soak: {rate:.0f} events/s for {args.minutes} min into {job.input} (service pid {pid})")
    producer = spawn_self("produce", "--bootstrap", args.bootstrap, "--topic", job.input,
                          "--rate", str(rate), "--seconds", str(seconds))
    samples_path = os.path.join(args.out, "samples.jsonl")
    samples = []
    started = time.monotonic()
    last_hist, last_lat_line = {}, 0
    def sample(minute):
        nonlocal last_hist, last_lat_line
        text = job.metrics()
        hist = histogram(text, "streamstate_checkpoint_duration_seconds")
        delta = {le: hist[le] - last_hist.get(le, 0) for le in hist}
        last_hist = hist
        with open(latencies) as lf:
            lines = lf.readlines()
        lat = sorted(int(l.split()[1]) for l in lines[last_lat_line:] if l.strip())
        last_lat_line = len(lines)
        s = {
            "minute": minute,
            "t_s": round(time.monotonic() - started, 1),
            "rss_kib": rss_kib(pid),
            "rss_anon_kib": rss_kib(pid, "RssAnon"),
            "latency_ms_p50": percentile(lat, 0.5),
            "latency_ms_p99": percentile(lat, 0.99),
            "latency_probes": len(lat),
            "checkpoint_seconds_p99_le": histogram_quantile(delta, 0.99),
            "checkpoints": delta.get(float("inf"), 0),
            "consumer_lag_records": metric_sum(text, "streamstate_consumer_lag_records"),
            "consumed_total": metric_sum(text, "streamstate_records_consumed_total"),
        }
        samples.append(s)
        sf.write(json.dumps(s) + "\n")
        sf.flush()
        log(json.dumps(s))

    with open(samples_path, "w") as sf:
        minute = 0
        while producer.poll() is None:
            if not job.alive():
                producer.terminate()
                raise SystemExit(f"service died during the soak ({job.proc.returncode}); see {job.dir}/service.log")
            next_at = started + 60 * (minute + 1)
            while time.monotonic() < next_at and producer.poll() is None:
                time.sleep(0.5)
            if producer.poll() is not None:
                break
            minute += 1
            sample(minute)
        # The producer started just before the clock did, so it usually ends a moment
        # before the last full minute: one more sample when it stops covers that minute
        # instead of losing it.
        if not samples or time.monotonic() - started - samples[-1]["t_s"] > 5:
            sample(round((time.monotonic() - started) / 60, 2))
    prod = json.loads(producer.stdout.read().strip().splitlines()[-1])
    if producer.returncode != 0:
        raise SystemExit(f"producer failed: {prod}")
    produced = end_total(args.bootstrap, job.input, job.partitions)
    log(f"producer done ({prod}); draining to {produced} committed")
    wait_for("the soak job to commit all input", 600,
             lambda: committed_total(args.bootstrap, job.app_id, job.input, job.partitions) >= produced, job)
    # Final figures before the stop: the service's last RSS and the whole histogram.
    text = job.metrics()
    rss_end, t_end = rss_kib(pid), time.monotonic() - started
    rss_anon_end = rss_kib(pid, "RssAnon")
    hist = histogram(text, "streamstate_checkpoint_duration_seconds")
    every = max(1, int(rate // PROBES_PER_S))
    probes = (produced + every - 1) // every

    def lines():
        with open(latencies) as lf:
            return sum(1 for _ in lf)
    wait_for(f"the latency reader to see all {probes} probes", 120, lambda: lines() >= probes, job)
    reader.terminate()
    reader.wait(timeout=30)
    code = job.stop()
    log(f"service stopped (exit {code}); the independent checker reads the rest and judges")
    open(stop_file, "w").close()
    out, _ = follower.communicate()
    report = last_json(out, "checker/follow.py")
    report.pop("examples", None) if report.get("ok") else None
    full = None
    if produced <= FULL_CHECK_MAX_EVENTS:
        checker = subprocess.run([sys.executable, CHECKER, "--bootstrap", args.bootstrap, "--group", job.app_id,
                                  "--input", job.input, "--output", job.output, "--dlq", job.dlq, "--expect-all"],
                                 capture_output=True, text=True)
        full = last_json(checker.stdout, "checker/check.py")
        full.pop("examples", None) if full.get("ok") else None
    with open(latencies) as lf:
        lat = sorted(int(l.split()[1]) for l in lf if l.strip())
    # RSS growth from the first minute's sample (warmed up) to the end of the run.
    rss_start = samples[0]["rss_kib"] if samples else rss_at_ready
    hours = (t_end - (samples[0]["t_s"] if samples else 0)) / 3600
    summary = {
        "minutes": args.minutes,
        "max_throughput_events_per_s": round(max_rate) if max_rate is not None else None,
        "max_throughput_prefilled_events_per_s": round(drain_rate) if drain_rate is not None else None,
        "max_throughput_while_producing_events_per_s": round(live_rate) if live_rate is not None else None,
        "rate_events_per_s": round(rate),
        "produced": produced,
        "checkpoint_interval": "10s",
        "rss_kib_start": rss_start,
        "rss_kib_end": rss_end,
        "rss_kib_at_ready": rss_at_ready,
        "rss_anon_kib_start": samples[0]["rss_anon_kib"] if samples else None,
        "rss_anon_kib_end": rss_anon_end,
        "rss_growth_kib_per_hour": round((rss_end - rss_start) / hours) if hours > 0 else None,
        "latency_ms_p50": percentile(lat, 0.5),
        "latency_ms_p99": percentile(lat, 0.99),
        "latency_ms_max": lat[-1] if lat else None,
        "latency_probes": len(lat),
        "checkpoint_seconds_p99_le": histogram_quantile(hist, 0.99),
        "checkpoints": hist.get(float("inf"), 0),
        "consumer_lag_records_max_sampled": max((s["consumer_lag_records"] for s in samples), default=None),
        "service_exit_code": code,
        "checker": report,
        "checker_whole_history": full,
        "samples": len(samples),
        "host": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()},
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    ck = report
    text = "\n".join([
        f"soak: {args.minutes} min at {summary['rate_events_per_s']} events/s"
        + (f" (max {summary['max_throughput_events_per_s']} events/s"
           + (f" x {args.rate_fraction})" if args.rate is None else ", rate given)") if max_rate else "")
        + f", checkpoint.interval 10s, {produced} events",
        f"max throughput: pre-filled topic {summary['max_throughput_prefilled_events_per_s']} events/s, "
        f"while producing {summary['max_throughput_while_producing_events_per_s']} events/s (the lower is the max)",
        f"RSS: at ready {rss_at_ready} KiB, after 1 min {rss_start} KiB, end {rss_end} KiB, growth {summary['rss_growth_kib_per_hour']} KiB/hour",
        f"latency (intended send -> visible read_committed): p50 {summary['latency_ms_p50']} ms, "
        f"p99 {summary['latency_ms_p99']} ms, max {summary['latency_ms_max']} ms ({len(lat)} probes)",
        f"checkpoint duration p99 <= {summary['checkpoint_seconds_p99_le']} s ({summary['checkpoints']:.0f} checkpoints)",
        f"consumer lag (max of minute samples): {summary['consumer_lag_records_max_sampled']} records",
        f"checker: ok={ck.get('ok')} missing={ck.get('missing')} duplicated={ck.get('duplicated')} "
        f"wrong={ck.get('wrong')} outputs={ck.get('outputs')} aborted={ck.get('aborted_attempts')}"
        + (f" error={ck.get('error')}" if ck.get("error") else ""),
        "checker/check.py over the whole history: "
        + ("not run (too many records)" if full is None else
           f"ok={full.get('ok')} missing={full.get('missing')} duplicated={full.get('duplicated')} "
           f"aborted={full.get('aborted_attempts')}"),
        f"service exit code after SIGTERM: {code}",
    ])
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if report.get("ok") and (full is None or full.get("ok")) else 1


def last_json(text, what):
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"ok": False, "error": f"{what} printed no report: {text[-2000:]}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bin", required=True)
    r.add_argument("--bootstrap", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--minutes", type=float, default=60)
    r.add_argument("--prefill", type=int, default=300_000)
    r.add_argument("--rate-fraction", type=float, default=0.6)
    r.add_argument("--rate", type=float, default=None,
                   help="soak at this rate instead of --rate-fraction of the maximum (still measured unless --prefill 0)")
    r.add_argument("--partitions", type=int, default=4)
    p = sub.add_parser("produce")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--rate", type=float, default=0, help="events/s; 0 = as fast as possible")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--seconds", type=float, default=0)
    d = sub.add_parser("read")
    d.add_argument("--bootstrap", required=True)
    d.add_argument("--topic", required=True)
    d.add_argument("--latencies", required=True)
    args = ap.parse_args()
    return {"run": run, "produce": cmd_produce, "read": cmd_read}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
