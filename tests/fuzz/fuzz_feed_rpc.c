/* Fuzz target: decoding of every sluice.v1 Datasets, Jobs, Epochs and Feed request by the RPC
 * bridge's decoder (sl_rpc_unpack, common/rpc/codec.c), then the feeding service's pure validation
 * of what decodes: the name check (server/feed/state.c) and, for Jobs.Create, the whole job-spec
 * validation the service runs before touching the catalog (sample config, dp rank, batch config).
 *
 * The first input byte picks the message type; the rest is its wire encoding. */
#include "fuzz.h"

#include "feed/internal.h"

#include "../../common/rpc/internal.h"

#include <stdlib.h>
#include <string.h>

static const ProtobufCMessageDescriptor *const requests[] = {
    &sluice__v1__create_dataset_request__descriptor,
    &sluice__v1__upload_lengths_request__descriptor,
    &sluice__v1__get_dataset_request__descriptor,
    &sluice__v1__list_datasets_request__descriptor,
    &sluice__v1__delete_dataset_request__descriptor,
    &sluice__v1__create_job_request__descriptor,
    &sluice__v1__get_job_request__descriptor,
    &sluice__v1__list_jobs_request__descriptor,
    &sluice__v1__delete_job_request__descriptor,
    &sluice__v1__resize_job_request__descriptor,
    &sluice__v1__get_epoch_request__descriptor,
    &sluice__v1__report_progress_request__descriptor,
    &sluice__v1__next_epoch_request__descriptor,
    &sluice__v1__stream_indices_request__descriptor,
    &sluice__v1__stream_batches_request__descriptor,
};
#define N_REQUESTS (sizeof(requests) / sizeof(requests[0]))

static void check_name(const char *what, const char *name)
{
    char msg[320];

    if (name && sl_name_check(what, name, msg, sizeof(msg)) == 0 &&
        (strchr(name, '/') || name[0] == '.' || strstr(name, "..")))
        abort();
}

/* What Jobs.Create validates before it looks at the catalog; the dataset's sample count comes
 * from the spec's seed so the fuzzer can steer it. */
static void check_job(const Sluice__V1__Job *spec)
{
    sl_sample_config cfg;
    sl_batch_config bc;
    uint32_t dp, dp_size;
    uint64_t samples = 1 + spec->seed % 100000;
    char msg[320];

    check_name("job", spec->name);
    check_name("dataset", spec->dataset);
    if (feed_spec_config(&cfg, spec, NULL, samples, spec->epoch, msg, sizeof(msg)) != 0)
        return;
    if (sl_sample_dp_rank(&dp, &dp_size, &cfg, msg, sizeof(msg)) != 0)
        return;
    if (dp_size == 0 || dp_size > FEED_MAX_WORLD)
        abort();
    if (spec->batching && feed_spec_batch_config(&bc, spec, dp_size, spec->seed, spec->epoch, msg,
                                                 sizeof(msg)) == 0) {
        if (sl_batch_config_check(&bc, msg, sizeof(msg)) != 0)
            abort(); /* the service would hand the planner a config it refuses */
    }
}

/* Decode as the RPC bridge does (common/rpc/codec.c: protobuf-c, then every string field must
 * be UTF-8 without NUL bytes). What the bridge accepts, protobuf-c alone must accept too. */
static ProtobufCMessage *decode(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n)
{
    grpc_byte_buffer *bb = sl_rpc_pack_raw(p, n);
    ProtobufCMessage *m, *plain;
    char why[256];

    if (!bb)
        return NULL;
    m = sl_rpc_unpack(d, bb, why, sizeof(why));
    grpc_byte_buffer_destroy(bb);
    plain = protobuf_c_message_unpack(d, NULL, n, p);
    if (m && !plain)
        abort();
    if (plain)
        protobuf_c_message_free_unpacked(plain, NULL);
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ProtobufCMessageDescriptor *d;
    ProtobufCMessage *m;

    if (size < 1)
        return 0;
    d = requests[data[0] % N_REQUESTS];
    m = decode(d, data + 1, size - 1);
    if (!m)
        return 0;
    if (d == &sluice__v1__create_job_request__descriptor) {
        const Sluice__V1__CreateJobRequest *r = (const void *)m;
        if (r->job)
            check_job(r->job);
    } else if (d == &sluice__v1__create_dataset_request__descriptor) {
        check_name("dataset", ((const Sluice__V1__CreateDatasetRequest *)m)->name);
    } else if (d == &sluice__v1__upload_lengths_request__descriptor) {
        check_name("dataset", ((const Sluice__V1__UploadLengthsRequest *)m)->name);
    } else if (d == &sluice__v1__get_job_request__descriptor) {
        check_name("job", ((const Sluice__V1__GetJobRequest *)m)->name);
    } else if (d == &sluice__v1__resize_job_request__descriptor) {
        check_name("job", ((const Sluice__V1__ResizeJobRequest *)m)->name);
    } else if (d == &sluice__v1__stream_indices_request__descriptor) {
        check_name("job", ((const Sluice__V1__StreamIndicesRequest *)m)->job);
    } else if (d == &sluice__v1__stream_batches_request__descriptor) {
        check_name("job", ((const Sluice__V1__StreamBatchesRequest *)m)->job);
    } else if (d == &sluice__v1__report_progress_request__descriptor) {
        check_name("job", ((const Sluice__V1__ReportProgressRequest *)m)->job);
    }
    /* Re-encoding what was decoded must work (replies echo request fields). */
    {
        size_t n = protobuf_c_message_get_packed_size(m);
        uint8_t *buf = malloc(n ? n : 1);
        if (buf) {
            if (protobuf_c_message_pack(m, buf) != n)
                abort();
            free(buf);
        }
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
