"""sluice.torch.DataLoader: torch's DataLoader that reports what the training loop consumed, and
how its workers start."""
import multiprocessing
import os
import sys

import torch.utils.data

from sluice.torch.sampler import BatchSampler, DistributedSampler

# How sluice.torch.DataLoader starts its workers when not told: not by fork(). This process
# talks gRPC (the samplers' streams and reports, CheckpointManager's background uploads), and
# grpcio's core registers a pthread_atfork prepare handler (grpc_prefork, fork_posix.cc; on by
# default in grpcio's build, whatever the Python layer's GRPC_ENABLE_FORK_SUPPORT default says)
# that stops gRPC's executor threads and runs the closures they had queued on the forking thread.
# Now and then one of those waits on a condition variable that nothing signals any more, and
# fork() never returns. torch forks the workers at the start of every epoch, so a trainer hung
# there holding the GIL (its checkpoint upload thread stopped with it) until the other ranks'
# collective timed out: the 90 s gloo timeouts of test_torch_ckpt_train, the hung rank at
# os.fork -> __run_prefork_handlers -> grpc_prefork -> Executor::SetThreadingAll(false) -> a
# closure -> gpr_cv_wait. The fork server is started by vfork+exec (no fork handlers run), has no
# gRPC state, and forks the workers itself.
_WORKER_START = "forkserver"


def _main_reimportable():
    """Whether a worker started by the fork server can run the training script's top level
    again, as it must to find what the script defined (the dataset's class, a collate_fn): a
    script run from its file, or a module run with ``python -m``. Not so for ``python -`` (a
    script piped to stdin: "<stdin>"), ``python -c``, a notebook or the REPL: their workers died
    at start, so those keep torch's own default (fork), as torch's DataLoader does there."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None):
        return True
    path = getattr(main, "__file__", None)
    return bool(path) and os.path.isfile(path)


def _worker_context():
    """The multiprocessing context of the workers (see _WORKER_START). The fork server imports
    torch once: a worker runs the training script's top level again (as with "spawn"), which
    imported torch in every worker of every epoch otherwise (1-2 s each on the 2-core VM). Only
    a hint for a server not yet started; the modules already asked for are kept. None (torch's
    default) where there is no fork server (Windows, which spawns anyway)."""
    if _WORKER_START not in multiprocessing.get_all_start_methods() or not _main_reimportable():
        return None
    ctx = multiprocessing.get_context(_WORKER_START)
    from multiprocessing import forkserver
    have = list(getattr(forkserver._forkserver, "_preload_modules", None) or ["__main__"])
    if "torch" not in have:
        ctx.set_forkserver_preload(have + ["torch"])
    return ctx


def _workers_failed(loader):
    """What to say when the workers died before the first batch (torch says only that they
    "exited unexpectedly")."""
    ctx = loader.multiprocessing_context
    how = ctx.get_start_method() if ctx is not None and not isinstance(ctx, str) else (
        ctx or multiprocessing.get_start_method(allow_none=True) or "fork")
    return ("sluice.torch.DataLoader: its %d workers (started by %r) exited before the first "
            "batch. With 'forkserver' or 'spawn' each worker imports the training script again: "
            "keep the training under `if __name__ == \"__main__\":`, and define the dataset, "
            "collate_fn and worker_init_fn at a module's top level; the workers' own error is "
            "above. multiprocessing_context='fork' (torch's default) avoids the re-import but "
            "risks gRPC's fork hang (docs/feeding.md)" % (loader.num_workers, how))


class _ExitWithRank:
    """worker_init_fn of sluice.torch.DataLoader's workers: a worker ends when the process that
    iterates the loader (the rank) is gone, then runs the user's worker_init_fn. torch's worker
    watchdog checks the worker's parent, which under the fork server is the server, not the
    rank: a SIGKILLed rank left its workers (and through them the fork server) running for
    good."""

    def __init__(self, pid, inner):
        self.pid, self.inner = pid, inner

    def __call__(self, worker_id):
        import threading
        threading.Thread(target=_wait_for_exit, args=(self.pid,), daemon=True,
                         name="sluice-rank-watch").start()
        if self.inner is not None:
            self.inner(worker_id)


def _wait_for_exit(pid):
    """os._exit(1) once process `pid` has exited (a pidfd turns readable; where there is none,
    polled once a second)."""
    import select
    import time
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        select.select([fd], [], [])
    else:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:
                pass
            time.sleep(1.0)
    os._exit(1)


def _fed_sampler(loader):
    """(sluice sampler, positions per batch) of a DataLoader, or (None, 0)."""
    bs = loader.batch_sampler
    if isinstance(bs, BatchSampler):
        return bs, 1
    inner = getattr(bs, "sampler", None)
    if isinstance(inner, DistributedSampler):
        return inner, bs.batch_size
    if bs is None and isinstance(loader.sampler, DistributedSampler):
        return loader.sampler, 1
    return None, 0


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader (same arguments) that reports what the training loop consumed
    to the coordinator, when its sampler or batch_sampler is a sluice sampler.

    When the loop asks for batch k of an epoch, batches [0, k) are consumed. That position
    (counted every ``report_every`` batches) is reported in the background, off the step's
    path, and coalesced: at most one report in flight, and a new one only once
    ``report_interval`` seconds (default 0.05) have passed since the last was sent or the loop
    is ``report_lag // 2`` batches past what the daemon recorded; the latest position wins. The
    loop waits for the daemon only when what it has recorded falls more than report_every - 1 +
    ``report_lag`` (default 64) batches behind what the loop consumed. So a rank killed without
    a checkpoint (torchrun restarting the group from the daemon's positions) trains at most
    report_every - 1 + report_lag batches again besides the one it was training, and loses
    none: only consumed positions are reported. ``report_lag=0`` reports every report_every
    batches and waits for each report before handing out the next batch (the report still
    overlaps the batch's fetch): a rank killed after a step resumes exactly after it. A restart from a checkpoint takes the position from the checkpoint (the
    loader's state_dict()), whatever the lag. When the loop has taken every batch the whole
    share is reported and waited for, which may end the epoch. Prefetched batches
    (num_workers > 0) are not counted until the loop takes them.

    Workers start with ``multiprocessing_context="forkserver"`` unless another is given, not by
    forking this process as torch does by default on Linux (see _WORKER_START). The dataset,
    collate_fn and worker_init_fn go to the workers pickled, and each worker runs the training
    script's top level again (as with ``spawn``): guard the training with
    ``if __name__ == "__main__":``. Where there is no script file to run again (``python -``,
    ``python -c``, a notebook), the workers are forked as torch's DataLoader forks them.
    Each worker ends when the process iterating the loader is gone, however it died."""

    def __init__(self, *args, report_every=1, report_lag=64, report_interval=0.05, **kwargs):
        if report_every < 1:
            raise ValueError("report_every %r must be at least 1" % (report_every,))
        if report_lag < 0:
            raise ValueError("report_lag %r must be at least 0" % (report_lag,))
        if not report_interval >= 0:
            raise ValueError("report_interval %r must be at least 0 (seconds)"
                             % (report_interval,))
        super().__init__(*args, **kwargs)
        self.report_every = report_every
        self.report_lag = report_lag
        self.report_interval = report_interval
        if self.num_workers > 0 and self.multiprocessing_context is None:
            self.multiprocessing_context = _worker_context()

    def data_position(self):
        """The data position of what the training loop took from this loader: its sampler's
        data_position() (see there)."""
        return self._sluice_sampler().data_position()

    def state_dict(self):
        """Its sluice sampler's state_dict(): the position the training loop consumed (a torch
        Stateful: put the loader itself in a torch.distributed.checkpoint state dict, e.g.
        ``{"model": ..., "optim": ..., "dataloader": loader}``)."""
        return self._sluice_sampler().state_dict()

    def load_state_dict(self, state):
        """Its sluice sampler's load_state_dict(): every rank calls it before iterating."""
        self._sluice_sampler().load_state_dict(state)

    def _sluice_sampler(self):
        sampler, _ = _fed_sampler(self)
        if sampler is None:
            raise ValueError("this DataLoader has no sluice sampler or batch_sampler")
        return sampler

    def __iter__(self):
        if self.num_workers > 0:
            fn = self.worker_init_fn
            if not isinstance(fn, _ExitWithRank) or fn.pid != os.getpid():
                self.worker_init_fn = _ExitWithRank(
                    os.getpid(), fn.inner if isinstance(fn, _ExitWithRank) else fn)
        sampler, per_batch = _fed_sampler(self)
        if sampler is None:
            return super().__iter__()
        # Before torch's iterator exists: with workers it prefetches (and may exhaust the
        # sampler) as it is built, and an untracked sampler would report its share itself.
        sampler._tracked = True
        sampler.consumed = None
        return self._tracked(super().__iter__(), sampler, per_batch)

    def _tracked(self, it, sampler, per_batch):
        taken, lag = 0, (self.report_every - 1 + self.report_lag) * per_batch
        gap = max(1, self.report_lag // 2) * per_batch
        try:
            while True:
                if taken:
                    sampler.consumed = min(sampler.start_position + taken * per_batch,
                                           sampler._share)
                    if taken % self.report_every == 0:
                        sampler._report_async(sampler.consumed, gap, self.report_interval)
                try:
                    batch = next(it)
                except StopIteration:
                    break
                except RuntimeError as e:
                    if taken or "exited unexpectedly" not in str(e):
                        raise
                    raise RuntimeError(_workers_failed(self)) from e
                if taken:
                    sampler._report_bound(sampler.consumed, lag)
                taken += 1
                # What a checkpoint taken while the loop holds this batch carries (the loop is
                # expected to save after training it).
                sampler._at = (sampler._serving,
                               min(sampler.start_position + taken * per_batch, sampler._share))
                yield batch
            if sampler._serving is not None:
                sampler.consumed = sampler._share
                sampler._finish()
        finally:
            sampler._tracked = False
