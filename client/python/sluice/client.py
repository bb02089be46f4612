"""A thin, typed wrapper over sluice's gRPC services (Datasets, Jobs, Epochs, Feed).

Only Debian's python3-grpcio and python3-protobuf are needed. Every method raises
``grpc.RpcError`` with the daemon's status code and message on failure.
"""
import grpc

from sluice._channel import DEFAULT_ADDR, bearer_metadata, default_address, make_channel
from sluice.v1 import feed_pb2, feed_pb2_grpc


class Client:
    """One channel to a sluiced. ``timeout`` (seconds) applies to unary calls; streams have none
    (a stream for the next epoch waits until the coordinator begins it).

    ``address``: "host:port" (default SLUICE_ADDR, else 127.0.0.1:7700), or the replicas'
    addresses comma-separated ("h1:7700,h2:7700"): calls go to the current replica, and one that
    ends UNAVAILABLE there moves the client on to the next, where a unary call is tried again at
    once (each replica at most once per call; then ``sluice._channel.ReplicasUnavailable``, an
    UNAVAILABLE RpcError naming the replicas tried) and a broken stream is reopened by its
    caller (docs/feeding.md, "Several replicas"). ValueError for an empty element of the list
    or a port outside [1, 65535]."""

    def __init__(self, address=None, timeout=10.0, token=None, tls=None, tls_ca=None,
                 tls_cert=None, tls_key=None):
        self.address = default_address(address)
        self.timeout = timeout
        self._metadata = bearer_metadata(token)
        self.channel = make_channel(self.address, tls, tls_ca, tls_cert, tls_key)
        self.datasets = feed_pb2_grpc.DatasetsStub(self.channel)
        self.jobs = feed_pb2_grpc.JobsStub(self.channel)
        self.epochs = feed_pb2_grpc.EpochsStub(self.channel)
        self.feed = feed_pb2_grpc.FeedStub(self.channel)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _kw(self, stream=False):
        kw = {} if stream else {"timeout": self.timeout}
        if self._metadata:
            kw["metadata"] = self._metadata
        return kw

    # ---- datasets ----

    def create_dataset(self, name, samples):
        return self.datasets.Create(
            feed_pb2.CreateDatasetRequest(name=name, samples=samples), **self._kw())

    def upload_lengths(self, name, lengths, per_message=1 << 18):
        """Upload every sample's length (a sequence of ints >= 1, or a numpy array)."""
        lengths = list(int(x) for x in lengths)

        def gen():
            if not lengths:
                yield feed_pb2.UploadLengthsRequest(name=name)
            for i in range(0, len(lengths), per_message):
                yield feed_pb2.UploadLengthsRequest(name=name,
                                                    lengths=lengths[i:i + per_message])

        return self.datasets.UploadLengths(gen(), **self._kw())

    def upload_labels(self, name, labels, per_message=1 << 18):
        """Upload every sample's class id (a sequence of ints in [0, 2^20), or a numpy array);
        stratified shares and class-balanced epochs of the dataset's jobs use them."""
        labels = list(int(x) for x in labels)

        def gen():
            if not labels:
                yield feed_pb2.UploadLabelsRequest(name=name)
            for i in range(0, len(labels), per_message):
                yield feed_pb2.UploadLabelsRequest(name=name, labels=labels[i:i + per_message])

        return self.datasets.UploadLabels(gen(), **self._kw())

    def get_dataset(self, name):
        return self.datasets.Get(feed_pb2.GetDatasetRequest(name=name), **self._kw())

    def list_datasets(self):
        return list(self.datasets.List(feed_pb2.ListDatasetsRequest(), **self._kw()).datasets)

    def delete_dataset(self, name):
        self.datasets.Delete(feed_pb2.DeleteDatasetRequest(name=name), **self._kw())

    # ---- jobs ----

    def create_job(self, name, dataset, world_size, partition="", shuffle="", seed=0,
                   drop_last=False, manual_advance=False, chunk_size=0, mesh=None, batching=None,
                   stratify=False, class_weights=None, balance_classes=False, epoch_length=0,
                   rank_weights=None):
        """Create a job. ``mesh`` is a dict (dp, tp, cp, pp, order), ``batching`` a dict of
        BatchConfig fields (strategy, max_batch_size, max_seq_len, max_tokens, ...).
        Sampling II (docs/sampling.md, needs the dataset's labels except rank_weights):
        ``stratify`` gives every dp rank each class in proportion; ``class_weights`` (one per
        class) or ``balance_classes`` (uniform) make class-balanced epochs of ``epoch_length``
        samples (0: N); ``rank_weights`` (one per dp rank) size the shares."""
        job = feed_pb2.Job(name=name, dataset=dataset, world_size=world_size,
                           partition=partition, shuffle=shuffle, seed=seed, drop_last=drop_last,
                           manual_advance=manual_advance, chunk_size=chunk_size,
                           stratify=bool(stratify), balance_classes=bool(balance_classes),
                           epoch_length=int(epoch_length),
                           class_weights=[float(w) for w in (class_weights or ())],
                           rank_weights=[float(w) for w in (rank_weights or ())])
        if mesh:
            job.mesh.CopyFrom(feed_pb2.Mesh(**mesh))
        if batching:
            job.batching.CopyFrom(feed_pb2.BatchConfig(**batching))
        return self.jobs.Create(feed_pb2.CreateJobRequest(job=job), **self._kw())

    def get_job(self, name):
        return self.jobs.Get(feed_pb2.GetJobRequest(name=name), **self._kw())

    def list_jobs(self, dataset=""):
        return list(self.jobs.List(feed_pb2.ListJobsRequest(dataset=dataset), **self._kw()).jobs)

    def delete_job(self, name):
        self.jobs.Delete(feed_pb2.DeleteJobRequest(name=name), **self._kw())

    def resize_job(self, name, world_size, mesh=None, rank_weights=None):
        """Resize job ``name`` to ``world_size`` (mid-epoch too: the rest of the epoch is
        redistributed). ``rank_weights``: one per new dp rank, shares in proportion to them."""
        req = feed_pb2.ResizeJobRequest(name=name, world_size=world_size)
        if mesh:
            req.mesh.CopyFrom(feed_pb2.Mesh(**mesh))
        if rank_weights:
            req.rank_weights.extend(rank_weights)
        return self.jobs.Resize(req, **self._kw())

    # ---- epochs ----

    def rewind(self, job, epoch, position, world_size, to_world_size=0, mesh=None):
        """Put ``job`` back to ``position`` of ``epoch`` for every data-parallel rank, counted in
        a world of ``world_size``, then resized into ``to_world_size`` (0: the same). What the
        samplers' load_state_dict() sends (one rank of the group)."""
        req = feed_pb2.RewindRequest(job=job, epoch=epoch, position=position,
                                     world_size=world_size, to_world_size=to_world_size)
        if mesh:
            req.to_mesh.CopyFrom(feed_pb2.Mesh(**mesh))
        return self.epochs.Rewind(req, **self._kw())

    def get_epoch(self, job):
        return self.epochs.Get(feed_pb2.GetEpochRequest(job=job), **self._kw())

    def report_progress(self, job, rank, epoch, position):
        """Rank ``rank`` consumed positions [0, position) of its share in ``epoch``."""
        return self.epochs.ReportProgress(
            feed_pb2.ReportProgressRequest(job=job, rank=rank, epoch=epoch, position=position),
            **self._kw())

    def report_progress_future(self, job, rank, epoch, position):
        """report_progress started without waiting: a grpc.Future whose result() is the
        answer (or raises grpc.RpcError)."""
        return self.epochs.ReportProgress.future(
            feed_pb2.ReportProgressRequest(job=job, rank=rank, epoch=epoch, position=position),
            **self._kw())

    def next_epoch(self, job, expect_epoch=None):
        req = feed_pb2.NextEpochRequest(job=job)
        if expect_epoch is not None:
            req.expect_epoch = expect_epoch
            req.check_epoch = True
        return self.epochs.Next(req, **self._kw())

    # ---- streams ----

    @staticmethod
    def _stream_request(req, epoch, position_field, position):
        if epoch is not None:
            req.epoch = epoch
            req.epoch_set = True
        if position is not None:
            setattr(req, position_field, position)
            setattr(req, position_field + "_set", True)
        return req

    def stream_indices(self, job, rank, epoch=None, position=None, max_chunk=0,
                       group_position=False):
        """Iterate over IndexChunk messages (epoch, start, indices, share_count). By default the
        current epoch from the rank's last reported position; with ``group_position`` from the
        lowest position any dp rank reported (DDP lockstep after a restart)."""
        req = feed_pb2.StreamIndicesRequest(job=job, rank=rank, max_chunk=max_chunk,
                                            group_position=group_position)
        return self.feed.StreamIndices(self._stream_request(req, epoch, "position", position),
                                       **self._kw(stream=True))

    def stream_batches(self, job, rank, epoch=None, step=None, max_batches=0,
                       group_position=False):
        """Iterate over BatchChunk messages (epoch, batches, batches_per_rank); positions (steps)
        as in stream_indices."""
        req = feed_pb2.StreamBatchesRequest(job=job, rank=rank, max_batches=max_batches,
                                            group_position=group_position)
        return self.feed.StreamBatches(self._stream_request(req, epoch, "step", step),
                                       **self._kw(stream=True))
