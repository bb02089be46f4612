"""sluice.torch.CheckpointManager: asynchronous checkpoints that carry the data position.

Every rank calls ``mgr.save(step, state)`` with its own state (model, optimizer, scheduler, RNG
states: anything torch.distributed.checkpoint saves, FSDP2's DTensors included). The call copies
the state's tensors to host memory, records where the training loop is in the feed (what
sluice.torch.DataLoader handed to the loop, not what its workers prefetched) and returns; this
rank's shard is uploaded on a background thread. Each rank plans its shard with DCP's default
planner by itself and writes its part of DCP's metadata at the shard's end, so the ranks never
wait for one another: Begin asks the daemon to commit once every rank's shard is durable. The
checkpoint is a DCP checkpoint (``dcp.load(state, checkpoint_id="sluice://JOB/STEP")`` reads it,
resharded). ``mgr.restore()`` puts the model state and the feed back to the
latest COMPLETE checkpoint::

    sampler = sluice.torch.DistributedSampler(ds, shuffle=True, seed=0, job="run1")
    loader = sluice.torch.DataLoader(ds, batch_size=32, sampler=sampler, num_workers=2)
    mgr = sluice.torch.CheckpointManager(loader, keep_last=3)
    state = mgr.restore()                      # None on a fresh start
    step = 0
    if state:
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
        step = state["step"]
    for epoch in range(sampler.epoch, EPOCHS):   # after restore(): the restored epoch
        sampler.set_epoch(epoch)
        for batch in loader:                     # resumes at the restored position
            train_step(batch); step += 1
            if step % 100 == 0:
                mgr.save(step, {"model": model.state_dict(), "opt": opt.state_dict(),
                                "step": step})
    mgr.close()                                  # waits for the last upload

With FSDP2 (DTensor state), restore into a template of the new sharding, which DCP's planner
fills in place whatever the world size the checkpoint was saved with::

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    msd, osd = get_state_dict(model, opt)
    if mgr.restore(state_dict={"model": msd, "opt": osd}):
        set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)

The shape is Orbax's CheckpointManager and PyTorch DCP's async_save: at most one save in
flight (the next waits for it), ``wait()``, an error of a background save raised by the next
call, ``keep_last``, ``latest_step()``, ``restore(step=None)``.
"""
import re
import threading
import time
import warnings

import grpc
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
# Loading without a template: DCP's own planner that builds the state from the metadata, as its
# dcp_to_torch_save does (private names, in every torch 2.x that has DCP's Stateful).
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from sluice import _retry
from sluice._retry import Backoff as _Backoff
from sluice.checkpoint import CHUNK, COMPLETE, WRITING, Checkpoints
from sluice.client import Client
from sluice.torch.dcp import LocalShard, NotDcp, Reader, _dcp_format, retype
from sluice.torch.loader import DataLoader, _fed_sampler
from sluice.torch.sampler import BatchSampler, DistributedSampler, _dp_rank, _world_and_rank

__all__ = ["CheckpointManager", "CheckpointError"]


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or restored; a failed background save is raised as one
    by the manager's next call (the original error is its __cause__)."""


def _not_found(e):
    return isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.NOT_FOUND


def _step_name(step):
    return "step_%d" % step


def _layout(tensors):
    """What host buffers for copies of `tensors` need: (dtype, shape, pinned) each, pinned for
    a CUDA tensor (the device-to-host copies then run at full speed and without blocking)."""
    return [(t.dtype, tuple(t.shape), t.device.type == "cuda") for t in tensors]


class CheckpointManager:
    """Asynchronous checkpoints of one training run, bound to its feed.

    ``data``: the run's sluice.torch DataLoader, DistributedSampler or BatchSampler (its data
    position goes into every checkpoint and restore() rewinds it), or the feed job's name, or
    None for checkpoints without a data position. It can be set later (``mgr.data = loader``):
    to restart into another world size, restore() must run before the samplers are built (the
    job still has the old world until then), so pass the job's name here and the loader after.

    ``job``: the checkpoint job (default: the feed job's name; checkpoints are named
    ``step_<step>``). ``keep_last``: keep only the last K COMPLETE checkpoints (the daemon's
    retention, set once by rank 0; None leaves the job's policy as it is). Rank and world come
    from ``rank``/``world_size``, else RANK and WORLD_SIZE (torchrun), else torch.distributed.
    Calls that fail transiently (UNAVAILABLE, a daemon restarting) are retried with backoff for
    up to ``retry_seconds``; an interrupted upload resumes where the daemon kept it.
    ``reuse_buffers``: keep the host copies of the last save for the next one when its tensors
    have the same dtypes and shapes (no fresh memory to fault in; one copy of the state stays
    allocated). ``allow_pickle``: save objects of types the state format has no encoding for
    (anything else torch.save takes) pickled, and unpickle them on restore: as torch.load
    without weights_only, only for checkpoints you trust (see Checkpoints.save_state_dict)."""

    def __init__(self, data=None, *, job=None, address=None, keep_last=None, rank=None,
                 world_size=None, retry_seconds=60.0, restore_timeout=300.0,
                 reuse_buffers=True, chunk_size=CHUNK, token=None, checkpoints=None,
                 allow_pickle=False):
        self.world, self.rank = _world_and_rank(world_size, rank)
        self._source = None
        self._feed_job = None
        self.client = None
        if isinstance(data, str):
            self._feed_job = data
        elif data is not None:
            self.data = data
        self.job = job or self._feed_job
        if not self.job:
            raise ValueError("a checkpoint job is needed: job=, or data= (a sluice loader or "
                             "sampler, or the feed job's name)")
        self.retry_seconds = retry_seconds
        self.restore_timeout = restore_timeout
        self.reuse_buffers = reuse_buffers
        self.allow_pickle = allow_pickle
        self.chunk_size = chunk_size
        if address is None and self._source is not None:
            address = self._source.client.address
        self.ck = checkpoints or Checkpoints(address, token=token)
        self._own_ck = checkpoints is None
        if self.client is None:
            self.client = Client(self.ck.address, token=token)
        self._thread = None
        self._error = None
        self._staged, self._staged_key = None, None
        self._reserving = None      # the thread restore(state_dict=...) allocates buffers on
        self.last_stall = None      # seconds the last save() took (the training loop's stall)
        self.last_upload = None     # seconds the last background upload took, until durable
        self.restored_step = None   # the step restore() put back, or None
        self.retries = 0            # calls repeated after a transient failure (daemon restarts)
        self.keep_last = keep_last
        if keep_last is not None:
            if not isinstance(keep_last, int) or keep_last < 0:
                raise ValueError("keep_last %r must be an integer >= 0 (0 keeps all)"
                                 % (keep_last,))
            if self.rank == 0:
                self._retry(self.ck.set_retention, self.job, keep_last)

    # ---- the feed ----

    @property
    def data(self):
        """The sluice sampler whose data position checkpoints carry (or None)."""
        return self._source

    @data.setter
    def data(self, data):
        if isinstance(data, DataLoader):
            sampler, _ = _fed_sampler(data)
            if sampler is None:
                raise ValueError("this DataLoader has no sluice sampler or batch_sampler")
        elif isinstance(data, (DistributedSampler, BatchSampler)):
            sampler = data
        else:
            raise TypeError("data must be a sluice.torch DataLoader, DistributedSampler or "
                            "BatchSampler, not %s" % type(data).__name__)
        if (sampler.rank, sampler.num_replicas) != (self.rank, self.world):
            raise ValueError("the sampler is rank %d of %d, this manager rank %d of %d"
                             % (sampler.rank, sampler.num_replicas, self.rank, self.world))
        if self._feed_job and sampler.job != self._feed_job:
            raise ValueError("the sampler feeds job %r, this manager %r"
                             % (sampler.job, self._feed_job))
        self._source = sampler
        self._feed_job = sampler.job
        if self.client is None:
            self.client = sampler.client

    # ---- retries ----

    def _retry(self, fn, *args, **kw):
        """fn(*args, **kw), retried like the samplers' calls (transient statuses, backoff)."""
        return _retry.call(lambda: fn(*args, **kw), self.retry_seconds, self._retried)

    def _retried(self, e, waited):
        self.retries += 1

    # ---- saving ----

    def _check(self):
        """Raise the error of a finished background save (once)."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread.join()
            self._thread = None
        if self._error is not None:
            step, err = self._error
            self._error = None
            raise CheckpointError("saving step %d of %s (rank %d) failed: %s: %s"
                                  % (step, self.job, self.rank, type(err).__name__, err)) from err

    def wait(self):
        """Wait until this rank's shard of the save in flight is durable; raise its error if it
        failed. The checkpoint is COMPLETE once every rank's is (the daemon commits it)."""
        if self._thread is not None:
            self._thread.join()
        self._check()

    def save(self, step, state_dict, user_metadata=""):
        """Checkpoint ``state_dict`` of this rank as ``step_<step>``: copy its tensors to host
        memory, record the data position of what the training loop consumed, start the upload
        in the background and return. Call it on every rank at the same step, after the
        optimizer step of the last batch the loop took. Waits first for a save still in flight
        and raises its error if it failed (CheckpointError).

        The state is anything torch.distributed.checkpoint saves: nested dicts and lists of
        tensors, DTensors (FSDP2: this rank's chunk), Stateful values (through their
        state_dict()) and plain values; DCP's default planner lays it out, without collectives:
        each rank writes its own shard. A value that would load back only by unpickling it
        raises TypeError naming its key, before anything is copied, unless allow_pickle."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError("step %r must be an integer >= 0" % (step,))
        if not isinstance(user_metadata, str) or _dcp_format(user_metadata) is not None:
            raise ValueError("user_metadata %.200r: a string, not dcp.save's record of its "
                             "metadata shard" % (user_metadata,))
        t0 = time.perf_counter()
        self.wait()
        shard = LocalShard(state_dict, self.rank, stage=self._stage,
                           allow_pickle=self.allow_pickle)
        position = self._source.data_position() if self._source is not None else None
        self._thread = threading.Thread(target=self._background, name="sluice-ckpt-%d" % step,
                                        args=(step, shard, position, user_metadata))
        self._thread.start()
        self.last_stall = time.perf_counter() - t0

    def reserve(self, state_dict):
        """Allocate (and fault in) the host buffers a save of a state like ``state_dict`` (the
        same tensor dtypes and shapes) copies into, so that even the first save() in the
        training loop only copies: fresh memory costs the kernel far more than the copy itself
        (about 0.6 s/GiB against 0.06 s/GiB on the 2-core development VM). Nothing is saved.
        Waits for a save in flight first."""
        if not self.reuse_buffers:
            raise ValueError("reserve() keeps buffers for the saves: not with reuse_buffers=False")
        self.wait()
        LocalShard(state_dict, self.rank, stage=self._reserve, allow_pickle=True)

    def _reserve(self, tensors):
        self._reserved()
        self._allocate(_layout(tensors))
        return self._staged

    def _allocate(self, key, fault_in=True):
        """Buffers for tensors of this layout (_layout), faulted in unless told not to; the
        ones there are kept if the layout is the same."""
        if key != self._staged_key:
            self._staged = self._staged_key = None
            bufs = [torch.empty(shape, dtype=dtype, pin_memory=pin) for dtype, shape, pin in key]
            if fault_in:
                for b in bufs:
                    b.zero_()
            self._staged, self._staged_key = bufs, key

    def _reserve_ahead(self, state_dict):
        """restore(state_dict=...): the template has the layout of the states the loop will
        save, so the buffers of the first save are allocated now, on a background thread (the
        plan is made here, on the caller's thread: it calls the Stateful values' state_dict());
        the first save() waits for them if they are not ready yet. A template this cannot plan
        is left to the first save."""
        if not self.reuse_buffers or state_dict is None:
            return
        keys = []

        def plan(tensors):
            keys.append(_layout(tensors))
            return [None] * len(tensors)
        try:
            LocalShard(state_dict, self.rank, stage=plan, allow_pickle=True)
        except Exception:   # the first save() says what is wrong with such a state
            return
        self._reserved()
        if keys and keys[0] != self._staged_key:
            self._reserving = threading.Thread(target=self._allocate, args=(keys[0],),
                                               name="sluice-ckpt-reserve", daemon=True)
            self._reserving.start()

    def _reserved(self):
        """Wait for restore()'s background allocation, if one runs."""
        if self._reserving is not None:
            self._reserving.join()
            self._reserving = None

    def _stage(self, tensors):
        """Every tensor copied to (contiguous, CPU) host memory, into the buffers of the last
        save when the layout is the same: pinned memory for GPU tensors, copied without
        blocking and waited for once at the end."""
        self._reserved()
        key = _layout(tensors)
        if not self.reuse_buffers:
            self._staged = self._staged_key = None
        self._allocate(key, fault_in=False)
        bufs = self._staged
        with torch.no_grad():
            for b, t, (_, _, pin) in zip(bufs, tensors, key):
                b.copy_(t.detach(), non_blocking=pin)
        if any(pin for _, _, pin in key):
            torch.cuda.synchronize()   # the background upload reads them
        if not self.reuse_buffers:
            self._staged = self._staged_key = None
        return bufs

    def _background(self, step, shard, position, user_metadata):
        t0 = time.perf_counter()
        try:
            self._upload(step, shard, position, user_metadata)
            self.last_upload = time.perf_counter() - t0
        except BaseException as e:     # raised by the next call of the training loop
            self._error = (step, e)

    def _upload(self, step, shard, position, user_metadata):
        name = _step_name(step)
        feed = dict(feed_job=self._feed_job) if position is not None else dict(no_feed=True)
        ck = self._retry(self.ck.begin, self.job, name, step, self.world, user_metadata,
                         auto_commit=True, **feed)
        if ck.state == COMPLETE:
            raise CheckpointError("%s/%s is already COMPLETE: a step is saved once (restore() "
                                  "an earlier step and save a later one, or delete it)"
                                  % (self.job, name))
        shard.build()
        self._send(name, shard, position)

    def _send(self, name, shard, position):
        """Upload the shard; after a transient failure resume what the daemon holds, or accept
        the shard the daemon stored before its answer was lost."""
        backoff = _Backoff(self.retry_seconds)
        resume = False
        while True:
            try:
                return self.ck.upload(self.job, name, self.rank, shard.reader(),
                                      tensors=shard.layout, chunk_size=self.chunk_size,
                                      size=shard.size, resume=resume, data_position=position)
            except grpc.RpcError as e:
                backoff.wait(e)
            self.retries += 1
            resume = True
            while True:
                try:
                    st = self.ck.upload_status(self.job, name, self.rank)
                except grpc.RpcError as e:
                    backoff.wait(e)
                    continue
                if st.stored and st.sha256 == shard.sha256():
                    return None
                if not st.in_progress:
                    break
                # The daemon has not yet noticed that the broken stream ended.
                backoff.wait(_InProgress())

    # ---- queries ----

    def latest_step(self):
        """The step of the job's newest COMPLETE checkpoint, or None."""
        self._check()
        try:
            return self._retry(self.ck.latest, self.job).step
        except grpc.RpcError as e:
            if _not_found(e):
                return None
            raise

    def all_steps(self):
        """The steps of the job's COMPLETE checkpoints, oldest first."""
        self._check()
        cks = self._retry(self.ck.list, self.job, COMPLETE)
        return sorted(c.step for c in cks)

    # ---- restoring ----

    def restore(self, step=None, shard_rank=None, mesh=None, state_dict=None):
        """Put the run back to checkpoint ``step`` (default the latest COMPLETE one): rewind
        the feed job to the data position the checkpoint was taken at and load the state, or
        return None if the job has no checkpoint yet.

        With ``state_dict`` (a template as for dcp.load: the model's and optimizer's state
        dicts, DTensors of the new sharding, Stateful values) the state loads into it in place
        and DCP's planner reshards: FSDP2/DTensor state saved by N ranks loads into any number;
        restore() returns the template. Without it, it returns the saved state as plain
        values, every tensor whole on the CPU.

        Every rank calls it, before training. Rank 0 picks the checkpoint, aborts checkpoints
        still WRITING (left by the ranks that died) and calls Restore once; the other ranks wait
        for it (a broadcast from rank 0 when torch.distributed is initialized, else polling the
        job until its epoch and their own position are the restored ones). Samplers bound with
        ``data`` start their next iteration at the restored position, in the restored epoch
        (``sampler.epoch``: start the epoch loop there). With another world size than the
        checkpoint's, the rest of the epoch is redistributed over the new world (index jobs;
        batch jobs resize at epoch boundaries). A key that every rank saved whole (DDP's
        replicated state, a per-rank RNG state) comes from the shard of rank ``shard_rank``
        (default this rank modulo the old world); ``mesh`` goes to Restore for jobs with a
        mesh. Checkpoints of the older state format (Checkpoints.save_state_dict) load too.
        With ``state_dict``, the host buffers the saves copy into are then allocated on a
        background thread, as reserve() would (also when there is no checkpoint yet), so
        that the loop's first save() only copies."""
        self.wait()
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)
                                 or step < 0):
            raise ValueError("step %r must be an integer >= 0" % (step,))
        group = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if self.rank == 0:
            try:
                info = self._lead(step, mesh)
            except Exception as e:
                if group:   # tell the others, or they would wait for the broadcast forever
                    dist.broadcast_object_list([("error", "%s: %s" % (type(e).__name__, e))],
                                               src=0)
                raise
            if group:
                dist.broadcast_object_list([("ok", info)], src=0)
        elif group:
            box = [None]
            dist.broadcast_object_list(box, src=0)
            kind, info = box[0]
            if kind == "error":
                raise CheckpointError("rank 0 could not restore %s: %s" % (self.job, info))
        else:
            info = self._follow(step)
        if info is None:
            self._reserve_ahead(state_dict)
            return None
        if self._source is not None and info["feed"]:
            self._source._resync()
        self.restored_step = info["step"]
        if shard_rank is None:
            shard_rank = self.rank % info["world"]
        out = self._retry(self._load, info["name"], shard_rank, state_dict)
        self._reserve_ahead(state_dict)
        return out

    def _load(self, name, shard_rank, state_dict):
        """Checkpoint ``name`` through DCP's load (sluice.torch.dcp.Reader), or one of the
        older state format through load_state_dict."""
        m = re.fullmatch(r"step_([0-9]+)", name)
        reader = Reader("sluice://%s/%s" % (self.job, m.group(1) if m else name),
                        allow_pickle=self.allow_pickle, prefer_rank=shard_rank,
                        checkpoints=self.ck)
        try:
            reader.preload()
        except NotDcp:
            return self._load_old(name, shard_rank, state_dict)
        with warnings.catch_warnings():   # each rank loads by itself: no collectives
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            try:
                if state_dict is not None:
                    dcp.load(state_dict, storage_reader=reader, no_dist=True)
                    return state_dict
                out = {}
                _load_state_dict(out, storage_reader=reader,
                                 planner=_EmptyStateDictLoadPlanner(), no_dist=True)
            except CheckpointException as e:   # DCP's wrapper: the reader's own error
                inner = next(iter(e.failures.values()), None)
                if isinstance(inner, tuple) and inner and isinstance(inner[0], Exception):
                    raise inner[0] from None
                raise
            return retype(out, reader.key_types, reader.empty_dicts)

    def _load_old(self, name, shard_rank, state_dict):
        old = self.ck.load_state_dict(self.job, name, shard_rank, allow_pickle=self.allow_pickle)
        if state_dict is None:
            return old
        for k, v in state_dict.items():
            if k in old:
                if isinstance(v, Stateful):
                    v.load_state_dict(old[k])
                else:
                    state_dict[k] = old[k]
        return state_dict

    def _find(self, step):
        """The checkpoint to restore: step's, or the latest COMPLETE one (None if none)."""
        try:
            if step is None:
                return self._retry(self.ck.latest, self.job)
            ck = self._retry(self.ck.get, self.job, _step_name(step))
        except grpc.RpcError as e:
            if not _not_found(e):
                raise
            if step is None:
                return None
            raise CheckpointError("job %r has no checkpoint %s" % (self.job, _step_name(step)))
        if ck.state != COMPLETE:
            raise CheckpointError("%s/%s is not COMPLETE (state %d): only complete checkpoints "
                                  "are restored" % (self.job, ck.name, ck.state))
        return ck

    def _lead(self, step, mesh):
        """Rank 0's part of restore(): find the checkpoint, abort the dead run's WRITING ones,
        rewind the feed. Returns what every rank needs to load its shard (or None)."""
        ck = self._find(step)
        for w in self._retry(self.ck.list, self.job, WRITING):
            try:
                self._retry(self.ck.abort, self.job, w.name)
            except grpc.RpcError as e:   # committed or aborted meanwhile
                if e.code() not in (grpc.StatusCode.FAILED_PRECONDITION,
                                    grpc.StatusCode.NOT_FOUND):
                    raise
        if ck is None:
            self._warn_fresh()
            return None
        has_feed = ck.HasField("feed_state")
        if self._source is not None:
            if not has_feed:
                raise CheckpointError("%s/%s carries no data position (saved without a feed "
                                      "job), so the feed cannot be rewound to it"
                                      % (self.job, ck.name))
            if ck.feed_job != self._source.job:
                raise CheckpointError("%s/%s carries the position of feed job %r, this run is "
                                      "fed by %r" % (self.job, ck.name, ck.feed_job,
                                                     self._source.job))
        epoch = None
        if has_feed:
            world = self.world if self.world != ck.feed_state.world_size else 0
            resp = self._retry(self.ck.restore, self.job, ck.name, world, mesh)
            epoch = resp.epoch
        return {"name": ck.name, "step": ck.step, "world": ck.world_size, "feed": has_feed,
                "epoch": epoch}

    def _warn_fresh(self):
        """No checkpoint: the model starts fresh, so should the feed."""
        if not self._feed_job:
            return
        try:
            st = self._retry(self.client.get_epoch, self._feed_job)
        except grpc.RpcError as e:
            if _not_found(e):
                return
            raise
        if st.epoch or any(r.position for r in st.ranks):
            warnings.warn("sluice: job %r has no checkpoint but its feed is at epoch %d with "
                          "progress: the model starts fresh while the data continues where the "
                          "job is (save a checkpoint at step 0 to make a restart before the "
                          "first one exact)" % (self.job, st.epoch))

    def _follow(self, step):
        """restore() of ranks other than 0 without torch.distributed: find the same checkpoint
        and poll the feed job until rank 0's Restore shows in this rank's own position (which
        only this rank moves forward)."""
        deadline = time.monotonic() + self.restore_timeout
        ck = self._find(step)
        if ck is None:
            return None
        info = {"name": ck.name, "step": ck.step, "world": ck.world_size,
                "feed": ck.HasField("feed_state"), "epoch": None}
        if not info["feed"]:
            return info
        fs = ck.feed_state
        while True:
            job_info = self._retry(self.client.get_job, ck.feed_job)
            st = self._retry(self.client.get_epoch, ck.feed_job)
            if job_info.world_size == self.world:
                dp = _dp_rank(job_info, self.rank)
                pos = next((r.position for r in st.ranks if r.dp_rank == dp), 0)
                want = fs.positions[dp] if self.world == fs.world_size and dp < len(
                    fs.positions) else 0
                if (st.epoch, pos) in ((fs.epoch, want), (fs.epoch + 1, 0)):
                    info["epoch"] = st.epoch
                    return info
            if time.monotonic() > deadline:
                raise CheckpointError("rank %d: the feed job %r did not come back to %s within "
                                      "%.0f s (did rank 0 call restore()?)"
                                      % (self.rank, ck.feed_job, ck.name, self.restore_timeout))
            time.sleep(0.05)

    # ---- lifetime ----

    def close(self):
        """Wait for the save in flight (raising its error) and close the channels."""
        try:
            self.wait()
        finally:
            self._reserved()
            if self._own_ck:
                self.ck.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:    # the training loop's error comes first; still wait for the upload
            try:
                self.close()
            except CheckpointError:
                pass


class _InProgress(grpc.RpcError):
    """A stand-in status for "an upload of this rank still runs on the daemon": waited for like
    UNAVAILABLE."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "an upload of this rank is still in progress on the daemon"
