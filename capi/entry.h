// Declarations shared by entry.c and the Go files of package main.
#ifndef TE_CAPI_ENTRY_H
#define TE_CAPI_ENTRY_H

#include <stddef.h>

// TECAPI_MAX_MESSAGE bounds one thread's last error message, NUL included.
#define TECAPI_MAX_MESSAGE 4096

// tecapi_set_error stores msg (n bytes) as the calling thread's last error.
void tecapi_set_error(const char *msg, size_t n);

#endif
