/* What _guard.c (trampolines, errors) and _answers.c (calls answered in C) share. */
#ifndef JAX_TRN_NATIVE_H
#define JAX_TRN_NATIVE_H

#include <stddef.h>
#include <stdint.h>

/* PJRT_Error_Code values (absl status codes), pjrt_c_api.h. */
enum { CODE_CANCELLED = 1, CODE_INVALID_ARGUMENT = 3, CODE_RESOURCE_EXHAUSTED = 8,
       CODE_INTERNAL = 13, CODE_UNAVAILABLE = 14, CODE_UNAUTHENTICATED = 16 };

/* Every *_Args starts with struct_size and extension_start; out-fields follow. */
#define ARGS_HEADER 16

/* Whether a caller's *_Args reaches `end` bytes (the end of the last field touched). */
#define ARGS_FIT(args, end) (*(const size_t *)(args) >= (size_t)(end))

/* A new PJRT_Error (or the preallocated RESOURCE_EXHAUSTED one if malloc fails). */
void *make_error(int code, const char *message, size_t size);
extern void *no_memory;

/* Tags: the second word of a handle block whose calls C may answer (the first word is
 * the vtable). A block that does not carry the tag its call expects (NULL, a freed
 * handle: Python zeroes freed blocks, another kind of handle) goes to Python, which
 * answers as it always did (an error, or a logged, zeroed answer). */
#define TAG(kind) ((intptr_t)(0x6A74726E00000000LL | (kind)))    /* 'jtrn' << 32 */
#define TAG_BUFFER TAG(1)
#define TAG_EXECUTABLE TAG(2)
#define TAG_MEMORY TAG(3)
#define TAG_EVENT TAG(4)

/* A call answered in C: returns 1 with the call's result (error or NULL) in *result,
 * or 0 if C cannot answer it (the trampoline then calls the Python function). Runs
 * without the GIL, from any thread, also while the interpreter shuts down. */
typedef int (*fast_fn)(void *args, void **result);

/* The fast path of entry point `name`, or NULL. */
fast_fn fast_path(const char *name);

/* A new event, ready, failed with (code, message) if code != 0; NULL if out of memory. */
void *new_event(int code, const char *message, size_t size);

#endif
