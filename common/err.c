#include "err.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

const char *sl_strerror(int code)
{
    static _Thread_local char buf[128];

    switch (code) {
    case 0:
        return "success";
#define SL_ERR_MSG(name, value, msg)                                                               \
    case value:                                                                                    \
        return msg;
        SL_ERR_TABLE(SL_ERR_MSG)
#undef SL_ERR_MSG
    default:
        break;
    }
    if (code < 0 && code > -1000)
        return strerror_r(-code, buf, sizeof(buf));
    snprintf(buf, sizeof(buf), "unknown error %d", code);
    return buf;
}

const char *sl_errname(int code)
{
    switch (code) {
    case 0:
        return "OK";
#define SL_ERR_NAME(name, value, msg)                                                              \
    case value:                                                                                    \
        return #name;
        SL_ERR_TABLE(SL_ERR_NAME)
#undef SL_ERR_NAME
    case -ENOENT:
        return "ENOENT";
    case -ENOMEM:
        return "ENOMEM";
    case -EEXIST:
        return "EEXIST";
    case -EINVAL:
        return "EINVAL";
    case -ENOSPC:
        return "ENOSPC";
    case -EIO:
        return "EIO";
    case -EACCES:
        return "EACCES";
    default:
        return code < 0 && code > -1000 ? "ERRNO" : "UNKNOWN";
    }
}
