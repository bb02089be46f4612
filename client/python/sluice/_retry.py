"""Retries of the Python client's calls, one helper for the samplers and CheckpointManager:
which statuses are transient, and the waits between tries."""
import time

import grpc

# Retried: the daemon (or a replica) is down or restarting, a call was caught by its shutdown,
# or timed out.
RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
         grpc.StatusCode.DEADLINE_EXCEEDED)


class Backoff:
    """The waits between tries of a call that failed transiently: 50 ms doubling to 1 s, for up
    to `seconds` after the first failure (0: no retries)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.reset()

    def reset(self):
        self.deadline, self.delay = None, 0.05

    def wait(self, e):
        """Sleep before the next try, or raise `e` if it is not transient or the time is up."""
        if e.code() not in RETRY or not self.seconds:
            raise e
        now = time.monotonic()
        self.deadline = self.deadline or now + self.seconds
        if now >= self.deadline:
            raise e
        time.sleep(min(self.delay, self.deadline - now))
        self.delay = min(self.delay * 2, 1.0)


def call(fn, seconds, on_retry=None):
    """fn(), retried on transient failures with Backoff for up to `seconds`; after each failed
    try that is tried again, on_retry(error, seconds since the first failure)."""
    backoff = Backoff(seconds)
    first = None
    while True:
        try:
            return fn()
        except grpc.RpcError as e:
            backoff.wait(e)
            now = time.monotonic()
            first = first or now
            if on_retry is not None:
                on_retry(e, now - first)
