/* Fuzz target: the shard header parser and the name and checksum validators (common/shard).
 * A header that decodes must encode back to the same 88 bytes, and names that pass the check
 * must be safe path components. */
#include "fuzz.h"
#include "shard.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sl_shard_header h;
    char *s;
    char file[SL_SHARD_NAME_MAX + 64];

    if (sl_shard_header_decode(&h, data, size) == 0) {
        uint8_t again[SL_SHARD_HEADER_SIZE];

        if (size < SL_SHARD_HEADER_SIZE || h.rank < 0 || h.tensor_count < 0 ||
            h.data_len > (uint64_t)INT64_MAX || sl_shard_hex_check(h.sha256) != 0)
            abort();
        sl_shard_header_encode(again, &h);
        if (memcmp(again, data, SL_SHARD_HEADER_SIZE) != 0)
            abort();
    }
    /* The same bytes as a NUL-terminated string: a name and a hex checksum. */
    if (!(s = malloc(size + 1)))
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    if (sl_shard_name_check(s) == 0) {
        size_t n = strlen(s);

        if (n == 0 || n > SL_SHARD_NAME_MAX || s[0] == '.' || strstr(s, "..") || strchr(s, '/'))
            abort();
        if (sl_shard_file_name(file, sizeof(file), s, 65535) != 0)
            abort();
    }
    if (sl_shard_hex_check(s) == 0 && strlen(s) != SL_SHARD_HEX_LEN)
        abort();
    free(s);
    return 0;
}
