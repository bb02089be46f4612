"""A fake trainer for test_feed: streams its rank's indices in steps of 10, writes each step as a
JSON line (flushed), then reports the step's end as consumed. Killed mid-epoch, a restart resumes
after the last reported position.

usage: feed_trainer.py JOB RANK OUT [--no-delay]
"""
import json
import sys
import time

from sluice.client import Client


def main():
    job, rank, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    delay = 0.0 if "--no-delay" in sys.argv else 0.01
    c = Client()
    epoch = None
    step = []
    pos = None
    with open(out, "a") as f:
        for ch in c.stream_indices(job, rank, max_chunk=7):
            if epoch is None:
                epoch, pos = ch.epoch, ch.start
            for i in ch.indices:
                step.append(i)
                if len(step) == 10:
                    f.write(json.dumps({"start": pos, "indices": step}) + "\n")
                    f.flush()
                    time.sleep(delay)
                    pos += len(step)
                    c.report_progress(job, rank, epoch, pos)
                    step = []
        if step:
            f.write(json.dumps({"start": pos, "indices": step}) + "\n")
            f.flush()
            pos += len(step)
            c.report_progress(job, rank, epoch, pos)


if __name__ == "__main__":
    main()
