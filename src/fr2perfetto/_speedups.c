/* Optional C speed-ups for the loops that run once per entry or per slice of a conversion.
 *
 * Each function does exactly what a Python twin in fr2perfetto does, for the common case only, and
 * leaves every other case to that twin, so results never depend on which path ran:
 *
 * - pickle_columns() reads a dump's pickle in one pass into columns (read.columns), without an object
 *   per entry; it gives up on anything but what PyTorch's pickler writes (see its comment below).
 * - gather() and first_uses() are columns.gather and columns.first_uses, the array operations that turn
 *   what pickle_columns read into columns.
 * - entries_from_columns() is columns.entries_in_python: entries made field by field from a rank's columns.
 * - match_collectives() is match._match_collectives_in_python: every rank's collectives filed by
 *   (group, seq) from their columns.
 * - rank_items(), rank_groups(), lay_out_rows() and encode_rows() lay out and write a rank's ops from its
 *   columns (layout.rows): its items as (op, row) pairs, partitioned by group, the common op laid out
 *   and written as a record, never as an object. Their twin is the object path of layout.streams and
 *   render.perfetto as a whole (timeline.ops_by_rank, Slice lists): the trace is the same, byte for byte.
 * - scan_pickle() is pickle_shape.scan: how deep and how large what a pickle describes would be,
 *   measured on a model of the unpickler's stack before a dump that pickle_columns leaves to the
 *   restricted unpickler (a 1.x dump, one PyTorch's pickler did not write) is unpickled.
 *
 * Only the stable ABI of Python 3.10 is used (the limited API): one build, tagged cp310-abi3, loads on
 * every CPython from 3.10 on, so a wheel need not be made for each Python. Items of lists and tuples
 * are read through PyList_GetItem and PyTuple_GetItem, not through their arrays, which the stable ABI
 * hides; the version here and py_limited_api in setup.cfg must name the same Python.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Py_XSETREF, which the limited API does not offer: replace a reference, releasing the old one last. */
#define REPLACE_REF(target, value)                  \
    do {                                            \
        PyObject *replaced_ = (PyObject *)(target); \
        (target) = (value);                         \
        Py_XDECREF(replaced_);                      \
    } while (0)

/* Item i of a list or tuple (the caller has checked which, and that i is in range); borrowed. */
static inline PyObject *item_at(PyObject *sequence, Py_ssize_t i) {
    return PyList_CheckExact(sequence) ? PyList_GetItem(sequence, i) : PyTuple_GetItem(sequence, i);
}

/* len() of a tuple or list the caller has checked to be one: its ob_size, a field the stable ABI keeps
 * (PyVarObject), read without the call PyTuple_Size or PyList_Size makes. */
#define LENGTH(sequence) Py_SIZE(sequence)

/* tuple.__new__, looked up once (PyType_GetSlot reads a static type's slots from Python 3.10 on). */
static newfunc tuple_new;
/* 1 when the running Python caches a tuple's hash in the tuple (3.14 on; this build runs on any from 3.10). */
static int hash_cached;

/* How the instances of a tuple subclass (Entry, Slice) are made, as tuple.__new__(type, items) makes them.
 * Up to 3.13 that is the type's tp_alloc with the items set after, done here directly (no two passing
 * tuples). From 3.14 tuple.__new__ also marks the cached hash not computed, a field the stable ABI cannot
 * reach (a tuple from tp_alloc would hash as 0): there tuple.__new__ itself makes them. */
typedef struct {
    PyTypeObject *type; /* NULL: a plain tuple */
    allocfunc alloc;    /* NULL: tuple.__new__ */
} Maker;

static void maker_for(Maker *maker, PyTypeObject *type) {
    maker->type = type;
    maker->alloc = type == NULL || hash_cached ? NULL : (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
}

/* A ``maker->type`` holding items[0:count] (borrowed). New reference; NULL with an error set. */
static PyObject *make(const Maker *maker, PyObject *const *items, Py_ssize_t count) {
    int direct = maker->alloc != NULL;
    PyObject *made = direct ? maker->alloc(maker->type, count) : PyTuple_New(count);
    for (Py_ssize_t i = 0; made != NULL && i < count; i++)
        if (PyTuple_SetItem(made, i, Py_NewRef(items[i])) < 0) Py_CLEAR(made);
    if (made == NULL || direct || maker->type == NULL) return made;
    PyObject *args = PyTuple_Pack(1, made);
    Py_DECREF(made);
    if (args == NULL) return NULL;
    made = tuple_new(maker->type, args, NULL);
    Py_DECREF(args);
    return made;
}

/* 1 when a function was called with ``expected`` arguments; else 0, with TypeError set. */
static int takes(const char *function, Py_ssize_t nargs, Py_ssize_t expected) {
    if (nargs == expected) return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", function, expected);
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------------- */

/* dict.get(key) as the Python reader does it: NULL (no error) when absent or unhashable. Borrowed. */
static PyObject *lookup(PyObject *table, PyObject *key) {
    PyObject *found = PyDict_GetItemWithError(table, key);
    if (found == NULL) PyErr_Clear();
    return found;
}

PyDoc_STRVAR(entries_from_columns_doc,
             "entries_from_columns(entry_type, count, sources, rows=None) -> list\n\n"
             "columns.entries_in_python: the entries of ``entry_type`` (a tuple subclass) at ``rows`` (uint32\n"
             "bytes; None: all ``count``), field by field from ``sources``, one (kind, data, extra) per field\n"
             "(see ``columns.Source``), each of ``count`` rows.");

/* One field's source, read from its (kind, data, extra). */
typedef struct {
    char kind;
    const char *data; /* the column's bytes (q, Q, d, I, 0, 1, B) */
    PyObject *seq;    /* 'v': the values; I, 0, 1, B: the table */
    PyObject *extra;  /* 'c': the value; q, Q: the dict of shared ints, or None */
    Py_ssize_t table_len;
} Source;

static int source_of(PyObject *spec, Py_ssize_t count, Source *source) {
    if (!PyTuple_CheckExact(spec) || LENGTH(spec) != 3) goto bad;
    PyObject *kind = PyTuple_GetItem(spec, 0), *data = PyTuple_GetItem(spec, 1), *extra = PyTuple_GetItem(spec, 2);
    const char *name = PyUnicode_Check(kind) ? PyUnicode_AsUTF8AndSize(kind, NULL) : NULL;
    if (name == NULL || name[0] == 0 || name[1] != 0) goto bad;
    source->kind = name[0];
    source->extra = extra;
    source->seq = NULL;
    source->data = NULL;
    Py_ssize_t width = 0;
    switch (source->kind) {
    case 'c': return 0;
    case 'v':
        if (!(PyList_CheckExact(data) || PyTuple_CheckExact(data)) || LENGTH(data) != count) goto bad;
        source->seq = data;
        return 0;
    case 'q': case 'Q': case 'd': width = 8; break;
    case 'I': case '0': case '1': width = 4; break;
    case 'B': width = 1; break;
    default: goto bad;
    }
    if (!PyBytes_CheckExact(data) || PyBytes_Size(data) != count * width) goto bad;
    source->data = PyBytes_AsString(data);
    if (width != 8) {
        if (!(PyList_CheckExact(extra) || PyTuple_CheckExact(extra))) goto bad;
        source->seq = extra;
        source->table_len = LENGTH(extra);
    } else if ((source->kind == 'q' || source->kind == 'Q') && extra != Py_None && !PyDict_CheckExact(extra)) {
        goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "entries_from_columns: a source is not (kind, data, extra) of its kind");
    return -1;
}

/* Row r of a source: a new reference, NULL with an error set. */
static PyObject *source_value(const Source *source, Py_ssize_t r) {
    switch (source->kind) {
    case 'c': return Py_NewRef(source->extra);
    case 'v': {
        PyObject *value = item_at(source->seq, r); /* NULL: a list that shrank meanwhile */
        return value != NULL ? Py_NewRef(value) : NULL;
    }
    case 'd': {
        double value;
        memcpy(&value, source->data + 8 * r, 8);
        return value != value ? Py_NewRef(Py_None) : PyFloat_FromDouble(value);
    }
    case 'I': case '0': case '1': case 'B': {
        size_t index;
        if (source->kind != 'B') {
            uint32_t id;
            memcpy(&id, source->data + 4 * r, 4);
            index = id;
        } else {
            index = (unsigned char)source->data[r];
        }
        if (index >= (size_t)source->table_len) {
            PyErr_SetString(PyExc_IndexError, "entries_from_columns: an id beyond its table");
            return NULL;
        }
        PyObject *value = item_at(source->seq, (Py_ssize_t)index);
        if (value == NULL) return NULL; /* a table that shrank meanwhile */
        if (source->kind == '0' || source->kind == '1') { /* a part of a (name, desc) and such */
            if (!PyTuple_CheckExact(value) || LENGTH(value) < 2) {
                PyErr_SetString(PyExc_ValueError, "entries_from_columns: a table's value is not a pair");
                return NULL;
            }
            value = PyTuple_GetItem(value, source->kind - '0');
        }
        return Py_NewRef(value);
    }
    default: break; /* q, Q */
    }
    long long value;
    memcpy(&value, source->data + 8 * r, 8);
    if (source->kind == 'Q' && value == -1) return Py_NewRef(Py_None);
    PyObject *made = PyLong_FromLongLong(value);
    if (made == NULL || source->extra == Py_None) return made;
    PyObject *shared = PyDict_GetItemWithError(source->extra, made); /* borrowed */
    if (shared != NULL) {
        Py_DECREF(made);
        return Py_NewRef(shared);
    }
    if (PyErr_Occurred() || PyDict_SetItem(source->extra, made, made) < 0) Py_CLEAR(made);
    return made;
}

static PyObject *entries_from_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "entries_from_columns takes 3 or 4 arguments");
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type) ||
        !PyLong_Check(args[1]) || !PyList_CheckExact(args[2]) ||
        (nargs == 4 && args[3] != Py_None && !PyBytes_CheckExact(args[3]))) {
        PyErr_SetString(PyExc_TypeError, "entries_from_columns(entry_type, count, sources, rows=None)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "entries_from_columns: a negative count");
        return NULL;
    }
    /* the rows asked for: every one, or those listed (each checked below to be one of the ``count``) */
    PyObject *wanted = nargs == 4 && args[3] != Py_None ? args[3] : NULL;
    Py_ssize_t made_count = wanted != NULL ? PyBytes_Size(wanted) / 4 : count;
    if (wanted != NULL && PyBytes_Size(wanted) % 4 != 0) {
        PyErr_SetString(PyExc_ValueError, "entries_from_columns: rows are not uint32s");
        return NULL;
    }
    /* the sources, held here as a tuple: making an entry may run the garbage collector, and what that
     * runs could change the list; then one row's values (new references) */
    PyObject *sources = PyList_AsTuple(args[2]);
    if (sources == NULL) return NULL;
    Py_INCREF(wanted != NULL ? wanted : Py_None); /* held like the sources */
    Py_ssize_t fields = LENGTH(sources);
    Source *read = PyMem_Calloc(fields ? (size_t)fields : 1, sizeof(Source));
    PyObject **row = PyMem_Calloc(fields ? (size_t)fields : 1, sizeof(PyObject *));
    PyObject *entries = NULL;
    if (read == NULL || row == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t f = 0; f < fields; f++)
        if (source_of(PyTuple_GetItem(sources, f), count, &read[f]) < 0) goto done;
    Maker maker;
    maker_for(&maker, (PyTypeObject *)args[0]);
    const char *rows = wanted != NULL ? PyBytes_AsString(wanted) : NULL;
    entries = PyList_New(made_count);
    for (Py_ssize_t k = 0; entries != NULL && k < made_count; k++) {
        Py_ssize_t r = k;
        if (rows != NULL) {
            uint32_t at;
            memcpy(&at, rows + 4 * k, 4);
            if ((Py_ssize_t)at >= count) {
                PyErr_SetString(PyExc_IndexError, "entries_from_columns: a row beyond the columns");
                Py_CLEAR(entries);
                break;
            }
            r = (Py_ssize_t)at;
        }
        Py_ssize_t made = 0;
        while (made < fields && (row[made] = source_value(&read[made], r)) != NULL) made++;
        PyObject *entry = made == fields ? make(&maker, row, fields) : NULL;
        for (Py_ssize_t f = 0; f < made; f++) Py_DECREF(row[f]);
        if (entry == NULL) Py_CLEAR(entries);
        else PyList_SetItem(entries, k, entry);
    }
done:
    PyMem_Free(read);
    PyMem_Free(row);
    Py_DECREF(sources);
    Py_DECREF(wanted != NULL ? wanted : Py_None);
    return entries;
}

/* ---- matching ------------------------------------------------------------------------------------ */

PyDoc_STRVAR(match_collectives_doc,
             "match_collectives(ranks, members, op_names, untracked, states, completed, scheduled)\n"
             "    -> (ops, covered, p2p)\n\n"
             "match._match_collectives_in_python: the collectives of every rank filed by (group, seq) from the\n"
             "ranks' columns; see there for the arguments and what is returned.");

/* One column of a rank: its bytes, checked to hold ``rows`` items of ``width`` bytes. */
static const char *column_of(PyObject *bytes, Py_ssize_t rows, Py_ssize_t width) {
    if (!PyBytes_Check(bytes) || PyBytes_Size(bytes) != rows * width) {
        PyErr_SetString(PyExc_ValueError, "match_collectives: a column of the wrong length");
        return NULL;
    }
    return PyBytes_AsString(bytes);
}

/* What match_collectives reads of one rank. */
typedef struct {
    int32_t rank; /* which the ops' rows name */
    Py_ssize_t rows;
    const uint32_t *group, *op, *sizes, *dtypes;
    const int64_t *seq, *created;
    const uint8_t *state, *is_p2p, *flagged; /* flagged: NULL where no entry is */
} RankInput;

/* An op: a (group, seq) met, and what is known of it as its rows are filed. */
typedef struct {
    uint32_t group;
    int64_t seq;
    Py_ssize_t count;   /* its rows */
    Py_ssize_t filled;  /* rows scanned so far, in the second pass */
    Py_ssize_t placed;  /* rows filed so far, in the second pass */
    Py_ssize_t rank;    /* the rank (index into the inputs) of its latest row, in the pass under way */
    int scanned;        /* 1 while every rank holds one row, none in a coalesced group: scanned here */
    int alike;
    Py_ssize_t pending;
    int64_t first;      /* the earliest creation time */
    uint32_t op_name, sizes, dtypes; /* the first row's, which the others must match */
    /* ranks, rows, created_ns: int32, uint32 and int64 bytes, a row's each; states: a list. ranks stays
     * NULL while the rows filed are those of the group's members, one each, and states while every
     * state is completed: the op then shares its group's members, and its states are None */
    PyObject *ranks, *rows, *created_ns, *states;
} OpSlot;

/* A group's members as the caller gives them (ascending int32 bytes), or none (object NULL). */
typedef struct {
    PyObject *object;
    const int32_t *ranks;
    Py_ssize_t count;
} Members;

static uint64_t op_hash(uint32_t group, int64_t seq) {
    uint64_t h = (uint64_t)seq * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)group + 0x632BE59BD9B4E019ULL) * 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 31);
}

static int read_rank_input(PyObject *spec, RankInput *in) {
    if (!PyTuple_CheckExact(spec) || LENGTH(spec) != 11 || !PyLong_CheckExact(PyTuple_GetItem(spec, 0)) ||
        !PyLong_CheckExact(PyTuple_GetItem(spec, 1))) {
        PyErr_SetString(PyExc_TypeError, "match_collectives: a rank is (rank, rows, 9 columns)");
        return -1;
    }
    long rank = PyLong_AsLong(PyTuple_GetItem(spec, 0));
    Py_ssize_t n = in->rows = PyLong_AsSsize_t(PyTuple_GetItem(spec, 1));
    if (PyErr_Occurred()) return -1;
    if (rank < 0 || rank > INT32_MAX || n < 0 || n > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "match_collectives: a rank or a row count beyond 32 bits");
        return -1;
    }
    in->rank = (int32_t)rank;
    if ((in->group = (const uint32_t *)column_of(PyTuple_GetItem(spec, 2), n, 4)) == NULL ||
        (in->seq = (const int64_t *)column_of(PyTuple_GetItem(spec, 3), n, 8)) == NULL ||
        (in->op = (const uint32_t *)column_of(PyTuple_GetItem(spec, 4), n, 4)) == NULL ||
        (in->sizes = (const uint32_t *)column_of(PyTuple_GetItem(spec, 5), n, 4)) == NULL ||
        (in->dtypes = (const uint32_t *)column_of(PyTuple_GetItem(spec, 6), n, 4)) == NULL ||
        (in->state = (const uint8_t *)column_of(PyTuple_GetItem(spec, 7), n, 1)) == NULL ||
        (in->created = (const int64_t *)column_of(PyTuple_GetItem(spec, 8), n, 8)) == NULL ||
        (in->is_p2p = (const uint8_t *)column_of(PyTuple_GetItem(spec, 9), n, 1)) == NULL)
        return -1;
    PyObject *flagged = PyTuple_GetItem(spec, 10);
    in->flagged = NULL;
    if (flagged != Py_None && (in->flagged = (const uint8_t *)column_of(flagged, n, 1)) == NULL) return -1;
    return 0;
}

/* The index of (group, seq) in ops, added when new; -1 with an error set when out of memory. The table
 * (of op indices, UINT32_MAX for empty) is kept under half full, doubling as ops are added. */
static Py_ssize_t op_index(OpSlot **ops, Py_ssize_t *op_count, Py_ssize_t *op_room, uint32_t **table,
                           Py_ssize_t *slots, uint32_t group, int64_t seq) {
    uint64_t mask = (uint64_t)*slots - 1, at = op_hash(group, seq) & mask;
    uint32_t *t = *table;
    while (t[at] != UINT32_MAX && ((*ops)[t[at]].group != group || (*ops)[t[at]].seq != seq)) at = (at + 1) & mask;
    if (t[at] != UINT32_MAX) return t[at];
    if (*op_count >= UINT32_MAX - 1) {
        PyErr_SetString(PyExc_ValueError, "match_collectives: too many ops");
        return -1;
    }
    if (*op_count == *op_room) {
        OpSlot *grown = PyMem_Realloc(*ops, sizeof(OpSlot) * (size_t)(*op_room * 2));
        if (grown == NULL) return PyErr_NoMemory(), -1;
        *ops = grown;
        *op_room *= 2;
    }
    OpSlot *op = &(*ops)[*op_count];
    memset(op, 0, sizeof(OpSlot));
    op->group = group;
    op->seq = seq;
    op->rank = -1;
    op->scanned = 1;
    t[at] = (uint32_t)*op_count;
    if (2 * (*op_count + 1) > *slots) { /* rehash into twice the slots */
        Py_ssize_t grown_slots = *slots * 2;
        uint32_t *grown = PyMem_Malloc(sizeof(uint32_t) * (size_t)grown_slots);
        if (grown == NULL) return PyErr_NoMemory(), -1;
        memset(grown, 0xFF, sizeof(uint32_t) * (size_t)grown_slots);
        uint64_t grown_mask = (uint64_t)grown_slots - 1;
        for (Py_ssize_t o = 0; o <= *op_count; o++) {
            uint64_t place = op_hash((*ops)[o].group, (*ops)[o].seq) & grown_mask;
            while (grown[place] != UINT32_MAX) place = (place + 1) & grown_mask;
            grown[place] = (uint32_t)o;
        }
        PyMem_Free(*table);
        *table = grown;
        *slots = grown_slots;
    }
    return (*op_count)++;
}

/* File the row ``row`` of a rank under ``op`` (its rank and row at the op's next place), and scan it. */
static int file_row(OpSlot *op, const Members *members, const RankInput *in, Py_ssize_t row,
                    const uint32_t *op_names, const uint8_t *untracked, PyObject *states, int completed,
                    int scheduled) {
    if (op->placed >= op->count) {
        PyErr_SetString(PyExc_RuntimeError, "match_collectives: an op's rows changed while they were filed");
        return -1;
    }
    /* without ranks of its own, the op has as many rows as its group has members (see match_collectives) */
    if (op->ranks == NULL && members->ranks[op->placed] != in->rank) {
        if ((op->ranks = PyBytes_FromStringAndSize(NULL, 4 * op->count)) == NULL) return -1;
        memcpy(PyBytes_AsString(op->ranks), members->ranks, 4 * (size_t)op->placed);
    }
    if (op->ranks != NULL) ((int32_t *)PyBytes_AsString(op->ranks))[op->placed] = in->rank;
    ((uint32_t *)PyBytes_AsString(op->rows))[op->placed] = (uint32_t)row;
    op->placed++;
    if (!op->scanned) return 0;
    uint32_t op_name = op_names[in->op[row]];
    if (op->filled == 0) {
        op->first = in->created[row];
        op->op_name = op_name;
        op->sizes = in->sizes[row];
        op->dtypes = in->dtypes[row];
    } else if (in->created[row] < op->first) {
        op->first = in->created[row];
    }
    if (op->alike && (op_name != op->op_name || in->sizes[row] != op->sizes || in->dtypes[row] != op->dtypes))
        op->alike = 0;
    int state = in->state[row];
    if (op->filled >= op->count) {
        PyErr_SetString(PyExc_RuntimeError, "match_collectives: an op's rows changed while they were filed");
        return -1;
    }
    memcpy(PyBytes_AsString(op->created_ns) + 8 * op->filled, &in->created[row], 8);
    if (op->states == NULL && state != completed) {
        if ((op->states = PyList_New(op->count)) == NULL) return -1;
        for (Py_ssize_t i = 0; i < op->filled; i++)
            PyList_SetItem(op->states, i, Py_NewRef(PyTuple_GetItem(states, completed)));
    }
    if (op->states != NULL) PyList_SetItem(op->states, op->filled, Py_NewRef(PyTuple_GetItem(states, state)));
    op->filled++;
    if (state != completed && (!untracked[in->op[row]] || state != scheduled)) op->pending++;
    return 0;
}

static PyObject *match_collectives(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("match_collectives", nargs, 7)) return NULL;
    PyObject *ranks = args[0], *states = args[4];
    int completed = (int)PyLong_AsLong(args[5]), scheduled = (int)PyLong_AsLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(ranks) || !PyList_CheckExact(args[1]) || !PyTuple_CheckExact(states) ||
        !PyBytes_Check(args[2]) || !PyBytes_Check(args[3]) || LENGTH(args[1]) >= UINT32_MAX || completed < 0 ||
        completed >= LENGTH(states)) {
        PyErr_SetString(PyExc_TypeError, "match_collectives: bad arguments");
        return NULL;
    }
    Py_ssize_t group_count = LENGTH(args[1]);
    Py_ssize_t op_table = PyBytes_Size(args[2]) / 4;
    if (PyBytes_Size(args[3]) != op_table) {
        PyErr_SetString(PyExc_ValueError, "match_collectives: op names and untracked of different lengths");
        return NULL;
    }
    const uint32_t *op_names = (const uint32_t *)PyBytes_AsString(args[2]);
    const uint8_t *untracked = (const uint8_t *)PyBytes_AsString(args[3]);
    Py_ssize_t rank_count = LENGTH(ranks), total = 0, op_count = 0, op_room = 1024, slots = 4096, most_rows = 0;
    RankInput *inputs = NULL;
    OpSlot *ops = NULL;
    uint32_t *op_of = NULL, *table = NULL, *touched = NULL, *p2p_rows = NULL; /* p2p_rows: a rank's at a time */
    int64_t *span_first = NULL, *span_last = NULL;
    Py_ssize_t *span_rank = NULL; /* the rank whose span of the group span_first and span_last hold */
    Members *members = NULL;
    PyObject *result_ops = NULL, *covered = NULL, *p2p = NULL, *result = NULL;
    if ((inputs = PyMem_Calloc((size_t)rank_count + 1, sizeof(RankInput))) == NULL ||
        (members = PyMem_Calloc((size_t)group_count + 1, sizeof(Members))) == NULL)
        goto nomemory;
    for (Py_ssize_t g = 0; g < group_count; g++) {
        PyObject *given = PyList_GetItem(args[1], g);
        if (given == Py_None) continue;
        if (!PyBytes_Check(given) || PyBytes_Size(given) % 4) {
            PyErr_SetString(PyExc_TypeError, "match_collectives: a group's members are int32 bytes or None");
            goto error;
        }
        members[g] = (Members){given, (const int32_t *)PyBytes_AsString(given), PyBytes_Size(given) / 4};
    }
    for (Py_ssize_t r = 0; r < rank_count; r++) {
        if (read_rank_input(PyList_GetItem(ranks, r), &inputs[r]) < 0) goto error;
        if (inputs[r].rows > most_rows) most_rows = inputs[r].rows;
        for (Py_ssize_t i = 0; i < inputs[r].rows; i++) {
            total += !inputs[r].is_p2p[i];
            if (inputs[r].state[i] >= LENGTH(states) || (uint64_t)inputs[r].op[i] >= (uint64_t)op_table) {
                PyErr_SetString(PyExc_ValueError, "match_collectives: a state or an op id beyond its table");
                goto error;
            }
        }
    }
    if ((op_of = PyMem_Malloc(sizeof(uint32_t) * ((size_t)total + 1))) == NULL ||
        (ops = PyMem_Malloc(sizeof(OpSlot) * (size_t)op_room)) == NULL ||
        (table = PyMem_Malloc(sizeof(uint32_t) * (size_t)slots)) == NULL ||
        (span_first = PyMem_Malloc(sizeof(int64_t) * ((size_t)group_count + 1))) == NULL ||
        (span_last = PyMem_Malloc(sizeof(int64_t) * ((size_t)group_count + 1))) == NULL ||
        (span_rank = PyMem_Malloc(sizeof(Py_ssize_t) * ((size_t)group_count + 1))) == NULL ||
        (touched = PyMem_Malloc(sizeof(uint32_t) * ((size_t)group_count + 1))) == NULL ||
        (p2p_rows = PyMem_Malloc(sizeof(uint32_t) * ((size_t)most_rows + 1))) == NULL)
        goto nomemory;
    memset(table, 0xFF, sizeof(uint32_t) * (size_t)slots);
    for (Py_ssize_t g = 0; g < group_count; g++) span_rank[g] = -1;
    if ((covered = PyList_New(0)) == NULL || (p2p = PyList_New(rank_count)) == NULL) goto error;
    /* First pass, rank by rank: each collective row's op (first met first), each rank's span of seqs on
     * each group, its sends and recvs, and which ops some rank holds several rows of, or one inside a
     * coalesced group (those are scanned by the caller, from their entries). */
    Py_ssize_t filed = 0;
    for (Py_ssize_t r = 0; r < rank_count; r++) {
        const RankInput *in = &inputs[r];
        Py_ssize_t touched_count = 0;
        Py_ssize_t sent = 0;
        for (Py_ssize_t i = 0; i < in->rows; i++) {
            if (in->is_p2p[i]) {
                p2p_rows[sent++] = (uint32_t)i;
                continue;
            }
            uint32_t group = in->group[i];
            int64_t seq = in->seq[i];
            if (group >= (uint32_t)group_count || filed >= total) {
                PyErr_SetString(PyExc_ValueError, "match_collectives: a collective of no group known");
                goto error;
            }
            Py_ssize_t o = op_index(&ops, &op_count, &op_room, &table, &slots, group, seq);
            if (o < 0) goto error;
            OpSlot *op = &ops[o];
            op->count++;
            if (op->rank == r || (in->flagged != NULL && in->flagged[i])) op->scanned = 0;
            op->rank = r;
            op_of[filed++] = (uint32_t)o;
            if (span_rank[group] != r) { /* touched[] lists the rank's groups in order of first use */
                span_rank[group] = r;
                touched[touched_count++] = group;
                span_first[group] = span_last[group] = seq;
            } else if (seq > span_last[group]) {
                span_last[group] = seq;
            } else if (seq < span_first[group]) {
                span_first[group] = seq;
            }
        }
        for (Py_ssize_t t = 0; t < touched_count; t++) {
            uint32_t group = touched[t];
            PyObject *span = Py_BuildValue("(nILL)", r, group, (long long)span_first[group], (long long)span_last[group]);
            if (span == NULL || PyList_Append(covered, span) < 0) {
                Py_XDECREF(span);
                goto error;
            }
            Py_DECREF(span);
        }
        PyObject *sends = PyBytes_FromStringAndSize((const char *)p2p_rows, 4 * sent);
        if (sends == NULL) goto error;
        PyList_SetItem(p2p, r, sends);
    }
    for (Py_ssize_t o = 0; o < op_count; o++) {
        OpSlot *op = &ops[o];
        op->rank = -1;
        op->alike = 1;
        if ((members[op->group].object == NULL || op->count != members[op->group].count) &&
            (op->ranks = PyBytes_FromStringAndSize(NULL, 4 * op->count)) == NULL)
            goto error;
        if ((op->rows = PyBytes_FromStringAndSize(NULL, 4 * op->count)) == NULL ||
            (op->scanned && (op->created_ns = PyBytes_FromStringAndSize(NULL, 8 * op->count)) == NULL))
            goto error;
    }
    /* Second pass, rank by rank again, row by row: a rank's entries lie together in memory, and so do
     * the ops it meets one after the other; each entry goes into its op's list for its rank. */
    filed = 0;
    for (Py_ssize_t r = 0; r < rank_count; r++) {
        const RankInput *in = &inputs[r];
        for (Py_ssize_t i = 0; i < in->rows; i++) {
            if (in->is_p2p[i]) continue;
            if (filed >= total) {
                PyErr_SetString(PyExc_RuntimeError, "match_collectives: the rows changed while they were filed");
                goto error;
            }
            OpSlot *op = &ops[op_of[filed++]];
            if (file_row(op, &members[op->group], in, i, op_names, untracked, states, completed, scheduled) < 0)
                goto error;
        }
    }
    if ((result_ops = PyList_New(op_count)) == NULL) goto error;
    for (Py_ssize_t o = 0; o < op_count; o++) {
        OpSlot *op = &ops[o];
        PyObject *scan = Py_None, *item;
        if (op->scanned) {
            scan = Py_BuildValue("(LOnOOI)", (long long)op->first, op->alike ? Py_True : Py_False, op->pending,
                                 op->created_ns, op->states ? op->states : Py_None, op->op_name);
            if (scan == NULL) goto error;
        } else {
            Py_INCREF(scan);
        }
        item = Py_BuildValue("(ILOON)", op->group, (long long)op->seq, op->ranks ? op->ranks : members[op->group].object,
                             op->rows, scan);
        if (item == NULL) goto error;
        PyList_SetItem(result_ops, o, item);
    }
    result = PyTuple_Pack(3, result_ops, covered, p2p);
    goto error; /* what follows frees what the result does not hold */
nomemory:
    PyErr_NoMemory();
error:
    for (Py_ssize_t o = 0; ops != NULL && o < op_count; o++) {
        Py_XDECREF(ops[o].ranks);
        Py_XDECREF(ops[o].rows);
        Py_XDECREF(ops[o].created_ns);
        Py_XDECREF(ops[o].states);
    }
    PyMem_Free(inputs);
    PyMem_Free(members);
    PyMem_Free(ops);
    PyMem_Free(op_of);
    PyMem_Free(table);
    PyMem_Free(span_first);
    PyMem_Free(span_last);
    PyMem_Free(span_rank);
    PyMem_Free(touched);
    PyMem_Free(p2p_rows);
    Py_XDECREF(result_ops);
    Py_XDECREF(covered);
    Py_XDECREF(p2p);
    return result;
}

/* ---- laying out --------------------------------------------------------------------------------- */

#define TIME_LIMIT (1LL << 62) /* times and offsets the layout does in C: no sum of two overflows */

/* An int field of an entry as a long long, in *out; 0 (no error) when it is not an int that fits. */
static int int_field(PyObject *value, long long *out) {
    if (!PyLong_CheckExact(value)) return 0;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The numbers a layout adds in C (the stream's free time, the clock offsets, the launch flows' base), read
 * from Python ints: 1, or 0 where one is not an int below what C adds without overflow (a stranger's times,
 * clocks), and the layout is then Python's. */
static int layout_numbers(PyObject *free_value, PyObject *offset_value, PyObject *launch_value,
                          PyObject *late_offset_value, long long *free_at, long long *offset, long long *launch_base,
                          long long *late_offset) {
    return int_field(free_value, free_at) && int_field(offset_value, offset) &&
           int_field(launch_value, launch_base) && int_field(late_offset_value, late_offset) &&
           *launch_base >= 0 && *launch_base < TIME_LIMIT;
}

/* As streams._ran, for a completed op on a stream nothing holds: from its start (``started``, where
 * ``has_start``; else its enqueue, where start events are off), no earlier than the stream was free, to its
 * completion, at least 1 ns; everything on the common clock (``offset`` subtracted). The stream is then
 * free from its end. */
static void ran_span(long long created_here, long long started, int has_start, long long completed,
                     long long offset, long long *free_at, long long *start, long long *end) {
    *start = has_start ? started - offset : created_here;
    if (*start < *free_at) *start = *free_at;
    long long done = completed - offset;
    *end = done > *start ? done : *start + 1;
    *free_at = *end;
}

/* As Looks.lateness: ms after the members' median (``reference``, on the group's clock, which the rank's
 * runs ``late_offset`` ahead of), never below 0, in steps; a point added to ``points`` where the value
 * changes. 0, or -1 with an error set. */
static int add_lateness(PyObject *points, long long created_here, long long created, long long late_offset,
                        long long reference, double step, double *last_late) {
    double late = (double)(created - late_offset - reference) / 1e6;
    double value = late > 0 ? nearbyint(late / step) * step : 0.0;
    if (value == *last_late) return 0;
    PyObject *point = Py_BuildValue("(Ld)", created_here, value);
    if (point == NULL || PyList_Append(points, point) < 0) {
        Py_XDECREF(point);
        return -1;
    }
    Py_DECREF(point);
    *last_late = value;
    return 0;
}

static PyObject *str_missing;

/* ---- writing ------------------------------------------------------------------------------------- */

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
    char *data;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(bytes, &data, &size) < 0) return -1;
    return buffer_put(buffer, data, size);
}

/* A double as the eight bytes of a protobuf ``double`` (IEEE 754, little-endian), as struct.pack("<d")
 * writes it. PyFloat_Pack8 is not in the stable ABI; every platform CPython runs on stores doubles in
 * IEEE 754, in the byte order of its 64-bit integers. */
static void pack_double(double value, unsigned char *out) {
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    for (int b = 0; b < 8; b++) out[b] = (unsigned char)(bits >> (8 * b));
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

/* The encoded bytes the writer remembers under key; NULL (no error) when absent: the fallback decides. */
static PyObject *bytes_in(PyObject *table, PyObject *key) {
    PyObject *found = lookup(table, key);
    return found != NULL && PyBytes_CheckExact(found) ? found : NULL;
}

static PyObject *str_encoded, *str_timed;

/* Bytes given once for a whole call (the writer's tags and heads), where they lie: read once, not through
 * a call for each slice (the stable ABI has no macro that reads a bytes object). The context tuple holds
 * them while encode_rows runs. */
typedef struct {
    const char *data;
    Py_ssize_t size;
} Chunk;

static int chunk_of(PyObject *bytes, Chunk *chunk) {
    char *data;
    if (PyBytes_AsStringAndSize(bytes, &data, &chunk->size) < 0) return -1;
    chunk->data = data;
    return 0;
}

static int buffer_put_chunk(Buffer *buffer, const Chunk *chunk) { return buffer_put(buffer, chunk->data, chunk->size); }

/* The writer's state, unpacked from the context tuple (see PerfettoWriter._fast_context). */
typedef struct {
    PyObject *token, *new_interned;
    Chunk packet_head, begin, instant, end_event;
    PyObject *op_ids, *record_ids, *threads;
    Chunk created_head, started_head, completed_head, duration_head;
    Chunk packet_tag, event_tag, flow_tag, interned_tag;
    PyObject *encode_look;
    Py_ssize_t launches; /* flows of the slices written that stand for an entry (a launch's other end) */
} Context;

static int read_context(PyObject *tuple, Context *context) {
    PyObject *heads, *packet_head, *begin, *instant, *end_event, *packet_tag, *event_tag, *flow_tag;
    PyObject *interned_tag, *created_head, *started_head, *completed_head, *duration_head;
    if (!PyArg_ParseTuple(tuple, "OSSSSO!O!O!O!O!SSSSO;encode_rows: bad context", &context->token, &packet_head,
                          &begin, &instant, &end_event, &PyList_Type, &context->new_interned, &PyDict_Type,
                          &context->op_ids, &PyDict_Type, &context->record_ids, &PyDict_Type, &context->threads,
                          &PyTuple_Type, &heads, &packet_tag, &event_tag, &flow_tag, &interned_tag,
                          &context->encode_look))
        return -1;
    context->launches = 0;
    if (!PyArg_ParseTuple(heads, "SSSS;encode_rows: bad fact heads", &created_head, &started_head, &completed_head,
                          &duration_head))
        return -1;
    if (chunk_of(packet_head, &context->packet_head) < 0 || chunk_of(begin, &context->begin) < 0 ||
        chunk_of(instant, &context->instant) < 0 || chunk_of(end_event, &context->end_event) < 0 ||
        chunk_of(packet_tag, &context->packet_tag) < 0 || chunk_of(event_tag, &context->event_tag) < 0 ||
        chunk_of(flow_tag, &context->flow_tag) < 0 || chunk_of(interned_tag, &context->interned_tag) < 0 ||
        chunk_of(created_head, &context->created_head) < 0 || chunk_of(started_head, &context->started_head) < 0 ||
        chunk_of(completed_head, &context->completed_head) < 0 || chunk_of(duration_head, &context->duration_head) < 0)
        return -1;
    return 0;
}

/* A look's encoded bytes (new reference), encoded by ``encode_look`` (the writer's _look) where this writer
 * has not encoded it yet: the names that interns wait in ``new_interned`` for the next packet. NULL with an
 * error set. */
static PyObject *encoded_look(Context *context, PyObject *look) {
    PyObject *encoded = PyObject_GetAttr(look, str_encoded);
    if (encoded == NULL) return NULL;
    if (PyTuple_CheckExact(encoded) && LENGTH(encoded) == 2 && PyTuple_GetItem(encoded, 0) == context->token) {
        PyObject *chunk = Py_NewRef(PyTuple_GetItem(encoded, 1));
        Py_DECREF(encoded);
        return chunk;
    }
    Py_DECREF(encoded);
    if ((encoded = PyObject_CallFunctionObjArgs(context->encode_look, look, NULL)) == NULL) return NULL;
    if (!PyBytes_CheckExact(encoded)) {
        Py_DECREF(encoded);
        PyErr_SetString(PyExc_TypeError, "encode_rows: a look must encode to bytes");
        return NULL;
    }
    return encoded;
}

/* The packets of an event made in ``event`` (its type and track, look, facts and flows) into ``out``: the
 * begin (or instant) packet at ``start``, with the names interned since the last packet, and for a slice
 * the end packet at ``end``. 1: done; 0: an interned part is not bytes (nothing written); -1: error. */
static int put_framed(Buffer *out, const Buffer *event, Context *context, unsigned long long start,
                      unsigned long long end, int instant) {
    Py_ssize_t interned_len = 0, pending = LENGTH(context->new_interned);
    for (Py_ssize_t i = 0; i < pending; i++) {
        PyObject *part = PyList_GetItem(context->new_interned, i);
        if (!PyBytes_CheckExact(part)) return 0;
        interned_len += PyBytes_Size(part);
    }
    Py_ssize_t interned_size = pending ? context->interned_tag.size +
                                             varint_size((unsigned long long)interned_len) + interned_len : 0;
    /* Begin (or instant): Trace.packet { packet head, timestamp, [interned], track_event { event } } */
    Py_ssize_t packet_size = context->packet_head.size + varint_size(start) + interned_size +
                             context->event_tag.size + varint_size((unsigned long long)event->len) +
                             event->len;
    if (buffer_put_chunk(out, &context->packet_tag) < 0 ||
        buffer_put_varint(out, (unsigned long long)packet_size) < 0 ||
        buffer_put_chunk(out, &context->packet_head) < 0 || buffer_put_varint(out, start) < 0)
        return -1;
    if (pending) {
        if (buffer_put_chunk(out, &context->interned_tag) < 0 ||
            buffer_put_varint(out, (unsigned long long)interned_len) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < pending; i++)
            if (buffer_put_bytes(out, PyList_GetItem(context->new_interned, i)) < 0) return -1;
        if (PyList_SetSlice(context->new_interned, 0, pending, NULL) < 0) return -1;
    }
    if (buffer_put_chunk(out, &context->event_tag) < 0 || buffer_put_varint(out, (unsigned long long)event->len) < 0 ||
        buffer_put(out, event->data, event->len) < 0)
        return -1;
    if (!instant) {
        /* End: Trace.packet { packet head, timestamp, end event } */
        packet_size = context->packet_head.size + varint_size(end) + context->end_event.size;
        if (buffer_put_chunk(out, &context->packet_tag) < 0 ||
            buffer_put_varint(out, (unsigned long long)packet_size) < 0 ||
            buffer_put_chunk(out, &context->packet_head) < 0 || buffer_put_varint(out, end) < 0 ||
            buffer_put_chunk(out, &context->end_event) < 0)
            return -1;
    }
    return 1;
}

/* Whether a look's slices show the times of a timed backend (SliceLook.timed); -1 with an error set. */
static int look_is_timed(PyObject *look) {
    PyObject *timed_value = PyObject_GetAttr(look, str_timed);
    if (timed_value == NULL) return -1;
    int timed = PyObject_IsTrue(timed_value);
    Py_DECREF(timed_value);
    return timed;
}

/* ---- laying out and writing from rows ------------------------------------------------------------ */

/* A rank's part in an op, as rows.RankItems holds it: the op's index in the job's ops and the row of the
 * rank's one entry in it, or ITEM_MISSING (the rank never issued the op), or ITEM_HELD (the op gives its
 * entries: several, or held as a dict). */
#define ITEM_MISSING (-1)
#define ITEM_HELD (-2)
typedef struct {
    int32_t op, row;
} Item;

/* A slice as rows.SliceRows holds it (rows.RECORD): start, end (NO_END: an instant), its own flow, the
 * number of its look (NO_LOOK: the slice is the container's extra number ``row``), the row of the rank's
 * entry it stands for (-1: none). */
#define NO_END INT64_MIN
#define NO_LOOK (-1)
typedef struct {
    int64_t start, end;
    uint64_t flow;
    int32_t look, row;
} Record;

/* Where rank is in ``ranks`` (ascending), or -1. */
static Py_ssize_t rank_slot(const long long *ranks, Py_ssize_t count, long long rank) {
    Py_ssize_t low = 0, high = count;
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (ranks[middle] < rank)
            low = middle + 1;
        else
            high = middle;
    }
    return low < count && ranks[low] == rank ? low : -1;
}

static int put_item(Buffer *buffer, Py_ssize_t op, int32_t row) {
    Item item = {(int32_t)op, row};
    return buffer_put(buffer, (const char *)&item, (Py_ssize_t)sizeof item);
}

/* A rank of an op, given as a Python int, into its ``wanted`` buffer; 0, or -1 with an error set. */
static int put_rank_item(PyObject *rank, const long long *ranks, Buffer *buffers, Py_ssize_t count, Py_ssize_t op,
                         int32_t row) {
    int overflow = 0;
    long long value = PyLong_Check(rank) ? PyLong_AsLongLongAndOverflow(rank, &overflow) : 0;
    if (!PyLong_Check(rank) || (value == -1 && PyErr_Occurred())) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "rank_items: a rank that is not an int");
        return -1;
    }
    Py_ssize_t slot = overflow ? -1 : rank_slot(ranks, count, value);
    return slot < 0 ? 0 : put_item(&buffers[slot], op, row);
}

PyDoc_STRVAR(rank_items_doc,
             "rank_items(ops, held, ranks) -> dict\n\n"
             "rows.rank_items: for each of ``ranks`` (ascending ints) with a part in any of ``ops``, its items\n"
             "in the order of ``ops``, as bytes of (op index, row) int32 pairs (``rows.ITEM``). ``held`` gives\n"
             "each op's entries: (ranks, rows) as EntriesByRank.packed gives them (a rank with one row: that\n"
             "row; with several: HELD_ROW), or a mapping whose keys are its ranks (HELD_ROW); the op's\n"
             "missing ranks have MISSING_ROW.");

static PyObject *rank_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("rank_items", nargs, 3)) return NULL;
    PyObject *ops = args[0], *held = args[1], *wanted = args[2];
    if (!PyList_CheckExact(ops) || !PyList_CheckExact(held) || LENGTH(held) != LENGTH(ops) ||
        !PyList_CheckExact(wanted) || LENGTH(ops) > INT32_MAX) {
        PyErr_SetString(PyExc_TypeError, "rank_items(ops, held, ranks): three lists, the first two of one length");
        return NULL;
    }
    Py_ssize_t count = LENGTH(wanted);
    long long *ranks = PyMem_Calloc(count ? (size_t)count : 1, sizeof(long long));
    Buffer *buffers = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Buffer));
    PyObject *result = NULL;
    if (ranks == NULL || buffers == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        ranks[k] = PyLong_AsLongLong(PyList_GetItem(wanted, k));
        if (ranks[k] == -1 && PyErr_Occurred()) goto done;
        if (k > 0 && ranks[k] <= ranks[k - 1]) {
            PyErr_SetString(PyExc_ValueError, "rank_items: the ranks must be ascending");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < LENGTH(ops); i++) {
        PyObject *entries = PyList_GetItem(held, i);
        if (PyTuple_CheckExact(entries)) { /* (ranks, rows): int32 and uint32 bytes, a rank's rows together */
            PyObject *rank_bytes = LENGTH(entries) == 2 ? PyTuple_GetItem(entries, 0) : NULL;
            PyObject *row_bytes = rank_bytes != NULL ? PyTuple_GetItem(entries, 1) : NULL;
            if (rank_bytes == NULL || !PyBytes_CheckExact(rank_bytes) || !PyBytes_CheckExact(row_bytes) ||
                PyBytes_Size(rank_bytes) != PyBytes_Size(row_bytes) || PyBytes_Size(rank_bytes) % 4 != 0) {
                PyErr_SetString(PyExc_TypeError, "rank_items: an op's entries are neither a mapping nor (ranks, rows)");
                goto done;
            }
            const char *rank_at = PyBytes_AsString(rank_bytes), *row_at = PyBytes_AsString(row_bytes);
            Py_ssize_t parts = PyBytes_Size(rank_bytes) / 4;
            for (Py_ssize_t k = 0; k < parts; k++) {
                int32_t rank, next = 0, previous = 0;
                uint32_t row;
                memcpy(&rank, rank_at + 4 * k, 4);
                memcpy(&row, row_at + 4 * k, 4);
                if (k > 0) memcpy(&previous, rank_at + 4 * (k - 1), 4);
                if (k > 0 && previous == rank) continue; /* its item is made */
                Py_ssize_t slot = rank_slot(ranks, count, rank);
                if (slot < 0) continue;
                if (k + 1 < parts) memcpy(&next, rank_at + 4 * (k + 1), 4);
                int several = k + 1 < parts && next == rank;
                if (put_item(&buffers[slot], i, several || row > INT32_MAX ? ITEM_HELD : (int32_t)row) < 0) goto done;
            }
        } else { /* a mapping: its keys are its ranks */
            PyObject *iterator = PyObject_GetIter(entries), *rank;
            if (iterator == NULL) goto done;
            int failed = 0;
            while (!failed && (rank = PyIter_Next(iterator)) != NULL) {
                failed = put_rank_item(rank, ranks, buffers, count, i, ITEM_HELD) < 0;
                Py_DECREF(rank);
            }
            Py_DECREF(iterator);
            if (failed || PyErr_Occurred()) goto done;
        }
        PyObject *missing = PyObject_GetAttr(PyList_GetItem(ops, i), str_missing);
        if (missing == NULL) goto done;
        int failed = !PyTuple_CheckExact(missing);
        if (failed) PyErr_SetString(PyExc_TypeError, "rank_items: an op's missing ranks are not a tuple");
        for (Py_ssize_t k = 0; !failed && k < LENGTH(missing); k++)
            failed = put_rank_item(PyTuple_GetItem(missing, k), ranks, buffers, count, i, ITEM_MISSING) < 0;
        Py_DECREF(missing);
        if (failed) goto done;
    }
    result = PyDict_New();
    for (Py_ssize_t k = 0; result != NULL && k < count; k++) {
        if (buffers[k].len == 0) continue;
        PyObject *rank = PyLong_FromLongLong(ranks[k]);
        PyObject *items = PyBytes_FromStringAndSize(buffers[k].data, buffers[k].len);
        if (rank == NULL || items == NULL || PyDict_SetItem(result, rank, items) < 0) Py_CLEAR(result);
        Py_XDECREF(rank);
        Py_XDECREF(items);
    }
done:
    for (Py_ssize_t k = 0; buffers != NULL && k < count; k++) PyMem_Free(buffers[k].data);
    PyMem_Free(buffers);
    PyMem_Free(ranks);
    return result;
}

/* An item with where it begins on the rank and where it was: what a stable sort by start compares. */
typedef struct {
    long long start;
    Py_ssize_t position;
    Item item;
} Placed;

static int compare_placed(const void *a, const void *b) {
    const Placed *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->position < y->position ? -1 : x->position > y->position;
}

/* A group a rank's items are in, as rank_groups meets it. */
typedef struct {
    int32_t group;
    int unordered;
    long long last;
    Py_ssize_t count, filled;
    Placed *placed;
} GroupItems;

PyDoc_STRVAR(rank_groups_doc,
             "rank_groups(items, op_groups, created, first_times, start_of) -> list\n\n"
             "streams._by_group for a rank's items (bytes of rows.ITEM pairs, in the job's op order): each\n"
             "group (an index, as ``op_groups`` gives one for each op in int32 bytes) with its items, in the\n"
             "order of each group's first item, as (group, bytes); a group's items sorted by when the rank\n"
             "began each (stable) where that order is not the given one. An item begins at its row's\n"
             "``created`` (int64 bytes, one per row), or for a rank that never issued the op at its\n"
             "``first_times`` (int64 bytes, one per op), or where the op gives its entries at ``start_of(op)``.");

static PyObject *rank_groups(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("rank_groups", nargs, 5)) return NULL;
    PyObject *items_bytes = args[0], *start_of = args[4];
    if (!PyBytes_CheckExact(items_bytes) || PyBytes_Size(items_bytes) % (Py_ssize_t)sizeof(Item) != 0 ||
        !PyBytes_CheckExact(args[1]) || !PyBytes_CheckExact(args[2]) || !PyBytes_CheckExact(args[3]) ||
        PyBytes_Size(args[1]) % 4 != 0 || PyBytes_Size(args[2]) % 8 != 0 ||
        PyBytes_Size(args[3]) != 2 * PyBytes_Size(args[1])) {
        PyErr_SetString(PyExc_TypeError, "rank_groups: items, op groups, created and first times as bytes");
        return NULL;
    }
    Py_ssize_t count = PyBytes_Size(items_bytes) / (Py_ssize_t)sizeof(Item);
    Py_ssize_t ops = PyBytes_Size(args[1]) / 4, rows = PyBytes_Size(args[2]) / 8;
    const char *items = PyBytes_AsString(items_bytes), *op_groups = PyBytes_AsString(args[1]);
    const char *created = PyBytes_AsString(args[2]), *first_times = PyBytes_AsString(args[3]);
    Placed *placed = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Placed));
    int32_t *slots = PyMem_Calloc(count ? (size_t)count : 1, sizeof(int32_t));
    GroupItems *groups = PyMem_Calloc(count ? (size_t)count : 1, sizeof(GroupItems));
    Py_ssize_t group_count = 0, last_slot = -1;
    PyObject *result = NULL;
    if (placed == NULL || slots == NULL || groups == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        Item item;
        memcpy(&item, items + k * (Py_ssize_t)sizeof(Item), sizeof item);
        if (item.op < 0 || item.op >= ops || item.row >= rows || item.row < ITEM_HELD) {
            PyErr_SetString(PyExc_IndexError, "rank_groups: an item beyond the ops or the rows");
            goto done;
        }
        long long start;
        if (item.row >= 0) {
            memcpy(&start, created + 8 * (Py_ssize_t)item.row, 8);
        } else if (item.row == ITEM_MISSING) {
            memcpy(&start, first_times + 8 * (Py_ssize_t)item.op, 8);
        } else {
            PyObject *value = PyObject_CallFunction(start_of, "i", item.op);
            if (value == NULL) goto done;
            start = PyLong_AsLongLong(value);
            Py_DECREF(value);
            if (start == -1 && PyErr_Occurred()) goto done;
        }
        int32_t group;
        memcpy(&group, op_groups + 4 * (Py_ssize_t)item.op, 4);
        Py_ssize_t slot = last_slot >= 0 && groups[last_slot].group == group ? last_slot : -1;
        for (Py_ssize_t g = 0; slot < 0 && g < group_count; g++)
            if (groups[g].group == group) slot = g;
        if (slot < 0) {
            slot = group_count++;
            groups[slot].group = group;
        } else if (start < groups[slot].last) {
            groups[slot].unordered = 1;
        }
        groups[slot].last = start;
        groups[slot].count++;
        last_slot = slot;
        slots[k] = (int32_t)slot;
        placed[k] = (Placed){start, k, item};
    }
    /* each group's items together, in the order given: then sorted where they are not in order */
    Py_ssize_t offset = 0;
    for (Py_ssize_t g = 0; g < group_count; g++) {
        groups[g].placed = NULL;
        groups[g].filled = offset; /* where its items begin, until they are placed */
        offset += groups[g].count;
    }
    Placed *ordered = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Placed));
    Item *out = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Item));
    if (ordered == NULL || out == NULL) {
        PyMem_Free(ordered);
        PyMem_Free(out);
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) ordered[groups[slots[k]].filled++] = placed[k];
    result = PyList_New(group_count);
    offset = 0;
    for (Py_ssize_t g = 0; result != NULL && g < group_count; g++) {
        Placed *first = ordered + offset;
        if (groups[g].unordered) qsort(first, (size_t)groups[g].count, sizeof(Placed), compare_placed);
        for (Py_ssize_t k = 0; k < groups[g].count; k++) out[k] = first[k].item;
        PyObject *pair = Py_BuildValue("(iy#)", groups[g].group, (const char *)out,
                                       groups[g].count * (Py_ssize_t)sizeof(Item));
        if (pair == NULL) Py_CLEAR(result);
        else PyList_SetItem(result, g, pair);
        offset += groups[g].count;
    }
    PyMem_Free(ordered);
    PyMem_Free(out);
done:
    PyMem_Free(placed);
    PyMem_Free(slots);
    PyMem_Free(groups);
    return result;
}

/* What lay_out_rows remembers of an op across ranks, in a bytearray it sizes (``cache``): the looks a rank's
 * entry takes in it (numbers in the writer's rows.LookTable) and the median of its members' enqueues,
 * made by ``prepare`` for the entry whose look columns (``signature``) it holds; another entry that agrees
 * on them takes them as they are. */
#define SIGNATURE_MAX 120
typedef struct {
    int32_t ran, enqueue;
    int64_t reference;
    uint8_t known, has_reference;
    uint8_t signature[SIGNATURE_MAX];
} LookCache;

/* A rank's columns as lay_out_rows reads them: every one ``rows`` long, of the width its bytes say. */
typedef struct {
    Py_ssize_t rows;
    const char *created, *started, *completed, *thread;
    Py_ssize_t look_count;
    const char *look[16];
    Py_ssize_t look_width[16];
    Py_ssize_t signature_size;
} RowColumns;

static int read_row_columns(PyObject *columns, PyObject *look_columns, RowColumns *out) {
    if (!PyTuple_CheckExact(columns) || LENGTH(columns) != 4 || !PyTuple_CheckExact(look_columns) ||
        LENGTH(look_columns) > 16) {
        PyErr_SetString(PyExc_TypeError, "lay_out_rows: four columns and at most 16 look columns");
        return -1;
    }
    PyObject *created = PyTuple_GetItem(columns, 0);
    if (!PyBytes_CheckExact(created) || PyBytes_Size(created) % 8 != 0) {
        PyErr_SetString(PyExc_TypeError, "lay_out_rows: created times are int64 bytes");
        return -1;
    }
    out->rows = PyBytes_Size(created) / 8;
    const Py_ssize_t widths[4] = {8, 8, 8, 4};
    const char **targets[4] = {&out->created, &out->started, &out->completed, &out->thread};
    for (int c = 0; c < 4; c++)
        if ((*targets[c] = column_of(PyTuple_GetItem(columns, c), out->rows, widths[c])) == NULL) return -1;
    out->look_count = LENGTH(look_columns);
    out->signature_size = 1; /* whether it started: a look says so */
    for (Py_ssize_t c = 0; c < out->look_count; c++) {
        PyObject *column = PyTuple_GetItem(look_columns, c);
        Py_ssize_t size = PyBytes_Check(column) ? PyBytes_Size(column) : -1;
        Py_ssize_t width = out->rows ? size / out->rows : 1;
        if (width != 1 && width != 4 && width != 8) width = 0;
        if (width == 0 || (out->look[c] = column_of(column, out->rows, width)) == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "lay_out_rows: a look column of the wrong length");
            return -1;
        }
        out->look_width[c] = width;
        out->signature_size += width;
    }
    if (out->signature_size > SIGNATURE_MAX) {
        PyErr_SetString(PyExc_ValueError, "lay_out_rows: too many look columns");
        return -1;
    }
    return 0;
}

static long long column_int64(const char *column, Py_ssize_t row) {
    long long value;
    memcpy(&value, column + 8 * row, 8);
    return value;
}

/* A bytearray's contents grown by a buffer's; 0, or -1 with an error set. */
static int bytearray_extend(PyObject *target, const Buffer *buffer) {
    if (buffer->len == 0) return 0;
    Py_ssize_t size = PyByteArray_Size(target);
    if (PyByteArray_Resize(target, size + buffer->len) < 0) return -1;
    memcpy(PyByteArray_AsString(target) + size, buffer->data, (size_t)buffer->len);
    return 0;
}

PyDoc_STRVAR(lay_out_rows_doc,
             "lay_out_rows(items, position, free, late, slices, context) -> (position, free, late)\n\n"
             "streams._group's common case for a rank's items of one group held as rows (rows.ITEM pairs):\n"
             "from ``position`` on, each completed collective the rank issued as one entry, on a stream\n"
             "nothing holds, enqueued by the thread of the last enqueue, in which it has no role, is laid out\n"
             "as streams._group lays it out, its slice a rows.RECORD added to ``slices`` (a bytearray), its\n"
             "enqueue one added to the thread's instants, its lateness to the points where it changes; stops\n"
             "at the first item that is not so. The context: the rank's columns (created, started, completed,\n"
             "thread) and look columns, each op's key (int64 bytes) and kind (uint8 bytes: 1 a collective),\n"
             "the looks cache (a bytearray), the clock offset, the rank's launch flow base, the lateness\n"
             "points (a list), the last enqueue's thread (an id; -1: none), its instants (a bytearray), the\n"
             "op keys of the rank's roles (ascending int64 bytes), the lateness step, ``prepare(op, row)`` (the\n"
             "numbers of the looks of the op for the entry at ``row`` and the median of its members' enqueues,\n"
             "or None), and how far the rank's clock runs ahead of the group's.");

static PyObject *lay_out_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("lay_out_rows", nargs, 6)) return NULL;
    PyObject *items_bytes = args[0], *slices = args[4];
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    double last_late = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    PyObject *columns, *look_columns, *op_keys, *op_kinds, *cache, *points, *instants, *roles, *prepare;
    PyObject *offset_value, *launch_value, *late_offset_value;
    long long thread;
    double step;
    if (!PyBytes_CheckExact(items_bytes) || PyBytes_Size(items_bytes) % (Py_ssize_t)sizeof(Item) != 0 ||
        !PyByteArray_CheckExact(slices) ||
        !PyArg_ParseTuple(args[5], "O!O!SSO!OOO!LO!SdOO;lay_out_rows: bad context", &PyTuple_Type, &columns,
                          &PyTuple_Type, &look_columns, &op_keys, &op_kinds, &PyByteArray_Type, &cache, &offset_value,
                          &launch_value, &PyList_Type, &points, &thread, &PyByteArray_Type, &instants, &roles, &step,
                          &prepare, &late_offset_value)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "lay_out_rows: items are bytes, slices a bytearray");
        return NULL;
    }
    long long free_at, offset, launch_base, late_offset;
    if (!layout_numbers(args[2], offset_value, launch_value, late_offset_value, &free_at, &offset, &launch_base,
                        &late_offset))
        return PyTuple_Pack(3, args[1], args[2], args[3]); /* Python's to lay out */
    RowColumns in;
    if (read_row_columns(columns, look_columns, &in) < 0) return NULL;
    Py_ssize_t ops = PyBytes_Size(op_keys) / 8;
    if (PyBytes_Size(op_keys) % 8 != 0 || PyBytes_Size(op_kinds) != ops || PyBytes_Size(roles) % 8 != 0) {
        PyErr_SetString(PyExc_ValueError, "lay_out_rows: op keys, kinds and roles of the wrong lengths");
        return NULL;
    }
    Py_ssize_t cache_size = ops * (Py_ssize_t)sizeof(LookCache);
    if (PyByteArray_Size(cache) == 0 && cache_size > 0) {
        if (PyByteArray_Resize(cache, cache_size) < 0) return NULL;
        memset(PyByteArray_AsString(cache), 0, (size_t)cache_size);
    }
    if (PyByteArray_Size(cache) != cache_size) {
        PyErr_SetString(PyExc_ValueError, "lay_out_rows: a looks cache of another job");
        return NULL;
    }
    const char *items = PyBytes_AsString(items_bytes), *keys = PyBytes_AsString(op_keys);
    const char *kinds = PyBytes_AsString(op_kinds), *role_keys = PyBytes_AsString(roles);
    Py_ssize_t count = PyBytes_Size(items_bytes) / (Py_ssize_t)sizeof(Item), role_count = PyBytes_Size(roles) / 8;
    if (offset <= -TIME_LIMIT || offset >= TIME_LIMIT || late_offset <= -TIME_LIMIT || late_offset >= TIME_LIMIT ||
        free_at <= -TIME_LIMIT || free_at >= TIME_LIMIT)
        return Py_BuildValue("(nLd)", position, free_at, last_late); /* Python's to lay out */
    Buffer ran_out = {NULL, 0, 0}, enqueued_out = {NULL, 0, 0};
    uint8_t signature[SIGNATURE_MAX];
    PyObject *result = NULL;
    for (; position >= 0 && position < count; position++) {
        Item item;
        memcpy(&item, items + position * (Py_ssize_t)sizeof(Item), sizeof item);
        if (item.row < 0 || item.row >= in.rows || item.op < 0 || item.op >= ops || kinds[item.op] != 1) break;
        Py_ssize_t row = item.row;
        long long created = column_int64(in.created, row), started = column_int64(in.started, row);
        long long completed = column_int64(in.completed, row);
        uint32_t thread_id;
        memcpy(&thread_id, in.thread + 4 * row, 4);
        /* not completed (None is -1), or times too large to add in C: Python's */
        if (completed <= 0 || completed >= TIME_LIMIT || created < 0 || created >= TIME_LIMIT || started < -1 ||
            started >= TIME_LIMIT || (long long)thread_id != thread)
            break;
        long long key = column_int64(keys, item.op);
        int role = 0;
        for (Py_ssize_t low = 0, high = role_count; !role && low < high;) {
            Py_ssize_t middle = low + (high - low) / 2;
            long long at = column_int64(role_keys, middle);
            if (at == key) role = 1;
            else if (at < key) low = middle + 1;
            else high = middle;
        }
        if (role) break; /* a victim's look: Python's */
        Py_ssize_t size = 0;
        signature[size++] = started == -1;
        for (Py_ssize_t c = 0; c < in.look_count; c++) {
            memcpy(signature + size, in.look[c] + in.look_width[c] * row, (size_t)in.look_width[c]);
            size += in.look_width[c];
        }
        /* the cache may move while prepare runs (it never does resize it, but nothing here relies on that) */
        LookCache *looks = (LookCache *)PyByteArray_AsString(cache) + item.op;
        if (!looks->known || memcmp(looks->signature, signature, (size_t)size) != 0) {
            PyObject *made = PyObject_CallFunction(prepare, "in", item.op, row);
            if (made == NULL) goto done;
            int ran = 0, enqueue = 0;
            PyObject *reference = Py_None;
            int usable = made != Py_None && PyArg_ParseTuple(made, "iiO;lay_out_rows: prepare gives (ran, enqueue, "
                                                                   "reference)", &ran, &enqueue, &reference);
            long long median = 0;
            if (usable && reference != Py_None)
                usable = int_field(reference, &median) && median > -TIME_LIMIT && median < TIME_LIMIT;
            Py_DECREF(made); /* the ints are read; the reference's value too */
            if (PyErr_Occurred()) goto done;
            looks = (LookCache *)PyByteArray_AsString(cache) + item.op;
            looks->known = 0;
            if (!usable) break;
            looks->ran = ran;
            looks->enqueue = enqueue;
            looks->has_reference = reference != Py_None;
            looks->reference = median;
            memcpy(looks->signature, signature, (size_t)size);
            looks->known = 1;
        }
        long long created_here = created - offset, start, end;
        ran_span(created_here, started, started > 0, completed, offset, &free_at, &start, &end); /* None is -1 */
        uint64_t flow = (uint64_t)launch_base + (uint64_t)key;
        Record ran = {start, end, flow, looks->ran, (int32_t)row};
        Record enqueued = {created_here, NO_END, flow, looks->enqueue, -1};
        if (buffer_put(&ran_out, (const char *)&ran, (Py_ssize_t)sizeof ran) < 0 ||
            buffer_put(&enqueued_out, (const char *)&enqueued, (Py_ssize_t)sizeof enqueued) < 0)
            goto done;
        if (looks->has_reference &&
            add_lateness(points, created_here, created, late_offset, looks->reference, step, &last_late) < 0)
            goto done;
    }
    if (bytearray_extend(slices, &ran_out) == 0 && bytearray_extend(instants, &enqueued_out) == 0)
        result = Py_BuildValue("(nLd)", position, free_at, last_late);
done:
    PyMem_Free(ran_out.data);
    PyMem_Free(enqueued_out.data);
    return result;
}

/* What encode_rows reads of a rank's entries for their ids and times (rows.SliceRows.facts): int64 op ids,
 * record ids, created, started and completed times, float64 durations and uint32 thread ids, each
 * ``rows`` long, and the threads table they index ((thread id, thread name) pairs). */
typedef struct {
    Py_ssize_t rows;
    const char *op_id, *record_id, *created, *started, *completed, *duration, *thread;
    PyObject *threads;
    long long last_thread; /* the thread met last, and its encoded bytes (held), or -1 */
    PyObject *last_thread_bytes;
} RowFacts;

static int read_row_facts(PyObject *facts, RowFacts *out) {
    PyObject *created;
    if (!PyTuple_CheckExact(facts) || LENGTH(facts) != 8 || !PyBytes_Check(created = PyTuple_GetItem(facts, 2)) ||
        !PyList_CheckExact(PyTuple_GetItem(facts, 7))) {
        PyErr_SetString(PyExc_TypeError, "encode_rows: facts are seven columns and the threads table");
        return -1;
    }
    out->rows = PyBytes_Size(created) / 8;
    const char **targets[7] = {&out->op_id, &out->record_id, &out->created, &out->started, &out->completed,
                               &out->duration, &out->thread};
    for (int c = 0; c < 7; c++)
        if ((*targets[c] = column_of(PyTuple_GetItem(facts, c), out->rows, c == 6 ? 4 : 8)) == NULL) return -1;
    out->threads = PyTuple_GetItem(facts, 7);
    out->last_thread = -1;
    out->last_thread_bytes = NULL;
    return 0;
}

/* The bytes the writer remembers for an id (an op's or a record's), as PerfettoWriter._facts finds them; borrowed,
 * NULL (no error) when absent. */
static PyObject *id_bytes(PyObject *table, long long value) {
    PyObject *key = PyLong_FromLongLong(value);
    if (key == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *found = bytes_in(table, key);
    Py_DECREF(key);
    return found;
}

/* PerfettoWriter._facts for the entry at ``row`` of a rank's columns: 1 done, 0 not on the fast path, -1 error. */
static int put_row_facts(Buffer *event, Context *context, RowFacts *facts, Py_ssize_t row, int timed) {
    if (row < 0 || row >= facts->rows) return 0;
    PyObject *op_id = id_bytes(context->op_ids, column_int64(facts->op_id, row));
    PyObject *record_id = id_bytes(context->record_ids, column_int64(facts->record_id, row));
    long long created = column_int64(facts->created, row), started = column_int64(facts->started, row);
    long long completed = column_int64(facts->completed, row);
    double duration;
    memcpy(&duration, facts->duration + 8 * row, 8);
    const long long nine_bytes = 1LL << 56; /* the writer's fact heads are for nine-byte varints */
    if (op_id == NULL || record_id == NULL || created < nine_bytes ||
        (timed && (started < nine_bytes || completed < nine_bytes || duration != duration)))
        return 0;
    uint32_t thread_id;
    memcpy(&thread_id, facts->thread + 4 * row, 4);
    PyObject *thread = NULL;
    if ((long long)thread_id == facts->last_thread) {
        thread = facts->last_thread_bytes; /* a rank's entries share their thread */
    } else {
        if ((Py_ssize_t)thread_id >= LENGTH(facts->threads)) return 0;
        PyObject *pair = PyList_GetItem(facts->threads, (Py_ssize_t)thread_id); /* (thread id, thread name) */
        if (!PyTuple_CheckExact(pair) || LENGTH(pair) != 2) return 0;
        PyObject *ident = PyTuple_GetItem(pair, 0), *name = PyTuple_GetItem(pair, 1);
        if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(ident)) return 0;
        if (PyUnicode_GetLength(name) || PyUnicode_GetLength(ident)) {
            PyObject *key = PyTuple_Pack(2, name, ident);
            if (key == NULL) return -1;
            thread = bytes_in(context->threads, key);
            Py_DECREF(key);
            if (thread == NULL) return 0;
        }
        facts->last_thread = (long long)thread_id;
        REPLACE_REF(facts->last_thread_bytes, Py_XNewRef(thread));
    }
    if (buffer_put_bytes(event, op_id) < 0 || buffer_put_bytes(event, record_id) < 0 ||
        buffer_put_chunk(event, &context->created_head) < 0 ||
        buffer_put_varint(event, (unsigned long long)created) < 0)
        return -1;
    if (timed) {
        unsigned char little[8];
        pack_double(duration, little);
        if (buffer_put_chunk(event, &context->started_head) < 0 ||
            buffer_put_varint(event, (unsigned long long)started) < 0 ||
            buffer_put_chunk(event, &context->completed_head) < 0 ||
            buffer_put_varint(event, (unsigned long long)completed) < 0 ||
            buffer_put_chunk(event, &context->duration_head) < 0 || buffer_put(event, (char *)little, 8) < 0)
            return -1;
    }
    if (thread != NULL && buffer_put_bytes(event, thread) < 0) return -1;
    return 1;
}

/* One record's packets, as PerfettoWriter._slice_packets writes its Slice's: 1 a slice, 2 an instant, 0 not
 * on the fast path (nothing written), -1 error. */
static int put_record(Buffer *out, Buffer *event, Context *context, const Record *record, PyObject *looks,
                      RowFacts *facts) {
    int instant = record->end == NO_END;
    event->len = 0;
    if (record->look < 0 || record->look >= LENGTH(looks) || record->start < 0 || (!instant && record->end < 0) ||
        (instant && record->row >= 0))
        return 0;
    PyObject *look = PyList_GetItem(looks, record->look);
    PyObject *chunk = encoded_look(context, look);
    if (chunk == NULL) return -1;
    int result = 0;
    if (!PyBytes_CheckExact(chunk)) goto done;
    if (buffer_put_chunk(event, instant ? &context->instant : &context->begin) < 0 ||
        buffer_put_bytes(event, chunk) < 0)
        goto error;
    if (record->row >= 0) {
        int timed = look_is_timed(look);
        if (timed < 0) goto error;
        int put = put_row_facts(event, context, facts, record->row, timed);
        if (put < 0) goto error;
        if (put == 0) goto done;
    }
    unsigned char little[8];
    for (int b = 0; b < 8; b++) little[b] = (unsigned char)(record->flow >> (8 * b));
    if (buffer_put_chunk(event, &context->flow_tag) < 0 || buffer_put(event, (char *)little, 8) < 0) goto error;
    int framed = put_framed(out, event, context, (unsigned long long)record->start,
                            instant ? 0 : (unsigned long long)record->end, instant);
    if (framed < 0) goto error;
    if (framed == 0) goto done;
    if (record->row >= 0) context->launches += 1;
    result = instant ? 2 : 1;
    goto done;
error:
    result = -1;
done:
    Py_DECREF(chunk);
    return result;
}

PyDoc_STRVAR(encode_rows_doc,
             "encode_rows(records, looks, facts, context, fallback) -> (bytes, slice count, marker count, launch flows)\n\n"
             "PerfettoWriter._slice_packets for a track's slices held as rows (rows.SliceRows): the packets of\n"
             "each record (rows.RECORD) in order, its look the one ``looks`` numbers, its entry's ids and times\n"
             "read from ``facts`` (SliceRows.facts); each record the fast path does not cover is encoded by\n"
             "``fallback(index)``.");

static PyObject *encode_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("encode_rows", nargs, 5)) return NULL;
    PyObject *records = args[0], *looks = args[1], *fallback = args[4];
    if (!PyByteArray_CheckExact(records) || PyByteArray_Size(records) % (Py_ssize_t)sizeof(Record) != 0 ||
        !PyList_CheckExact(looks) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "encode_rows: records (a bytearray), looks (a list), a context tuple");
        return NULL;
    }
    Context context;
    RowFacts facts;
    if (read_context(args[3], &context) < 0 || read_row_facts(args[2], &facts) < 0) return NULL;
    /* held: a fallback may run code that changes the records */
    PyObject *held = PyBytes_FromStringAndSize(PyByteArray_AsString(records), PyByteArray_Size(records));
    if (held == NULL) return NULL;
    const char *data = PyBytes_AsString(held);
    Py_ssize_t count = PyBytes_Size(held) / (Py_ssize_t)sizeof(Record), slices = 0, markers = 0;
    Buffer out = {NULL, 0, 0}, event = {NULL, 0, 0};
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        Record record;
        memcpy(&record, data + i * (Py_ssize_t)sizeof(Record), sizeof record);
        int done = put_record(&out, &event, &context, &record, looks, &facts);
        if (done < 0) goto finish;
        if (done == 0) {
            PyObject *packets = PyObject_CallFunction(fallback, "n", i);
            int ok = packets != NULL && PyBytes_Check(packets) && buffer_put_bytes(&out, packets) == 0;
            if (packets != NULL && !PyBytes_Check(packets))
                PyErr_SetString(PyExc_TypeError, "encode_rows: the fallback must return bytes");
            Py_XDECREF(packets);
            if (!ok) goto finish;
            done = record.end == NO_END ? 2 : 1;
        }
        if (done == 1)
            slices++;
        else
            markers++;
    }
    result = Py_BuildValue("(y#nnn)", out.data ? out.data : "", out.len, slices, markers, context.launches);
finish:
    Py_DECREF(held);
    Py_XDECREF(facts.last_thread_bytes);
    PyMem_Free(out.data);
    PyMem_Free(event.data);
    return result;
}

/* ---- the shape of a pickle ---------------------------------------------------------------------- */

/* pickle_shape.scan in C: the unpickler's stack modelled as each object's depth and node count. */
typedef struct {
    unsigned char *depth;
    long long *nodes;
    Py_ssize_t *ident; /* a list's, dict's or set's own number (0: any other object) */
    Py_ssize_t len, cap;
} ShapeStack;

#define SHAPE_CAP (1LL << 62)
#define GROWS_SHARED "corrupt pickle: a list or dict grows after it is shared"

static int shape_grow(unsigned char **depth, long long **nodes, Py_ssize_t *cap, Py_ssize_t wanted) {
    if (wanted <= *cap) return 0;
    Py_ssize_t cap2 = *cap ? *cap : 64;
    while (cap2 < wanted) cap2 *= 2;
    unsigned char *d = PyMem_Realloc(*depth, (size_t)cap2);
    if (d == NULL) return -1;
    *depth = d;
    long long *n = PyMem_Realloc(*nodes, (size_t)cap2 * sizeof(long long));
    if (n == NULL) return -1;
    *nodes = n;
    *cap = cap2;
    return 0;
}

static int shape_push_ident(ShapeStack *s, unsigned char depth, long long nodes, Py_ssize_t ident) {
    Py_ssize_t cap = s->cap;
    if (shape_grow(&s->depth, &s->nodes, &cap, s->len + 1) < 0) return -1;
    if (cap != s->cap) {
        Py_ssize_t *id = PyMem_Realloc(s->ident, (size_t)cap * sizeof(Py_ssize_t));
        if (id == NULL) return -1;
        s->ident = id;
        s->cap = cap;
    }
    s->depth[s->len] = depth;
    s->nodes[s->len] = nodes;
    s->ident[s->len] = ident;
    s->len++;
    return 0;
}

static int shape_push(ShapeStack *s, unsigned char depth, long long nodes) {
    return shape_push_ident(s, depth, nodes, 0);
}

static long long shape_add(long long a, long long b) { return a + b > SHAPE_CAP ? SHAPE_CAP : a + b; }

static unsigned long long little_endian(const unsigned char *p, int width) {
    unsigned long long value = 0;
    for (int i = width - 1; i >= 0; i--) value = (value << 8) | p[i];
    return value;
}

PyDoc_STRVAR(scan_pickle_doc, "scan_pickle(data, max_depth, max_nodes) -> str | None\n\n"
                              "pickle_shape.scan: why a pickle must not be unpickled, or None.");

static PyObject *scan_pickle(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!takes("scan_pickle", nargs, 3)) return NULL;
    /* The reader passes bytes. Another buffer (bytearray, memoryview) is copied to bytes: the stable ABI
     * of Python 3.10 has no buffer protocol (Py_buffer came to it in 3.11). */
    PyObject *bytes = PyBytes_Check(args[0]) ? Py_NewRef(args[0]) : PyBytes_FromObject(args[0]);
    if (bytes == NULL) return NULL;
    char *text;
    Py_ssize_t size;
    long max_depth = PyLong_AsLong(args[1]);
    long long max_nodes = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred() || PyBytes_AsStringAndSize(bytes, &text, &size) < 0) {
        Py_DECREF(bytes);
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)text;
    Py_ssize_t end = size, pos = 0, max_memo = size;
    ShapeStack stack = {NULL, NULL, NULL, 0, 0};
    Py_ssize_t *marks = NULL, mark_len = 0, mark_cap = 0;
    unsigned char *memo_depth = NULL;
    long long *memo_nodes = NULL; /* -1: not defined */
    Py_ssize_t *memo_ident = NULL, memo_cap = 0, memo_count = 0;
    /* shared[k]: container k was fetched from the memo or duplicated; at most one container an opcode */
    unsigned char *shared = PyMem_Calloc((size_t)end + 2, 1);
    Py_ssize_t made = 0;
    if (shared == NULL) {
        Py_DECREF(bytes);
        return PyErr_NoMemory();
    }
    const char *why = "truncated or corrupt pickle";
    char buffer[64];
    int failed = 0;
#define FAIL(text)     \
    do {               \
        why = (text);  \
        goto done;     \
    } while (0)
#define OOM()         \
    do {              \
        failed = 1;   \
        goto done;    \
    } while (0)
#define NEED(n) \
    if (pos + (n) > end) FAIL("truncated or corrupt pickle")
#define FLOOR() (mark_len ? marks[mark_len - 1] : 0)
    while (pos < end) {
        unsigned char op = data[pos++];
        Py_ssize_t index = -1;
        int is_get = 0, is_put = 0;
        switch (op) {
        case '.':
            why = NULL;
            goto done;
        case 'c': case 'R': case 'b': case 'i': case 'o': case 'P': case 'Q':
        case 0x81: case 0x82: case 0x83: case 0x84: case 0x92: case 0x93: case 0x97: case 0x98:
            why = NULL; /* the unpickler refuses it */
            goto done;
        case 0x80:
            NEED(1);
            if (data[pos] > 5) {
                PyOS_snprintf(buffer, sizeof(buffer), "unsupported pickle protocol %d", data[pos]);
                FAIL(buffer);
            }
            pos += 1;
            continue;
        case 0x95: NEED(8); pos += 8; continue;
        case 'K': NEED(1); pos += 1; if (shape_push(&stack, 0, 1) < 0) OOM(); continue;
        case 'M': NEED(2); pos += 2; if (shape_push(&stack, 0, 1) < 0) OOM(); continue;
        case 'J': NEED(4); pos += 4; if (shape_push(&stack, 0, 1) < 0) OOM(); continue;
        case 'G': NEED(8); pos += 8; if (shape_push(&stack, 0, 1) < 0) OOM(); continue;
        case 'h': NEED(1); index = data[pos]; pos += 1; is_get = 1; break;
        case 'j': NEED(4); index = (Py_ssize_t)little_endian(data + pos, 4); pos += 4; is_get = 1; break;
        case 'q': NEED(1); index = data[pos]; pos += 1; is_put = 1; break;
        case 'r': NEED(4); index = (Py_ssize_t)little_endian(data + pos, 4); pos += 4; is_put = 1; break;
        case 'T': case 'U': case 'X': case 0x8c: case 0x8d: case 'B': case 'C': case 0x8e: case 0x96:
        case 0x8a: case 0x8b: {
            int width = (op == 'U' || op == 0x8c || op == 'C' || op == 0x8a) ? 1
                        : (op == 0x8d || op == 0x8e || op == 0x96) ? 8 : 4;
            NEED(width);
            unsigned long long length = little_endian(data + pos, width);
            pos += width;
            if (op == 0x8b && (length & 0x80000000ULL)) FAIL("truncated or corrupt pickle"); /* negative */
            if (length > (unsigned long long)(end - pos)) FAIL("truncated or corrupt pickle");
            pos += (Py_ssize_t)length;
            if (shape_push(&stack, 0, 1) < 0) OOM();
            continue;
        }
        case 'F': case 'I': case 'L': case 'S': case 'V': case 'g': case 'p': {
            const unsigned char *newline = memchr(data + pos, '\n', (size_t)(end - pos));
            if (newline == NULL) FAIL("truncated or corrupt pickle");
            Py_ssize_t start = pos;
            pos = newline - data + 1;
            if (op == 'g' || op == 'p') {
                /* int(line): optional sign and spaces around digits, as Python's int() reads them */
                Py_ssize_t i = start, stop = newline - data;
                while (i < stop && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r')) i++;
                while (stop > i && (data[stop - 1] == ' ' || data[stop - 1] == '\t' || data[stop - 1] == '\r')) stop--;
                int negative = 0;
                if (i < stop && (data[i] == '+' || data[i] == '-')) negative = data[i++] == '-';
                if (i == stop) FAIL("corrupt pickle: memo index not a number");
                long long value = 0;
                for (; i < stop; i++) {
                    if (data[i] == '_' && i + 1 < stop && data[i + 1] != '_') continue;
                    if (data[i] < '0' || data[i] > '9') FAIL("corrupt pickle: memo index not a number");
                    if (value < (1LL << 56)) value = value * 10 + (data[i] - '0');
                }
                index = negative ? -value : value;
                if (op == 'g') is_get = 1; else is_put = 1;
                break;
            }
            if (shape_push(&stack, 0, 1) < 0) OOM();
            continue;
        }
        case 'N': case 0x88: case 0x89:
            if (shape_push(&stack, 0, 1) < 0) OOM();
            continue;
        case ']': case '}': case ')': case 0x8f:
            if (shape_push_ident(&stack, 1, 1, op == ')' ? 0 : ++made) < 0) OOM();
            break;
        case '(':
            if (mark_len == mark_cap) {
                Py_ssize_t cap2 = mark_cap ? mark_cap * 2 : 64;
                Py_ssize_t *m = PyMem_Realloc(marks, (size_t)cap2 * sizeof(Py_ssize_t));
                if (m == NULL) OOM();
                marks = m;
                mark_cap = cap2;
            }
            marks[mark_len++] = stack.len;
            continue;
        case 0x94: /* MEMOIZE */
            index = memo_count; /* len(memo) */
            is_put = 2;
            break;
        case 't': case 'l': case 'd': case 0x91: case 'e': case 'u': case 0x90: case '1': {
            if (!mark_len) FAIL("corrupt pickle: no mark to pop to");
            Py_ssize_t at = marks[--mark_len];
            unsigned char deepest = 0;
            long long total = 0;
            for (Py_ssize_t k = at; k < stack.len; k++) {
                if (stack.depth[k] > deepest) deepest = stack.depth[k];
                total = shape_add(total, stack.nodes[k]);
            }
            stack.len = at;
            if (op == '1') continue;
            if (op == 'e' || op == 'u' || op == 0x90) {
                if (!stack.len) FAIL("corrupt pickle: stack underflow");
                if (shared[stack.ident[stack.len - 1]]) FAIL(GROWS_SHARED);
                if (deepest + 1 > stack.depth[stack.len - 1]) stack.depth[stack.len - 1] = deepest + 1;
                stack.nodes[stack.len - 1] = shape_add(stack.nodes[stack.len - 1], total);
            } else if (shape_push_ident(&stack, deepest + 1, shape_add(total, 1),
                                        (op == 'l' || op == 'd') ? ++made : 0) < 0) {
                OOM();
            }
            break;
        }
        case 0x85: case 0x86: case 0x87: {
            Py_ssize_t count = op - 0x84;
            if (stack.len - FLOOR() < count) FAIL("corrupt pickle: stack underflow");
            unsigned char deepest = 0;
            long long total = 1;
            for (Py_ssize_t k = stack.len - count; k < stack.len; k++) {
                if (stack.depth[k] > deepest) deepest = stack.depth[k];
                total = shape_add(total, stack.nodes[k]);
            }
            stack.len -= count;
            if (shape_push(&stack, deepest + 1, total) < 0) OOM();
            break;
        }
        case 'a': case 's': {
            Py_ssize_t count = op == 'a' ? 1 : 2;
            if (stack.len - FLOOR() < count + 1) FAIL("corrupt pickle: stack underflow");
            unsigned char deepest = 0;
            long long total = 0;
            for (Py_ssize_t k = stack.len - count; k < stack.len; k++) {
                if (stack.depth[k] > deepest) deepest = stack.depth[k];
                total = shape_add(total, stack.nodes[k]);
            }
            stack.len -= count;
            if (shared[stack.ident[stack.len - 1]]) FAIL(GROWS_SHARED);
            if (deepest + 1 > stack.depth[stack.len - 1]) stack.depth[stack.len - 1] = deepest + 1;
            stack.nodes[stack.len - 1] = shape_add(stack.nodes[stack.len - 1], total);
            break;
        }
        case '0':
            if (mark_len && marks[mark_len - 1] == stack.len) mark_len--;
            else if (stack.len) stack.len--;
            else FAIL("corrupt pickle: stack underflow");
            continue;
        case '2':
            if (!stack.len) FAIL("corrupt pickle: stack underflow");
            if (stack.ident[stack.len - 1]) shared[stack.ident[stack.len - 1]] = 1;
            if (shape_push_ident(&stack, stack.depth[stack.len - 1], stack.nodes[stack.len - 1],
                                 stack.ident[stack.len - 1]) < 0)
                OOM();
            continue;
        default:
            PyOS_snprintf(buffer, sizeof(buffer), "corrupt pickle: unknown opcode 0x%02x", op);
            FAIL(buffer);
        }
        if (is_get) {
            if (index < 0 || index >= memo_cap || memo_nodes[index] < 0) FAIL("corrupt pickle: memo index not defined");
            if (shape_push_ident(&stack, memo_depth[index], memo_nodes[index], memo_ident[index]) < 0) OOM();
            if (memo_ident[index]) shared[memo_ident[index]] = 1;
            continue;
        }
        if (is_put) {
            if (is_put == 1 && (index < 0 || index >= max_memo)) FAIL("corrupt pickle: memo index too large");
            if (is_put == 2 && memo_count >= max_memo) FAIL("corrupt pickle: memo too large");
            if (!stack.len) FAIL("corrupt pickle: nothing to memoise");
            if (index >= memo_cap) {
                Py_ssize_t old = memo_cap;
                if (shape_grow(&memo_depth, &memo_nodes, &memo_cap, index + 1) < 0) OOM();
                Py_ssize_t *id = PyMem_Realloc(memo_ident, (size_t)memo_cap * sizeof(Py_ssize_t));
                if (id == NULL) OOM();
                memo_ident = id;
                for (Py_ssize_t k = old; k < memo_cap; k++) memo_nodes[k] = -1;
            }
            if (memo_nodes[index] < 0) memo_count++;
            memo_depth[index] = stack.depth[stack.len - 1];
            memo_nodes[index] = stack.nodes[stack.len - 1];
            memo_ident[index] = stack.ident[stack.len - 1];
            continue;
        }
        if (stack.len && (stack.depth[stack.len - 1] > max_depth || stack.nodes[stack.len - 1] > max_nodes)) {
            if (stack.depth[stack.len - 1] > max_depth)
                PyOS_snprintf(buffer, sizeof(buffer), "corrupt pickle: nested more than %ld deep", max_depth);
            else
                PyOS_snprintf(buffer, sizeof(buffer), "corrupt pickle: describes more than %lld nodes", max_nodes);
            FAIL(buffer);
        }
    }
done:
#undef FAIL
#undef OOM
#undef NEED
#undef FLOOR
    Py_DECREF(bytes);
    PyMem_Free(stack.depth);
    PyMem_Free(stack.nodes);
    PyMem_Free(stack.ident);
    PyMem_Free(marks);
    PyMem_Free(memo_depth);
    PyMem_Free(memo_nodes);
    PyMem_Free(memo_ident);
    PyMem_Free(shared);
    if (failed) return PyErr_NoMemory();
    if (why == NULL) Py_RETURN_NONE;
    return PyUnicode_FromString(why);
}

/* ---- a pickle straight to columns ---------------------------------------------------------------- */

/* pickle_columns() walks a dump's opcodes once and writes its entries as columns, without a Python
 * object per entry: each list, tuple and dict outside the entries is made once per distinct content
 * (hash-consed on its items), and each entry becomes one row of fixed-width fields, with its repeating
 * fields (op, group, state, thread...: ``reader._SHAPE_KEYS``) one id into a table of their distinct
 * combinations. It knows only the opcodes PyTorch's pickler writes: c10d's ``pickle_str`` (beside
 * ``new_dict``/``new_list`` in torch/csrc/distributed/c10d/, TraceUtils.h in older releases) runs a
 * ``torch::jit::Pickler`` whose ``protocol()`` writes PROTO 2 (every dump starts 0x80 0x02), then
 * ``pushIValue`` of the c10::Dict that ``FlightRecorder::dump`` builds, a dict whose "entries" is a
 * list of dicts (torch/csrc/jit/serialization/pickler.cpp). At anything else (another opcode,
 * an object fetched from the memo before it is complete, a value of a type the fast reader does not
 * take, too deep or too many nodes, pickle_shape's bounds) it gives up and returns None, and the
 * caller reads the file as before: restricted unpickler, then the Python reader. So its result never
 * differs from theirs, and it runs no code (it never looks a class up). Work is linear in the file. */

enum { V_NONE, V_FALSE, V_TRUE, V_INT, V_FLOAT, V_OBJ, V_OPEN, V_ENTRIES };
typedef struct {
    unsigned char kind;
    union {
        long long i;
        double f;
    } u; /* V_OBJ, V_OPEN: the id in i */
} Val;

#define WK_KEYS 22     /* reader._FAST_KEYS, then "entries" */
#define WK_ENTRIES 22
#define WK_OTHER 255
#define NO_ID 0xFFFFFFFFu /* more objects than a uint32 counts: give up */

typedef struct {
    unsigned char kind; /* 'l' list, 'd' dict, 'E' the entries list, 'e' an entry */
    unsigned char done; /* 1: made (final holds its id); 2: used up (an entry, the entries list) */
    long long final;
    Val *items;
    Py_ssize_t len, cap;
} Open;

typedef struct {
    uint64_t hash;
    Py_ssize_t off, len;
    long long id;
} HKey;

typedef struct {
    HKey *keys;
    Py_ssize_t count, cap;
    Py_ssize_t *slots; /* index + 1 into keys; 0: empty */
    Py_ssize_t mask;
    Buffer arena;
} Interner;

/* A hash of n bytes, eight at a time (the keys are runs of nine-byte values: byte by byte costs more
 * than the rest of the walk). */
static uint64_t fnv(const unsigned char *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t word;
        memcpy(&word, p + i, 8);
        h = (h ^ word) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h ^ (h >> 32);
}

/* The id of ``key`` (n bytes), or -1 when new: then *slot says where to put it. */
static long long interner_find(Interner *in, const char *key, Py_ssize_t n, uint64_t h, Py_ssize_t *slot) {
    if (in->slots == NULL) {
        *slot = -1;
        return -1;
    }
    Py_ssize_t s = (Py_ssize_t)(h & (uint64_t)in->mask);
    while (in->slots[s]) {
        HKey *k = &in->keys[in->slots[s] - 1];
        if (k->hash == h && k->len == n && memcmp(in->arena.data + k->off, key, (size_t)n) == 0) return k->id;
        s = (s + 1) & in->mask;
    }
    *slot = s;
    return -1;
}

static int interner_rehash(Interner *in) {
    Py_ssize_t size = in->slots ? 2 * (in->mask + 1) : 1024;
    Py_ssize_t *slots = PyMem_Calloc((size_t)size, sizeof(Py_ssize_t));
    if (slots == NULL) return -1;
    for (Py_ssize_t i = 0; i < in->count; i++) {
        Py_ssize_t s = (Py_ssize_t)(in->keys[i].hash & (uint64_t)(size - 1));
        while (slots[s]) s = (s + 1) & (size - 1);
        slots[s] = i + 1;
    }
    PyMem_Free(in->slots);
    in->slots = slots;
    in->mask = size - 1;
    return 0;
}

/* Remember ``key`` as ``id``; -1 out of memory. */
static int interner_add(Interner *in, const char *key, Py_ssize_t n, uint64_t h, long long id) {
    if (in->count + 1 > in->cap) {
        Py_ssize_t cap = in->cap ? 2 * in->cap : 256;
        HKey *keys = PyMem_Realloc(in->keys, (size_t)cap * sizeof(HKey));
        if (keys == NULL) return -1;
        in->keys = keys;
        in->cap = cap;
    }
    Py_ssize_t off = in->arena.len;
    if (buffer_put(&in->arena, key, n) < 0) return -1;
    in->keys[in->count++] = (HKey){h, off, n, id};
    if (in->slots == NULL || 2 * in->count > in->mask) return interner_rehash(in);
    Py_ssize_t slot;
    interner_find(in, key, n, h, &slot); /* new: finds its empty slot */
    in->slots[slot] = in->count;
    return 0;
}

static void interner_free(Interner *in) {
    PyMem_Free(in->keys);
    PyMem_Free(in->slots);
    PyMem_Free(in->arena.data);
}

/* The walker's state. Columns: 8 int64 (record id, pg id, collective seq, p2p seq, op id, created,
 * started, completed; -1 for None), duration (float64, NaN for None), then 6 uint32 (the shape, then
 * the raw ids of input and output sizes and dtypes and frames; 0 for None). */
#define WK_INT_COLUMNS 8
#define WK_ID_COLUMNS 6
typedef struct {
    Val *stack;
    Py_ssize_t len, cap;
    Py_ssize_t *marks;
    Py_ssize_t mark_len, mark_cap;
    Val *memo;
    unsigned char *memo_set;
    Py_ssize_t memo_cap, memo_count;
    Open *opens;
    Py_ssize_t open_len, open_cap;
    PyObject *objs; /* id -> object (a str, or a list, tuple or dict made once) */
    Buffer meta;    /* per id: depth (1 byte), key slot (1 byte), nodes (8 bytes) */
    Interner made, shapes;
    Buffer scratch; /* the key being interned */
    PyObject *shape_list;
    PyObject *entries_list; /* the top dict's "entries" where they were read as rows */
    Buffer cols[WK_INT_COLUMNS + 1 + WK_ID_COLUMNS];
    Py_ssize_t rows;
    long long first, last; /* base.model.time_range of the rows */
    const char *key_text[WK_KEYS + 1];
    Py_ssize_t key_len[WK_KEYS + 1];
    int entries_seen;
    long max_depth;
    long long max_nodes;
} Walker;

#define META_SIZE 10

static unsigned char meta_depth(Walker *w, long long id) { return (unsigned char)w->meta.data[id * META_SIZE]; }
static unsigned char meta_slot(Walker *w, long long id) { return (unsigned char)w->meta.data[id * META_SIZE + 1]; }
static long long meta_nodes(Walker *w, long long id) {
    long long n;
    memcpy(&n, w->meta.data + id * META_SIZE + 2, sizeof n);
    return n;
}

/* Add ``obj`` (stolen) as the next id; -1 on error. */
static long long add_obj(Walker *w, PyObject *obj, unsigned char depth, unsigned char slot, long long nodes) {
    if (obj == NULL) return -1;
    long long id = PyList_Size(w->objs);
    int failed = PyList_Append(w->objs, obj);
    Py_DECREF(obj);
    char m[META_SIZE];
    m[0] = (char)depth;
    m[1] = (char)slot;
    memcpy(m + 2, &nodes, sizeof nodes);
    if (failed || id >= (long long)NO_ID || buffer_put(&w->meta, m, META_SIZE) < 0) return -1;
    return id;
}

static int push(Walker *w, Val v) {
    if (w->len == w->cap) {
        Py_ssize_t cap = w->cap ? 2 * w->cap : 256;
        Val *s = PyMem_Realloc(w->stack, (size_t)cap * sizeof(Val));
        if (s == NULL) return -1;
        w->stack = s;
        w->cap = cap;
    }
    w->stack[w->len++] = v;
    return 0;
}

/* A value's object (new reference); NULL with an error set. */
static PyObject *object_of(Walker *w, const Val *v) {
    switch (v->kind) {
    case V_NONE: return Py_NewRef(Py_None);
    case V_FALSE: return Py_NewRef(Py_False);
    case V_TRUE: return Py_NewRef(Py_True);
    case V_INT: return PyLong_FromLongLong(v->u.i);
    case V_FLOAT: return PyFloat_FromDouble(v->u.f);
    case V_OBJ: return Py_NewRef(PyList_GetItem(w->objs, (Py_ssize_t)v->u.i));
    case V_ENTRIES: /* the entries are the columns: one empty list, which the caller knows by identity */
        if (w->entries_list == NULL) w->entries_list = PyList_New(0);
        return w->entries_list ? Py_NewRef(w->entries_list) : NULL;
    default: PyErr_SetString(PyExc_ValueError, "open container"); return NULL;
    }
}

/* A value as the nine bytes of an interning key. */
static void key_of(const Val *v, char *out) {
    out[0] = (char)v->kind;
    memset(out + 1, 0, 8);
    if (v->kind == V_FLOAT) memcpy(out + 1, &v->u.f, 8);
    else if (v->kind == V_INT || v->kind == V_OBJ) memcpy(out + 1, &v->u.i, 8);
}

/* The id of the container ``kind`` ('l', 'd', 't') of ``items``, made once per distinct content; -1
 * on error, -2: past the bounds (give up). */
static long long intern_container(Walker *w, char kind, const Val *items, Py_ssize_t n) {
    Buffer key = w->scratch; /* reused: no key is made while another is */
    key.len = 0;
    char one[9];
    one[0] = kind;
    if (buffer_reserve(&key, 1 + 9 * n) < 0) {
        w->scratch = key;
        return -1;
    }
    w->scratch = key;
    buffer_put(&key, one, 1);
    unsigned char depth = 0;
    long long nodes = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        key_of(&items[i], one);
        buffer_put(&key, one, 9); /* reserved above */
        if (items[i].kind == V_OBJ) {
            unsigned char d = meta_depth(w, items[i].u.i);
            if (d > depth) depth = d;
            nodes = shape_add(nodes, meta_nodes(w, items[i].u.i));
        } else {
            nodes = shape_add(nodes, 1);
        }
    }
    depth++;
    uint64_t h = fnv((const unsigned char *)key.data, key.len);
    Py_ssize_t slot;
    long long id = interner_find(&w->made, key.data, key.len, h, &slot);
    if (id < 0) {
        if (depth > w->max_depth || nodes > w->max_nodes) return -2;
        PyObject *obj = kind == 'l' ? PyList_New(n) : kind == 't' ? PyTuple_New(n) : PyDict_New();
        for (Py_ssize_t i = 0; obj != NULL && i < n; i++) {
            PyObject *item = object_of(w, &items[i]);
            if (item == NULL) Py_CLEAR(obj);
            else if (kind == 'l') PyList_SetItem(obj, i, item);
            else if (kind == 't') PyTuple_SetItem(obj, i, item);
            else if (i % 2 == 0) { /* a key: set with its value */
                PyObject *value = i + 1 < n ? object_of(w, &items[i + 1]) : NULL;
                if (value == NULL || PyDict_SetItem(obj, item, value) < 0) Py_CLEAR(obj);
                Py_XDECREF(value);
                Py_DECREF(item);
            } else {
                Py_DECREF(item);
            }
        }
        id = add_obj(w, obj, depth, WK_OTHER, nodes);
        if (id >= 0 && interner_add(&w->made, key.data, key.len, h, id) < 0) id = -1;
    }
    return id;
}

/* Make an open list or dict final as it is put into another object; 0, -1 error, -2 give up. */
static int settle(Walker *w, Val *v, int into_top) {
    if (v->kind != V_OPEN) return 0;
    Open *o = &w->opens[v->u.i];
    if (o->done == 1) { /* made already, when it was fetched from the memo */
        v->kind = V_OBJ;
        v->u.i = o->final;
        return 0;
    }
    if (o->done) return -2;
    if (o->kind == 'E' && into_top) {
        o->done = 2;
        v->kind = V_ENTRIES;
        return 0;
    }
    if (o->kind != 'l' && o->kind != 'd') return -2;
    if (o->kind == 'd' && o->len % 2) return -2;
    long long id = intern_container(w, o->kind, o->items, o->len);
    if (id < 0) return (int)id;
    PyMem_Free(o->items);
    o->items = NULL;
    o->done = 1;
    o->final = id;
    v->kind = V_OBJ;
    v->u.i = id;
    return 0;
}

static int open_put(Open *o, const Val *items, Py_ssize_t n) {
    if (o->len + n > o->cap) {
        Py_ssize_t cap = o->cap ? 2 * o->cap : 16;
        while (cap < o->len + n) cap *= 2;
        Val *grown = PyMem_Realloc(o->items, (size_t)cap * sizeof(Val));
        if (grown == NULL) return -1;
        o->items = grown;
        o->cap = cap;
    }
    memcpy(o->items + o->len, items, (size_t)n * sizeof(Val));
    o->len += n;
    return 0;
}

/* A number field as the fast reader takes it (an int in 0..2**63-1); 0, or -2. */
static int count_of(const Val *v, long long *out) {
    if (v->kind != V_INT || v->u.i < 0) return -2;
    *out = v->u.i;
    return 0;
}

/* A time: None, 0 (unknown) or a positive int; -1 for None. */
static int time_of(const Val *v, long long *out) {
    if (v->kind == V_NONE) {
        *out = -1;
        return 0;
    }
    if (v->kind != V_INT || v->u.i < 0) return -2;
    *out = v->u.i ? v->u.i : -1;
    return 0;
}

/* The raw id of sizes, dtypes or frames: an object, or 0 (None). */
static int raw_id_of(const Val *v, uint32_t *out) {
    if (v->kind == V_NONE) {
        *out = 0;
        return 0;
    }
    if (v->kind != V_OBJ) return -2;
    *out = (uint32_t)v->u.i;
    return 0;
}

/* One entry dict (its items, key then value) as a row of the columns; 0, -1 error, -2 give up. */
static int put_row(Walker *w, Open *o) {
    const Val *fields[WK_KEYS] = {NULL};
    for (Py_ssize_t i = 0; i + 1 < o->len; i += 2) {
        const Val *k = &o->items[i];
        if (k->kind == V_OBJ) {
            unsigned char slot = meta_slot(w, k->u.i);
            if (slot < WK_KEYS) fields[slot] = &o->items[i + 1]; /* a later equal key wins, as in a dict */
            else if (slot != WK_OTHER && slot != WK_ENTRIES) return -2;
            else if (meta_depth(w, k->u.i) != 0) return -2; /* a container as a key: unhashable, or odd */
        } else if (k->kind == V_FLOAT) {
            return -2;
        }
    }
    /* gloo writes no duration (ProcessGroupGloo times nothing); a time or a duration missing is None, as
     * in reader._read_entry; any other key missing: the Python reader's defaults decide */
    static const Val none = {V_NONE, {.i = 0}};
    for (int f = 6; f <= 8; f++)
        if (fields[f] == NULL) fields[f] = &none;
    for (int f = 0; f < WK_KEYS; f++)
        if (fields[f] == NULL) return -2;
    long long ints[WK_INT_COLUMNS];
    for (int f = 0; f < 6; f++)
        if (count_of(fields[f], &ints[f]) < 0) return -2;
    if (time_of(fields[6], &ints[6]) < 0 || time_of(fields[7], &ints[7]) < 0) return -2;
    const Val *d = fields[8];
    /* reader._is_duration: a finite float, or an int a float holds; anything else is no duration */
    double duration = d->kind == V_FLOAT && isfinite(d->u.f) ? d->u.f : d->kind == V_INT ? (double)d->u.i : NAN;
    uint32_t ids[WK_ID_COLUMNS];
    for (int f = 0; f < 5; f++)
        if (raw_id_of(fields[9 + f], &ids[1 + f]) < 0) return -2;
    /* the shape: fields 14 to 21, interned as one key */
    char key[9 * 8];
    for (int f = 0; f < 8; f++) key_of(fields[14 + f], key + 9 * f);
    uint64_t h = fnv((const unsigned char *)key, sizeof key);
    Py_ssize_t slot;
    long long id = interner_find(&w->shapes, key, sizeof key, h, &slot);
    if (id < 0) {
        PyObject *shape = PyTuple_New(8);
        for (int f = 0; shape != NULL && f < 8; f++) {
            PyObject *item = object_of(w, fields[14 + f]);
            if (item == NULL) Py_CLEAR(shape);
            else PyTuple_SetItem(shape, f, item);
        }
        id = PyList_Size(w->shape_list);
        if (shape == NULL || PyList_Append(w->shape_list, shape) < 0) id = -1;
        Py_XDECREF(shape);
        if (id < 0 || interner_add(&w->shapes, key, sizeof key, h, id) < 0) return -1;
    }
    ids[0] = (uint32_t)id;
    if (w->rows == 0) w->first = w->last = ints[5];
    if (ints[5] < w->first) w->first = ints[5];
    for (int c = 5; c < 8; c++) /* a time of None is -1, below any */
        if (ints[c] > w->last) w->last = ints[c];
    for (int c = 0; c < WK_INT_COLUMNS; c++)
        if (buffer_put(&w->cols[c], (const char *)&ints[c], 8) < 0) return -1;
    if (buffer_put(&w->cols[WK_INT_COLUMNS], (const char *)&duration, 8) < 0) return -1;
    for (int c = 0; c < WK_ID_COLUMNS; c++)
        if (buffer_put(&w->cols[WK_INT_COLUMNS + 1 + c], (const char *)&ids[c], 4) < 0) return -1;
    w->rows++;
    return 0;
}

/* Put stack[from:] into the open container below (APPEND(S), SETITEM(S)); 0, -1, -2. */
static int put_items(Walker *w, Py_ssize_t from, int dict) {
    if (from < 1) return -2;
    Val *target = &w->stack[from - 1];
    if (target->kind != V_OPEN) return -2;
    Open *o = &w->opens[target->u.i];
    Py_ssize_t n = w->len - from;
    if (o->done || (dict ? (o->kind != 'd' && o->kind != 'e') || n % 2 : o->kind != 'l' && o->kind != 'E'))
        return -2;
    int into_top = target->u.i == 0 && from - 1 == 0;
    for (Py_ssize_t i = from; i < w->len; i++) {
        Val *v = &w->stack[i];
        if (o->kind == 'E') {
            if (v->kind != V_OPEN || w->opens[v->u.i].kind != 'e') return -2;
            Open *entry = &w->opens[v->u.i];
            int r = put_row(w, entry);
            if (r < 0) return r;
            PyMem_Free(entry->items);
            entry->items = NULL;
            entry->done = 2;
            continue;
        }
        int r = settle(w, v, into_top && dict && (i - from) % 2 == 1);
        if (r < 0) return r;
    }
    if (o->kind != 'E' && open_put(o, w->stack + from, n) < 0) return -1;
    w->len = from;
    return 0;
}

/* A new list or dict, open until it is put into another object. */
static int push_open(Walker *w, unsigned char kind) {
    if (w->open_len == w->open_cap) {
        Py_ssize_t cap = w->open_cap ? 2 * w->open_cap : 256;
        Open *grown = PyMem_Realloc(w->opens, (size_t)cap * sizeof(Open));
        if (grown == NULL) return -1;
        w->opens = grown;
        w->open_cap = cap;
    }
    w->opens[w->open_len] = (Open){kind, 0, -1, NULL, 0, 0};
    Val v = {V_OPEN, {.i = w->open_len++}};
    return push(w, v);
}

/* What kind a new list or dict is: the entries list is the value of "entries" in the top dict, an
 * entry is a dict put into it. */
static unsigned char kind_of_new(Walker *w, char kind) {
    Py_ssize_t base = w->mark_len ? w->marks[w->mark_len - 1] : w->len;
    if (kind == 'l') {
        Py_ssize_t from = w->mark_len ? base : 1;
        if (w->len >= 2 && w->stack[0].kind == V_OPEN && w->stack[0].u.i == 0 && w->opens[0].kind == 'd' &&
            w->mark_len <= 1 && from == 1 &&
            (w->len - from) % 2 == 1 && w->stack[w->len - 1].kind == V_OBJ &&
            meta_slot(w, w->stack[w->len - 1].u.i) == WK_ENTRIES)
            return 'E';
        return 'l';
    }
    /* put by APPEND (the list right below it, a mark or not between) or by APPENDS from the mark */
    if (w->len >= 1 && w->stack[w->len - 1].kind == V_OPEN && w->opens[w->stack[w->len - 1].u.i].kind == 'E')
        return 'e';
    if (base >= 1 && w->stack[base - 1].kind == V_OPEN && w->opens[w->stack[base - 1].u.i].kind == 'E') return 'e';
    return 'd';
}

/* A str from UTF-8 (as the unpickler decodes it), with the slot of the key it is, if any; one id per
 * distinct text (a pickler that memoises strings by object, as Python's does, writes equal ones again). */
static int push_str(Walker *w, const char *text, Py_ssize_t n) {
    Buffer key = w->scratch;
    key.len = 0;
    int failed = buffer_put(&key, "s", 1) < 0 || buffer_put(&key, text, n) < 0;
    w->scratch = key;
    if (failed) return -1;
    uint64_t h = fnv((const unsigned char *)key.data, key.len);
    Py_ssize_t where;
    long long id = interner_find(&w->made, key.data, key.len, h, &where);
    if (id < 0) {
        PyObject *s = PyUnicode_DecodeUTF8(text, n, "surrogatepass");
        if (s == NULL) return -2;
        unsigned char slot = WK_OTHER;
        for (int k = 0; k <= WK_KEYS; k++)
            if (w->key_len[k] == n && memcmp(w->key_text[k], text, (size_t)n) == 0) slot = (unsigned char)k;
        id = add_obj(w, s, 0, slot, 1);
        if (id >= 0 && interner_add(&w->made, key.data, key.len, h, id) < 0) id = -1;
    }
    if (id < 0) return -1;
    Val v = {V_OBJ, {.i = id}};
    return push(w, v);
}

static int memo_put(Walker *w, unsigned long long index) {
    if (w->len == 0) return -2;
    /* PyTorch numbers memo entries one after another: a far index is no dump of it */
    if (index > (unsigned long long)(2 * w->memo_count + 1024)) return -2;
    if ((Py_ssize_t)index >= w->memo_cap) {
        Py_ssize_t cap = w->memo_cap ? w->memo_cap : 1024;
        while (cap <= (Py_ssize_t)index) cap *= 2;
        Val *memo = PyMem_Realloc(w->memo, (size_t)cap * sizeof(Val));
        if (memo == NULL) return -1;
        w->memo = memo;
        unsigned char *set = PyMem_Realloc(w->memo_set, (size_t)cap);
        if (set == NULL) return -1;
        memset(set + w->memo_cap, 0, (size_t)(cap - w->memo_cap));
        w->memo_set = set;
        w->memo_cap = cap;
    }
    if (!w->memo_set[index]) w->memo_count++;
    w->memo_set[index] = 1;
    w->memo[index] = w->stack[w->len - 1];
    return 0;
}

#define TRY_SETTLE(call)       \
    do {                       \
        int r_ = (call);       \
        if (r_ < 0) return r_; \
    } while (0)

static int memo_get(Walker *w, unsigned long long index) {
    if ((Py_ssize_t)index >= w->memo_cap || !w->memo_set[index]) return -2;
    Val v = w->memo[index];
    /* PyTorch's pickler shares a list two fields hold (an op's input and output sizes): it is made
     * final here, and may not grow after (as pickle_shape refuses); an entry is never shared */
    if (v.kind == V_OPEN) TRY_SETTLE(settle(w, &v, 0));
    return push(w, v);
}

/* Build a tuple of stack[from:]. */
static int make_tuple(Walker *w, Py_ssize_t from) {
    for (Py_ssize_t i = from; i < w->len; i++) {
        int r = settle(w, &w->stack[i], 0);
        if (r < 0) return r;
    }
    long long id = intern_container(w, 't', w->stack + from, w->len - from);
    if (id < 0) return (int)id;
    w->len = from;
    Val v = {V_OBJ, {.i = id}};
    return push(w, v);
}

/* LIST or DICT from the mark: an open container, filled at once. */
static int make_from_mark(Walker *w, Py_ssize_t from, char kind) {
    Py_ssize_t n = w->len - from;
    if (kind == 'd' && n % 2) return -2;
    for (Py_ssize_t i = from; i < w->len; i++) {
        int r = settle(w, &w->stack[i], 0);
        if (r < 0) return r;
    }
    long long id = intern_container(w, kind, w->stack + from, n);
    if (id < 0) return (int)id;
    w->len = from;
    Val v = {V_OBJ, {.i = id}};
    return push(w, v);
}

static Py_ssize_t pop_mark(Walker *w) { return w->mark_len ? w->marks[--w->mark_len] : -1; }

/* Run the opcodes; 0 at STOP with the result on the stack, -1 error, -2 give up. */
static int walk(Walker *w, const unsigned char *data, Py_ssize_t end) {
    Py_ssize_t pos = 0;
#define NEED(n)                                  \
    do {                                         \
        if ((n) < 0 || end - pos < (n)) return -2; \
    } while (0)
#define TRY(call)                \
    do {                         \
        int r_ = (call);         \
        if (r_ < 0) return r_;   \
    } while (0)
    while (pos < end) {
        unsigned char op = data[pos++];
        Val v = {V_NONE, {.i = 0}};
        switch (op) {
        case 0x80: /* PROTO */
            NEED(1);
            if (data[pos++] > 5) return -2;
            break;
        case 0x95: /* FRAME */
            NEED(8);
            pos += 8;
            break;
        case '.': /* STOP */
            if (w->len != 1 || w->mark_len) return -2;
            return 0;
        case '}': TRY(push_open(w, kind_of_new(w, 'd'))); break;
        case ']': {
            unsigned char kind = kind_of_new(w, 'l');
            if (kind == 'E' && w->entries_seen++) return -2;
            TRY(push_open(w, kind));
            break;
        }
        case ')': TRY(make_tuple(w, w->len)); break;
        case '(':
            if (w->mark_len == w->mark_cap) {
                Py_ssize_t cap = w->mark_cap ? 2 * w->mark_cap : 64;
                Py_ssize_t *marks = PyMem_Realloc(w->marks, (size_t)cap * sizeof(Py_ssize_t));
                if (marks == NULL) return -1;
                w->marks = marks;
                w->mark_cap = cap;
            }
            w->marks[w->mark_len++] = w->len;
            break;
        case 's': /* SETITEM */
            if (w->len - (w->mark_len ? w->marks[w->mark_len - 1] : 0) < 3) return -2;
            TRY(put_items(w, w->len - 2, 1));
            break;
        case 'a': /* APPEND */
            if (w->len - (w->mark_len ? w->marks[w->mark_len - 1] : 0) < 2) return -2;
            TRY(put_items(w, w->len - 1, 0));
            break;
        case 'u':
        case 'e': { /* SETITEMS, APPENDS */
            Py_ssize_t from = pop_mark(w);
            if (from < 0) return -2;
            TRY(put_items(w, from, op == 'u'));
            break;
        }
        case 't': {
            Py_ssize_t from = pop_mark(w);
            if (from < 0) return -2;
            TRY(make_tuple(w, from));
            break;
        }
        case 'l':
        case 'd': {
            Py_ssize_t from = pop_mark(w);
            if (from < 0) return -2;
            TRY(make_from_mark(w, from, (char)op));
            break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
            Py_ssize_t n = op - 0x84;
            if (w->len - (w->mark_len ? w->marks[w->mark_len - 1] : 0) < n) return -2;
            TRY(make_tuple(w, w->len - n));
            break;
        }
        case 'N': TRY(push(w, v)); break;
        case 0x88: v.kind = V_TRUE; TRY(push(w, v)); break;
        case 0x89: v.kind = V_FALSE; TRY(push(w, v)); break;
        case 'K':
            NEED(1);
            v.kind = V_INT;
            v.u.i = data[pos++];
            TRY(push(w, v));
            break;
        case 'M':
            NEED(2);
            v.kind = V_INT;
            v.u.i = (long long)little_endian(data + pos, 2);
            pos += 2;
            TRY(push(w, v));
            break;
        case 'J':
            NEED(4);
            v.kind = V_INT;
            v.u.i = (int32_t)(uint32_t)little_endian(data + pos, 4);
            pos += 4;
            TRY(push(w, v));
            break;
        case 0x8a: { /* LONG1: a signed little-endian int of n bytes; up to 8 read here */
            NEED(1);
            int n = data[pos++];
            NEED(n);
            if (n > 8) return -2;
            unsigned long long u = n ? little_endian(data + pos, n) : 0;
            if (n && n < 8 && (data[pos + n - 1] & 0x80)) u |= ~0ULL << (8 * n);
            pos += n;
            v.kind = V_INT;
            memcpy(&v.u.i, &u, 8);
            TRY(push(w, v));
            break;
        }
        case 'G': { /* BINFLOAT: big-endian IEEE 754 */
            NEED(8);
            uint64_t bits = 0;
            for (int b = 0; b < 8; b++) bits = (bits << 8) | data[pos + b];
            pos += 8;
            v.kind = V_FLOAT;
            memcpy(&v.u.f, &bits, 8);
            TRY(push(w, v));
            break;
        }
        case 0x8c:
        case 'X':
        case 0x8d: { /* SHORT_BINUNICODE, BINUNICODE, BINUNICODE8 */
            int width = op == 0x8c ? 1 : op == 'X' ? 4 : 8;
            NEED(width);
            unsigned long long n = little_endian(data + pos, width);
            pos += width;
            if (n > (unsigned long long)(end - pos)) return -2;
            TRY(push_str(w, (const char *)data + pos, (Py_ssize_t)n));
            pos += (Py_ssize_t)n;
            break;
        }
        case 'q': NEED(1); TRY(memo_put(w, data[pos++])); break;
        case 'r': NEED(4); TRY(memo_put(w, little_endian(data + pos, 4))); pos += 4; break;
        case 0x94: TRY(memo_put(w, (unsigned long long)w->memo_count)); break;
        case 'h': NEED(1); TRY(memo_get(w, data[pos++])); break;
        case 'j': NEED(4); TRY(memo_get(w, little_endian(data + pos, 4))); pos += 4; break;
        default: return -2; /* an opcode no dump of PyTorch's holds: the unpickler decides */
        }
    }
    return -2; /* no STOP: truncated */
#undef NEED
#undef TRY
}

/* The walker's large arrays, kept from one call to the next: made anew for each file, they cost more
 * in page faults than the walk itself. Safe without a lock: a call holds the GIL from start to end, and
 * what it calls runs no Python code (it makes only str, int, float, list, tuple and dict). */
static struct {
    Val *stack, *memo;
    unsigned char *memo_set;
    Py_ssize_t cap, memo_cap;
    Open *opens;
    Py_ssize_t open_cap;
    Buffer cols[WK_INT_COLUMNS + 1 + WK_ID_COLUMNS];
} kept;

static void walker_take(Walker *w) {
    w->stack = kept.stack;
    w->cap = kept.cap;
    w->memo = kept.memo;
    w->memo_set = kept.memo_set;
    w->memo_cap = kept.memo_cap;
    if (w->memo_set != NULL) memset(w->memo_set, 0, (size_t)w->memo_cap);
    w->opens = kept.opens;
    w->open_cap = kept.open_cap;
    for (int c = 0; c < WK_INT_COLUMNS + 1 + WK_ID_COLUMNS; c++) {
        w->cols[c] = kept.cols[c];
        w->cols[c].len = 0;
    }
    memset(&kept, 0, sizeof kept);
}

static void walker_free(Walker *w) {
    for (Py_ssize_t i = 0; i < w->open_len; i++) PyMem_Free(w->opens[i].items);
    kept.stack = w->stack;
    kept.cap = w->cap;
    kept.memo = w->memo;
    kept.memo_set = w->memo_set;
    kept.memo_cap = w->memo_cap;
    kept.opens = w->opens;
    kept.open_cap = w->open_cap;
    for (int c = 0; c < WK_INT_COLUMNS + 1 + WK_ID_COLUMNS; c++) kept.cols[c] = w->cols[c];
    PyMem_Free(w->marks);
    Py_XDECREF(w->objs);
    Py_XDECREF(w->shape_list);
    Py_XDECREF(w->entries_list);
    PyMem_Free(w->meta.data);
    PyMem_Free(w->scratch.data);
    interner_free(&w->made);
    interner_free(&w->shapes);
}

PyDoc_STRVAR(pickle_columns_doc,
             "pickle_columns(data, max_depth, max_nodes, keys) -> tuple | None\n\n"
             "A dump's pickle read in one pass: (top dict; rows; columns, a tuple of bytes: 8 int64, duration\n"
             "float64, shape and 5 raw ids uint32; shapes, a list of tuples of the 8 shape fields; objects, raw\n"
             "id -> object; the empty list that stands in the top dict for the entries read as rows, or None;\n"
             "the first creation time and the last time of any kind of the rows).\n"
             "``keys`` are reader._FAST_KEYS and \"entries\". None: read this file the other way (see the\n"
             "comment above walk()).");

static PyObject *pickle_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("pickle_columns", nargs, 4)) return NULL;
    if (!PyBytes_Check(args[0]) || !PyTuple_Check(args[3]) || PyTuple_Size(args[3]) != WK_KEYS + 1) {
        PyErr_SetString(PyExc_TypeError, "pickle_columns(data: bytes, max_depth, max_nodes, keys: 23 str)");
        return NULL;
    }
    Walker w;
    memset(&w, 0, sizeof w);
    w.max_depth = PyLong_AsLong(args[1]);
    w.max_nodes = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    for (int k = 0; k <= WK_KEYS; k++) {
        w.key_text[k] = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(args[3], k), &w.key_len[k]);
        if (w.key_text[k] == NULL) return NULL;
    }
    char *text;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(args[0], &text, &size) < 0) return NULL;
    walker_take(&w);
    w.objs = PyList_New(0);
    w.shape_list = PyList_New(0);
    PyObject *result = NULL;
    /* raw id 0 is None: a field of sizes, dtypes or frames that is None */
    int r = w.objs && w.shape_list && add_obj(&w, Py_NewRef(Py_None), 0, WK_OTHER, 1) == 0
                ? walk(&w, (const unsigned char *)text, size)
                : -1;
    if (r == 0) r = settle(&w, &w.stack[0], 0);
    if (r == 0 && (w.stack[0].kind != V_OBJ || !PyDict_Check(PyList_GetItem(w.objs, (Py_ssize_t)w.stack[0].u.i))))
        r = -2;
    if (r == 0) {
        PyObject *columns = PyTuple_New(WK_INT_COLUMNS + 1 + WK_ID_COLUMNS);
        for (int c = 0; columns != NULL && c < WK_INT_COLUMNS + 1 + WK_ID_COLUMNS; c++) {
            PyObject *b = PyBytes_FromStringAndSize(w.cols[c].data ? w.cols[c].data : "", w.cols[c].len);
            if (b == NULL) Py_CLEAR(columns);
            else PyTuple_SetItem(columns, c, b);
        }
        if (columns != NULL)
            result = Py_BuildValue("(OnNOOOLL)", PyList_GetItem(w.objs, (Py_ssize_t)w.stack[0].u.i), w.rows, columns,
                                   w.shape_list, w.objs, w.entries_list ? w.entries_list : Py_None, w.first, w.last);
        if (result == NULL) r = -1;
    }
    walker_free(&w);
    if (r == -2 || (r == -1 && result == NULL)) {
        /* give up, also on an error from making an object (an unhashable key, memory): the unpickler
         * says what is wrong */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return result;
}

PyDoc_STRVAR(gather_doc, "gather(ids, table, width) -> bytes\n\n"
                         "``table``'s item ``ids[i]`` for each i: ``ids`` uint32s, ``table`` items of ``width`` bytes\n"
                         "(columns.gather in Python).");

static PyObject *gather(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("gather", nargs, 3)) return NULL;
    char *ids, *table;
    Py_ssize_t ids_size, table_size, width = PyLong_AsSsize_t(args[2]);
    if ((width == -1 && PyErr_Occurred()) || PyBytes_AsStringAndSize(args[0], &ids, &ids_size) < 0 ||
        PyBytes_AsStringAndSize(args[1], &table, &table_size) < 0)
        return NULL;
    if (width < 1 || width > 8 || ids_size % 4 || table_size % width) {
        PyErr_SetString(PyExc_ValueError, "gather: ids of 4 bytes, a table of width 1 to 8");
        return NULL;
    }
    Py_ssize_t count = ids_size / 4, items = table_size / width;
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * width);
    if (out == NULL) return NULL;
    char *to = PyBytes_AsString(out);
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t id;
        memcpy(&id, ids + 4 * i, 4);
        if ((Py_ssize_t)id >= items) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_ValueError, "gather: an id past the table");
            return NULL;
        }
        memcpy(to + width * i, table + width * (Py_ssize_t)id, (size_t)width);
    }
    return out;
}

PyDoc_STRVAR(first_uses_doc, "first_uses(ids) -> list\n\n"
                             "The distinct uint32s of ``ids`` in order of first use (list(dict.fromkeys(ids))).");

static PyObject *first_uses(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("first_uses", nargs, 1)) return NULL;
    char *ids;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(args[0], &ids, &size) < 0) return NULL;
    Py_ssize_t count = size / 4;
    uint32_t top = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint32_t id;
        memcpy(&id, ids + 4 * i, 4);
        if (id > top) top = id;
    }
    unsigned char *seen = count ? PyMem_Calloc((size_t)top + 1, 1) : NULL;
    if (count && seen == NULL) return PyErr_NoMemory();
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < count; i++) {
        uint32_t id;
        memcpy(&id, ids + 4 * i, 4);
        if (seen[id]) continue;
        seen[id] = 1;
        PyObject *number = PyLong_FromUnsignedLong(id);
        if (number == NULL || PyList_Append(out, number) < 0) Py_CLEAR(out);
        Py_XDECREF(number);
    }
    PyMem_Free(seen);
    return out;
}

static PyMethodDef methods[] = {
    {"gather", (PyCFunction)(void (*)(void))gather, METH_FASTCALL, gather_doc},
    {"first_uses", (PyCFunction)(void (*)(void))first_uses, METH_FASTCALL, first_uses_doc},
    {"pickle_columns", (PyCFunction)(void (*)(void))pickle_columns, METH_FASTCALL, pickle_columns_doc},
    {"entries_from_columns", (PyCFunction)(void (*)(void))entries_from_columns, METH_FASTCALL,
     entries_from_columns_doc},
    {"match_collectives", (PyCFunction)(void (*)(void))match_collectives, METH_FASTCALL, match_collectives_doc},
    {"rank_items", (PyCFunction)(void (*)(void))rank_items, METH_FASTCALL, rank_items_doc},
    {"rank_groups", (PyCFunction)(void (*)(void))rank_groups, METH_FASTCALL, rank_groups_doc},
    {"lay_out_rows", (PyCFunction)(void (*)(void))lay_out_rows, METH_FASTCALL, lay_out_rows_doc},
    {"encode_rows", (PyCFunction)(void (*)(void))encode_rows, METH_FASTCALL, encode_rows_doc},
    {"scan_pickle", (PyCFunction)(void (*)(void))scan_pickle, METH_FASTCALL, scan_pickle_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fr2perfetto._speedups",
    .m_doc = "Optional C speed-ups for fr2perfetto's reader and Perfetto writer.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    /* The Python this runs on, not the one it was built with (Py_Version is not in the stable ABI of
     * 3.10). Where it cannot be told, as from 3.14: tuple.__new__ is right on every Python. */
    PyObject *hexversion = PySys_GetObject("hexversion"); /* borrowed */
    unsigned long running = hexversion != NULL ? PyLong_AsUnsignedLong(hexversion) : 0;
    if (running == (unsigned long)-1 && PyErr_Occurred()) PyErr_Clear();
    hash_cached = hexversion == NULL || running == (unsigned long)-1 || running >= 0x030E0000;
    if ((tuple_new = (newfunc)PyType_GetSlot(&PyTuple_Type, Py_tp_new)) == NULL ||
        (str_encoded = PyUnicode_InternFromString("encoded")) == NULL ||
        (str_timed = PyUnicode_InternFromString("timed")) == NULL ||
        (str_missing = PyUnicode_InternFromString("missing")) == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ImportError, "fr2perfetto._speedups: no tuple.__new__");
        return NULL;
    }
    return PyModule_Create(&module);
}
