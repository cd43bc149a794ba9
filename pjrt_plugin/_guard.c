/* Native trampolines around the plugin's ctypes entry points.
 *
 * JAX calls some PJRT entry points (PJRT_Buffer_Destroy above all) from C++ destructors
 * that run while a Python exception is propagating: a jax.Array that was a temporary
 * argument of a failing call is freed during the unwind. A ctypes callback cannot run
 * with an exception pending: the first call inside it fails on it, and on return ctypes
 * consumes it, so JAX either aborts (an error from a destroy) or loses the user's
 * exception. Each trampoline here takes the GIL, sets the pending exception aside, calls
 * the ctypes thunk, and puts the exception back, which no Python code can do.
 *
 * Every PJRT entry point and error-vtable function takes at most four pointer-sized
 * arguments and returns a pointer, an int or nothing, so one trampoline shape serves all
 * (extra argument registers are ignored by the callee under the x86-64 and AArch64 ABIs).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef void *(*entry_fn)(void *, void *, void *, void *);

#define MAX_SLOTS 256
static entry_fn targets[MAX_SLOTS];

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

static void *guarded(int slot, void *a, void *b, void *c, void *d) {
    PyGILState_STATE gil;
    PyObject *type, *value, *traceback;
    void *result;
    if (finalizing() || targets[slot] == NULL)
        return NULL;          /* the interpreter is going away: nothing left to free */
    gil = PyGILState_Ensure();
    PyErr_Fetch(&type, &value, &traceback);
    result = targets[slot](a, b, c, d);
    PyErr_Restore(type, value, traceback);
    PyGILState_Release(gil);
    return result;
}

/* 256 trampolines, tramp_0000 .. tramp_3333, named by their slot in base 4. */
#define T1(a, b, c, d) static void *tramp_##a##b##c##d(void *p, void *q, void *r, void *s) { \
    return guarded((a) * 64 + (b) * 16 + (c) * 4 + (d), p, q, r, s); }
#define T4(a, b, c) T1(a, b, c, 0) T1(a, b, c, 1) T1(a, b, c, 2) T1(a, b, c, 3)
#define T16(a, b) T4(a, b, 0) T4(a, b, 1) T4(a, b, 2) T4(a, b, 3)
#define T64(a) T16(a, 0) T16(a, 1) T16(a, 2) T16(a, 3)
T64(0) T64(1) T64(2) T64(3)

#define A1(a, b, c, d) tramp_##a##b##c##d,
#define A4(a, b, c) A1(a, b, c, 0) A1(a, b, c, 1) A1(a, b, c, 2) A1(a, b, c, 3)
#define A16(a, b) A4(a, b, 0) A4(a, b, 1) A4(a, b, 2) A4(a, b, 3)
#define A64(a) A16(a, 0) A16(a, 1) A16(a, 2) A16(a, 3)
static entry_fn trampolines[MAX_SLOTS] = { A64(0) A64(1) A64(2) A64(3) };

static PyObject *install(PyObject *self, PyObject *args) {
    int slot;
    unsigned long long target;
    if (!PyArg_ParseTuple(args, "iK", &slot, &target))
        return NULL;
    if (slot < 0 || slot >= MAX_SLOTS) {
        PyErr_Format(PyExc_IndexError, "trampoline slot %d outside 0..%d", slot, MAX_SLOTS - 1);
        return NULL;
    }
    targets[slot] = (entry_fn)(uintptr_t)target;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)trampolines[slot]);
}

static PyMethodDef methods[] = {
    {"install", install, METH_VARARGS,
     "install(slot, target_address) -> address of a trampoline that calls the target "
     "with any pending Python exception set aside."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_guard", "Exception-safe trampolines for ctypes entry points.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__guard(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL)
        PyModule_AddIntConstant(m, "MAX_SLOTS", MAX_SLOTS);
    return m;
}
