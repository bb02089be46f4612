"""PyTorch samplers fed by the sluice coordinator.

``DistributedSampler`` takes the arguments of ``torch.utils.data.DistributedSampler`` plus the
daemon's address and a job name, and can be used wherever torch's is. The coordinator owns the
epoch: every rank of a job gets the same epoch and a disjoint share of it; a restarted rank resumes
after its last reported position; when every rank has finished the epoch, the next one begins.
``set_epoch`` is accepted and ignored (the coordinator decides the epoch).

Progress: at the end of each iteration the sampler reports its whole share as consumed. For
finer-grained resume, call ``sampler.report(position)`` after the samples before ``position`` are
really consumed (e.g. after an optimizer step); ``report_every=N`` instead reports every N
indices handed out, which with a prefetching DataLoader may count a few prefetched samples as
consumed. If the daemon restarts mid-epoch, the sampler reconnects (for up to ``retry_seconds``)
and continues where it was. If the training loop pauses longer than the daemon's
``--idle-timeout`` (the DataLoader stops taking indices, e.g. for a long evaluation), the daemon
ends the stream it can no longer send on; the sampler then opens a new one at the position it
reached, so a pause never loses or repeats samples.
"""
import os
import time
import warnings

import grpc
import torch.distributed as dist
from torch.utils.data import Sampler

from sluice.client import Client

__all__ = ["DistributedSampler", "BatchSampler"]


def _world_and_rank(num_replicas, rank):
    if num_replicas is None:
        if os.environ.get("WORLD_SIZE"):
            num_replicas = int(os.environ["WORLD_SIZE"])
        elif dist.is_available() and dist.is_initialized():
            num_replicas = dist.get_world_size()
        else:
            num_replicas = 1
    if rank is None:
        if os.environ.get("RANK"):
            rank = int(os.environ["RANK"])
        elif os.environ.get("LOCAL_RANK"):
            rank = int(os.environ["LOCAL_RANK"])
        elif dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
        else:
            rank = 0
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError("rank %d out of range [0, %d)" % (rank, num_replicas))
    return num_replicas, rank


def _idle_ended(e):
    """True if the daemon ended a stream because this client stopped reading it for the idle
    timeout (the message is the daemon's, see docs/hardening.md): safe to reopen at once."""
    return (e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            and "no send progress" in (e.details() or ""))


def _ensure_job(client, job, dataset_name, num_samples, num_replicas, create, **job_args):
    """Create the dataset and the job if asked to (every rank may race: ALREADY_EXISTS is
    fine), then check that the job's world matches this process's."""
    if create:
        try:
            client.create_dataset(dataset_name, num_samples)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        try:
            client.create_job(job, dataset_name, num_replicas, **job_args)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
    info = client.get_job(job)
    if info.world_size != num_replicas:
        raise ValueError("job %r has world size %d, this process was started with %d"
                         % (job, info.world_size, num_replicas))
    return info


class _Fed:
    """Shared state of the samplers: client, job, rank, epoch bookkeeping, reporting."""

    def _setup(self, address, job, rank, client):
        self.client = client or Client(address)
        self.job = job or os.environ.get("SLUICE_JOB")
        if not self.job:
            raise ValueError("a job name is required (job= or SLUICE_JOB)")
        self.rank = rank
        self.epoch = None           # the epoch of the current (or last) iteration
        self.position = 0           # positions [0, position) of the share were handed out
        self.start_position = 0     # where the current iteration resumed
        self._next_epoch = None     # None: the coordinator's current epoch
        self._reported = -1
        self.reconnects = 0         # streams reopened (daemon restarts, idle timeouts)

    def set_epoch(self, epoch):
        """Accepted for compatibility with torch; the coordinator decides the epoch."""
        self.requested_epoch = epoch

    def report(self, position=None):
        """Report that positions [0, position) of this rank's share in the current epoch are
        consumed (default: everything handed out so far). Returns the daemon's answer."""
        if self.epoch is None:
            raise RuntimeError("nothing to report before the first iteration")
        position = self.position if position is None else position
        if position <= self._reported:
            return None
        resp = self.client.report_progress(self.job, self.rank, self.epoch, position)
        self._reported = position
        return resp

    def _begin(self, epoch, start):
        self.epoch = epoch
        self.position = start
        self.start_position = start
        self._reported = start

    def _end(self):
        if self.epoch is not None:
            self._next_epoch = self.epoch + 1


class DistributedSampler(Sampler, _Fed):
    """Drop-in for torch.utils.data.DistributedSampler with the coordinator owning the epoch.

    ``shuffle=True`` uses the ``torch`` shuffle mode, which reproduces torch's own sampler
    exactly for the same seed (pass ``shuffle_mode="feistel"`` for O(1)-memory shuffling of very
    large datasets). ``dataset`` is only used for its length (or pass ``num_samples``).
    """

    def __init__(self, dataset=None, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False, *, address=None, job=None, dataset_name=None,
                 num_samples=None, shuffle_mode=None, partition="", chunk_size=0, create=True,
                 report_every=0, max_chunk=0, retry_seconds=60.0, client=None):
        num_replicas, rank = _world_and_rank(num_replicas, rank)
        self._setup(address, job, rank, client)
        if num_samples is None:
            if dataset is None:
                raise ValueError("give a dataset or num_samples")
            num_samples = len(dataset)
        self.num_replicas = num_replicas
        self.total_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.report_every = report_every
        self.max_chunk = max_chunk
        self.retry_seconds = retry_seconds
        self.reconnects = 0
        self._iter_begun = False
        mode = shuffle_mode or ("torch" if shuffle else "none")
        self.info = _ensure_job(self.client, self.job, dataset_name or self.job + "-data",
                                num_samples, num_replicas, create, partition=partition,
                                shuffle=mode, seed=seed, drop_last=drop_last,
                                chunk_size=chunk_size)
        self.num_samples = self._share_count()

    def _share_count(self):
        st = self.client.get_epoch(self.job)
        if self.info.HasField("mesh"):
            return max(r.count for r in st.ranks) if st.ranks else 0
        return st.ranks[self.rank].count if self.rank < len(st.ranks) else 0

    def __len__(self):
        return self.num_samples

    def _chunks(self):
        """Index chunks of this iteration. If the daemon goes away (UNAVAILABLE: restarted,
        shutting down), reconnect with backoff for up to retry_seconds and continue at the
        position reached, in the same epoch."""
        deadline = None
        delay = 0.05
        while True:
            begun = self.epoch is not None and self._iter_begun
            stream = self.client.stream_indices(
                self.job, self.rank, epoch=self.epoch if begun else self._next_epoch,
                position=self.position if begun else None, max_chunk=self.max_chunk)
            try:
                for chunk in stream:
                    deadline = None
                    yield chunk
                return
            except grpc.RpcError as e:
                if self._iter_begun and _idle_ended(e):
                    self.reconnects += 1
                    continue
                if e.code() != grpc.StatusCode.UNAVAILABLE or not self.retry_seconds:
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.retry_seconds
                if now >= deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                self.reconnects += 1
            finally:
                stream.cancel()

    def __iter__(self):
        self._iter_begun = False
        for chunk in self._chunks():
            if not self._iter_begun:
                self._begin(chunk.epoch, chunk.start)
                self.num_samples = chunk.share_count
                self._iter_begun = True
            for index in chunk.indices:
                self.position += 1
                yield index
                if self.report_every and self.position - self._reported >= self.report_every:
                    self.report()
        if not self._iter_begun:
            return
        if self.position >= self.num_samples:
            try:
                self.report(self.num_samples)
            except grpc.RpcError as e:
                warnings.warn("sluice: progress report failed: %s" % e.details())
        self._end()


class BatchSampler(Sampler, _Fed):
    """Token-budget batches of a job with a batching config: yields lists of sample indices.
    Every rank gets the same number of batches per epoch, and no batch exceeds the budget.
    Positions are counted in batches (``report(step)``)."""

    def __init__(self, num_replicas=None, rank=None, *, address=None, job=None, report_every=0,
                 max_batches=0, client=None):
        num_replicas, rank = _world_and_rank(num_replicas, rank)
        self._setup(address, job, rank, client)
        self.num_replicas = num_replicas
        self.report_every = report_every
        self.max_batches = max_batches
        self.info = self.client.get_job(self.job)
        if not self.info.HasField("batching"):
            raise ValueError("job %r has no batching config" % self.job)
        self.num_batches = None
        self.last_batches = []  # (max_len, tokens, padded_tokens) of each batch handed out

    def __len__(self):
        if self.num_batches is None:
            st = self.client.get_epoch(self.job)
            self.num_batches = st.ranks[0].count if st.ranks else 0
        return self.num_batches

    def _chunks(self, state):
        """Batch chunks of this iteration; a stream the daemon ended as idle (the consumer
        paused) is reopened at the step reached."""
        while True:
            begun = not state["first"]
            stream = self.client.stream_batches(
                self.job, self.rank, epoch=self.epoch if begun else self._next_epoch,
                step=self.position if begun else None, max_batches=self.max_batches)
            try:
                for chunk in stream:
                    yield chunk
                return
            except grpc.RpcError as e:
                if state["first"] or not _idle_ended(e):
                    raise
                self.reconnects += 1
            finally:
                stream.cancel()

    def __iter__(self):
        state = {"first": True}
        first = True
        self.last_batches = []
        chunks = self._chunks(state)
        try:
            for chunk in chunks:
                if first:
                    start = chunk.batches[0].step if chunk.batches else chunk.batches_per_rank
                    self._begin(chunk.epoch, start)
                    self.num_batches = chunk.batches_per_rank
                    first = state["first"] = False
                for b in chunk.batches:
                    self.position = b.step + 1
                    self.last_batches.append((b.max_len, b.tokens, b.padded_tokens))
                    yield list(b.indices)
                    if self.report_every and self.position - self._reported >= self.report_every:
                        self.report()
        finally:
            chunks.close()
        if first:
            return
        if self.position >= self.num_batches:
            try:
                self.report(self.num_batches)
            except grpc.RpcError as e:
                warnings.warn("sluice: progress report failed: %s" % e.details())
        self._end()
