"""PyTorch samplers fed by the sluice coordinator.

``DistributedSampler`` takes the arguments of ``torch.utils.data.DistributedSampler`` plus the
daemon's address and a job name, and can be used wherever torch's is; ``BatchSampler`` serves a
job's token-budget batches. ``DataLoader`` is torch's DataLoader (same arguments) that also tells
the coordinator how far the training loop got::

    sampler = sluice.torch.DistributedSampler(ds, shuffle=True, seed=0, job="run1")
    loader = sluice.torch.DataLoader(ds, batch_size=32, sampler=sampler, num_workers=2)
    for epoch in range(sampler.epoch, EPOCHS):   # sampler.epoch: the epoch served next
        sampler.set_epoch(epoch)
        for batch in loader:
            train_step(batch)

The coordinator owns the epoch: every rank of a job gets the same epoch and a disjoint share of
it; when every rank has finished the epoch, the next one begins.

Positions count what the training loop consumed. ``DataLoader`` reports, before it hands the loop
batch k of an epoch, that batches [0, k) are consumed, and at the end of the epoch the whole share
(retried until it lands). With DataLoader workers the sampler runs ahead of the loop by the
prefetched batches; those are not counted. A rank killed while training batch k trains it again
after its restart, and nothing is lost.

DDP lockstep: a new iteration starts at the group's common position, the lowest position any
data-parallel rank of the job reported in the epoch, so after torchrun restarts the group every
rank has the same number of steps left. A rank that had reported further trains the difference
again (at most ``report_every`` batches, default 1).

``loader.data_position()`` is where the loop is (epoch, position in the job's unit), as counted
above; ``CheckpointManager`` (sluice/torch/checkpoint.py) saves it with every asynchronous checkpoint
and rewinds the job to it on restore.

Failures: every call is retried on UNAVAILABLE, CANCELLED (a daemon shutting down) and
DEADLINE_EXCEEDED with backoff for up to ``retry_seconds`` (also the first call, so a sampler
built before sluiced is up waits for it). A stream that breaks is reopened at the position
reached, in the same epoch. With several replicas (``address="h1:7700,h2:7700"``), a replica
that is UNAVAILABLE sends calls and the reopened stream on to the next one. If the training loop pauses longer than the daemon's
``--idle-timeout``, the daemon ends the stream it cannot send on; the sampler opens a new one at
the position reached.
"""
# The package: sampler.py (the samplers), loader.py (DataLoader and its workers), checkpoint.py
# (CheckpointManager). Each imports only those before it.
from sluice.torch.sampler import BatchSampler, DistributedSampler, JobMismatchError
from sluice.torch.loader import DataLoader
from sluice.torch.checkpoint import CheckpointError, CheckpointManager

__all__ = ["DistributedSampler", "BatchSampler", "DataLoader", "JobMismatchError",
           "CheckpointManager", "CheckpointError"]
