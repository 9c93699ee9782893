/* tasks/ingest/native/logscan.c's outputs as Python objects. Needs Python.h and logscan_json.h first. */

/* A scan's output handed to Python without a copy: a read-only buffer that owns the
 * memory the scan wrote (numpy and Arrow wrap it in place; it is freed with the last
 * view). Copying into bytes instead cost a second pass over every chunk's values. */
typedef struct { PyObject_HEAD char *p; Py_ssize_t len; } Block;

static int block_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Block *b = (Block *)self;
    return PyBuffer_FillInfo(view, self, b->p ? b->p : (char *)"", b->len, 1, flags);
}
static void block_dealloc(PyObject *self) {
    free(((Block *)self)->p);
    Py_TYPE(self)->tp_free(self);
}
static PyBufferProcs BLOCK_BUFFER = {block_getbuffer, NULL};
static PyTypeObject BLOCK_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tasks.ingest.native._logscan.Block", .tp_basicsize = sizeof(Block), .tp_dealloc = block_dealloc,
    .tp_as_buffer = &BLOCK_BUFFER, .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes a scan wrote, exposed through the buffer protocol without a copy.",
};

/* Hands b's memory to a new Block (trimmed to its length); b is left empty. */
static PyObject *as_block(Buf *b) {
    Block *out = PyObject_New(Block, &BLOCK_TYPE);
    if (!out) { free(b->p); b->p = NULL; return NULL; }
    char *trimmed = b->len && b->len < b->cap ? realloc(b->p, b->len) : NULL;
    out->p = trimmed ? trimmed : b->p;
    out->len = (Py_ssize_t)b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)out;
}
