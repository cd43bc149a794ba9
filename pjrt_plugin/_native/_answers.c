/* Calls answered in C, without Python: what JAX asks on every dispatch.
 *
 * A tiny jitted call makes about fourteen PJRT calls; each one that enters Python costs
 * microseconds (the GIL, a ctypes structure, a handle lookup). The answers of most of
 * them are facts Python knew when it made the handle, or events that are born ready
 * (the simulator runs each call to completion before Execute returns). This file
 * answers those from memory, with no Python at all:
 *
 * - Native entry points (`native_entry`): the infallible buffer getters, from the words
 *   Python wrote in the buffer's handle block (`BUFFER_WORDS`; they answer in every
 *   phase of interpreter exit, even once module teardown cleared the plugin's globals).
 *
 * - Fast paths (`fast_path`) of entry points that also have a Python function: the
 *   trampoline tries the fast path first and calls Python only when C cannot answer
 *   (a block without the expected tag: NULL, freed, another kind of handle; an *_Args
 *   too short for its fields). Python then answers exactly as it did before this file
 *   existed, errors included. They cover the executable's counts, a memory's kind, a
 *   buffer's ready event, and every PJRT_Event_* call on events made here.
 *
 * Events. With the extension every PJRT_Event is a C `Event` (`new_event`, also called
 * by Python through _guard.new_event). Like the Python events before, they are ready
 * from birth (PJRT_Event_Set may still give one an error). Events are never returned
 * to malloc: a destroyed one goes to a free list with its tag cleared, so a call on a
 * destroyed event reaches Python and fails as before ("invalid or freed handle").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "_native.h"

/* --- buffers: infallible getters answered from the handle block ------------------- */

/* The words of a buffer's handle block, in order (pjrt_plugin._objects.BUFFER_WORDS):
 * `failed` is 1 if the buffer was made with an error (an output of a failed call). */
enum { B_VTABLE, B_TAG, B_TYPE, B_DIMS, B_NUM_DIMS, B_DEVICE, B_MEMORY, B_DELETED, B_FAILED,
       B_WORDS };
const char buffer_words_text[] = "vtable tag type dims num_dims device memory deleted failed";

/* *_Args of the handle getters: the header, the handle, then one or two out-fields. */
typedef struct { size_t struct_size; void *ext; intptr_t *handle; } HandleArgs;
#define OUT(a, type) (*(type *)((char *)(a) + sizeof(HandleArgs)))
#define OUT2(a, type) (*(type *)((char *)(a) + sizeof(HandleArgs) + sizeof(void *)))
#define WORD(a, i) (((HandleArgs *)(a))->handle[i])
#define HANDLE_END sizeof(HandleArgs)                          /* no out-field */
#define OUT_END (sizeof(HandleArgs) + sizeof(void *))          /* one out-field */
#define OUT2_END (sizeof(HandleArgs) + 2 * sizeof(void *))     /* two */

static void *buffer_element_type(void *a) { OUT(a, int) = (int)WORD(a, B_TYPE); return NULL; }

static void *buffer_dimensions(void *a) {           /* also UnpaddedDimensions */
    OUT(a, const int64_t *) = (const int64_t *)WORD(a, B_DIMS);
    OUT2(a, size_t) = (size_t)WORD(a, B_NUM_DIMS);
    return NULL;
}

static void *buffer_dynamic_dimension_indices(void *a) {   /* none: static shapes */
    OUT(a, const size_t *) = NULL;
    OUT2(a, size_t) = 0;
    return NULL;
}

static void *buffer_device(void *a) { OUT(a, void *) = (void *)WORD(a, B_DEVICE); return NULL; }

static void *buffer_memory(void *a) { OUT(a, void *) = (void *)WORD(a, B_MEMORY); return NULL; }

static void *buffer_is_deleted(void *a) { OUT(a, _Bool) = WORD(a, B_DELETED) != 0; return NULL; }

static void *buffer_is_on_cpu(void *a) { OUT(a, _Bool) = 0; return NULL; }

static const struct { const char *name; void *fn; } natives[] = {
    {"PJRT_Buffer_ElementType", (void *)buffer_element_type},
    {"PJRT_Buffer_Dimensions", (void *)buffer_dimensions},
    {"PJRT_Buffer_UnpaddedDimensions", (void *)buffer_dimensions},
    {"PJRT_Buffer_DynamicDimensionIndices", (void *)buffer_dynamic_dimension_indices},
    {"PJRT_Buffer_Device", (void *)buffer_device},
    {"PJRT_Buffer_Memory", (void *)buffer_memory},
    {"PJRT_Buffer_IsDeleted", (void *)buffer_is_deleted},
    {"PJRT_Buffer_IsOnCpu", (void *)buffer_is_on_cpu},
    {NULL, NULL},
};

/* The i-th native entry point (name and address), or 0 past the last. */
int native_entry(int i, const char **name, void **fn) {
    if (natives[i].name == NULL)
        return 0;
    *name = natives[i].name;
    *fn = natives[i].fn;
    return 1;
}

/* --- events ------------------------------------------------------------------------ */

typedef struct Event {
    void *vtable;               /* NULL: a handle block's first word */
    intptr_t tag;               /* TAG_EVENT while alive, 0 once destroyed */
    int code;                   /* 0: no error */
    size_t size;
    char *message;              /* malloc'd (code != 0), or NULL */
    struct Event *next;         /* the free list */
} Event;

static Event *free_events;
static char event_lock;         /* a spin lock: held for a few instructions */

static void lock(void) {
    while (__atomic_test_and_set(&event_lock, __ATOMIC_ACQUIRE))
        ;
}

static void unlock(void) { __atomic_clear(&event_lock, __ATOMIC_RELEASE); }

void *new_event(int code, const char *message, size_t size) {
    char *text = NULL;
    Event *e;
    if (code != 0) {
        if ((text = malloc(size + 1)) == NULL)
            return NULL;
        memcpy(text, message, size);
        text[size] = '\0';
    }
    lock();
    if ((e = free_events) != NULL)
        free_events = e->next;
    unlock();
    if (e == NULL && (e = malloc(sizeof(Event))) == NULL) {
        free(text);
        return NULL;
    }
    e->vtable = NULL;
    e->code = code;
    e->size = code != 0 ? size : 0;
    e->message = text;
    e->next = NULL;
    __atomic_store_n(&e->tag, TAG_EVENT, __ATOMIC_RELEASE);
    return e;
}

/* The event an *_Args names (its first field after the header), if it is one of ours. */
static Event *event_of(void *a) {
    Event *e = *(Event **)((char *)a + ARGS_HEADER);
    return e != NULL && __atomic_load_n(&e->tag, __ATOMIC_ACQUIRE) == TAG_EVENT ? e : NULL;
}

/* The event's error as a new PJRT_Error (the caller owns it), or NULL. */
static void *event_error_of(Event *e) {
    void *error = NULL;
    lock();
    if (e->code != 0)
        error = make_error(e->code, e->message, e->size);
    unlock();
    return error;
}

static int event_destroy(void *a, void **result) {
    Event *e;
    char *text;
    if (!ARGS_FIT(a, HANDLE_END) || (e = event_of(a)) == NULL)
        return 0;
    lock();
    e->tag = 0;
    text = e->message;
    e->message = NULL;
    e->next = free_events;
    free_events = e;
    unlock();
    free(text);
    *result = NULL;
    return 1;
}

static int event_is_ready(void *a, void **result) {
    if (!ARGS_FIT(a, HANDLE_END + sizeof(_Bool)) || event_of(a) == NULL)
        return 0;
    OUT(a, _Bool) = 1;
    *result = NULL;
    return 1;
}

static int event_error(void *a, void **result) {       /* also Await: it is ready */
    Event *e;
    if (!ARGS_FIT(a, HANDLE_END) || (e = event_of(a)) == NULL)
        return 0;
    *result = event_error_of(e);
    return 1;
}

typedef void (*on_ready_fn)(void *error, void *user_arg);

static int event_on_ready(void *a, void **result) {
    struct { size_t size; void *ext; Event *event; on_ready_fn callback; void *user; } *args = a;
    Event *e;
    if (!ARGS_FIT(a, sizeof *args) || (e = event_of(a)) == NULL || args->callback == NULL)
        return 0;
    args->callback(event_error_of(e), args->user);     /* ready: called now */
    *result = NULL;
    return 1;
}

static int event_create(void *a, void **result) {
    void *e;
    if (!ARGS_FIT(a, HANDLE_END))
        return 0;
    if ((e = new_event(0, NULL, 0)) == NULL)
        return 0;                                       /* Python answers */
    *(void **)((char *)a + ARGS_HEADER) = e;
    *result = NULL;
    return 1;
}

static int event_set(void *a, void **result) {
    struct { size_t size; void *ext; Event *event; int code; const char *message;
             size_t message_size; } *args = a;
    Event *e;
    char *text, *old;
    if (!ARGS_FIT(a, sizeof *args) || (e = event_of(a)) == NULL)
        return 0;
    if (args->code == 0) {                              /* success: nothing changes */
        *result = NULL;
        return 1;
    }
    if (args->code < 0 || args->code > CODE_UNAUTHENTICATED ||
        (args->message == NULL && args->message_size > 0)) {
        static const char bad[] = "PJRT_Event_Set: invalid error code or message";
        *result = make_error(CODE_INVALID_ARGUMENT, bad, sizeof bad - 1);
        return 1;
    }
    if ((text = malloc(args->message_size + 1)) == NULL)
        return 0;
    if (args->message_size > 0)
        memcpy(text, args->message, args->message_size);
    text[args->message_size] = '\0';
    lock();
    old = e->message;
    e->code = args->code;
    e->size = args->message_size;
    e->message = text;
    unlock();
    free(old);
    *result = NULL;
    return 1;
}

/* --- executables, memories, buffer events: facts written into the handle block ------ */

/* The handle of an *_Args if its block carries `tag`. */
static intptr_t *tagged(void *a, intptr_t tag) {
    intptr_t *block = ((HandleArgs *)a)->handle;
    return block != NULL && block[1] == tag ? block : NULL;
}

/* An executable's block (pjrt_plugin._objects.EXECUTABLE_WORDS). */
enum { X_VTABLE, X_TAG, X_NUM_REPLICAS, X_NUM_PARTITIONS, X_NUM_OUTPUTS, X_WORDS };
const char executable_words_text[] = "vtable tag num_replicas num_partitions num_outputs";

static int executable_count(void *a, void **result, int word) {
    intptr_t *block;
    if (!ARGS_FIT(a, OUT_END) || (block = tagged(a, TAG_EXECUTABLE)) == NULL)
        return 0;
    OUT(a, size_t) = (size_t)block[word];
    *result = NULL;
    return 1;
}

static int executable_num_replicas(void *a, void **r) {
    return executable_count(a, r, X_NUM_REPLICAS);
}

static int executable_num_partitions(void *a, void **r) {
    return executable_count(a, r, X_NUM_PARTITIONS);
}

static int executable_num_outputs(void *a, void **r) {
    return executable_count(a, r, X_NUM_OUTPUTS);
}

/* A memory's block (pjrt_plugin._objects.MEMORY_WORDS). */
enum { M_VTABLE, M_TAG, M_KIND, M_KIND_SIZE, M_WORDS };
const char memory_words_text[] = "vtable tag kind kind_size";

static int memory_kind(void *a, void **result) {
    intptr_t *block;
    if (!ARGS_FIT(a, OUT2_END) || (block = tagged(a, TAG_MEMORY)) == NULL)
        return 0;
    OUT(a, const char *) = (const char *)block[M_KIND];
    OUT2(a, size_t) = (size_t)block[M_KIND_SIZE];
    *result = NULL;
    return 1;
}

/* A buffer that was made without an error: its ready event is a new ready one. A
 * failed buffer's (the event carries its error) is made by Python. */
static int buffer_ready_event(void *a, void **result) {
    intptr_t *block;
    void *e;
    if (!ARGS_FIT(a, OUT_END) || (block = tagged(a, TAG_BUFFER)) == NULL ||
        block[B_FAILED] != 0 || (e = new_event(0, NULL, 0)) == NULL)
        return 0;
    OUT(a, void *) = e;
    *result = NULL;
    return 1;
}

static const struct { const char *name; fast_fn fn; } fast[] = {
    {"PJRT_Event_Destroy", event_destroy},
    {"PJRT_Event_IsReady", event_is_ready},
    {"PJRT_Event_Error", event_error},
    {"PJRT_Event_Await", event_error},
    {"PJRT_Event_OnReady", event_on_ready},
    {"PJRT_Event_Create", event_create},
    {"PJRT_Event_Set", event_set},
    {"PJRT_Executable_NumReplicas", executable_num_replicas},
    {"PJRT_Executable_NumPartitions", executable_num_partitions},
    {"PJRT_Executable_NumOutputs", executable_num_outputs},
    {"PJRT_Memory_Kind", memory_kind},
    {"PJRT_Buffer_ReadyEvent", buffer_ready_event},
    {NULL, NULL},
};

fast_fn fast_path(const char *name) {
    int i;
    for (i = 0; fast[i].name != NULL; i++)
        if (strcmp(fast[i].name, name) == 0)
            return fast[i].fn;
    return NULL;
}

/* The names of the entry points with a fast path (for _guard.fast_paths()). */
const char *fast_path_name(int i) { return fast[i].name; }
