"""Resize chains (issue 25, item 8): the time of the k-th chained Resize of a job of many ranks,
and the longest grpc.health.v1 Check the daemon answered while it ran (the loop's stall).

    SLUICED=build/rel/server/sluiced PYTHONPATH=build/rel/python:tests/python \\
        python3 tests/bench/resize_bench.py [--world 65536] [--resizes 100] [--every 1]

Each step: rank 0 reports one position (so the resize chains a step rather than re-planning the
last one), then the job is resized to the same world; a thread calls Health.Check in a loop
meanwhile. Prints "k resize_ms max_check_ms" rows (every --every-th k, and the last)."""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import grpc  # noqa: E402

from sluice.client import Client  # noqa: E402
from sluice.v1 import feed_pb2  # noqa: E402
from sluice._health import health_pb2 as hp  # noqa: E402
from sltest import Daemon  # noqa: E402


class Checker:
    """Calls Health.Check back to back on its own channel; records each call's latency."""

    def __init__(self, addr):
        self.ch = grpc.insecure_channel(addr)
        self.check = self.ch.unary_unary("/grpc.health.v1.Health/Check",
                                         request_serializer=hp.HealthCheckRequest.SerializeToString,
                                         response_deserializer=hp.HealthCheckResponse.FromString)
        self.check(hp.HealthCheckRequest(), timeout=30)
        self.lat, self.stop, self.lock = [], threading.Event(), threading.Lock()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.check(hp.HealthCheckRequest(), timeout=60)
            except grpc.RpcError:
                pass  # counted with the time it waited
            with self.lock:
                self.lat.append(time.monotonic() - t0)
            time.sleep(0.005)

    def take(self):
        with self.lock:
            lat, self.lat = self.lat, []
        return lat

    def close(self):
        self.stop.set()
        self.t.join()
        self.ch.close()


def chain(c, job, world, resizes, on_step=None):
    """Create `job` over `world` ranks and resize it `resizes` times in a row, each after rank 0
    reported a position; on_step(k, seconds) after each. Returns the seconds of each resize."""
    c.create_dataset(job + "-ds", world * 64)
    c.jobs.Create(feed_pb2.CreateJobRequest(job=feed_pb2.Job(
        name=job, dataset=job + "-ds", world_size=world, seed=1)), **c._kw())
    times = []
    for k in range(1, resizes + 1):
        c.report_progress(job, 0, 0, 1)
        t0 = time.monotonic()
        c.resize_job(job, world)
        times.append(time.monotonic() - t0)
        if on_step:
            on_step(k, times[-1])
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=65536)
    ap.add_argument("--resizes", type=int, default=100)
    ap.add_argument("--every", type=int, default=1)
    a = ap.parse_args()
    with Daemon() as d:
        c = Client(d.addr)
        chk = Checker(d.addr)
        print("# sluiced=%s world=%d" % (os.environ.get("SLUICED", "sluiced"), a.world))
        print("k resize_ms max_check_ms")
        chk.take()

        def row(k, s):
            lat = chk.take()
            if k % a.every == 0 or k == a.resizes:
                print("%d %.1f %.1f" % (k, s * 1e3, max(lat) * 1e3 if lat else 0), flush=True)

        chain(c, "bench", a.world, a.resizes, row)
        chk.close()
        c.close()
        d.stop()


if __name__ == "__main__":
    main()
