#!/usr/bin/env python3
"""HTTP/2 rapid-reset flood against a real sluiced (docs/hardening.md, "Attacks without a token").

Starts sluiced on 127.0.0.1 (port 0, a temporary data dir), then N attacker processes (default
3), each sending HEADERS + RST_STREAM pairs on one connection from --source (default 127.0.0.2)
for --duration seconds and reconnecting whenever the daemon closes the connection, while a
grpcio client on 127.0.0.1 calls grpc.health.v1.Health/Check every 0.1 s (deadline 1 s) and the
daemon's RSS is sampled every 0.1 s. Prints the attack rate, RSS percentiles and Check latency
percentiles; exits 1 if RSS reached --rss-max MiB, a Check failed or took 1 s or more, or the
daemon did not exit 0 on SIGTERM.

    SLUICED=build/rel/server/sluiced PYTHONPATH=build/rel/python:tests/python \\
        build/venv/bin/python tests/bench/attack_bench.py --duration 60
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import test_attacks  # noqa: E402  (the attacker and the sampling harness)
from sltest import Daemon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--connections", type=int, default=3)
    ap.add_argument("--path", default=test_attacks.UPLOAD)
    ap.add_argument("--source", default="127.0.0.2",
                    help="source address of the attackers (127.0.0.1 is the checker's)")
    ap.add_argument("--rss-max", type=float, default=256)
    ap.add_argument("--daemon-args", default="", help="extra sluiced flags, space-separated")
    a = ap.parse_args()

    d = Daemon(args=["--metrics-listen", "127.0.0.1:0"] + a.daemon_args.split()).start()
    try:
        f = test_attacks.Flood(d, a.duration, conns=a.connections, path=a.path,
                               source=a.source).run()
        rc = d.stop()
        log = d.log()
    finally:
        d.cleanup()
    rss, lat = sorted(f.rss), sorted(f.latency)
    pct = test_attacks.percentile
    print("rapid reset on %s: %d connections, %.0f s" % (a.path, a.connections, a.duration))
    print("  attack:  %d HEADERS+RST_STREAM pairs written (%.0f/s), %d connections opened "
          "(the daemon closes flooding ones and filters their address for 10 s)"
          % (f.pairs, f.pairs / a.duration, f.connections))
    print("  RSS MiB: start %.0f, p50 %.0f, p90 %.0f, max %.0f (%d samples)"
          % (rss and f.rss[0] or 0, pct(rss, 0.5), pct(rss, 0.9), rss[-1], len(rss)))
    print("  Check:   %d calls, p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms, %d failed"
          % (len(lat), 1e3 * pct(lat, 0.5), 1e3 * pct(lat, 0.9), 1e3 * pct(lat, 0.99),
             1e3 * lat[-1], len(f.check_errors)))
    flood_lines = [l for l in log.splitlines() if "event=rpc_flood" in l]
    print("  daemon:  %d rpc_flood events; exit code %s" % (len(flood_lines), rc))
    ok = rc == 0 and not f.check_errors and lat[-1] < 1.0 and rss[-1] < a.rss_max
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
