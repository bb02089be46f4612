#include "metrics.h"

#include "err.h"
#include "log.h"
#include "util/buf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FAMILIES 64
#define MAX_SERIES   4096
#define MAX_METHODS  128
/* Series one family may hold: whatever a family is fed, the others keep room. */
#define MAX_FAMILY_SERIES 1024
#define N_BUCKETS         14
#define MAX_METHOD_LEN    128

static const double bucket_le[N_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                            0.1,    0.25,  0.5,    1,     2.5,  5,     10};

typedef struct family {
    char name[96];
    char help[320];
    sl_metric_type type;
    int n_series;
} family;

typedef struct series {
    int family;
    char labels[256];
    double value;
} series;

typedef struct histogram {
    char method[MAX_METHOD_LEN];
    uint64_t buckets[N_BUCKETS];
    uint64_t count;
    double sum;
} histogram;

struct sl_metrics {
    pthread_mutex_t mu;
    family fam[MAX_FAMILIES];
    int n_fam;
    series *ser;
    int n_ser;
    histogram *hist;
    int n_hist;
    uint64_t dropped; /* series refused: registry or family full, labels too long */
    sl_metrics_collect_fn collect;
    void *collect_arg;
    struct MHD_Daemon *httpd;
};

int sl_metrics_new(sl_metrics **out)
{
    sl_metrics *m = calloc(1, sizeof(*m));

    *out = NULL;
    if (!m)
        return -ENOMEM;
    m->ser = calloc(MAX_SERIES, sizeof(*m->ser));
    m->hist = calloc(MAX_METHODS, sizeof(*m->hist));
    if (!m->ser || !m->hist) {
        free(m->ser);
        free(m->hist);
        free(m);
        return -ENOMEM;
    }
    pthread_mutex_init(&m->mu, NULL);
    sl_metrics_declare(m, "sluice_rpc_requests_total", SL_METRIC_COUNTER,
                       "RPCs finished, by method and gRPC status code.");
    *out = m;
    return 0;
}

void sl_metrics_free(sl_metrics *m)
{
    if (!m)
        return;
    if (m->httpd)
        MHD_stop_daemon(m->httpd);
    pthread_mutex_destroy(&m->mu);
    free(m->ser);
    free(m->hist);
    free(m);
}

static int find_family(const sl_metrics *m, const char *name)
{
    for (int i = 0; i < m->n_fam; i++)
        if (strcmp(m->fam[i].name, name) == 0)
            return i;
    return -1;
}

int sl_metrics_declare(sl_metrics *m, const char *name, sl_metric_type type, const char *help)
{
    int err = 0;

    pthread_mutex_lock(&m->mu);
    if (find_family(m, name) < 0) {
        if (m->n_fam == MAX_FAMILIES) {
            err = SL_ELIMIT;
        } else {
            family *f = &m->fam[m->n_fam++];
            snprintf(f->name, sizeof(f->name), "%s", name);
            snprintf(f->help, sizeof(f->help), "%s", help);
            f->type = type;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return err;
}

/* The series for (name, labels), created on first use; NULL if unknown or full. With mu held. */
static series *get_series(sl_metrics *m, const char *name, const char *labels)
{
    int f = find_family(m, name);

    if (f < 0)
        return NULL;
    if (!labels)
        labels = "";
    for (int i = 0; i < m->n_ser; i++)
        if (m->ser[i].family == f && strcmp(m->ser[i].labels, labels) == 0)
            return &m->ser[i];
    if (m->n_ser == MAX_SERIES || m->fam[f].n_series == MAX_FAMILY_SERIES ||
        strlen(labels) >= sizeof(m->ser[0].labels)) {
        m->dropped++;
        return NULL;
    }
    m->fam[f].n_series++;
    m->ser[m->n_ser].family = f;
    strcpy(m->ser[m->n_ser].labels, labels);
    m->ser[m->n_ser].value = 0;
    return &m->ser[m->n_ser++];
}

void sl_metrics_add(sl_metrics *m, const char *name, const char *labels, double v)
{
    series *s;

    pthread_mutex_lock(&m->mu);
    if ((s = get_series(m, name, labels)) != NULL)
        s->value += v;
    pthread_mutex_unlock(&m->mu);
}

void sl_metrics_set(sl_metrics *m, const char *name, const char *labels, double v)
{
    series *s;

    pthread_mutex_lock(&m->mu);
    if ((s = get_series(m, name, labels)) != NULL)
        s->value = v;
    pthread_mutex_unlock(&m->mu);
}

void sl_metrics_label_escape(char *dst, size_t len, const char *value)
{
    size_t k = 0;

    if (len == 0)
        return;
    for (const char *p = value; *p; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        size_t n = esc ? 2 : 1;
        if (k + n >= len)
            break;
        if (esc)
            memcpy(dst + k, esc, 2);
        else
            dst[k] = *p;
        k += n;
    }
    dst[k] = '\0';
}

/* 1 if s has the shape of a registered method's path, "/package.Service/Method", and fits. */
static int method_path(const char *s)
{
    size_t n = strlen(s), slashes = 0;

    if (n < 3 || n >= MAX_METHOD_LEN || s[0] != '/')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '/')
            slashes++;
        else if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '_' || c == '.'))
            return 0;
    }
    return slashes == 2;
}

void sl_metrics_observe_rpc(sl_metrics *m, const char *method, sl_rpc_code code,
                            uint64_t duration_us)
{
    char labels[256], value[MAX_METHOD_LEN];
    double secs = (double)duration_us / 1e6;
    histogram *h = NULL;

    /* Only the paths of registered methods become label values: a path the client chose (an
     * unknown method, whatever its status) is "unknown", so no client can add series or inject
     * text into the exposition. The value is escaped all the same. */
    if (!method || code == SL_RPC_UNIMPLEMENTED || !method_path(method))
        method = "unknown";
    sl_metrics_label_escape(value, sizeof(value), method);
    snprintf(labels, sizeof(labels), "method=\"%s\",code=\"%s\"", value, sl_rpc_code_name(code));
    pthread_mutex_lock(&m->mu);
    {
        series *s = get_series(m, "sluice_rpc_requests_total", labels);
        if (s)
            s->value += 1;
    }
    if (strcmp(method, "unknown") != 0) {
        for (int i = 0; i < m->n_hist && !h; i++)
            if (strcmp(m->hist[i].method, method) == 0)
                h = &m->hist[i];
        if (!h && m->n_hist < MAX_METHODS && strlen(method) < sizeof(h->method)) {
            h = &m->hist[m->n_hist++];
            strcpy(h->method, method);
        }
    }
    if (h) {
        for (int b = 0; b < N_BUCKETS; b++)
            if (secs <= bucket_le[b])
                h->buckets[b]++;
        h->count++;
        h->sum += secs;
    }
    pthread_mutex_unlock(&m->mu);
}

void sl_metrics_on_collect(sl_metrics *m, sl_metrics_collect_fn fn, void *arg)
{
    pthread_mutex_lock(&m->mu);
    m->collect = fn;
    m->collect_arg = arg;
    pthread_mutex_unlock(&m->mu);
}

/* Most bytes one /metrics page may hold: far above what the bounded series render to. */
#define RENDER_MAX (64u << 20)

char *sl_metrics_render(sl_metrics *m)
{
    sl_metrics_collect_fn collect;
    void *arg;
    sl_buf b;
    int err = 0; /* any failed append (out of memory, over RENDER_MAX) */

    sl_buf_init(&b, RENDER_MAX);
    pthread_mutex_lock(&m->mu);
    collect = m->collect;
    arg = m->collect_arg;
    pthread_mutex_unlock(&m->mu);
    if (collect)
        collect(m, arg);

    pthread_mutex_lock(&m->mu);
    for (int f = 0; f < m->n_fam; f++) {
        err |= sl_buf_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", m->fam[f].name, m->fam[f].help,
                             m->fam[f].name,
                             m->fam[f].type == SL_METRIC_COUNTER ? "counter" : "gauge");
        for (int i = 0; i < m->n_ser; i++) {
            const series *s = &m->ser[i];
            if (s->family != f)
                continue;
            if (s->labels[0])
                err |= sl_buf_printf(&b, "%s{%s} %.17g\n", m->fam[f].name, s->labels, s->value);
            else
                err |= sl_buf_printf(&b, "%s %.17g\n", m->fam[f].name, s->value);
        }
    }
    err |= sl_buf_printf(
        &b, "# HELP sluice_rpc_duration_seconds Time from a call's arrival to its end, by "
            "method.\n# TYPE sluice_rpc_duration_seconds histogram\n");
    for (int i = 0; i < m->n_hist; i++) {
        const histogram *h = &m->hist[i];
        for (int k = 0; k < N_BUCKETS; k++)
            err |= sl_buf_printf(
                &b, "sluice_rpc_duration_seconds_bucket{method=\"%s\",le=\"%g\"} %llu\n", h->method,
                bucket_le[k], (unsigned long long)h->buckets[k]);
        err |= sl_buf_printf(&b,
                             "sluice_rpc_duration_seconds_bucket{method=\"%s\",le=\"+Inf\"} %llu\n",
                             h->method, (unsigned long long)h->count);
        err |= sl_buf_printf(&b, "sluice_rpc_duration_seconds_sum{method=\"%s\"} %.9g\n", h->method,
                             h->sum);
        err |= sl_buf_printf(&b, "sluice_rpc_duration_seconds_count{method=\"%s\"} %llu\n",
                             h->method, (unsigned long long)h->count);
    }
    err |= sl_buf_printf(&b,
                         "# HELP sluice_metrics_series_dropped_total Series not recorded because "
                         "the registry (%d) or their family (%d) was full.\n"
                         "# TYPE sluice_metrics_series_dropped_total counter\n"
                         "sluice_metrics_series_dropped_total %llu\n",
                         MAX_SERIES, MAX_FAMILY_SERIES, (unsigned long long)m->dropped);
    pthread_mutex_unlock(&m->mu);
    if (err) {
        sl_buf_free(&b);
        return NULL;
    }
    return sl_buf_take(&b);
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
    sl_metrics *m = cls;
    struct MHD_Response *resp;
    enum MHD_Result ret;
    unsigned status = MHD_HTTP_OK;
    char *body;

    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        body = strdup("only GET\n");
        status = MHD_HTTP_METHOD_NOT_ALLOWED;
    } else if (strcmp(url, "/metrics") != 0) {
        body = strdup("sluiced metrics: GET /metrics\n");
        status = MHD_HTTP_NOT_FOUND;
    } else {
        body = sl_metrics_render(m);
    }
    if (!body)
        return MHD_NO;
    resp = MHD_create_response_from_buffer_with_free_callback(strlen(body), body, free);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    ret = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Parse "host:port" (IPv4, localhost or [IPv6]) into *ss. */
static int parse_addr(const char *addr, struct sockaddr_storage *ss, int *ipv6, uint16_t *port)
{
    const char *colon = strrchr(addr, ':');
    char host[128];
    char *end;
    long p;

    memset(ss, 0, sizeof(*ss));
    *ipv6 = 0;
    if (!colon || (size_t)(colon - addr) >= sizeof(host))
        return SL_EINVAL;
    p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || p < 0 || p > 65535)
        return SL_EINVAL;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    *port = (uint16_t)p;
    if (host[0] == '[' && strlen(host) > 2 && host[strlen(host) - 1] == ']') {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        host[strlen(host) - 1] = '\0';
        if (inet_pton(AF_INET6, host + 1, &s6->sin6_addr) != 1)
            return SL_EINVAL;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(*port);
        *ipv6 = 1;
        return 0;
    }
    {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        if (strcmp(host, "localhost") == 0)
            strcpy(host, "127.0.0.1");
        if (inet_pton(AF_INET, host, &s4->sin_addr) != 1)
            return SL_EINVAL;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(*port);
    }
    return 0;
}

int sl_metrics_parse_addr(const char *addr)
{
    struct sockaddr_storage ss;
    uint16_t port;
    int ipv6;

    return parse_addr(addr, &ss, &ipv6, &port);
}

int sl_metrics_listen(sl_metrics *m, const char *addr, int *port)
{
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    const union MHD_DaemonInfo *info;
    uint16_t p;
    int ipv6;

    if (parse_addr(addr, &ss, &ipv6, &p) != 0)
        return SL_EINVAL;
    if (ipv6)
        flags |= MHD_USE_IPv6;
    m->httpd = MHD_start_daemon(flags, p, NULL, NULL, answer, m, MHD_OPTION_SOCK_ADDR,
                                (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                                MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
    if (!m->httpd) {
        sl_log_error("metrics_listen_failed", "addr=%s", addr);
        return SL_EUNAVAILABLE;
    }
    info = MHD_get_daemon_info(m->httpd, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? info->port : (int)p;
    return 0;
}
