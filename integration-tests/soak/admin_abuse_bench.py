#!/usr/bin/env python3
"""Processing throughput with and without admin-API abuse (docs/reliability.md).

  admin_abuse_bench.py --bin PATH --bootstrap HOST:PORT --out DIR [--rounds 3] [--prefill 1000000]

Each round runs the `count` function twice over one pre-filled topic of `--prefill`
events (a new consumer group each time), once quietly and once while the admin API is
abused, alternating which goes first; events/s is measured from `streamstate_records_consumed_total` between 10% and 90%
of the input (soak.consume_rate). The abuse, for the whole measured run (rates: RATES):
  * requests with bad bearer tokens on guarded routes, 1,000 a second (4 threads),
  * a burst of 100 concurrent `POST /checkpoints` with the right token every 10 s,
  * `../` ids (plain and encoded) on every id-taking route, 100 a second,
  * `POST /savepoints` with a 1 MiB body, 10 a second,
  * 200 slow clients sending a request line byte by byte, reconnecting when closed.
The abuse runs in its own process at nice 19 (`admin_abuse_bench.py abuse ...`), and the
service's own CPU time for the input is reported besides events/s.
Prints medians, spread and the drop as text and JSON (DIR/abuse-bench.json). A benchmark,
not a test: nothing is asserted; the exit status is 0 unless a run failed.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak  # noqa: E402

TOKEN = "bench-admin-token"
# Requests a second. The 10,000 bad tokens of the test spread over 10 s; the abuse runs
# on the same 2 cores as the service, so an unpaced flood would measure the load
# generator's own CPU use rather than what the abuse costs the server.
RATES = {"bad_tokens": 1000, "traversal": 100, "big_bodies": 10}


def request(addr, raw, timeout=30):
    host, port = addr.rsplit(":", 1)
    data = b""
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            try:
                s.sendall(raw)
            except OSError:
                pass  # the server answered (413) and closed before taking the whole body
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        pass  # a reset after the answer: keep what arrived
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def http(addr, method, path, headers=(), body=b""):
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return request(addr, head.encode() + body)


class Abuse:
    """The abuse load against one admin address; counts answers by status."""

    def __init__(self, addr, rates):
        self.addr = addr
        self.rates = rates
        self.stop = threading.Event()
        self.statuses = {}
        self.lock = threading.Lock()
        self.threads = []

    def count(self, kind, status):
        with self.lock:
            k = f"{kind}:{status}"
            self.statuses[k] = self.statuses.get(k, 0) + 1

    def paced(self, per_s):
        """Yields request numbers at `per_s` a second until stopped (open loop)."""
        start, i = time.monotonic(), 0
        while not self.stop.is_set():
            due = start + i / per_s
            if due > time.monotonic():
                self.stop.wait(due - time.monotonic())
                continue
            yield i
            i += 1

    def bad_tokens(self, n):
        for i in self.paced(self.rates["bad_tokens"] / 4):
            path = ["/checkpoints", "/savepoints", "/stop"][i % 3]
            self.count("bad_token", http(self.addr, "POST", path, [("Authorization", f"Bearer wrong-{n}-{i}")]))

    def checkpoint_bursts(self):
        while not self.stop.wait(10):
            results = []
            barrier = threading.Barrier(100)

            def one():
                barrier.wait()
                results.append(http(self.addr, "POST", "/checkpoints", [("Authorization", f"Bearer {TOKEN}")]))

            ts = [threading.Thread(target=one) for _ in range(100)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            for r in results:
                self.count("checkpoint_burst", r)

    def traversal(self):
        ids = ["../../../../etc/passwd", "..%2F..%2F..%2Fetc%2Fpasswd", "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
               "..%252f..%252fetc", "..", "%2e%2e"]
        routes = ["/checkpoints/", "/savepoints/", "/rules/", "/state/"]
        for n in self.paced(self.rates["traversal"]):
            path = routes[n % len(routes)] + ids[(n // len(routes)) % len(ids)]
            self.count("traversal", http(self.addr, "GET", path, [("Authorization", f"Bearer {TOKEN}")]))

    def big_bodies(self):
        body = b"x" * (1 << 20)
        for _ in self.paced(self.rates["big_bodies"]):
            self.count("1mib_body", http(self.addr, "POST", "/savepoints", [("Authorization", f"Bearer {TOKEN}")], body))

    def slow_clients(self):
        host, port = self.addr.rsplit(":", 1)
        socks = []
        while not self.stop.is_set():
            while len(socks) < 200:
                try:
                    s = socket.create_connection((host, int(port)), timeout=5)
                    s.sendall(b"GET /liv")
                    socks.append(s)
                except OSError:
                    break
            alive = []
            for s in socks:
                try:
                    s.sendall(b"a")
                    alive.append(s)
                except OSError:
                    s.close()
                    self.count("slow_client_closed_by_server", 0)
            socks = alive
            self.stop.wait(0.5)
        for s in socks:
            s.close()

    def start(self):
        targets = [lambda n=n: self.bad_tokens(n) for n in range(4)]
        targets += [self.checkpoint_bursts, self.traversal, self.big_bodies, self.slow_clients]
        self.threads = [threading.Thread(target=t, daemon=True) for t in targets]
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        return dict(sorted(self.statuses.items()))


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(args, name, abused, input_topic):
    job = soak.Job(args.bootstrap, args.out, name, args.partitions, "10s",
                   admin_extra=f'token = "{TOKEN}"\n', input_topic=input_topic)
    # The service starts with the input already there; the abuse starts as soon as it is
    # ready, before the measured window (10%..90% of the input) opens. The abuse runs in
    # its own process at nice 19: it shares the service's cores here, and an abuser on
    # another machine costs the service only the requests it serves.
    job.start(args.bin)
    cpu0 = cpu_seconds(job.proc.pid)
    abuse = None
    stop_file = os.path.join(job.dir, "abuse.stop")
    answers_file = os.path.join(job.dir, "abuse.json")
    if abused:
        abuse = subprocess.Popen(["nice", "-n", "19", sys.executable, os.path.abspath(__file__), "abuse",
                                  "--addr", job.admin, "--stop-file", stop_file, "--answers", answers_file])
    try:
        rate = soak.consume_rate(job, args.prefill, args.bootstrap)
        cpu = cpu_seconds(job.proc.pid) - cpu0
    finally:
        statuses = None
        if abuse:
            open(stop_file, "w").close()
            abuse.wait(timeout=120)
            with open(answers_file) as f:
                statuses = json.load(f)
    alive = job.alive()
    code = job.stop()
    job.delete_topics()
    soak.log(f"{name}: {rate:.0f} events/s, service CPU {cpu:.1f} s" + (f", answers {statuses}" if statuses else ""))
    return {"name": name, "abused": abused, "events_per_s": rate, "service_cpu_seconds": cpu,
            "answers": statuses, "alive_until_stop": alive, "exit_code": code}


def abuse_main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--answers", required=True)
    args = ap.parse_args(argv)
    abuse = Abuse(args.addr, RATES)
    abuse.start()
    while not os.path.exists(args.stop_file):
        time.sleep(0.2)
    with open(args.answers, "w") as f:
        json.dump(abuse.finish(), f)
    return 0


def main():
    if sys.argv[1:2] == ["abuse"]:
        return abuse_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # One pre-filled input read by every run (each with its own consumer group from the
    # earliest offset, and its own output topic, deleted after the run).
    input_topic = f"abuse-bench-{os.getpid()}-{int(time.time())}-in"
    soak.create_topics(args.bootstrap, [(input_topic, args.partitions)], args.partitions)
    soak.log(f"pre-filling {args.prefill} events into {input_topic}")
    soak.prefill(args.bootstrap, input_topic, args.prefill)
    runs = []
    for r in range(args.rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        for abused in order:
            runs.append(one_run(args, f"r{r}-{'abused' if abused else 'quiet'}", abused, input_topic))
    soak.delete_topics(args.bootstrap, [input_topic])
    quiet = [x["events_per_s"] for x in runs if not x["abused"]]
    abused = [x["events_per_s"] for x in runs if x["abused"]]
    mq, ma = statistics.median(quiet), statistics.median(abused)
    cq = statistics.median(x["service_cpu_seconds"] for x in runs if not x["abused"])
    ca = statistics.median(x["service_cpu_seconds"] for x in runs if x["abused"])
    result = {
        "prefill": args.prefill,
        "abuse_rates_per_s": RATES,
        "rounds": args.rounds,
        "quiet_events_per_s": {"median": round(mq), "min": round(min(quiet)), "max": round(max(quiet))},
        "abused_events_per_s": {"median": round(ma), "min": round(min(abused)), "max": round(max(abused))},
        "drop_percent_of_medians": round(100 * (mq - ma) / mq, 1),
        "service_cpu_seconds_median": {"quiet": round(cq, 1), "abused": round(ca, 1)},
        "host": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()},
        "runs": runs,
    }
    with open(os.path.join(args.out, "abuse-bench.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"quiet:  median {mq:.0f} events/s (min {min(quiet):.0f}, max {max(quiet):.0f}) over {len(quiet)} runs")
    print(f"abused: median {ma:.0f} events/s (min {min(abused):.0f}, max {max(abused):.0f}) over {len(abused)} runs")
    print(f"service CPU for the input: median {cq:.1f} s quiet, {ca:.1f} s abused")
    print(f"drop: {result['drop_percent_of_medians']}% of the quiet median; load average at the end {os.getloadavg()}")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    return 0 if all(x["alive_until_stop"] and x["exit_code"] == 0 for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
