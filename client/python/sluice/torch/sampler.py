"""sluice.torch's samplers: DistributedSampler (indices) and BatchSampler (token-budget batches)
fed by the coordinator, with what both share (_Fed: the job check, the epoch and position
bookkeeping, progress reports, the stream loop). See sluice.torch for the guarantees."""
import multiprocessing
import os
import sys
import threading
import time
import warnings

import grpc
import torch.distributed as dist
import torch.utils.data
from torch.utils.data import Sampler

from sluice import _retry
from sluice._retry import RETRY as _RETRY
from sluice._retry import Backoff as _Backoff
from sluice.client import Client
from sluice.v1.feed_pb2 import BatchConfig

# Seconds of failed tries after which a sampler waiting for the daemon says so.
_WARN_AFTER = 5.0


class JobMismatchError(ValueError):
    """The job exists with other settings than the sampler was given."""


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


def _mismatches(job, want):
    """[(setting, job's value, sampler's value)] for every given setting that differs."""
    out = []
    for key, value in want.items():
        have = job[key]
        if value is not None and have != value:
            out.append((key, have, value))
    return out


def _dp_rank(info, rank):
    """The data-parallel rank of global rank `rank` in job `info` (its mesh order, outermost to
    innermost; "pp,dp,cp,tp" by default), or `rank` itself without a mesh."""
    if not info.HasField("mesh"):
        return rank
    m = info.mesh
    sizes = {"dp": m.dp or 1, "tp": m.tp or 1, "cp": m.cp or 1, "pp": m.pp or 1}
    order = [d.strip() for d in (m.order or "pp,dp,cp,tp").split(",")]
    inner = 1
    for d in reversed(order):
        if d == "dp":
            return (rank // inner) % sizes["dp"]
        inner *= sizes.get(d, 1)
    return rank


def _refuse_in_reimported_main():
    """A sampler made while a worker process (forkserver, spawn) runs the training script's top
    level again, because the script has no ``if __name__ == "__main__":`` guard: that copy
    would stream and report the job's data itself (it did: a second consumer of the epoch, with
    nothing said). Refused, so that the worker fails at start and the loop gets a clear error."""
    # multiprocessing sets _inheriting while a child imports the parent's main module (spawn's
    # preparation, the fork server's preload), and only then: a sampler made later in a child's
    # target function is fine.
    main = sys.modules.get("__main__")
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            "sluice: a sampler was created while a worker process re-ran the training script "
            "(%s): put the training under `if __name__ == \"__main__\":`"
            % (getattr(main, "__file__", None) or "its top level"))


# The version of the samplers' state_dict() format.
_STATE_VERSION = 1


def _state_settings(have):
    """The job settings a state_dict() carries and load_state_dict() compares: those that define
    the epochs' order (a resize changes the world and the rank weights, not these)."""
    return {k: v for k, v in have.items() if k != "rank_weights"}


_prefetch_warned = False


def _warn_if_prefetching():
    """Once per process: warn when a sluice sampler is iterated by torch's own DataLoader with
    workers. That loader takes indices ahead of the training loop (prefetch_factor x num_workers
    batches), so the positions the sampler reports count batches the loop has not trained: a
    rank killed then skips them (96 samples in one test). Called from the sampler's __iter__
    body, which torch's iterator runs a few frames below itself."""
    global _prefetch_warned
    if _prefetch_warned:
        return
    mp_iter = getattr(torch.utils.data.dataloader, "_MultiProcessingDataLoaderIter", None)
    f = sys._getframe(2)
    for _ in range(16):
        if f is None:
            return
        me = f.f_locals.get("self")
        if mp_iter is not None and isinstance(me, mp_iter):
            _prefetch_warned = True
            warnings.warn(
                "sluice: a sluice sampler is iterated by torch.utils.data.DataLoader with "
                "num_workers=%d: its progress reports and data_position() count the batches the "
                "workers prefetched, not those the training loop consumed, so a rank killed now "
                "skips them on resume. sluice.torch.DataLoader (same arguments) counts what the "
                "loop consumed." % getattr(me, "_num_workers", 0), RuntimeWarning, stacklevel=2)
            return
        f = f.f_back


class _Fed:
    """What both samplers share: the client, retries, the job check, the epoch and position
    bookkeeping, progress reports and the stream loop."""

    def _setup(self, address, job, num_replicas, rank, client, retry_seconds, lockstep):
        _refuse_in_reimported_main()
        self.client = client or Client(address)
        self.job = job or os.environ.get("SLUICE_JOB")
        if not self.job:
            raise ValueError("a job name is required (job= or SLUICE_JOB)")
        self.num_replicas = num_replicas
        self.rank = rank
        self.retry_seconds = retry_seconds
        self.lockstep = lockstep
        self.reconnects = 0         # streams reopened (daemon restarts, idle timeouts)
        self.retries = 0            # calls repeated after a retryable failure
        self.epoch = 0              # the epoch of the current (or last) iteration, or set_epoch's
        self._next_epoch = 0        # served by the next iteration unless set_epoch says otherwise
        self._live = None           # (end, list iterator) of the chunk being handed out
        self.position = 0           # positions [0, position) of the share were handed out
        self.start_position = 0     # where the current iteration resumed
        self.consumed = None        # counted by sluice.torch.DataLoader, else None
        self._serving = None        # epoch of the iteration under way
        self._share = 0             # share size of the iteration under way
        self._reported = -1
        # Background reports (_report_async): the one in flight (a grpc future), when the last
        # one was sent, a generation that tells a new iteration's reports from earlier ones,
        # and a failure that was not transient, raised on the loop's next report.
        self._rcond = threading.Condition(threading.RLock())
        self._rflight = None
        self._rsent = -1e9           # time.monotonic() of the last one sent
        self._rgen = 0
        self._rerror = None
        self._epoch_set = False     # set_epoch was called since the last iteration began
        self._tracked = False       # a sluice.torch.DataLoader reports for this sampler
        # (epoch, position) the training loop has consumed, as sluice.torch.DataLoader counts
        # it (or the end of an iteration); None: see data_position().
        self._at = None

    def _call(self, fn, *args, **kw):
        """fn(*args, **kw), retried on transient failures for up to retry_seconds (with a
        warning naming the address once the daemon has been unreachable for _WARN_AFTER s)."""
        warned = []

        def retried(e, waited):
            self.retries += 1
            if not warned and waited >= _WARN_AFTER:
                warned.append(True)  # once per call
                self._warn_unreachable(e)
        return _retry.call(lambda: fn(*args, **kw), self.retry_seconds, retried)

    def _warn_unreachable(self, e):
        warnings.warn("sluice: the daemon at %s has not answered for %g s (%s: %s); still "
                      "trying, for up to %g s in all (retry_seconds)"
                      % (self.client.address, _WARN_AFTER, e.code().name, e.details(),
                         self.retry_seconds), RuntimeWarning, stacklevel=4)

    def _attach(self, create, attach_any, want, create_fn):
        """Create the job if asked to (every rank may race: ALREADY_EXISTS is fine), then check
        that the existing job has the settings this sampler was given."""
        if create:
            try:
                self._call(create_fn)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    # The settings themselves (e.g. stratify with shuffle_mode="torch"): the
                    # daemon's message names the bad value.
                    raise ValueError("sluice: job %r: %s" % (self.job, e.details())) from None
                if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
        info = self._call(self.client.get_job, self.job)
        # Another world: refused when the sampler is first used, unless a load_state_dict()
        # (a restart into another world size, the state coming from the trainer's checkpoint
        # after the sampler was built) resizes the job to this world first.
        self._world_pending = None if info.world_size == self.num_replicas else info.world_size
        have = self._job_settings(info)
        diff = [] if attach_any else _mismatches(have, want)
        if diff:
            raise JobMismatchError(
                "job %r exists with other settings than this sampler's: %s. Use another job "
                "name, or attach_any=True to use the job as it is"
                % (self.job, "; ".join("%s: job has %r, sampler %r" % d for d in diff)))
        self.info = info
        self.epoch = self._next_epoch = info.epoch
        self._settings = _state_settings(have)
        return have

    @property
    def next_epoch(self):
        """The epoch the next iteration serves (set_epoch's, else the one after the last)."""
        return self.epoch if self._epoch_set else self._next_epoch

    def set_epoch(self, epoch):
        """Serve ``epoch`` in the next iteration, as torch's sampler does. The coordinator owns
        the epoch: an epoch that is over is not served again (the sampler warns and serves the
        coordinator's current one), and one more than one ahead of it is refused."""
        self.epoch = int(epoch)
        self._epoch_set = True

    def _check_world(self):
        if self._world_pending is not None:
            raise JobMismatchError("job %r has world size %d, this process was started with %d "
                                   "(load_state_dict() of a saved state resizes the job to this "
                                   "world)" % (self.job, self._world_pending, self.num_replicas))

    def _want_epoch(self):
        """The epoch to stream in a new iteration: self.epoch, checked against the job's."""
        self._check_world()
        current = self._call(self.client.get_job, self.job).epoch
        want = self.next_epoch
        if want < current:
            if self._epoch_set:
                warnings.warn("sluice: epoch %d of job %r is over; serving the coordinator's "
                              "epoch %d (after a restart, start the epoch loop at "
                              "sampler.epoch)" % (want, self.job, current))
            want = current
        elif want > current + 1:
            raise ValueError("set_epoch(%d): job %r is at epoch %d, so it serves epoch %d or %d "
                             "next" % (want, self.job, current, current, current + 1))
        self._epoch_set = False
        return want

    def _begin(self, epoch, start, share):
        self.epoch = self._serving = epoch
        self.position = self.start_position = start
        self._share = share
        with self._rcond:
            self._rgen += 1  # a report of an earlier iteration still in flight no longer counts
            self._reported = start if start else -1
            self._rerror = None
        if not self._tracked:
            self._at = None

    def data_position(self):
        """Where the training loop is in the feed: {"job", "epoch", "position", "world_size"},
        position in the job's unit (indices for DistributedSampler, batches for BatchSampler)
        counted in this rank's share of that epoch. This is what a checkpoint taken now must
        carry (sluice.torch.CheckpointManager records it with every save).

        With sluice.torch.DataLoader it counts the batches handed to the loop, not those its
        workers prefetched: after the loop trained batch k of an iteration that resumed at s,
        the position is s + (k + 1) * batch_size (capped at the share); once the loop has taken
        the whole epoch it is the share size of that epoch. Iterated without it (a plain torch
        DataLoader, or by hand) it counts the positions the sampler handed out, which with
        DataLoader workers runs ahead of the loop. Before this process iterated, it is where the
        next iteration starts (the job's epoch and the group's position, or the rank's own
        without lockstep), read from the coordinator."""
        if self._at is not None:
            epoch, position = self._at
        elif self._serving is not None:
            epoch = self._serving
            position = self.start_position if self._tracked else self.position
        else:
            st = self._call(self.client.get_epoch, self.job)
            epoch, position = st.epoch, st.group_position
            if not self.lockstep:
                dp = _dp_rank(self.info, self.rank)
                position = next((r.position for r in st.ranks if r.dp_rank == dp), 0)
        return {"job": self.job, "epoch": int(epoch), "position": int(position),
                "world_size": self.num_replicas}

    # ---- the position as a torch Stateful ----

    def state_dict(self):
        """The data position as a torch Stateful state (torch.distributed.checkpoint, torchdata's
        StatefulDataLoader, a torchtitan-style ``{"dataloader": loader}``): the job, the epoch,
        the position (data_position(): with sluice.torch.DataLoader what the loop consumed, else
        what this sampler handed out, which is what StatefulDataLoader's snapshots expect), the
        world it was counted in, the unit and the job's settings. Plain values only, so that
        ``torch.load(weights_only=True)`` reads it."""
        pos = self.data_position()
        return {"sluice_state": _STATE_VERSION, "job": self.job, "unit": self._unit,
                "epoch": pos["epoch"], "position": pos["position"],
                "world_size": pos["world_size"], "settings": dict(self._settings)}

    def load_state_dict(self, state):
        """Rewind the job to a state_dict() every rank of the data-parallel group saved at the
        same step: rank 0 puts every rank at that position (in this process's world: a state
        saved by 4 ranks loads into 2 or 3, the rest of the epoch redistributed) and, with
        torch.distributed initialized, the others wait for it at a barrier, so call it on every
        rank before iterating. Then this sampler takes the job as it is. ValueError naming the
        difference for a state of another job, unit or settings."""
        if not isinstance(state, dict) or state.get("sluice_state") != _STATE_VERSION:
            raise ValueError("not a sluice sampler state (state_dict() of sluice %d): %r"
                             % (_STATE_VERSION, type(state).__name__ if not isinstance(state, dict)
                                else sorted(state)))
        diff = []
        if state.get("job") != self.job:
            diff.append(("job", state.get("job"), self.job))
        if state.get("unit") != self._unit:
            diff.append(("unit", state.get("unit"), self._unit))
        saved = state.get("settings") or {}
        for key in sorted(set(saved) | set(self._settings)):
            if saved.get(key) != self._settings.get(key):
                diff.append((key, saved.get(key), self._settings.get(key)))
        if diff:
            raise ValueError("sluice: this state was saved with other settings than job %r has "
                             "now: %s" % (self.job, "; ".join("%s: state has %r, job %r" % d
                                                              for d in diff)))
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if (dist.get_rank() if distributed else self.rank) == 0:
            self._call(self.client.rewind, self.job, int(state["epoch"]), int(state["position"]),
                       int(state["world_size"]), self.num_replicas)
        if distributed:
            dist.barrier()
        self._resync()

    def _resync(self):
        """Forget where this process was in the feed and take the job as the coordinator has
        it now (after a Restore rewound it): its epoch, world and share sizes. The next
        iteration starts at the job's positions."""
        info = self._call(self.client.get_job, self.job)
        if info.world_size != self.num_replicas:
            raise JobMismatchError("job %r now has world size %d, this process was started "
                                   "with %d" % (self.job, info.world_size, self.num_replicas))
        self.info = info
        self._world_pending = None
        self._settings = _state_settings(self._job_settings(info))
        self.epoch = self._next_epoch = info.epoch
        self._epoch_set = False
        self._serving = self._at = self.consumed = None
        self.position = self.start_position = self._share = 0
        self._reported = -1
        self._recount()

    def report(self, position=None):
        """Report that positions [0, position) of this rank's share in the current epoch are
        consumed (default: what sluice.torch.DataLoader counted, else everything handed out).
        Retried like every call; returns the daemon's answer, or None if nothing was new."""
        if self._serving is None:
            raise RuntimeError("nothing to report before the first iteration")
        if position is None:
            position = self.position if self.consumed is None else self.consumed
        if position <= self._reported:
            return None
        resp = self._call(self.client.report_progress, self.job, self.rank, self._serving,
                          position)
        with self._rcond:
            self._reported = max(self._reported, position)
        return resp

    def _report_async(self, position, gap, interval):
        """Report `position` in the background (sluice.torch.DataLoader's reports): sent only
        when no report is in flight and either `interval` seconds have passed since the last
        one was sent or `position` is at least `gap` past what the daemon recorded; otherwise
        a later call sends a later position (the latest wins). A transient failure is sent
        again by a later call (or by _report_bound); one that is not transient is raised by
        the next call."""
        with self._rcond:
            self._raise_report_error()
            if self._rflight is not None or position <= self._reported:
                return
            now = time.monotonic()
            if (now - self._rsent < interval and
                    position - max(self._reported, self.start_position) < gap):
                return
            gen = self._rgen
            try:
                fut = self.client.report_progress_future(self.job, self.rank, self._serving,
                                                         position)
            except grpc.RpcError:
                return  # sent again later
            self._rsent, self._rflight = now, fut
        fut.add_done_callback(lambda f: self._report_done(f, gen, position))

    def _report_done(self, fut, gen, position):
        """A background report landed (on gRPC's thread, or at once): record it."""
        with self._rcond:
            if self._rflight is fut:
                self._rflight = None
            if gen == self._rgen:
                try:
                    fut.result()
                    self._reported = max(self._reported, position)
                except grpc.RpcError as e:
                    if e.code() not in _RETRY:
                        self._rerror = e
            self._rcond.notify_all()

    def _raise_report_error(self):
        if self._rerror is not None:
            e, self._rerror = self._rerror, None
            raise e

    def _report_bound(self, position, lag):
        """Wait until the daemon has recorded at least position - lag (the bound on what a rank
        killed without a checkpoint trains again): for the report in flight, then, if that is
        not enough, report `position` itself (retried like report())."""
        if position - max(self._reported, self.start_position) <= lag:
            return
        self._report_wait()
        if position - max(self._reported, self.start_position) > lag:
            self.report(position)

    def _report_wait(self):
        """Wait for the background report in flight, if any; raise its failure if it was not
        transient."""
        with self._rcond:
            while self._rflight is not None:
                self._rcond.wait()
            self._raise_report_error()

    def _finish(self):
        """The share of the iteration is consumed: report it (also an empty one, so that its
        epoch can end) and move on to the next epoch."""
        self._at = (self._serving, self._share)
        self._report_wait()
        self.report(self._share)
        self._next_epoch = self._serving + 1

    def __len__(self):
        return self._len()

    def __iter__(self):
        """One epoch of this rank's share: what _items makes of each chunk _open streams."""
        if not self._tracked:
            _warn_if_prefetching()
        begun = False
        try:
            for chunk in self._chunks(self._open):
                if not begun:
                    self._begin(chunk.epoch, *self._start_and_count(chunk))
                    begun = True
                plain = self._plain(chunk) if not self.report_every else None
                if plain is not None:
                    # No per-item Python work: the list iterator yields in C, and the position
                    # is read off how much of it is left (the position property).
                    self._live = (chunk.start + len(plain), iter(plain))
                    yield from self._live[1]
                    self._live = None
                    self._position = chunk.start + len(plain)
                    continue
                for position, item in self._items(chunk):
                    self.position = position
                    yield item
                    if self.report_every and self.position - self._reported >= self.report_every:
                        self.report()
        finally:
            if self._live is not None:
                self.position = self.position   # what was handed out, fixed
        if begun and not self._tracked:
            self._finish()

    @property
    def position(self):
        """Positions [0, position) of the share were handed out."""
        live = self._live
        if live is not None:
            return live[0] - live[1].__length_hint__()
        return self._position

    @position.setter
    def position(self, value):
        self._live = None
        self._position = value

    def _plain(self, chunk):
        """The chunk's items as a list when each is its index itself, else None."""
        return None

    def _chunks(self, open_stream):
        """Chunks of this iteration from open_stream(epoch, position). If the stream breaks
        (daemon restart or shutdown), reopen it with backoff for up to retry_seconds at the
        position reached, in the same epoch; a stream the daemon ended as idle (the loop
        paused) is reopened at once."""
        begun = False
        self._serving = None
        epoch = self._want_epoch()
        backoff = _Backoff(self.retry_seconds)
        while True:
            stream = open_stream(epoch, self.position if begun else None)
            try:
                for chunk in stream:
                    backoff.reset()
                    begun = True
                    yield chunk
                return
            except grpc.RpcError as e:
                if not (begun and _idle_ended(e)):
                    backoff.wait(e)
                self.reconnects += 1
            finally:
                stream.cancel()


class DistributedSampler(_Fed, Sampler):
    """Drop-in for torch.utils.data.DistributedSampler with the coordinator owning the epoch.

    ``shuffle=True`` uses the ``torch`` shuffle mode, which reproduces torch's own sampler
    exactly for the same seed (pass ``shuffle_mode="feistel"`` for O(1)-memory shuffling of very
    large datasets). ``dataset`` is only used for its length (or pass ``num_samples``). With
    ``create=True`` the dataset (``dataset_name``, default ``<job>-data``) and the job are
    created if they do not exist; an existing job must have the sample count, seed, shuffle
    mode, drop_last and partition given here (JobMismatchError names the difference), unless
    ``attach_any=True``, which takes the job's settings as they are.

    Sampling II (docs/sampling.md): ``stratify=True`` gives every rank each class in proportion;
    ``class_weights`` (one per class) or ``balance_classes=True`` make class-balanced epochs of
    ``epoch_length`` samples (default N); ``rank_weights`` (one per rank) size the shares, e.g.
    for mixed GPU generations. Classes need the dataset's labels: pass ``labels`` (one class id
    per sample), uploaded when the dataset has none yet. With classes the default shuffle mode is
    ``feistel`` (torch's permutation is not class-aware). These settings are compared with an
    existing job's like the others.
    """

    _unit = "indices"  # what a position counts (state_dict)

    def __init__(self, dataset=None, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False, *, address=None, job=None, dataset_name=None,
                 num_samples=None, shuffle_mode=None, partition="", chunk_size=0, create=True,
                 attach_any=False, report_every=0, max_chunk=0, retry_seconds=60.0,
                 lockstep=True, client=None, stratify=False, class_weights=None,
                 balance_classes=False, epoch_length=0, rank_weights=None, labels=None):
        num_replicas, rank = _world_and_rank(num_replicas, rank)
        self._setup(address, job, num_replicas, rank, client, retry_seconds, lockstep)
        if num_samples is None:
            if dataset is None:
                raise ValueError("give a dataset or num_samples")
            num_samples = len(dataset)
        self.dataset = dataset
        self.report_every = report_every
        self.max_chunk = max_chunk
        classes = bool(stratify or balance_classes or class_weights)
        mode = shuffle_mode or (("feistel" if classes else "torch") if shuffle else "none")
        data = dataset_name or self.job + "-data"
        class_weights = [float(w) for w in class_weights] if class_weights else []
        rank_weights = [float(w) for w in rank_weights] if rank_weights else []

        def create_fn():
            try:
                self.client.create_dataset(data, num_samples)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
            if labels is not None and not self.client.get_dataset(data).has_labels:
                try:
                    self.client.upload_labels(data, labels)
                except grpc.RpcError as e:
                    # Another rank's upload won and a job uses it already: same labels.
                    if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                        raise
            self.client.create_job(self.job, data, num_replicas, partition=partition,
                                   shuffle=mode, seed=seed, drop_last=drop_last,
                                   chunk_size=chunk_size, stratify=stratify,
                                   class_weights=class_weights,
                                   balance_classes=balance_classes, epoch_length=epoch_length,
                                   rank_weights=rank_weights)

        want = dict(samples=num_samples, seed=seed, shuffle=mode, drop_last=bool(drop_last),
                    partition=partition or "interleaved",
                    chunk_size=chunk_size if partition == "chunked" else None,
                    stratify=bool(stratify), balance_classes=bool(balance_classes),
                    class_weights=class_weights, epoch_length=int(epoch_length),
                    rank_weights=rank_weights)
        have = self._attach(create, attach_any, want, create_fn)
        self.total_samples = have["samples"]
        self.seed = have["seed"]
        self.shuffle_mode = have["shuffle"]
        self.shuffle = have["shuffle"] != "none"
        self.drop_last = have["drop_last"]
        self.num_samples = self._share_count()

    def _job_settings(self, info):
        samples = self._call(self.client.get_dataset, info.dataset).samples
        return dict(samples=samples, seed=info.seed, shuffle=info.shuffle,
                    drop_last=info.drop_last, partition=info.partition,
                    chunk_size=info.chunk_size, stratify=info.stratify,
                    balance_classes=info.balance_classes,
                    class_weights=list(info.class_weights), epoch_length=info.epoch_length,
                    rank_weights=list(info.rank_weights))

    def _recount(self):
        self.num_samples = self._share_count()

    def _share_count(self):
        st = self._call(self.client.get_epoch, self.job)
        self.dp_size = st.dp_size or self.num_replicas
        if self.info.HasField("mesh"):
            return max(r.count for r in st.ranks) if st.ranks else 0
        return st.ranks[self.rank].count if self.rank < len(st.ranks) else 0

    @property
    def total_size(self):
        """Indices of one epoch over all data-parallel ranks, padding included (torch's)."""
        return self.num_samples * self.dp_size

    def _len(self):
        return self.num_samples

    def _open(self, epoch, position):
        return self.client.stream_indices(self.job, self.rank, epoch, position, self.max_chunk,
                                          self.lockstep)

    def _start_and_count(self, chunk):
        self.num_samples = chunk.share_count
        return chunk.start, chunk.share_count

    def _items(self, chunk):
        return enumerate(chunk.indices, chunk.start + 1)

    def _plain(self, chunk):
        return list(chunk.indices)


class BatchSampler(_Fed, Sampler):
    """Token-budget batches of a job with a batching config: yields lists of sample indices.
    Every rank gets the same number of batches per epoch, and no batch exceeds the budget.
    Positions are counted in batches. Give ``batching`` (BatchConfig fields), ``seed`` or
    ``shuffle_mode`` to check them against the job (JobMismatchError), or ``attach_any=True``.
    ``len()`` is the epoch's number of batches per rank, known right after construction."""

    _unit = "batches"  # what a position counts (state_dict)

    def __init__(self, num_replicas=None, rank=None, *, address=None, job=None, batching=None,
                 seed=None, shuffle_mode=None, attach_any=False, report_every=0, max_batches=0,
                 retry_seconds=60.0, lockstep=True, client=None):
        num_replicas, rank = _world_and_rank(num_replicas, rank)
        self._setup(address, job, num_replicas, rank, client, retry_seconds, lockstep)
        self.report_every = report_every
        self.max_batches = max_batches
        want = dict(seed=seed, shuffle=shuffle_mode)
        fields = {f.name for f in BatchConfig.DESCRIPTOR.fields}
        for key, value in (batching or {}).items():
            if key not in fields:
                raise ValueError("unknown batching setting %r (one of %s)"
                                 % (key, ", ".join(sorted(fields))))
            want["batching." + key] = value
        have = self._attach(False, attach_any, want, None)
        if not self.info.HasField("batching"):
            raise ValueError("job %r has no batching config" % self.job)
        self.seed = have["seed"]
        self.shuffle = have["shuffle"] != "none"
        self.last_batches = []  # (max_len, tokens, padded_tokens) of each batch handed out
        self.num_batches = self._batch_count()

    def _job_settings(self, info):
        have = dict(seed=info.seed, shuffle=info.shuffle)
        for field in info.batching.DESCRIPTOR.fields:
            have["batching." + field.name] = getattr(info.batching, field.name)
        return have

    def _recount(self):
        self.num_batches = self._batch_count()

    def _batch_count(self):
        # Epochs.Get waits for the epoch's batch plan, so the count is known before streaming.
        st = self._call(self.client.get_epoch, self.job)
        return st.ranks[0].count if st.ranks else 0

    def _len(self):
        return self.num_batches

    def _open(self, epoch, step):
        return self.client.stream_batches(self.job, self.rank, epoch, step, self.max_batches,
                                          self.lockstep)

    def _start_and_count(self, chunk):
        self.num_batches = chunk.batches_per_rank
        self.last_batches = []
        start = chunk.batches[0].step if chunk.batches else chunk.batches_per_rank
        return start, chunk.batches_per_rank

    def _items(self, chunk):
        for b in chunk.batches:
            self.last_batches.append((b.max_len, b.tokens, b.padded_tokens))
            yield b.step + 1, list(b.indices)
