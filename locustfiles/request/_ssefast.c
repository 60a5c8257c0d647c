/* The SSE hot path in C: one call per socket read undoes the chunked framing, makes every
 * line end LF, splits the events and takes their data, as locustfiles/request/sse.py does in
 * Python (`dechunk`, `events`, `data_of`): sse.py uses this module when it is built and
 * falls back to its own code when it is not. The two are tested against each other over
 * random bodies and random read splits (tests/unit/test_sse_native.py), errors included.
 *
 * Decoder(chunked, max_event_bytes, size_of, body_error, too_long)
 *   feed(data: bytes) -> list[bytes] | None   the data of the events this read completed
 *   read(fd, skew_ns) -> (list | None, ns) | None   a socket read of a chunked body, fed
 *   last() -> bytes | None                    the data of an event still pending at the end
 *   held() -> int                             buffer bytes kept between reads
 *   done                                      the chunked body's end was read
 *   full                                      the last read filled its buffer (more may wait)
 * recv(fd, skew_ns) -> (bytes, ns) | None     a socket read with its kernel arrival time
 * perf_ns() -> int                            the clock of those times (perf_counter's)
 * readable(fd) -> bool                        bytes or an end to read now (poll, no wait)
 *
 * size_of(line) judges a chunk size line that is not plain hex digits (Python's rules:
 * extensions, whitespace, garbage), so unusual servers are read exactly as the Python path
 * reads them. body_error and too_long are the exception classes raised (sse.BodyError,
 * sse.EventTooLong), with the Python path's messages.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#define READ_SIZE 65536 /* sse.READ_SIZE */

enum { SIZE = 0, DATA = 1, CRLF = 2, TRAILER = 3 };

typedef struct {
    PyObject_HEAD
    int chunked;
    int done;
    int full; /* the last read() filled READ_SIZE: the socket may hold more right now */
    int state;
    int cr; /* a CR ended the last data: an LF right after it belongs to it */
    Py_ssize_t left; /* data bytes of the current chunk still to come */
    Py_ssize_t max_event;
    PyObject *size_of;
    PyObject *body_error;
    PyObject *too_long;
    char *raw; /* framing bytes carried to the next read (a split size line or CRLF) */
    Py_ssize_t raw_len, raw_cap;
    char *buf; /* the pending event text, every line end made LF */
    Py_ssize_t buf_len, buf_cap;
} Decoder;

static int grow(char **b, Py_ssize_t *cap, Py_ssize_t need) {
    if (need <= *cap) {
        return 0;
    }
    Py_ssize_t size = *cap ? *cap : 512;
    while (size < need) {
        size *= 2;
    }
    char *bigger = PyMem_Realloc(*b, (size_t)size);
    if (bigger == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *b = bigger;
    *cap = size;
    return 0;
}

/* Data bytes (de-chunked) onto the pending text, CRLF and CR made LF; a CR at the end waits
 * for the next byte (sse.py's `carry`). */
static int sse_feed(Decoder *d, const char *p, Py_ssize_t n) {
    if (grow(&d->buf, &d->buf_cap, d->buf_len + n + 1) < 0) {
        return -1;
    }
    char *out = d->buf + d->buf_len;
    const char *end = p + n;
    if (d->cr && p < end) {
        *out++ = '\n';
        d->cr = 0;
        if (*p == '\n') {
            p++;
        }
    }
    while (p < end) {
        const char *r = memchr(p, '\r', (size_t)(end - p));
        if (r == NULL) {
            memcpy(out, p, (size_t)(end - p));
            out += end - p;
            break;
        }
        memcpy(out, p, (size_t)(r - p));
        out += r - p;
        p = r + 1;
        if (p == end) {
            d->cr = 1;
            break;
        }
        *out++ = '\n';
        if (*p == '\n') {
            p++;
        }
    }
    d->buf_len = out - d->buf;
    return 0;
}

/* An event block's data (its data fields joined by LF): a new bytes object, or NULL with no
 * error set when it has none (sse.py's `data_of`). */
static PyObject *data_of(const char *s, Py_ssize_t n) {
    if (n >= 6 && memcmp(s, "data: ", 6) == 0 && memchr(s, '\n', (size_t)n) == NULL) {
        return PyBytes_FromStringAndSize(s + 6, n - 6);
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, n);
    if (result == NULL) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(result);
    Py_ssize_t size = 0;
    int any = 0;
    const char *line = s, *end = s + n;
    for (;;) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *line_end = nl ? nl : end;
        const char *colon = memchr(line, ':', (size_t)(line_end - line));
        const char *name_end = colon ? colon : line_end;
        if (name_end - line == 4 && memcmp(line, "data", 4) == 0) {
            const char *value = colon ? colon + 1 : line_end;
            if (value < line_end && *value == ' ') {
                value++;
            }
            if (any) {
                out[size++] = '\n';
            }
            memcpy(out + size, value, (size_t)(line_end - value));
            size += line_end - value;
            any = 1;
        }
        if (nl == NULL) {
            break;
        }
        line = nl + 1;
    }
    if (!any) {
        Py_DECREF(result);
        return NULL;
    }
    if (_PyBytes_Resize(&result, size) < 0) {
        return NULL;
    }
    return result;
}

/* The first `a` followed by `b` in [at, end), or NULL: a blank line ("\n\n") in the pending
 * text, the end of a framing line ("\r\n") in a read. */
static const char *find_pair(const char *at, const char *end, char a, char b) {
    while (at < end) {
        const char *hit = memchr(at, a, (size_t)(end - at));
        if (hit == NULL || hit + 1 >= end) {
            return NULL;
        }
        if (hit[1] == b) {
            return hit;
        }
        at = hit + 1;
    }
    return NULL;
}

/* A buffer grown for one large read goes back to a small one once it holds little: an open
 * stream keeps only what is pending. */
static void trim(char **b, Py_ssize_t *cap, Py_ssize_t len) {
    if (*cap > 16384 && len < *cap / 4) {
        Py_ssize_t size = len > 256 ? len * 2 : 512;
        char *smaller = PyMem_Realloc(*b, (size_t)size);
        if (smaller != NULL) {
            *b = smaller;
            *cap = size;
        }
    }
}

/* The events the pending text completes (blocks ended by a blank line), searched from `from`
 * (the text before it holds no blank line); the rest stays pending, bounded. */
static PyObject *take_events(Decoder *d, Py_ssize_t from) {
    PyObject *list = NULL;
    char *b = d->buf;
    Py_ssize_t len = d->buf_len, pos = 0;
    for (;;) {
        const char *q = find_pair(b + from, b + len, '\n', '\n');
        if (q == NULL) {
            break;
        }
        Py_ssize_t idx = q - b;
        PyObject *data = data_of(b + pos, idx - pos);
        if (data == NULL && PyErr_Occurred()) {
            Py_XDECREF(list);
            return NULL;
        }
        if (data != NULL) {
            if (list == NULL && (list = PyList_New(0)) == NULL) {
                Py_DECREF(data);
                return NULL;
            }
            int failed = PyList_Append(list, data);
            Py_DECREF(data);
            if (failed) {
                Py_DECREF(list);
                return NULL;
            }
        }
        pos = from = idx + 2;
    }
    if (pos) {
        memmove(b, b + pos, (size_t)(len - pos));
        d->buf_len = len - pos;
    }
    trim(&d->buf, &d->buf_cap, d->buf_len);
    if (d->buf_len > d->max_event) {
        Py_XDECREF(list);
        PyErr_Format(d->too_long, "an event line longer than %zd bytes", d->max_event);
        return NULL;
    }
    if (list == NULL) {
        Py_RETURN_NONE;
    }
    return list;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* A chunk size line: plain hex here, anything else by size_of (Python's rules). -1 with an
 * error set when it is not a size. */
static Py_ssize_t chunk_size(Decoder *d, const char *line, Py_ssize_t n) {
    if (n > 0 && n <= 15) {
        Py_ssize_t size = 0;
        Py_ssize_t i = 0;
        for (; i < n; i++) {
            int v = hex_digit(line[i]);
            if (v < 0) {
                break;
            }
            size = size * 16 + v;
        }
        if (i == n) {
            return size;
        }
    }
    PyObject *arg = PyBytes_FromStringAndSize(line, n);
    if (arg == NULL) {
        return -1;
    }
    PyObject *got = PyObject_CallOneArg(d->size_of, arg);
    Py_DECREF(arg);
    if (got == NULL) {
        return -1;
    }
    Py_ssize_t size = PyLong_AsSsize_t(got);
    Py_DECREF(got);
    if (size < 0 && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "size_of returned a negative size");
    }
    return size;
}

static PyObject *body_error(Decoder *d, const char *message) {
    PyErr_SetString(d->body_error, message);
    return NULL;
}

static PyObject *parse(Decoder *d, const char *p, Py_ssize_t n, Py_ssize_t from);

static PyObject *feed_bytes(Decoder *d, const char *data, Py_ssize_t size);

static PyObject *Decoder_feed(Decoder *d, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "feed() takes bytes");
        return NULL;
    }
    return feed_bytes(d, PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
}

/* The events one read's bytes complete (a list), or None. */
static PyObject *feed_bytes(Decoder *d, const char *data, Py_ssize_t size) {
    Py_ssize_t before = d->buf_len;
    Py_ssize_t from = before ? before - 1 : 0;
    if (size == 0 || d->done) {
        Py_RETURN_NONE;
    }
    if (!d->chunked) {
        return sse_feed(d, data, size) < 0 ? NULL : take_events(d, from);
    }
    if (d->raw_len) {
        if (grow(&d->raw, &d->raw_cap, d->raw_len + size) < 0) {
            return NULL;
        }
        memcpy(d->raw + d->raw_len, data, (size_t)size);
        d->raw_len += size;
        return parse(d, d->raw, d->raw_len, from);
    }
    return parse(d, data, size, from);
}

/* Undo the framing of the bytes p[0:n] (the carried framing bytes and a new read, in `raw`,
 * or a read by itself), feeding the data to the events; what is left of the framing is
 * carried. */
static PyObject *parse(Decoder *d, const char *p, Py_ssize_t n, Py_ssize_t from) {
    Py_ssize_t pos = 0;
    int fed = 0;
    while (pos < n && !d->done) {
        if (d->state == DATA) {
            Py_ssize_t take = d->left < n - pos ? d->left : n - pos;
            if (sse_feed(d, p + pos, take) < 0) {
                return NULL;
            }
            fed = 1;
            pos += take;
            d->left -= take;
            if (d->left == 0) {
                d->state = CRLF;
            }
        } else if (d->state == CRLF) {
            if (n - pos < 2) {
                break;
            }
            if (p[pos] != '\r' || p[pos + 1] != '\n') {
                return body_error(d, "chunk data not followed by CRLF");
            }
            pos += 2;
            d->state = SIZE;
        } else {
            const char *eol = find_pair(p + pos, p + n, '\r', '\n');
            if (eol == NULL) {
                break;
            }
            const char *line = p + pos;
            Py_ssize_t line_len = eol - line;
            pos += line_len + 2;
            if (d->state == TRAILER) {
                if (line_len == 0) { /* the empty line that ends the body */
                    d->done = 1;
                }
                continue;
            }
            Py_ssize_t left = chunk_size(d, line, line_len);
            if (left < 0) {
                return NULL;
            }
            if (left == 0) {
                d->state = TRAILER;
            } else if (pos + left + 2 <= n) { /* the common case: the whole chunk is here */
                if (p[pos + left] != '\r' || p[pos + left + 1] != '\n') {
                    return body_error(d, "chunk data not followed by CRLF");
                }
                if (sse_feed(d, p + pos, left) < 0) {
                    return NULL;
                }
                fed = 1;
                pos += left + 2;
            } else {
                d->left = left;
                d->state = DATA;
            }
        }
    }
    if (d->done) {
        d->raw_len = 0;
    } else if (p == d->raw) {
        memmove(d->raw, d->raw + pos, (size_t)(n - pos));
        d->raw_len = n - pos;
    } else if (pos < n) {
        if (grow(&d->raw, &d->raw_cap, n - pos) < 0) {
            return NULL;
        }
        memcpy(d->raw, p + pos, (size_t)(n - pos));
        d->raw_len = n - pos;
    }
    trim(&d->raw, &d->raw_cap, d->raw_len);
    if (!fed) {
        Py_RETURN_NONE;
    }
    return take_events(d, from);
}

static long long clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* One non-blocking recvmsg of at most READ_SIZE bytes into `data`, with its arrival time in
 * *t: the kernel's receive stamp (SO_TIMESTAMPNS, which the caller turned on) moved onto the
 * perf_counter clock (CLOCK_MONOTONIC), `skew` being how far this process's wall clock runs
 * from the kernel's (sse.kernel_skew_ns); without a sane stamp, the time of the read.
 * Returns the bytes read (0 at the end), -2 when there is nothing to read yet (no exception
 * set), -1 with OSError set. */
static ssize_t recv_stamped(int fd, char *data, long long skew, long long *t) {
    union {
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {data, READ_SIZE};
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    ssize_t got;
    int err;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        got = recvmsg(fd, &msg, 0);
        err = errno;
        Py_END_ALLOW_THREADS
        if (got >= 0 || err != EINTR) {
            break;
        }
        if (PyErr_CheckSignals() < 0) {
            return -1;
        }
    }
    if (got < 0) {
        if (err == EAGAIN || err == EWOULDBLOCK) {
            return -2;
        }
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    long long wall = clock_ns(CLOCK_REALTIME); /* the wall clock first, as sse.py does */
    *t = clock_ns(CLOCK_MONOTONIC);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
            struct timespec stamp;
            memcpy(&stamp, CMSG_DATA(c), sizeof(stamp));
            long long lag = wall - ((long long)stamp.tv_sec * 1000000000LL + stamp.tv_nsec) - skew;
            if (lag >= 0 && lag < 1000000000LL) { /* sane (no clock step): the kernel's time */
                *t -= lag;
            }
            break;
        }
    }
    return got;
}

/* recv(fd, skew_ns): one non-blocking read of the socket as sse.socket_reader's reads are,
 * (bytes, arrival ns) (b"" at the end), or None when there is nothing to read yet (no
 * exception: the caller waits for the socket). */
static PyObject *recv_timed(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd;
    long long skew, t = 0;
    if (!PyArg_ParseTuple(args, "iL", &fd, &skew)) {
        return NULL;
    }
    char data[READ_SIZE];
    ssize_t got = recv_stamped(fd, data, skew, &t);
    if (got == -2) {
        Py_RETURN_NONE;
    }
    if (got < 0) {
        return NULL;
    }
    return Py_BuildValue("(y#L)", data, (Py_ssize_t)got, t);
}

/* read(fd, skew_ns): one non-blocking read of a chunked body from the socket (recv_stamped),
 * decoded: (the data of the events it completed or None, its arrival time), or None when
 * there is nothing to read yet (no exception: the caller waits for the socket). The
 * connection closed mid-body raises body_error; a socket error, OSError. */
static PyObject *Decoder_read(Decoder *d, PyObject *args) {
    int fd;
    long long skew;
    if (!PyArg_ParseTuple(args, "iL", &fd, &skew)) {
        return NULL;
    }
    if (!d->chunked || d->done) {
        PyErr_SetString(PyExc_ValueError, "read() is for a chunked body not yet ended");
        return NULL;
    }
    /* on the stack, not in the decoder: a stream holds no 64 KiB buffer between reads */
    char data[READ_SIZE];
    long long t = 0;
    ssize_t got = recv_stamped(fd, data, skew, &t);
    if (got == -2) {
        Py_RETURN_NONE;
    }
    if (got < 0) {
        return NULL;
    }
    if (got == 0) {
        PyErr_SetString(d->body_error, "connection closed before the end of the chunked body");
        return NULL;
    }
    d->full = got == READ_SIZE;
    PyObject *datas = feed_bytes(d, data, got);
    if (datas == NULL) {
        return NULL;
    }
    return Py_BuildValue("(NL)", datas, t);
}

/* readable(fd): whether the socket has bytes or an end to read now (poll with no wait; an
 * idle keep-alive connection should not). A closed descriptor counts as readable. */
static PyObject *readable(PyObject *Py_UNUSED(self), PyObject *arg) {
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (fd < 0 || fd > INT_MAX) {
        Py_RETURN_TRUE; /* closed (-1): not a connection to use again */
    }
    struct pollfd p = {(int)fd, POLLIN, 0};
    int n;
    do {
        n = poll(&p, 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong(n > 0);
}

/* perf_ns(): the clock read() gives its times on (CLOCK_MONOTONIC: time.perf_counter_ns's on
 * Linux; a test holds them equal). */
static PyObject *perf_ns(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromLongLong(clock_ns(CLOCK_MONOTONIC));
}

static PyObject *Decoder_held(Decoder *d, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSsize_t(d->raw_cap + d->buf_cap);
}

static PyObject *Decoder_last(Decoder *d, PyObject *Py_UNUSED(ignored)) {
    PyObject *data = data_of(d->buf, d->buf_len);
    if (data == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return data;
}

static int Decoder_init(Decoder *d, PyObject *args, PyObject *kwds) {
    static char *names[] = {"chunked", "max_event_bytes", "size_of", "body_error", "too_long",
                            NULL};
    int chunked;
    Py_ssize_t max_event;
    PyObject *size_of, *body_err, *too_long;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "pnOOO", names, &chunked, &max_event,
                                     &size_of, &body_err, &too_long)) {
        return -1;
    }
    if (!PyCallable_Check(size_of) || !PyExceptionClass_Check(body_err) ||
        !PyExceptionClass_Check(too_long)) {
        PyErr_SetString(PyExc_TypeError,
                        "size_of must be callable; body_error and too_long exception classes");
        return -1;
    }
    d->chunked = chunked;
    d->max_event = max_event;
    Py_INCREF(size_of);
    Py_XSETREF(d->size_of, size_of);
    Py_INCREF(body_err);
    Py_XSETREF(d->body_error, body_err);
    Py_INCREF(too_long);
    Py_XSETREF(d->too_long, too_long);
    d->done = d->cr = d->full = 0;
    d->state = SIZE;
    d->left = d->raw_len = d->buf_len = 0;
    return 0;
}

static void Decoder_dealloc(Decoder *d) {
    Py_XDECREF(d->size_of);
    Py_XDECREF(d->body_error);
    Py_XDECREF(d->too_long);
    PyMem_Free(d->raw);
    PyMem_Free(d->buf);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyMethodDef Decoder_methods[] = {
    {"feed", (PyCFunction)Decoder_feed, METH_O,
     "The data of the events one read completes (a list), or None."},
    {"read", (PyCFunction)Decoder_read, METH_VARARGS,
     "One non-blocking read of the socket, decoded: (datas or None, arrival ns), or None."},
    {"held", (PyCFunction)Decoder_held, METH_NOARGS,
     "Bytes of buffer the decoder holds between reads (what an open stream costs)."},
    {"last", (PyCFunction)Decoder_last, METH_NOARGS,
     "The data of the event still pending at the body's end, or None."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Decoder_members[] = {
    {"done", T_INT, offsetof(Decoder, done), READONLY, "the chunked body's end was read"},
    {"full", T_INT, offsetof(Decoder, full), READONLY,
     "the last read filled its buffer: more may be there now"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "locustfiles.request._ssefast.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "De-chunks and splits one SSE response body, one read at a time.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_methods = Decoder_methods,
    .tp_members = Decoder_members,
};

static PyMethodDef module_methods[] = {
    {"perf_ns", (PyCFunction)perf_ns, METH_NOARGS, "The clock of read()'s times, in ns."},
    {"readable", (PyCFunction)readable, METH_O,
     "Whether the socket has bytes or an end to read now (no wait)."},
    {"recv", (PyCFunction)recv_timed, METH_VARARGS,
     "One non-blocking read: (bytes, arrival ns), or None when nothing is there yet."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ssefast", "The SSE reader's hot path in C (see sse.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__ssefast(void) {
    if (PyType_Ready(&DecoderType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(&DecoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
