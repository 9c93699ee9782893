/* tasks.ingest.native._logscan: one strict pass over failure-log lines that recognises the clean ones.
 *
 * A line is "clean" when it is a well-formed log in its plainest spelling: strict
 * RFC 8259 JSON, a top-level object whose known fields have the expected types, every
 * message an object with a known role and non-blank string content, a user message,
 * sizes within the rules, integers only (no floats, no -0, at most 19 digits), no
 * repeated known key, `ts` in ISO 8601 with its offset. For a clean line every Great Expectations feature is fixed by
 * what this pass saw, so tasks/ingest/scan.py builds its feature row directly; every
 * other line (the rare bad or unusual one) goes through DuckDB's feature query
 * (tasks/ingest/features.py), which stays the definition. Nothing here decides that a
 * line is invalid: "not clean" only means "ask the slow path".
 *
 * For clean lines it also writes the failure_logs values exactly as DuckDB's
 * json_extract would (minified; strings re-escaped the way yyjson writes them) and the
 * log id: sha256 of the same text DuckDB hashes, `[id, ts, ..., meta]` with `NULL` for
 * an absent field, and `ts` as microseconds (tasks/ingest/native/logscan_ts.h).
 * tests/tasks/ingest/test_scan.py holds both paths to equality.
 *
 * The GIL is released while scanning, so a chunk's halves run on two threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>

#include "logscan_json.h"
#include "logscan_ts.h"
#include "logscan_block.h"

/* Output columns. Strings: a validity byte per row, int64 offsets, data. */
enum { S_ID, S_TS, S_MODEL, S_DOMAIN, S_VERIFIER, S_RESPONSE, S_KIND, S_DETAIL,
       S_MESSAGES, S_REFERENCE, S_META, N_STR };
/* A byte per row: clean, the optional fields' type codes, the reference flags. */
enum { B_CLEAN, B_T_ID, B_T_META, B_T_VERIFIER, B_T_DETAIL, B_ANSWER, B_CODE, B_SCHEMA, N_BYTE };
enum { T_ABSENT = 0, T_STRING = 1, T_OBJECT = 2, T_NULL = 3 };
/* Top-level fields in the order DuckDB's feature query extracts (and hashes) them. */
static const char *FIELDS[] = {"id", "ts", "model", "domain", "verifier", "messages",
                               "response", "failure", "reference", "meta"};
enum { F_ID, F_TS, F_MODEL, F_DOMAIN, F_VERIFIER, F_MESSAGES, F_RESPONSE, F_FAILURE,
       F_REFERENCE, F_META, N_FIELDS };
static const char *ROLES[] = {"system", "user", "assistant", "tool"};

typedef struct { Buf valid, offsets, data; } Column;
/* Where a field's value was written: a column's data, or the line's own canon. */
typedef struct { const Buf *in; size_t at, len; int have; } Span;

/* One line's work. Values go straight into the columns and are cut back if the line
 * turns out not clean; the canonical text of fields that are not JSON columns (and
 * keys) goes to `canon`, for the hash. */
typedef struct {
    Column *col;
    Buf canon, key, scratch;
    Span field[N_FIELDS], decoded[N_STR];
    size_t mark[N_STR];
    uint8_t byte[N_BYTE];
    int64_t ts_micros;
    long max_messages, max_content_chars, max_response_chars;
} Line;

static Span span_from(const Buf *b, size_t at) { return (Span){b, at, b->len - at, 1}; }

/* A string field: decoded into its column, canonical into the line's canon. */
static int text_field(In *in, Line *l, int col) {
    Buf *out = &l->col[col].data;
    size_t at = out->len;
    if (peek(in) != '"' || !string(in, out, &l->canon, NULL)) return 0;
    l->decoded[col] = span_from(out, at);
    return 1;
}

static int messages(In *in, Line *l) {
    Buf *out = &l->col[S_MESSAGES].data;
    long n = 0, chars = 0;
    int user = 0;
    if (!eat(in, '[')) return 0;
    putc1(out, '[');
    if (!eat(in, ']')) {
        do {
            int role = 0, content = 0, keys = 0;
            if (n) putc1(out, ',');
            if (!eat(in, '{')) return 0;
            putc1(out, '{');
            do {
                if (keys++) putc1(out, ',');
                if (!key(in, &l->key, out)) return 0;
                l->scratch.len = 0;
                if (is(&l->key, "role")) {
                    if (role++ || peek(in) != '"' || !string(in, &l->scratch, out, NULL)) return 0;
                    int known = 0;
                    for (int r = 0; r < 4; r++) known |= is(&l->scratch, ROLES[r]);
                    if (!known) return 0;
                    user |= is(&l->scratch, "user");
                } else if (is(&l->key, "content")) {
                    Stats st = {0};  /* DuckDB's test is regexp '[^ ]': anything but a space counts */
                    if (content++ || peek(in) != '"' || !string(in, NULL, out, &st) || !st.not_blank) return 0;
                    chars += st.chars;
                } else if (!value(in, out)) {  /* name, tool_calls, ...: kept, not checked */
                    return 0;
                }
            } while (eat(in, ','));
            if (!eat(in, '}') || !role || !content) return 0;
            putc1(out, '}');
            n++;
        } while (eat(in, ','));
        if (!eat(in, ']')) return 0;
    }
    putc1(out, ']');
    /* Code points, where DuckDB's length() counts characters: never fewer, so a line
     * this pass accepts is within DuckDB's limit too. */
    return n >= 1 && n <= l->max_messages && chars <= l->max_content_chars && user;
}

static int failure(In *in, Line *l) {
    int kind = 0, detail = 0, first = 1;
    if (!eat(in, '{')) return 0;
    putc1(&l->canon, '{');
    if (!eat(in, '}')) {
        do {
            if (!first) putc1(&l->canon, ',');
            first = 0;
            if (!key(in, &l->key, &l->canon)) return 0;
            if (is(&l->key, "kind")) {
                if (kind++ || !text_field(in, l, S_KIND)) return 0;
            } else if (is(&l->key, "detail")) {
                if (detail++) return 0;
                if (peek(in) == 'n') {
                    if (!value(in, &l->canon)) return 0;
                    l->byte[B_T_DETAIL] = T_NULL;
                } else {
                    if (!text_field(in, l, S_DETAIL)) return 0;
                    l->byte[B_T_DETAIL] = T_STRING;
                }
            } else if (!value(in, &l->canon)) {
                return 0;
            }
        } while (eat(in, ','));
        if (!eat(in, '}')) return 0;
    }
    putc1(&l->canon, '}');
    return kind;
}

static int identifier(const Buf *b) {
    if (!b->len) return 0;
    for (size_t i = 0; i < b->len; i++) {
        char c = b->p[i];
        int alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
        if (!alpha && !(i && c >= '0' && c <= '9')) return 0;
    }
    return 1;
}

/* The reference, and what each verifier would find in it (the feature query's
 * reference_ok, before it picks the line's verifier). */
static int reference(In *in, Line *l) {
    enum { ANSWER, ENTRY, TESTS, SOLUTION, SCHEMA, N_REF };
    static const char *KEYS[] = {"answer", "entry_point", "tests", "solution", "schema"};
    Buf *out = &l->col[S_REFERENCE].data;
    int seen[N_REF] = {0}, ok[N_REF] = {0, 0, 0, 1, 0}, first = 1;
    if (!eat(in, '{')) return 0;
    putc1(out, '{');
    if (!eat(in, '}')) {
        do {
            if (!first) putc1(out, ',');
            first = 0;
            if (!key(in, &l->key, out)) return 0;
            int k = 0;
            while (k < N_REF && !is(&l->key, KEYS[k])) k++;
            if (k < N_REF && seen[k]++) return 0;
            char c = peek(in);
            l->scratch.len = 0;
            if (c == '"') {
                if (!string(in, &l->scratch, out, NULL)) return 0;
                if (k == ANSWER || k == SOLUTION) ok[k] = 1;
                if (k == ENTRY) ok[k] = identifier(&l->scratch);
                if (k == TESTS) ok[k] = memmem(l->scratch.p, l->scratch.len, "def check", 9) != NULL;
            } else {
                /* a list answer (exact takes one of scalars) is the feature query's to judge */
                if (k == ANSWER && c == '[') return 0;
                if (!value(in, out)) return 0;
                if (k == ANSWER) ok[k] = c == '-' || (c >= '0' && c <= '9');
                if (k == SOLUTION) ok[k] = 0;
                if (k == SCHEMA) ok[k] = c == '{';
            }
        } while (eat(in, ','));
        if (!eat(in, '}')) return 0;
    }
    putc1(out, '}');
    l->byte[B_ANSWER] = ok[ANSWER];
    l->byte[B_CODE] = ok[ENTRY] && ok[TESTS] && ok[SOLUTION];
    l->byte[B_SCHEMA] = ok[SCHEMA];
    return 1;
}

/* verifier or meta: a string or an object, or null; its type code goes to byte `b`.
 * Returns where its canonical text went, or NULL when it is neither. */
static const Buf *or_null(In *in, Line *l, int b, char want) {
    char c = peek(in);
    l->byte[b] = c == 'n' ? T_NULL : c == '"' ? T_STRING : T_OBJECT;
    if (c == 'n') return value(in, &l->canon) ? &l->canon : NULL;
    if (c != want) return NULL;
    if (c == '"') return text_field(in, l, S_VERIFIER) ? &l->canon : NULL;
    return value(in, &l->col[S_META].data) ? &l->col[S_META].data : NULL;
}

/* Reads field f; returns the buffer its canonical text went to (NULL: not clean). */
static const Buf *field(In *in, Line *l, int f) {
    static const int TEXT[N_FIELDS] = {[F_ID] = S_ID + 1, [F_TS] = S_TS + 1, [F_MODEL] = S_MODEL + 1,
                                       [F_DOMAIN] = S_DOMAIN + 1, [F_RESPONSE] = S_RESPONSE + 1};
    if (f == F_ID) l->byte[B_T_ID] = T_STRING;
    if (TEXT[f]) return text_field(in, l, TEXT[f] - 1) ? &l->canon : NULL;
    switch (f) {
        case F_VERIFIER: return or_null(in, l, B_T_VERIFIER, '"');
        case F_META: return or_null(in, l, B_T_META, '{');
        case F_MESSAGES: return messages(in, l) ? &l->col[S_MESSAGES].data : NULL;
        case F_FAILURE: return failure(in, l) ? &l->canon : NULL;
        default: return reference(in, l) ? &l->col[S_REFERENCE].data : NULL;
    }
}

static int buffers_ok(const Line *l) {
    int oom = l->canon.oom | l->key.oom | l->scratch.oom;
    for (int c = 0; c < N_STR; c++) oom |= l->col[c].data.oom;
    return !oom;
}

/* 1 when the line is clean; its spans and bytes are then filled in. */
static int scan_line(Line *l, const unsigned char *p, size_t n) {
    In in = {p, p + n, 0};
    l->canon.len = 0;
    memset(l->field, 0, sizeof l->field);
    memset(l->decoded, 0, sizeof l->decoded);
    memset(l->byte, 0, sizeof l->byte);
    if (!eat(&in, '{')) return 0;
    if (!eat(&in, '}')) {
        do {
            if (!key(&in, &l->key, NULL)) return 0;
            int f = 0;
            while (f < N_FIELDS && !is(&l->key, FIELDS[f])) f++;
            /* The chat template's arguments are judged and stored by the feature query only
             * (tasks/ingest/features.py): a line that has them is not clean here. */
            if (is(&l->key, "chat_template_kwargs")) return 0;
            if (f == N_FIELDS) {  /* an unknown key: only has to be JSON */
                l->scratch.len = 0;
                if (!value(&in, &l->scratch)) return 0;
                continue;
            }
            if (l->field[f].have) return 0;  /* repeated: DuckDB reads the first; slow path */
            size_t at = l->canon.len;
            const Buf *out = field(&in, l, f);
            if (!out) return 0;
            /* in a column, the field is all this line wrote there: it starts at the mark */
            for (int c = 0; c < N_STR; c++) if (out == &l->col[c].data) at = l->mark[c];
            l->field[f] = span_from(out, at);
        } while (eat(&in, ','));
        if (!eat(&in, '}')) return 0;
    }
    ws(&in);
    static const int REQUIRED[] = {F_TS, F_MODEL, F_DOMAIN, F_MESSAGES, F_RESPONSE, F_FAILURE, F_REFERENCE};
    for (size_t i = 0; i < sizeof REQUIRED / sizeof *REQUIRED; i++)
        if (!l->field[REQUIRED[i]].have) return 0;
    Stats response = {0};
    count(&response, (const unsigned char *)l->col[S_RESPONSE].data.p + l->decoded[S_RESPONSE].at,
          l->decoded[S_RESPONSE].len);
    const Span *ts = &l->decoded[S_TS];
    return in.p == in.end && response.chars <= l->max_response_chars && buffers_ok(l) &&
           parse_ts((const unsigned char *)ts->in->p + ts->at, ts->len, &l->ts_micros);
}

/* Close the line's row in every column (cutting back what a line that was not clean
 * wrote) and hash a clean line's fields as DuckDB does: sha256 of the field values
 * cast to text as a list, `[v1, v2, NULL, ...]`. */
static void finish_line(Line *l, int clean, Buf *bytes, Buf *ids, Buf *stamps, EVP_MD_CTX *ctx,
                        const EVP_MD *sha256) {
    static const unsigned char zero[EVP_MAX_MD_SIZE];
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (clean && l->byte[B_T_META] != T_OBJECT) put(&l->col[S_META].data, "{}", 2);
    for (int c = 0; c < N_STR; c++) {
        Column *col = &l->col[c];
        int valid = clean && (c == S_META || c == S_MESSAGES || c == S_REFERENCE || l->decoded[c].have);
        if (!valid) col->data.len = l->mark[c];
        int64_t end = (int64_t)col->data.len;
        putc1(&col->valid, (char)valid);
        put(&col->offsets, &end, sizeof end);
        l->mark[c] = col->data.len;
    }
    l->byte[B_CLEAN] = (uint8_t)clean;
    for (int b = 0; b < N_BYTE; b++) putc1(&bytes[b], clean ? (char)l->byte[b] : 0);
    int64_t micros = clean ? l->ts_micros : 0;
    put(stamps, &micros, sizeof micros);
    if (!clean) { put(ids, zero, 32); return; }
    int ok = EVP_DigestInit_ex(ctx, sha256, NULL) && EVP_DigestUpdate(ctx, "[", 1);
    for (int f = 0; f < N_FIELDS; f++) {
        const Span *s = &l->field[f];
        if (f) ok = ok && EVP_DigestUpdate(ctx, ", ", 2);
        ok = ok && (s->have ? EVP_DigestUpdate(ctx, s->in->p + s->at, s->len) : EVP_DigestUpdate(ctx, "NULL", 4));
    }
    ok = ok && EVP_DigestUpdate(ctx, "]", 1) && EVP_DigestFinal_ex(ctx, md, &md_len);
    if (!ok) ids->oom = 1;  /* reported as a failure of the whole scan */
    put(ids, md, 32);
}

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, starts, lengths;
    Column col[N_STR];
    memset(col, 0, sizeof col);
    Line l = {.col = col};
    if (!PyArg_ParseTuple(args, "y*y*y*lll", &data, &starts, &lengths, &l.max_messages,
                          &l.max_content_chars, &l.max_response_chars))
        return NULL;
    Py_ssize_t n = lengths.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *start = starts.buf, *length = lengths.buf;
    Buf bytes[N_BYTE] = {{0}}, ids = {0}, stamps = {0};
    int oom = 0, bounds = starts.len < lengths.len;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_MD *sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);  /* once: an implicit fetch per line is slow */
    Py_BEGIN_ALLOW_THREADS
    for (int c = 0; c < N_STR; c++) { int64_t zero = 0; put(&col[c].offsets, &zero, sizeof zero); }
    for (Py_ssize_t i = 0; i < n && ctx && sha256 && !bounds; i++) {
        if (start[i] < 0 || length[i] < 0 || start[i] + length[i] > data.len) { bounds = 1; break; }
        int clean = scan_line(&l, (const unsigned char *)data.buf + start[i], (size_t)length[i]);
        finish_line(&l, clean, bytes, &ids, &stamps, ctx, sha256);
    }
    for (int c = 0; c < N_STR; c++) oom |= col[c].valid.oom | col[c].offsets.oom | col[c].data.oom;
    for (int b = 0; b < N_BYTE; b++) oom |= bytes[b].oom;
    oom |= ids.oom | stamps.oom | l.canon.oom | l.key.oom | l.scratch.oom | !ctx | !sha256;
    Py_END_ALLOW_THREADS
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(sha256);
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    free(l.canon.p); free(l.key.p); free(l.scratch.p);
    PyObject *byte_cols = PyList_New(N_BYTE), *str_cols = PyList_New(N_STR);
    for (int b = 0; b < N_BYTE; b++) PyList_SET_ITEM(byte_cols, b, as_block(&bytes[b]));
    for (int c = 0; c < N_STR; c++)
        PyList_SET_ITEM(str_cols, c, Py_BuildValue("(NNN)", as_block(&col[c].valid),
                                                   as_block(&col[c].offsets), as_block(&col[c].data)));
    PyObject *out = Py_BuildValue("(NNNN)", byte_cols, as_block(&ids), str_cols, as_block(&stamps));
    if (bounds) { Py_XDECREF(out); PyErr_SetString(PyExc_ValueError, "a line's start or length lies outside the data"); return NULL; }
    if (oom) { Py_XDECREF(out); return PyErr_NoMemory(); }
    return out;
}

/* Offsets of every '\n' in a block, as int64: memchr runs at memory speed, where a
 * numpy comparison pass plus nonzero took ~0.6 ms per MB. */
static PyObject *newlines(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    Buf out = {0};
    Py_BEGIN_ALLOW_THREADS
    const char *start = data.buf, *p = start, *end = start + data.len;
    while (p < end && (p = memchr(p, '\n', (size_t)(end - p)))) {
        int64_t at = p - start;
        put(&out, &at, sizeof at);
        p++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (out.oom) { free(out.p); return PyErr_NoMemory(); }
    return as_block(&out);
}

static PyMethodDef METHODS[] = {
    {"scan", scan, METH_VARARGS,
     "scan(data, starts, lengths, max_messages, max_content_chars, max_response_chars) -> "
     "(byte columns, 32-byte log ids, string columns as (valid, int64 offsets, data), "
     "int64 ts in microseconds), each a read-only buffer"},
    {"newlines", newlines, METH_VARARGS, "newlines(data) -> int64 offsets of every newline, as a read-only buffer"},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_logscan", NULL, -1, METHODS, NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__logscan(void) {
    if (PyType_Ready(&BLOCK_TYPE) < 0) return NULL;
    return PyModule_Create(&MODULE);
}
