/* Optional C speed-ups for the hottest loop of a conversion: encoding slice packets.
 *
 * encode_slices() produces exactly the bytes that PerfettoWriter._slice_packets (Python) produces,
 * for the common case only: a slice whose look the writer has already encoded, whose ids and thread
 * it has already met, and whose times are nine-byte varints. Every other slice, and every marker,
 * is handed to the Python fallback it is given, so the output never depends on which path ran.
 * Nothing here reads a dump: it sees only values the reader has already checked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buffer;

static int buffer_reserve(Buffer *buffer, Py_ssize_t extra) {
    if (buffer->len + extra <= buffer->cap) return 0;
    Py_ssize_t cap = buffer->cap ? buffer->cap : 1 << 16;
    while (cap < buffer->len + extra) cap *= 2;
    char *data = PyMem_Realloc(buffer->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buffer->data = data;
    buffer->cap = cap;
    return 0;
}

static int buffer_put(Buffer *buffer, const char *bytes, Py_ssize_t size) {
    if (buffer_reserve(buffer, size) < 0) return -1;
    memcpy(buffer->data + buffer->len, bytes, (size_t)size);
    buffer->len += size;
    return 0;
}

static int buffer_put_bytes(Buffer *buffer, PyObject *bytes) {
    return buffer_put(buffer, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
}

static int buffer_put_varint(Buffer *buffer, unsigned long long value) {
    if (buffer_reserve(buffer, 10) < 0) return -1;
    unsigned char *out = (unsigned char *)buffer->data + buffer->len;
    Py_ssize_t n = 0;
    while (value >= 0x80) {
        out[n++] = (unsigned char)(value | 0x80);
        value >>= 7;
    }
    out[n++] = (unsigned char)value;
    buffer->len += n;
    return 0;
}

static Py_ssize_t varint_size(unsigned long long value) {
    Py_ssize_t n = 1;
    while (value >= 0x80) {
        value >>= 7;
        n++;
    }
    return n;
}

/* A non-negative int that fits 64 bits; -1 (with no error set) when the value is anything else. */
static int as_u64(PyObject *value, unsigned long long *out) {
    if (!PyLong_CheckExact(value)) return -1;
    unsigned long long number = PyLong_AsUnsignedLongLong(value);
    if (number == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    *out = number;
    return 0;
}

/* A time whose varint takes nine bytes (2**56 <= t < 2**63), as the writer's fact heads expect. */
static int as_long_time(PyObject *value, unsigned long long *out) {
    if (as_u64(value, out) < 0) return -1;
    return (*out >= (1ULL << 56) && *out < (1ULL << 63)) ? 0 : -1;
}

static PyObject *bytes_in(PyObject *table, PyObject *key) {
    PyObject *found = PyDict_GetItemWithError(table, key); /* borrowed */
    if (found == NULL) {
        PyErr_Clear(); /* absent, or a key that cannot be hashed: either way the fallback decides */
        return NULL;
    }
    return PyBytes_CheckExact(found) ? found : NULL;
}

static PyObject *str_start, *str_end, *str_look, *str_head, *str_last, *str_encoded, *str_timed;

/* The writer's state, unpacked from the context tuple (see PerfettoWriter._fast_context). */
typedef struct {
    PyObject *token, *packet_head, *begin, *end_event, *new_interned;
    PyObject *op_ids, *record_ids, *threads;
    PyObject *created_head, *started_head, *completed_head, *duration_head;
    PyObject *packet_tag, *event_tag;
    Py_ssize_t op_id, record_id, created, started, completed, duration, thread_name, thread_id;
    Py_ssize_t entry_size; /* an entry must be at least this long to hold all of the above */
} Context;

static int read_context(PyObject *tuple, Context *context) {
    PyObject *heads, *fields;
    if (!PyArg_ParseTuple(tuple, "OSSSO!O!O!O!O!SSO!;encode_slices: bad context", &context->token,
                          &context->packet_head, &context->begin, &context->end_event, &PyList_Type,
                          &context->new_interned, &PyDict_Type, &context->op_ids, &PyDict_Type,
                          &context->record_ids, &PyDict_Type, &context->threads, &PyTuple_Type, &heads,
                          &context->packet_tag, &context->event_tag, &PyTuple_Type, &fields))
        return -1;
    if (!PyArg_ParseTuple(heads, "SSSS;encode_slices: bad fact heads", &context->created_head,
                          &context->started_head, &context->completed_head, &context->duration_head))
        return -1;
    if (!PyArg_ParseTuple(fields, "nnnnnnnn;encode_slices: bad entry fields", &context->op_id,
                          &context->record_id, &context->created, &context->started, &context->completed,
                          &context->duration, &context->thread_name, &context->thread_id))
        return -1;
    Py_ssize_t indices[] = {context->op_id,     context->record_id, context->created,     context->started,
                            context->completed, context->duration,  context->thread_name, context->thread_id};
    context->entry_size = 0;
    for (size_t i = 0; i < sizeof indices / sizeof indices[0]; i++) {
        if (indices[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "encode_slices: negative entry field index");
            return -1;
        }
        if (indices[i] + 1 > context->entry_size) context->entry_size = indices[i] + 1;
    }
    return 0;
}

/* A rank's ids and times (PerfettoWriter._facts), when every piece is already known. 1: done; 0: not
 * on the fast path; -1: error. */
static int put_facts(Buffer *event, const Context *context, PyObject *head, PyObject *last, int timed) {
    if (!PyTuple_Check(head) || !PyTuple_Check(last) || PyTuple_GET_SIZE(head) < context->entry_size ||
        PyTuple_GET_SIZE(last) < context->entry_size)
        return 0;
    PyObject *op_id = bytes_in(context->op_ids, PyTuple_GET_ITEM(head, context->op_id));
    PyObject *record_id = bytes_in(context->record_ids, PyTuple_GET_ITEM(head, context->record_id));
    unsigned long long created, started = 0, completed = 0;
    if (op_id == NULL || record_id == NULL || as_long_time(PyTuple_GET_ITEM(head, context->created), &created) < 0)
        return 0;
    double duration = 0;
    if (timed) {
        PyObject *duration_value = PyTuple_GET_ITEM(last, context->duration);
        if (as_long_time(PyTuple_GET_ITEM(last, context->started), &started) < 0 ||
            as_long_time(PyTuple_GET_ITEM(last, context->completed), &completed) < 0 ||
            !PyFloat_CheckExact(duration_value))
            return 0;
        duration = PyFloat_AS_DOUBLE(duration_value);
    }
    PyObject *thread_name = PyTuple_GET_ITEM(head, context->thread_name);
    PyObject *thread_id = PyTuple_GET_ITEM(head, context->thread_id);
    PyObject *thread = NULL;
    if (!PyUnicode_CheckExact(thread_name) || !PyUnicode_CheckExact(thread_id)) return 0;
    if (PyUnicode_GET_LENGTH(thread_name) || PyUnicode_GET_LENGTH(thread_id)) {
        PyObject *key = PyTuple_Pack(2, thread_name, thread_id);
        if (key == NULL) return -1;
        thread = bytes_in(context->threads, key);
        Py_DECREF(key);
        if (thread == NULL) return 0;
    }
    if (buffer_put_bytes(event, op_id) < 0 || buffer_put_bytes(event, record_id) < 0 ||
        buffer_put_bytes(event, context->created_head) < 0 || buffer_put_varint(event, created) < 0)
        return -1;
    if (timed) {
        unsigned char little[8];
#if PY_VERSION_HEX >= 0x030B0000
        if (PyFloat_Pack8(duration, (char *)little, 1) < 0) return -1;
#else
        if (_PyFloat_Pack8(duration, little, 1) < 0) return -1;
#endif
        if (buffer_put_bytes(event, context->started_head) < 0 || buffer_put_varint(event, started) < 0 ||
            buffer_put_bytes(event, context->completed_head) < 0 || buffer_put_varint(event, completed) < 0 ||
            buffer_put_bytes(event, context->duration_head) < 0 || buffer_put(event, (char *)little, 8) < 0)
            return -1;
    }
    if (thread != NULL && buffer_put_bytes(event, thread) < 0) return -1;
    return 1;
}

/* One slice's two packets into ``out``. 1: done; 0: not on the fast path (nothing written); -1: error. */
static int put_slice(Buffer *out, Buffer *event, const Context *context, PyObject *item) {
    int result = 0;
    PyObject *look = NULL, *encoded = NULL, *start_value = NULL, *end_value = NULL, *head = NULL, *last = NULL;
    unsigned long long start, end;
    event->len = 0;
    if (PyList_GET_SIZE(context->new_interned) != 0) return 0; /* the packet must carry them */
    if ((end_value = PyObject_GetAttr(item, str_end)) == NULL) goto error;
    if (end_value == Py_None || as_u64(end_value, &end) < 0) goto done;
    if ((start_value = PyObject_GetAttr(item, str_start)) == NULL) goto error;
    if (as_u64(start_value, &start) < 0) goto done;
    if ((look = PyObject_GetAttr(item, str_look)) == NULL) goto error;
    if ((encoded = PyObject_GetAttr(look, str_encoded)) == NULL) goto error;
    if (!PyTuple_CheckExact(encoded) || PyTuple_GET_SIZE(encoded) != 2 ||
        PyTuple_GET_ITEM(encoded, 0) != context->token || !PyBytes_CheckExact(PyTuple_GET_ITEM(encoded, 1)))
        goto done;
    if (buffer_put_bytes(event, context->begin) < 0 || buffer_put_bytes(event, PyTuple_GET_ITEM(encoded, 1)) < 0)
        goto error;
    if ((head = PyObject_GetAttr(item, str_head)) == NULL || (last = PyObject_GetAttr(item, str_last)) == NULL)
        goto error;
    if (head != Py_None && last != Py_None) {
        PyObject *timed_value = PyObject_GetAttr(look, str_timed);
        if (timed_value == NULL) goto error;
        int timed = PyObject_IsTrue(timed_value);
        Py_DECREF(timed_value);
        if (timed < 0) goto error;
        int facts = put_facts(event, context, head, last, timed);
        if (facts < 0) goto error;
        if (facts == 0) goto done;
    }
    /* Begin: Trace.packet { packet head, timestamp, track_event { event } } */
    Py_ssize_t packet_size = PyBytes_GET_SIZE(context->packet_head) + varint_size(start) +
                             PyBytes_GET_SIZE(context->event_tag) + varint_size((unsigned long long)event->len) +
                             event->len;
    if (buffer_put_bytes(out, context->packet_tag) < 0 || buffer_put_varint(out, (unsigned long long)packet_size) < 0 ||
        buffer_put_bytes(out, context->packet_head) < 0 || buffer_put_varint(out, start) < 0 ||
        buffer_put_bytes(out, context->event_tag) < 0 || buffer_put_varint(out, (unsigned long long)event->len) < 0 ||
        buffer_put(out, event->data, event->len) < 0)
        goto error;
    /* End: Trace.packet { packet head, timestamp, end event } */
    packet_size = PyBytes_GET_SIZE(context->packet_head) + varint_size(end) + PyBytes_GET_SIZE(context->end_event);
    if (buffer_put_bytes(out, context->packet_tag) < 0 || buffer_put_varint(out, (unsigned long long)packet_size) < 0 ||
        buffer_put_bytes(out, context->packet_head) < 0 || buffer_put_varint(out, end) < 0 ||
        buffer_put_bytes(out, context->end_event) < 0)
        goto error;
    result = 1;
    goto done;
error:
    result = -1;
done:
    Py_XDECREF(look);
    Py_XDECREF(encoded);
    Py_XDECREF(start_value);
    Py_XDECREF(end_value);
    Py_XDECREF(head);
    Py_XDECREF(last);
    return result;
}

PyDoc_STRVAR(encode_slices_doc,
             "encode_slices(slices, context, fallback) -> (bytes, slice count, marker count)\n\n"
             "The packets of ``slices`` in order, as PerfettoWriter._slice_packets writes them; each slice\n"
             "the fast path does not cover is encoded by ``fallback(slice)``.");

static PyObject *encode_slices(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_slices takes 3 arguments");
        return NULL;
    }
    Context context;
    if (!PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "encode_slices: context must be a tuple");
        return NULL;
    }
    if (read_context(args[1], &context) < 0) return NULL;
    PyObject *fallback = args[2];
    PyObject *iterator = PyObject_GetIter(args[0]);
    if (iterator == NULL) return NULL;
    Buffer out = {NULL, 0, 0}, event = {NULL, 0, 0};
    Py_ssize_t slices = 0, markers = 0;
    PyObject *item, *result = NULL;
    while ((item = PyIter_Next(iterator)) != NULL) {
        int done = put_slice(&out, &event, &context, item);
        if (done == 0) {
            PyObject *end = PyObject_GetAttr(item, str_end);
            PyObject *packets = end == NULL ? NULL : PyObject_CallOneArg(fallback, item);
            int ok = packets != NULL && PyBytes_Check(packets) && buffer_put_bytes(&out, packets) == 0;
            if (packets != NULL && !PyBytes_Check(packets))
                PyErr_SetString(PyExc_TypeError, "encode_slices: the fallback must return bytes");
            if (ok) {
                if (end == Py_None)
                    markers++;
                else
                    slices++;
            }
            Py_XDECREF(packets);
            Py_XDECREF(end);
            if (!ok) done = -1;
        } else if (done == 1) {
            slices++;
        }
        Py_DECREF(item);
        if (done < 0) goto finish;
    }
    if (PyErr_Occurred()) goto finish;
    result = Py_BuildValue("(y#nn)", out.data ? out.data : "", out.len, slices, markers);
finish:
    Py_DECREF(iterator);
    PyMem_Free(out.data);
    PyMem_Free(event.data);
    return result;
}

static PyMethodDef methods[] = {
    {"encode_slices", (PyCFunction)(void (*)(void))encode_slices, METH_FASTCALL, encode_slices_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fr2perfetto._speedups",
    .m_doc = "Optional C speed-ups for fr2perfetto's Perfetto writer.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    if ((str_start = PyUnicode_InternFromString("start")) == NULL ||
        (str_end = PyUnicode_InternFromString("end")) == NULL ||
        (str_look = PyUnicode_InternFromString("look")) == NULL ||
        (str_head = PyUnicode_InternFromString("head")) == NULL ||
        (str_last = PyUnicode_InternFromString("last")) == NULL ||
        (str_encoded = PyUnicode_InternFromString("encoded")) == NULL ||
        (str_timed = PyUnicode_InternFromString("timed")) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
