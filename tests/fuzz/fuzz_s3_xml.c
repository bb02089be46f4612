/* Fuzz target: the S3 client's reading of a store's XML answers (server/store/s3_xml.c), as
 * sstore's listings, multipart answers and errors use it (server/store/s3.c, s3_mpu.c,
 * s3_req.c). The answer is a hostile store's: any bytes.
 *
 * Every element found must lie inside the answer, end before its bounds and start after its
 * opening tag; decoded text must fit and be NUL-terminated; a listing's entries are walked as
 * s3.c walks them and every one lies inside the result. It must never crash or read outside
 * the answer (ASan: the answer is copied into a buffer of exactly its size). */
#include "fuzz.h"

#include "store/s3_internal.h"

#include <stdlib.h>
#include <string.h>

static void check_range(const char *p, const char *end, const char *vs, const char *ve)
{
    if (vs < p || ve > end || vs > ve)
        abort();
}

static void text_of(const char *p, const char *end, const char *tag)
{
    char out[64];
    const char *vs, *ve;

    memset(out, 0x5a, sizeof(out));
    if (s3_xml_get(p, end, tag, out, sizeof(out)) == 0 && !memchr(out, 0, sizeof(out)))
        abort();
    if (s3_xml_find(p, end, tag, &vs, &ve))
        check_range(p, end, vs, ve);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    const char *p, *end, *vs, *ve, *es, *ee;
    static const char *const tags[] = {"Error",         "Code",
                                       "Message",       "UploadId",
                                       "Key",           "Size",
                                       "IsTruncated",   "Initiated",
                                       "Contents",      "LastModified",
                                       "Upload",        "ETag",
                                       "NextKeyMarker", "NextContinuationToken"};
    char when[40];

    if (!buf)
        return 0;
    memcpy(buf, data, size);
    p = buf;
    end = buf + size;
    for (size_t i = 0; i < sizeof(tags) / sizeof(tags[0]); i++)
        text_of(p, end, tags[i]);
    /* A listing: the result, then its entries in turn (s3.c's page loop; each entry found starts
     * after the last one's contents, so the walk always moves on). */
    if (s3_xml_find(p, end, "ListBucketResult", &vs, &ve)) {
        check_range(p, end, vs, ve);
        for (const char *q = vs; s3_xml_find(q, ve, "Contents", &es, &ee); q = ee) {
            check_range(vs, ve, es, ee);
            text_of(es, ee, "Key");
            text_of(es, ee, "Size");
            if (s3_xml_get(es, ee, "LastModified", when, sizeof(when)) == 0)
                (void)s3_iso8601_ms(when);
        }
    }
    free(buf);
    return 0;
}
