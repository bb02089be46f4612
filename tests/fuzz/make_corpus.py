#!/usr/bin/env python3
"""Write the seed corpora of tests/fuzz/corpus/<target>/ (run once; the files are committed).

Usage: PYTHONPATH=<build>/python make_corpus.py   (needs the generated sluice.v1 *_pb2 modules)
Every seed is small: valid messages and files, plus a few near misses.
"""
import hashlib
import os
import struct

from sluice.v1 import checkpoint_pb2 as ck
from sluice.v1 import feed_pb2 as fd

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def shard_header(rank=0, sha=None, count=1, length=16, magic=0x53484152, hexlen=64):
    sha = sha or hashlib.sha256(b"x").hexdigest()
    return struct.pack("<IiI", magic, rank, hexlen) + sha.encode() + struct.pack("<iQ", count, length)


def shard():
    put("fuzz_shard", "valid", shard_header())
    put("fuzz_shard", "valid_with_data", shard_header(rank=7, length=4) + b"data")
    put("fuzz_shard", "bad_magic", shard_header(magic=0x12345678))
    put("fuzz_shard", "negative_rank", shard_header(rank=-1))
    put("fuzz_shard", "huge_length", shard_header()[:80] + struct.pack("<Q", 1 << 63))
    put("fuzz_shard", "upper_hex", shard_header(sha="A" * 64))
    put("fuzz_shard", "short", shard_header()[:40])
    put("fuzz_shard", "name_ok", b"step_100")
    put("fuzz_shard", "name_dotdot", b"a..b")
    put("fuzz_shard", "name_slash", b"a/b")
    put("fuzz_shard", "hex", hashlib.sha256(b"").hexdigest().encode())


def lengths():
    # First byte: bit 0 = u32 format; bits 1-2 strategy; bits 3-5 batch size; bit 6 skip; bit 7
    # two replicas.
    put("fuzz_lengths", "text", b"\x00" + b"".join(b"%d\n" % (i % 37 + 1) for i in range(64)))
    put("fuzz_lengths", "text_crlf", b"\x0c" + b"5\r\n17\r\n300\r\n2")
    put("fuzz_lengths", "text_zero", b"\x00" + b"3\n0\n")
    put("fuzz_lengths", "text_overflow", b"\x00" + b"4294967296\n")
    put("fuzz_lengths", "text_garbage", b"\x00" + b"12 3\n-4\n")
    put("fuzz_lengths", "u32", b"\x01" + struct.pack("<8I", 1, 2, 3, 400, 5, 6, 7, 8))
    put("fuzz_lengths", "u32_packed_skip", b"\xc7" + struct.pack("<6I", 9, 200, 3, 3, 3, 1))
    put("fuzz_lengths", "u32_trailing", b"\x01" + struct.pack("<2I", 1, 2) + b"\x01\x02")
    put("fuzz_lengths", "u32_zero", b"\x01" + struct.pack("<2I", 1, 0))


def config():
    put("fuzz_config", "full", b"""[sluiced]
listen = 127.0.0.1:0
data-dir = /tmp/sluice-fuzz
log-level = debug
log_format = json
grace-period = 2.5
max-message-bytes = 4194304
rpc-threads = 4
max-shard-bytes = 1073741824
upload-timeout = 60
upload-memory = 268435456
""")
    put("fuzz_config", "no_section", b"listen = [::1]:7700\n# comment\n; other comment\n")
    put("fuzz_config", "bad_section", b"[other]\nlisten = x\n")
    put("fuzz_config", "bad_key", b"[sluiced]\nnope = 1\n")
    put("fuzz_config", "bad_int", b"[sluiced]\nrpc-threads = 99999999999999999999\n")
    put("fuzz_config", "bad_seconds", b"[sluiced]\ngrace-period = nan\n")
    put("fuzz_config", "tls_half", b"[sluiced]\ntls-cert = /x.pem\n")
    put("fuzz_config", "long", b"[sluiced]\ndata-dir = " + b"d" * 5000 + b"\n")
    put("fuzz_config", "syntax", b"[sluiced\nlisten\n")


def feed():
    msgs = [
        fd.CreateDatasetRequest(name="ds", samples=1000),
        fd.UploadLengthsRequest(name="ds", lengths=[1, 2, 3, 4096]),
        fd.GetDatasetRequest(name="../x"),
        fd.ListDatasetsRequest(),
        fd.DeleteDatasetRequest(name="a/b"),
        fd.CreateJobRequest(job=fd.Job(name="j", dataset="ds", world_size=8, seed=999,
                                       shuffle="torch", partition="contiguous", drop_last=True)),
        fd.GetJobRequest(name="j"),
        fd.ListJobsRequest(dataset="ds"),
        fd.DeleteJobRequest(name="j"),
        fd.ResizeJobRequest(name="j", world_size=4, mesh=fd.Mesh(dp=2, tp=2)),
        fd.GetEpochRequest(job="j"),
        fd.ReportProgressRequest(job="j", rank=3, epoch=0, position=10),
        fd.NextEpochRequest(job="j", expect_epoch=1, check_epoch=True),
        fd.StreamIndicesRequest(job="j", rank=1, epoch=2, epoch_set=True, max_chunk=65536),
        fd.StreamBatchesRequest(job="j", rank=0, step=5, step_set=True, max_batches=1024),
    ]
    for i, m in enumerate(msgs):
        put("fuzz_feed_rpc", "%02d_%s" % (i, type(m).__name__), bytes([i]) + m.SerializeToString())
    jobs = [
        fd.Job(name="mesh", dataset="ds", world_size=16, seed=5000,
               mesh=fd.Mesh(dp=2, tp=2, cp=2, pp=2, order="pp,dp,cp,tp")),
        fd.Job(name="chunked", dataset="ds", world_size=3, partition="chunked", chunk_size=7,
               seed=77),
        fd.Job(name="batch", dataset="ds", world_size=4, seed=1234,
               batching=fd.BatchConfig(strategy="packed", max_batch_size=8, max_seq_len=512,
                                       max_tokens=4096, cost="sum", bucket_width=32,
                                       window=256, batch_size_multiple=2, balance=True)),
        fd.Job(name="badbatch", dataset="ds", world_size=2,
               batching=fd.BatchConfig(strategy="pad", max_batch_size=0, max_seq_len=1 << 30)),
        fd.Job(name="huge", dataset="ds", world_size=1 << 31, seed=1),
        fd.Job(name="badmesh", dataset="ds", world_size=6, mesh=fd.Mesh(dp=4, tp=2)),
    ]
    for k, j in enumerate(jobs):
        put("fuzz_feed_rpc", "job_%s" % j.name, bytes([5]) + fd.CreateJobRequest(job=j)
            .SerializeToString())
    put("fuzz_feed_rpc", "nul_in_name", bytes([2]) + fd.GetDatasetRequest(name="ds\x00../x")
        .SerializeToString())
    put("fuzz_feed_rpc", "nul_in_nested", bytes([5]) + fd.CreateJobRequest(job=fd.Job(
        name="j", dataset="ds\x00x", world_size=1)).SerializeToString())
    put("fuzz_feed_rpc", "truncated", bytes([5]) + jobs[2].SerializeToString()[:-3])


def ckpt():
    t = [ck.TensorInfo(name="w", dtype="float32", shape=[4, 4], offset=0, size=64),
         ck.TensorInfo(name="b\"ias\\", dtype="bfloat16", shape=[8], offset=64, size=16)]
    msgs = [
        ck.BeginRequest(job="job1", name="step_1", step=1, world_size=8,
                        user_metadata='{"lr": 0.1, "\u00e9": 1}'),
        ck.UploadShardRequest(header=ck.ShardHeader(
            job="job1", checkpoint="step_1", rank=3, tensors=t, data_size=80,
            sha256=hashlib.sha256(b"").hexdigest(), offset=0)),
        ck.UploadStatusRequest(job="job1", checkpoint="step_1", rank=3),
        ck.CheckpointRef(job="job1", name="../etc"),
        ck.ListRequest(job="job1", state=ck.COMPLETE),
        ck.LatestRequest(job="job1"),
        ck.VerifyRequest(job="job1", name="step_1", mode=ck.DEEP),
        ck.DownloadShardRequest(job="job1", name="step_1", rank=2, offset=100),
        ck.SetRetentionRequest(job="job1", keep_last=3),
    ]
    for i, m in enumerate(msgs):
        put("fuzz_ckpt_rpc", "%02d_%s" % (i, type(m).__name__), bytes([i]) + m.SerializeToString())
    bad = [
        ("overlap", [ck.TensorInfo(name="a", dtype="uint8", shape=[10], offset=0, size=10),
                     ck.TensorInfo(name="b", dtype="uint8", shape=[10], offset=5, size=10)], 20),
        ("neg_dim", [ck.TensorInfo(name="a", dtype="int64", shape=[-1], offset=0, size=8)], 8),
        ("overflow", [ck.TensorInfo(name="a", dtype="float64", shape=[1 << 62, 1 << 62],
                                    offset=0, size=0)], 8),
        ("offset_wrap", [ck.TensorInfo(name="a", dtype="uint8", shape=[16],
                                       offset=(1 << 64) - 8, size=16)], 8),
        ("bad_dtype", [ck.TensorInfo(name="a", dtype="complex256", shape=[1], offset=0,
                                     size=1)], 8),
        ("ctrl_name", [ck.TensorInfo(name="a\x01b", dtype="uint8", shape=[1], offset=0,
                                     size=1)], 8),
        ("zero_size", [ck.TensorInfo(name="e", dtype="uint8", shape=[0], offset=8, size=0),
                       ck.TensorInfo(name="f", dtype="uint8", shape=[8], offset=0, size=8)], 8),
    ]
    for name, tensors, size in bad:
        m = ck.UploadShardRequest(header=ck.ShardHeader(job="j", checkpoint="c", rank=0,
                                                        tensors=tensors, data_size=size))
        put("fuzz_ckpt_rpc", "hdr_" + name, bytes([1]) + m.SerializeToString())
    put("fuzz_ckpt_rpc", "chunk", bytes([1]) + ck.UploadShardRequest(chunk=b"abc")
        .SerializeToString())
    put("fuzz_ckpt_rpc", "nul_in_tensor_name", bytes([1]) + ck.UploadShardRequest(
        header=ck.ShardHeader(job="j", checkpoint="c", data_size=1, tensors=[ck.TensorInfo(
            name="a\x00b", dtype="uint8", shape=[1], offset=0, size=1)])).SerializeToString())
    put("fuzz_ckpt_rpc", "bad_utf8", bytes([0]) + ck.BeginRequest(job="j", world_size=1)
        .SerializeToString() + b"\x2a\x02\xc0\x80")


def read_lengths():
    # Byte 0: bits 0-1 how the sample count is derived, bits 2-3 the expected hash, bit 4 no file;
    # byte 1 a parameter, bytes 2-9 a u64 (see fuzz_read_lengths.c).
    def head(mode, param=0, u=0):
        return bytes([mode, param]) + struct.pack("<Q", u)
    data = struct.pack("<5I", 1, 2, 300, 4, 0xffffffff)
    put("fuzz_read_lengths", "valid", head(0) + data)
    put("fuzz_read_lengths", "empty", head(0))
    put("fuzz_read_lengths", "one_more", head(1, 1) + data)
    put("fuzz_read_lengths", "one_less", head(1, 0xff) + data)
    put("fuzz_read_lengths", "odd_size", head(0) + data + b"\x07")
    put("fuzz_read_lengths", "count_given", head(2, 0, 5) + data)
    put("fuzz_read_lengths", "count_wraps", head(2, 0, 1 << 62))
    put("fuzz_read_lengths", "count_top_bits", head(3, 0, 0x40) + data)
    put("fuzz_read_lengths", "upper_hash", head(4) + data)
    put("fuzz_read_lengths", "given_hash", head(8) + hashlib.sha256(data).hexdigest().encode()
        + data)
    put("fuzz_read_lengths", "given_hash_short", head(8) + b"ab" + b"\x00" * 62 + data)
    put("fuzz_read_lengths", "changed_hash", head(12, 63) + data)
    put("fuzz_read_lengths", "no_file", head(16) + data)


def read_labels():
    # The layout of read_lengths (see fuzz_read_labels.c); bit 4 makes the file a directory.
    def head(mode, param=0, u=0):
        return bytes([mode, param]) + struct.pack("<Q", u)
    data = struct.pack("<6I", 0, 2, 1, 0, 1048575, 2)
    put("fuzz_read_labels", "valid", head(0) + data)
    put("fuzz_read_labels", "one_class", head(0) + struct.pack("<3I", 7, 7, 7))
    put("fuzz_read_labels", "empty", head(0))
    put("fuzz_read_labels", "label_over_max", head(0) + struct.pack("<2I", 1, 1048576))
    put("fuzz_read_labels", "one_more", head(1, 1) + data)
    put("fuzz_read_labels", "one_less", head(1, 0xff) + data)
    put("fuzz_read_labels", "odd_size", head(0) + data + b"\x07")
    put("fuzz_read_labels", "count_given", head(2, 0, 6) + data)
    put("fuzz_read_labels", "count_huge", head(2, 0, 1 << 62) + data)
    put("fuzz_read_labels", "count_top_bits", head(3, 0, 0x40) + data)
    put("fuzz_read_labels", "upper_hash", head(4) + data)
    put("fuzz_read_labels", "given_hash", head(8) + hashlib.sha256(data).hexdigest().encode()
        + data)
    put("fuzz_read_labels", "changed_hash", head(12, 63) + data)
    put("fuzz_read_labels", "directory", head(16) + data)


def flags():
    # NUL-separated argv tokens and SLUICE_*=value variables; after a 0x01 byte, a config file.
    def args(*tokens, config=None):
        data = b"\x00".join(t.encode() for t in tokens)
        return data + (b"\x01" + config.encode() if config is not None else b"")
    put("fuzz_flags", "all_flags", args(
        "--listen", "127.0.0.1:0", "--data-dir", "/tmp/d", "--port-file", "/tmp/p",
        "--log-level", "debug", "--log-format", "json", "--grace-period", "2.5",
        "--max-message-bytes", "4194304", "--rpc-threads", "4", "--max-shard-bytes", "1048576",
        "--upload-timeout", "60", "--upload-memory", "16777216", "--metrics-listen", ":9100",
        "--tls-cert", "/c.pem", "--tls-key", "/k.pem", "--tls-client-ca", "/ca.pem",
        "--token-file", "/t", "--allow-shared-data-dir", "--check-config"))
    put("fuzz_flags", "equals_form", args("--listen=[::1]:7700", "--grace-period=0.001",
                                          "--upload-timeout=1.0015"))
    put("fuzz_flags", "env", args("SLUICE_LISTEN=0.0.0.0:1", "SLUICE_LOG_LEVEL=warn",
                                  "SLUICE_UPLOAD_MEMORY=8388608", "SLUICE_GRACE_PERIOD=86400"))
    put("fuzz_flags", "env_and_flag", args("SLUICE_RPC_THREADS=8", "--rpc-threads", "3"))
    put("fuzz_flags", "switch_forms", args("SLUICE_ALLOW_SHARED_DATA_DIR=yes",
                                           "--allow-shared-data-dir=false",
                                           config="allow_shared_data_dir = 1\n"))
    put("fuzz_flags", "all_layers", args("SLUICE_DATA_DIR=/env", "--listen", "a:1",
                                         config="[sluiced]\ndata-dir = /file\nlisten = b:2\n"))
    put("fuzz_flags", "help", args("-h"))
    put("fuzz_flags", "short_cluster", args("-hV"))
    put("fuzz_flags", "version", args("--version"))
    put("fuzz_flags", "abbrev", args("--list", "x:1", "--rpc", "2"))
    put("fuzz_flags", "missing_value", args("--listen"))
    put("fuzz_flags", "unknown", args("--nope", "1"))
    put("fuzz_flags", "positional", args("extra"))
    put("fuzz_flags", "bad_int", args("--rpc-threads", "1"))
    put("fuzz_flags", "bad_env", args("SLUICE_MAX_MESSAGE_BYTES=12x"))
    put("fuzz_flags", "tls_half", args("--tls-key", "/k.pem"))
    put("fuzz_flags", "empty_value", args("--port-file", ""))
    put("fuzz_flags", "long_path", args("--data-dir", "/" + "d" * 300))
    # Found while fuzzing: values a config file cannot hold, so --check-config printed a file
    # that parsed differently (now refused), and a long line that inih split in two.
    put("fuzz_flags", "value_newline", args("--data-dir", "/d\n[sluiced]\nd"))
    put("fuzz_flags", "value_semicolon", args("--data-dir", ";;;d;"))
    put("fuzz_flags", "value_space_semicolon", args("SLUICE_LISTEN=a ;b"))
    put("fuzz_flags", "value_trailing_space", args("--token-file", "/t "))
    put("fuzz_flags", "seconds_rounding", args("--grace-period", "1.001",
                                               "SLUICE_UPLOAD_TIMEOUT=2591999"))
    put("fuzz_flags", "long_line_split", args(
        config="data-dir = /" + "a" * 185 + "listen = evil\n"))


def s3_xml():
    t = "fuzz_s3_xml"
    put(t, "listing", b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="x">'
        b"<Name>b</Name><IsTruncated>true</IsTruncated><Contents><Key>j/a_shard_0.shard</Key>"
        b"<LastModified>2026-11-24T01:57:37.123Z</LastModified><Size>4096</Size></Contents>"
        b"<Contents><Key>j/&lt;b&amp;c&#65;&#x42;</Key><Size>0</Size></Contents>"
        b"<NextContinuationToken>tok</NextContinuationToken></ListBucketResult>")
    put(t, "error", b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate."
        b"</Message><RequestId>1</RequestId></Error>")
    put(t, "uploads", b"<ListMultipartUploadsResult><Upload><Key>j/.x.part</Key><UploadId>u1"
        b"</UploadId><Initiated>2026-11-24T01:57:37Z</Initiated></Upload><NextKeyMarker>k"
        b"</NextKeyMarker></ListMultipartUploadsResult>")
    put(t, "upload_id", b"<InitiateMultipartUploadResult><UploadId>abc</UploadId>"
        b"</InitiateMultipartUploadResult>")
    put(t, "nested_same_name", b"<ListBucketResult><Contents><Key>a</Key><Contents><Key>b</Key>"
        b"</Contents><Size>1</Size></Contents></ListBucketResult>")
    put(t, "empty_elements", b"<ListBucketResult><Contents/><Contents ></Contents><Key/>"
        b"</ListBucketResult>")
    put(t, "unclosed", b"<ListBucketResult><Contents><Key>a</Key><Contents><Key")
    put(t, "bad_entities", b"<Error><Code>&#xFFFFFFFF;&bogus;&#0;&</Code><Message>&#55296;"
        b"</Message></Error>")
    put(t, "bad_dates", b"<Contents><LastModified>2026-13-40T99:99:99.9999Z</LastModified>"
        b"</Contents>")


if __name__ == "__main__":
    shard()
    lengths()
    config()
    feed()
    ckpt()
    read_lengths()
    read_labels()
    flags()
    s3_xml()
