/* Benchmark of common/rpc over loopback: unary calls/s with 1 and 32 calls in flight, and
 * server-streamed messages/s, from the C client against the test service running in a separate
 * process (this binary re-executed with --serve). Prints the median of several runs.
 *
 *   rpc_bench [--runs N] [--seconds S] [--stream-messages M] [--payload BYTES]
 */
#include "err.h"
#include "rpc/client.h"
#include "sluice/test/test.pb-c.h"
#include "testsvc.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int serve(void)
{
    sl_testsrv *s;
    char buf[16];

    if (sl_testsrv_start(&s, 0, NULL) != 0)
        return 1;
    printf("%d\n", sl_testsrv_port(s));
    fflush(stdout);
    /* Serve until the parent closes our stdin. */
    while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
    }
    sl_testsrv_stop(s, 0);
    return 0;
}

typedef struct unary_job {
    sl_rpc_client *c;
    double until;
    atomic_long *calls;
    atomic_int *errors;
} unary_job;

static void *unary_loop(void *arg)
{
    unary_job *j = arg;
    Sluice__Test__EchoRequest req = SLUICE__TEST__ECHO_REQUEST__INIT;
    long n = 0;

    req.text = "ping";
    while (now_s() < j->until) {
        Sluice__Test__EchoResponse *resp = NULL;
        sl_rpc_status st;
        if (sl_rpc_client_unary(j->c, "/sluice.test.Test/Echo", &req.base,
                                &sluice__test__echo_response__descriptor,
                                (ProtobufCMessage **)&resp, 10000, &st) != 0) {
            atomic_fetch_add(j->errors, 1);
            continue;
        }
        protobuf_c_message_free_unpacked(&resp->base, NULL);
        n++;
    }
    atomic_fetch_add(j->calls, n);
    return NULL;
}

static double run_unary(sl_rpc_client *c, int in_flight, double secs, int *errors)
{
    pthread_t t[64];
    unary_job j;
    atomic_long calls = 0;
    atomic_int errs = 0;
    double t0 = now_s(), took;

    j = (unary_job){c, t0 + secs, &calls, &errs};
    for (int i = 0; i < in_flight; i++)
        pthread_create(&t[i], NULL, unary_loop, &j);
    for (int i = 0; i < in_flight; i++)
        pthread_join(t[i], NULL);
    took = now_s() - t0;
    *errors += atomic_load(&errs);
    return (double)atomic_load(&calls) / took;
}

/* `in_flight` calls kept outstanding from one thread with the async API. */
static double run_async(sl_rpc_client *c, int in_flight, double secs, int *errors)
{
    Sluice__Test__EchoRequest req = SLUICE__TEST__ECHO_REQUEST__INIT;
    sl_rpc_async *a = NULL;
    double t0 = now_s(), until = t0 + secs;
    long calls = 0;

    req.text = "ping";
    if (sl_rpc_async_new(&a, c) != 0) {
        (*errors)++;
        return 0;
    }
    for (int i = 0; i < in_flight; i++)
        sl_rpc_async_start(a, "/sluice.test.Test/Echo", &req.base, 10000, NULL);
    while (sl_rpc_async_pending(a) > 0) {
        ProtobufCMessage *resp = NULL;
        if (sl_rpc_async_wait(a, &sluice__test__echo_response__descriptor, &resp, NULL, NULL) ==
            0) {
            calls++;
            protobuf_c_message_free_unpacked(resp, NULL);
        } else {
            (*errors)++;
        }
        if (now_s() < until)
            sl_rpc_async_start(a, "/sluice.test.Test/Echo", &req.base, 10000, NULL);
    }
    sl_rpc_async_free(a);
    return (double)calls / (now_s() - t0);
}

typedef struct async_job {
    sl_rpc_client *c;
    int in_flight;
    double secs, rate;
    int errors;
} async_job;

static void *async_thread(void *arg)
{
    async_job *j = arg;

    j->rate = run_async(j->c, j->in_flight, j->secs, &j->errors);
    return NULL;
}

/* `threads` threads, each keeping in_flight/threads async calls outstanding. */
static double run_async_threads(sl_rpc_client *c, int in_flight, int threads, double secs,
                                int *errors)
{
    pthread_t t[8];
    async_job j[8];
    double total = 0;

    for (int i = 0; i < threads; i++) {
        j[i] = (async_job){c, in_flight / threads, secs, 0, 0};
        pthread_create(&t[i], NULL, async_thread, &j[i]);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        total += j[i].rate;
        *errors += j[i].errors;
    }
    return total;
}

static double run_stream(sl_rpc_client *c, uint64_t count, uint32_t payload, int *errors)
{
    Sluice__Test__CountRequest req = SLUICE__TEST__COUNT_REQUEST__INIT;
    sl_rpc_stream *s = NULL;
    ProtobufCMessage *msg;
    uint64_t got = 0;
    double t0 = now_s();

    req.count = count;
    req.payload_size = payload;
    if (sl_rpc_stream_open(&s, c, "/sluice.test.Test/Count", 0) != 0) {
        (*errors)++;
        return 0;
    }
    sl_rpc_stream_write(s, &req.base, 0);
    sl_rpc_stream_close_send(s);
    while (sl_rpc_stream_read(s, &sluice__test__count_response__descriptor, &msg) == 1) {
        got++;
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    if (sl_rpc_stream_finish(s, NULL) != 0 || got != count)
        (*errors)++;
    sl_rpc_stream_free(s);
    return (double)got / (now_s() - t0);
}

static void print_row(const char *what, double *v, int runs)
{
    printf("%-40s median %10.0f   runs:", what, median(v, runs));
    for (int i = 0; i < runs; i++)
        printf(" %.0f", v[i]);
    printf("\n");
}

int main(int argc, char **argv)
{
    int runs = 5, errors = 0;
    double secs = 2.0, u1[32], u32[32], a32[32], b32[32], st[32];
    uint64_t stream_msgs = 1000000;
    uint32_t payload = 8;
    int to_child[2], from_child[2], port = 0;
    char target[64], line[32];
    sl_rpc_client *c = NULL;
    pid_t pid;
    FILE *f;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--serve") == 0)
            return serve();
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            secs = atof(argv[++i]);
        else if (strcmp(argv[i], "--stream-messages") == 0 && i + 1 < argc)
            stream_msgs = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--payload") == 0 && i + 1 < argc)
            payload = (uint32_t)atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--runs N] [--seconds S] [--stream-messages M] "
                    "[--payload BYTES]\n",
                    argv[0]);
            return 2;
        }
    }
    if (runs < 1 || runs > 32 || secs <= 0 || stream_msgs == 0) {
        fprintf(stderr, "rpc_bench: runs must be in [1, 32], seconds and messages positive\n");
        return 2;
    }

    /* The server runs in its own process so client and server do not share a heap or a gRPC
     * instance, as in production. */
    if (pipe(to_child) != 0 || pipe(from_child) != 0)
        return 1;
    pid = fork();
    if (pid == 0) {
        dup2(to_child[0], STDIN_FILENO);
        dup2(from_child[1], STDOUT_FILENO);
        close(to_child[1]);
        close(from_child[0]);
        execl("/proc/self/exe", argv[0], "--serve", (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    f = fdopen(from_child[0], "r");
    if (!f || !fgets(line, sizeof(line), f) || (port = atoi(line)) <= 0) {
        fprintf(stderr, "rpc_bench: server did not start\n");
        return 1;
    }
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    sl_rpc_client_new(&c, target, NULL);

    printf("rpc_bench: C client -> test service in another process over loopback %s\n", target);
    printf("%d runs; unary %.1f s each; stream %llu messages of %u payload bytes\n", runs, secs,
           (unsigned long long)stream_msgs, payload);
    run_unary(c, 4, 0.3, &errors); /* warm up the connection */
    for (int r = 0; r < runs; r++) {
        u1[r] = run_unary(c, 1, secs, &errors);
        u32[r] = run_unary(c, 32, secs, &errors);
        a32[r] = run_async(c, 32, secs, &errors);
        b32[r] = run_async_threads(c, 32, 2, secs, &errors);
        st[r] = run_stream(c, stream_msgs, payload, &errors);
    }
    print_row("unary calls/s, 1 in flight (blocking)", u1, runs);
    print_row("unary calls/s, 32 threads x 1 blocking", u32, runs);
    print_row("unary calls/s, 32 in flight (async)", a32, runs);
    print_row("unary calls/s, 32 in flight (2 x 16 async)", b32, runs);
    print_row("server-streamed messages/s", st, runs);
    printf("errors: %d\n", errors);

    sl_rpc_client_free(c);
    close(to_child[1]);
    waitpid(pid, NULL, 0);
    fclose(f);
    return errors ? 1 : 0;
}
