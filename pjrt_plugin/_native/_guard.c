/* The plugin's native layer: the addresses JAX calls, and the plugin's PJRT_Errors.
 *
 * Every PJRT entry point JAX calls lands in a trampoline here, which calls the entry's
 * Python function `call(args_address) -> error address or None` (pjrt_plugin._api). The
 * trampoline owns everything a Python function cannot do for itself:
 *
 * 1. Exceptions already propagating. JAX calls some entry points (PJRT_Buffer_Destroy
 *    above all) from C++ destructors that run while a Python exception propagates: a
 *    jax.Array that was a temporary argument of a failing call is freed during the
 *    unwind. Python code cannot run with an exception pending, so the trampoline sets it
 *    aside (PyErr_Fetch) around the call and puts it back afterwards.
 *
 * 2. Interrupts (Ctrl-C). A KeyboardInterrupt (or any BaseException that is not an
 *    Exception, e.g. SystemExit from a signal handler) raised while an entry point runs
 *    must reach the user as itself, not as JaxRuntimeError: the trampoline returns
 *    CANCELLED for the interrupted call and raises the exception again, unchanged, as soon
 *    as control is back in Python (a pending call, which the interpreter runs in the main
 *    thread between two bytecodes). While the exception waits, other entry points JAX
 *    calls on its way out run normally: each trampoline first takes the signals and
 *    pending calls due (PyErr_CheckSignals, Py_MakePendingCalls) and defers what they
 *    raise again, so that nothing fires on the first line of the Python code, outside
 *    its error handling.
 *
 * 3. Interpreter shutdown. A jax.Array can be read in a __del__ that the interpreter's
 *    final garbage collection runs, after Py_FinalizeEx started: the thread running the
 *    finalization still runs Python, so its calls go to Python as usual (the thread is
 *    recorded by an atexit handler, `exiting()`). Any other thread cannot take the GIL
 *    any more (CPython would end it), and after Py_FinalizeEx (Py_AtExit) nothing may
 *    touch Python: such calls get an answer made in C (4).
 *
 * 4. No garbage, ever. XLA reads the out-fields of a call that returned no error. A
 *    fallible entry point (kind FALLIBLE) that could not run, or whose Python function
 *    failed without producing an error, returns a PJRT_Error made here (INTERNAL,
 *    CANCELLED for an interrupt, UNAVAILABLE during shutdown). An infallible one (kind
 *    INFALLIBLE: JAX aborts on an error from it) returns success with its out-fields
 *    zeroed: NULL pointers, zero counts, false flags -- an empty answer, never an unset one.
 *
 * Errors. All the plugin's PJRT_Errors are made here (`new_error`), laid out as the C
 * API 0.107 requires (the first word points at a PJRT_Error_FunctionTable), and the
 * PJRT_Error_* entry points and the vtable are C functions, so an error can be made,
 * read and destroyed with no Python at all (during shutdown, or from any thread).
 *
 * Answers in C (_answers.c). XLA asks a buffer's element type, dimensions, device...
 * when JAX reads it, and aborts on a wrong answer as on an error: those getters are C
 * functions reading the words Python put in the buffer's handle block. Other calls JAX
 * makes on every dispatch (events, an executable's counts, a memory's kind) have a fast
 * path in C: the trampoline tries it first, before it takes the GIL, and calls Python
 * only when C cannot answer (see _answers.c).
 *
 * Every trampoline takes one pointer (the entry point's *_Args) and returns one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "_native.h"

/* _answers.c: the entry points it implements, and the words of the blocks it reads. */
int native_entry(int i, const char **name, void **fn);
const char *fast_path_name(int i);
extern const char buffer_words_text[], executable_words_text[], memory_words_text[];

/* --- errors -------------------------------------------------------------------- */

typedef struct {                /* PJRT_Error_FunctionTable, C API 0.107 */
    size_t struct_size;
    size_t instance_size;
    void *extension_start;
    void (*destroy)(void *error);
    void (*message)(void *error, const char **message, size_t *size);
    int (*get_code)(void *error);
    void (*for_each_payload)(void *error, void *visitor, void *user_arg);
} ErrorVtable;

typedef struct {
    const ErrorVtable *vtable;  /* first word: PJRT_Error */
    int code;
    size_t size;
    char message[];             /* NUL-terminated */
} Error;

void *no_memory;                 /* the error reported when malloc fails (never freed) */

static void vt_destroy(void *e) {
    if (e != no_memory)
        free(e);
}

static void vt_message(void *e, const char **message, size_t *size) {
    *message = ((Error *)e)->message;
    *size = ((Error *)e)->size;
}

static int vt_get_code(void *e) { return ((Error *)e)->code; }

static void vt_for_each_payload(void *e, void *visitor, void *user_arg) {
    (void)e; (void)visitor; (void)user_arg;     /* our errors carry no payloads */
}

/* struct_size: offset of the last field + 8 = 56; instance_size: the PJRT_Error base. */
static const ErrorVtable vtable = {56, 8, NULL, vt_destroy, vt_message, vt_get_code,
                                   vt_for_each_payload};

/* A new error, or the preallocated RESOURCE_EXHAUSTED one if malloc fails. */
void *make_error(int code, const char *message, size_t size) {
    Error *e = malloc(sizeof(Error) + size + 1);
    if (e == NULL)
        return no_memory;
    e->vtable = &vtable;
    e->code = code;
    e->size = size;
    memcpy(e->message, message, size);
    e->message[size] = '\0';
    return e;
}

static void *make_error_f(int code, const char *format, const char *a, const char *b) {
    char text[512];
    int n = snprintf(text, sizeof text, format, a, b);
    return make_error(code, text, n < 0 ? 0 : (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
}

/* The PJRT_Error_* entry points of the API table (args: header, then the error). */
typedef struct { size_t struct_size; void *ext; Error *error; } ErrorArgs;
typedef struct { size_t struct_size; void *ext; Error *error; const char *message;
                 size_t message_size; } MessageArgs;
typedef struct { size_t struct_size; void *ext; Error *error; int code; } CodeArgs;

static void *api_error_destroy(ErrorArgs *a) { vt_destroy(a->error); return NULL; }

static void *api_error_message(MessageArgs *a) {
    vt_message(a->error, &a->message, &a->message_size);
    return NULL;
}

static void *api_error_get_code(CodeArgs *a) { a->code = a->error->code; return NULL; }

static void *api_error_for_each_payload(ErrorArgs *a) { (void)a; return NULL; }

/* --- interpreter state ----------------------------------------------------------- */

static int python_gone;                 /* Py_FinalizeEx has finished (Py_AtExit) */
static int exit_thread_known;
static unsigned long exit_thread;       /* the thread running Py_FinalizeEx */

static void on_python_gone(void) { python_gone = 1; }

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* Whether this thread may call Python now (see 3 above). */
static int python_usable(void) {
    if (python_gone)
        return 0;
    if (!finalizing())
        return 1;
    return exit_thread_known && PyThread_get_thread_ident() == exit_thread;
}

/* --- deferred interrupts (see 2 above); all under the GIL ------------------------- */

static PyObject *deferred_type, *deferred_value, *deferred_traceback;
static int deferred_armed;
static int depth;               /* trampolines running (nested or in other threads) */

static int raise_deferred(void *unused) {
    (void)unused;
    deferred_armed = 0;
    if (deferred_type == NULL)
        return 0;
    PyErr_Restore(deferred_type, deferred_value, deferred_traceback);
    deferred_type = deferred_value = deferred_traceback = NULL;
    return -1;                  /* the interpreter raises it where it stands */
}

static void arm_deferred(void) {
    if (deferred_type != NULL && !deferred_armed)
        deferred_armed = Py_AddPendingCall(raise_deferred, NULL) == 0;
}

/* Moves the current exception to the deferred slot (the first one waiting wins: a
 * second Ctrl-C before the first reached Python adds nothing). It is armed when the
 * last trampoline returns: armed earlier, it would fire inside the next Python call. */
static void defer_current(void) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (deferred_type == NULL) {
        deferred_type = type;
        deferred_value = value;
        deferred_traceback = traceback;
    } else {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
    }
}

/* Runs the signal handlers and pending calls due now, deferring what they raise. */
static void take_pending(void) {
    if (PyErr_CheckSignals() < 0 || Py_MakePendingCalls() < 0)
        defer_current();
}

/* --- trampolines ----------------------------------------------------------------- */

enum { FALLIBLE = 0, INFALLIBLE = 1 };

typedef struct {
    PyObject *call;             /* call(args_address) -> error address or None */
    fast_fn fast;               /* answers in C first, if not NULL (_answers.c) */
    int kind;
    char name[96];
} Slot;

#define MAX_SLOTS 256
static Slot slots[MAX_SLOTS];

static void clear_outputs(void *args) {
    size_t size = *(size_t *)args;
    if (size > ARGS_HEADER)
        memset((char *)args + ARGS_HEADER, 0, size - ARGS_HEADER);
}

/* The answer of a call whose Python function did not produce one (see 4 above). */
static void *no_answer(Slot *slot, void *args, int code, const char *why) {
    if (slot->kind == FALLIBLE)
        return make_error_f(code, "jax-trn: %s %s", slot->name, why);
    clear_outputs(args);
    return NULL;
}

/* The call's Python function raised (the exception is set). */
static void *failed(Slot *slot, void *args) {
    PyObject *type, *value, *traceback, *text = NULL;
    const char *what = "an unknown error";
    void *result;
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {   /* KeyboardInterrupt, SystemExit */
        defer_current();
        return no_answer(slot, args, CODE_CANCELLED,
                         "was interrupted; the interrupt is raised again in Python");
    }
    PyErr_Fetch(&type, &value, &traceback);
    if (value != NULL && (text = PyObject_Str(value)) != NULL)
        what = PyUnicode_AsUTF8(text);
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
        defer_current();        /* an interrupt while making the message */
    PyErr_Clear();
    if (what == NULL)
        what = "an error without a message";
    if (slot->kind == INFALLIBLE && !finalizing())    /* quiet during module teardown */
        fprintf(stderr, "jax-trn: %s failed (ignored): %s\n", slot->name, what);
    result = slot->kind == FALLIBLE
        ? make_error_f(CODE_INTERNAL, "jax-trn: %s failed: %s", slot->name, what)
        : (clear_outputs(args), NULL);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return result;
}

static void *call_python(Slot *slot, void *args) {
    PyObject *address = PyLong_FromVoidPtr(args), *r;
    void *result;
    if (address == NULL)
        return failed(slot, args);
    r = PyObject_CallOneArg(slot->call, address);
    Py_DECREF(address);
    if (r == NULL)
        return failed(slot, args);
    result = r == Py_None ? NULL : PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    if (result == NULL && PyErr_Occurred())
        return failed(slot, args);
    return result;
}

static void *guarded_call(Slot *slot, void *args);

/* Threads inside a trampoline (waiting for the GIL or holding it): `exiting()` waits
 * for them to leave before the interpreter finalizes (see 3 above). */
static int active;

static void *guarded(int index, void *args) {
    void *result;
    if (slots[index].fast != NULL && slots[index].fast(args, &result))
        return result;          /* answered in C: no GIL, no Python */
    __atomic_add_fetch(&active, 1, __ATOMIC_SEQ_CST);
    result = guarded_call(&slots[index], args);
    __atomic_sub_fetch(&active, 1, __ATOMIC_SEQ_CST);
    return result;
}

static void *guarded_call(Slot *slot, void *args) {
    PyGILState_STATE gil;
    PyObject *type, *value, *traceback;
    void *result;
    if (!python_usable())
        return no_answer(slot, args, CODE_UNAVAILABLE,
                         "was called while the Python interpreter is shutting down");
    gil = PyGILState_Ensure();
    PyErr_Fetch(&type, &value, &traceback);
    depth++;
    take_pending();
    result = call_python(slot, args);
    if (--depth == 0)
        arm_deferred();
    PyErr_Restore(type, value, traceback);
    PyGILState_Release(gil);
    return result;
}

/* 256 trampolines, tramp_0000 .. tramp_3333, named by their slot in base 4. */
typedef void *(*entry_fn)(void *);
#define T1(a, b, c, d) static void *tramp_##a##b##c##d(void *p) { \
    return guarded((a) * 64 + (b) * 16 + (c) * 4 + (d), p); }
#define T4(a, b, c) T1(a, b, c, 0) T1(a, b, c, 1) T1(a, b, c, 2) T1(a, b, c, 3)
#define T16(a, b) T4(a, b, 0) T4(a, b, 1) T4(a, b, 2) T4(a, b, 3)
#define T64(a) T16(a, 0) T16(a, 1) T16(a, 2) T16(a, 3)
T64(0) T64(1) T64(2) T64(3)

#define A1(a, b, c, d) tramp_##a##b##c##d,
#define A4(a, b, c) A1(a, b, c, 0) A1(a, b, c, 1) A1(a, b, c, 2) A1(a, b, c, 3)
#define A16(a, b) A4(a, b, 0) A4(a, b, 1) A4(a, b, 2) A4(a, b, 3)
#define A64(a) A16(a, 0) A16(a, 1) A16(a, 2) A16(a, 3)
static entry_fn trampolines[MAX_SLOTS] = { A64(0) A64(1) A64(2) A64(3) };

/* --- the module -------------------------------------------------------------------- */

static int next_slot;

static PyObject *install(PyObject *self, PyObject *args) {
    PyObject *call;
    const char *name;
    int kind;
    Slot *slot;
    if (!PyArg_ParseTuple(args, "sOi", &name, &call, &kind))
        return NULL;
    if (next_slot >= MAX_SLOTS) {
        PyErr_Format(PyExc_IndexError, "more than %d entry points", MAX_SLOTS);
        return NULL;
    }
    slot = &slots[next_slot];
    Py_INCREF(call);                    /* never released: JAX may call during shutdown */
    slot->call = call;
    slot->fast = fast_path(name);
    slot->kind = kind == FALLIBLE ? FALLIBLE : INFALLIBLE;
    snprintf(slot->name, sizeof slot->name, "%s", name);
    return PyLong_FromVoidPtr((void *)trampolines[next_slot++]);
}

static PyObject *new_error(PyObject *self, PyObject *args) {
    int code;
    const char *message;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "iy#", &code, &message, &size))
        return NULL;
    return PyLong_FromVoidPtr(make_error(code, message, (size_t)size));
}

static PyObject *py_new_event(PyObject *self, PyObject *args) {
    int code;
    const char *message;
    Py_ssize_t size;
    void *e;
    if (!PyArg_ParseTuple(args, "iy#", &code, &message, &size))
        return NULL;
    if ((e = new_event(code, message, (size_t)size)) == NULL)
        return PyErr_NoMemory();
    return PyLong_FromVoidPtr(e);
}

static PyObject *fast_paths(PyObject *self, PyObject *unused) {
    PyObject *names = PyList_New(0), *name;
    const char *text;
    int i;
    for (i = 0; names != NULL && (text = fast_path_name(i)) != NULL; i++) {
        name = PyUnicode_FromString(text);
        if (name == NULL || PyList_Append(names, name) < 0)
            Py_CLEAR(names);
        Py_XDECREF(name);
    }
    return names;
}

static int add_address(PyObject *table, const char *name, void *fn) {
    PyObject *address = PyLong_FromVoidPtr(fn);
    int failed = address == NULL || PyDict_SetItemString(table, name, address) < 0;
    Py_XDECREF(address);
    return failed ? -1 : 0;
}

static PyObject *entry_points(PyObject *self, PyObject *unused) {
    const struct { const char *name; void *fn; } errors[] = {
        {"PJRT_Error_Destroy", (void *)api_error_destroy},
        {"PJRT_Error_Message", (void *)api_error_message},
        {"PJRT_Error_GetCode", (void *)api_error_get_code},
        {"PJRT_Error_ForEachPayload", (void *)api_error_for_each_payload},
    };
    PyObject *table = PyDict_New();
    const char *name;
    void *fn;
    int i, n = (int)(sizeof errors / sizeof errors[0]);
    for (i = 0; table != NULL; i++) {
        if (i < n) {
            name = errors[i].name;
            fn = errors[i].fn;
        } else if (!native_entry(i - n, &name, &fn)) {
            break;
        }
        if (add_address(table, name, fn) < 0)
            Py_CLEAR(table);
    }
    return table;
}

static PyObject *defer(PyObject *self, PyObject *exc) {
    if (!PyExceptionInstance_Check(exc)) {
        PyErr_SetString(PyExc_TypeError, "defer() takes an exception");
        return NULL;
    }
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), Py_NewRef(exc),
                  PyException_GetTraceback(exc));
    defer_current();
    Py_RETURN_NONE;
}

/* Waits up to a minute (GIL released) for other threads to leave the trampolines: a
 * compile still running on JAX's thread when the interpreter exits (after Ctrl-C) would
 * otherwise take the GIL again after finalization began, CPython would end that thread
 * in the middle of XLA's task, and the exit would hang joining XLA's thread pool. */
static PyObject *exiting(PyObject *self, PyObject *unused) {
    int waited;
    exit_thread = PyThread_get_thread_ident();
    exit_thread_known = 1;
    for (waited = 0; waited < 60000 && __atomic_load_n(&active, __ATOMIC_SEQ_CST) > 0;
         waited++) {
        Py_BEGIN_ALLOW_THREADS
        usleep(1000);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS,
     "install(name, call, kind) -> address of a trampoline that calls `call(args_address)` "
     "(kind 0: fallible, 1: infallible; see the file's comment)."},
    {"new_error", new_error, METH_VARARGS,
     "new_error(code, message: bytes) -> address of a new PJRT_Error."},
    {"new_event", py_new_event, METH_VARARGS,
     "new_event(code, message: bytes) -> address of a new ready PJRT_Event, failed with "
     "(code, message) if code != 0 (see _answers.c, \"Events\")."},
    {"entry_points", entry_points, METH_NOARGS,
     "{name: address} of the entry points implemented in C: PJRT_Error_*, and the "
     "buffer getters answered from the handle block (BUFFER_WORDS)."},
    {"fast_paths", fast_paths, METH_NOARGS,
     "The entry points C answers before calling their Python function (_answers.c)."},
    {"defer", defer, METH_O,
     "defer(exc): raises `exc` again once control is back in Python, after the entry "
     "point running now has returned (see \"Interrupts\" above)."},
    {"exiting", exiting, METH_NOARGS,
     "Records the calling thread as the one finalizing the interpreter and waits for "
     "other threads to leave the entry points (an atexit handler)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_guard", "The plugin's trampolines and PJRT_Errors.", -1, methods,
};

PyMODINIT_FUNC PyInit__guard(void) {
    static const char oom[] = "jax-trn: out of host memory while reporting an error";
    PyObject *m;
    if (no_memory == NULL &&
        (no_memory = make_error(CODE_RESOURCE_EXHAUSTED, oom, sizeof oom - 1)) == NULL)
        return PyErr_NoMemory();
    if ((m = PyModule_Create(&module)) == NULL)
        return NULL;
    Py_AtExit(on_python_gone);
    PyModule_AddIntConstant(m, "ABI", 2);    /* pjrt_plugin._native.ABI */
    PyModule_AddIntConstant(m, "MAX_SLOTS", MAX_SLOTS);
    PyModule_AddIntConstant(m, "FALLIBLE", FALLIBLE);
    PyModule_AddIntConstant(m, "INFALLIBLE", INFALLIBLE);
    PyModule_AddStringConstant(m, "BUFFER_WORDS", buffer_words_text);
    PyModule_AddStringConstant(m, "EXECUTABLE_WORDS", executable_words_text);
    PyModule_AddStringConstant(m, "MEMORY_WORDS", memory_words_text);
    PyModule_AddObject(m, "TAGS", Py_BuildValue(
        "{sLsLsLsL}", "buffer", (long long)TAG_BUFFER, "executable", (long long)TAG_EXECUTABLE,
        "memory", (long long)TAG_MEMORY, "event", (long long)TAG_EVENT));
    return m;
}
