/* Optional C speed-ups for the loops that run once per entry or per slice of a conversion.
 *
 * Each function does exactly what a Python twin in fr2perfetto does, for the common case only, and
 * leaves every other case to that twin, so results never depend on which path ran:
 *
 * - read_rows() reads 2.x entries as reader._read_entry_fast does, for entries whose repeating fields
 *   (op, group, state, thread, sizes, dtypes, stack) the Python reader has already checked; it stops at
 *   the first entry that is not so and lets the Python reader take it. It only looks values up and
 *   compares types and ranges; it allocates only in proportion to what the dump already holds in
 *   memory and never indexes by a number the dump gives. The dump holds plain data (the unpickler
 *   allows nothing else), so nothing here runs Python code.
 * - entries_from_columns() is job._entries_from_columns: entries from the columns a reading process sent;
 *   canonical_column() is job._canonical_column, which makes the ranks' equal strings and tuples one object.
 * - bucket_collectives() and scan_op() are match._bucket_collectives and match._scan_in_python (the
 *   latter for ops where every rank holds one entry).
 * - ops_by_rank() is timeline.ops_by_rank for every rank, the ops of each rank;
 * - by_group() is streams._by_group, the partition of a rank's ops by group;
 * - lay_out_collectives() lays out a rank's completed collectives as streams._group does, for those
 *   whose looks are made; every other op goes back to streams.
 * - scan_pickle() is pickle_shape.scan: how deep and how large what a pickle describes would be,
 *   measured on a model of the unpickler's stack before anything is unpickled.
 * - encode_slices() writes the bytes PerfettoWriter._slice_packets writes, for a slice whose look the
 *   writer has already encoded, whose ids and thread it has already met, and whose times are nine-byte
 *   varints, and for an instant that stands for no entry (an enqueue); everything else goes to the
 *   Python fallback it is given.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

/* 1 when a function was called with ``expected`` arguments; else 0, with TypeError set. */
static int takes(const char *function, Py_ssize_t nargs, Py_ssize_t expected) {
    if (nargs == expected) return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", function, expected);
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------------- */

#define FAST_KEY_COUNT 22

/* 1 when value is an int (not a bool) in 0..2**63-1. */
static int is_count(PyObject *value) {
    if (!PyLong_CheckExact(value)) return 0;
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (number == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return number >= 0;
}

/* dict.get(key) as the Python reader does it: NULL (no error) when absent or unhashable. Borrowed. */
static PyObject *lookup(PyObject *table, PyObject *key) {
    PyObject *found = PyDict_GetItemWithError(table, key);
    if (found == NULL) PyErr_Clear();
    return found;
}

/* The last few keys looked up in one of the reader's caches and what they found. Entries repeat a few
 * sizes, dtypes, stacks and shapes over and over: a raw value that equals a recent key (as a dict
 * lookup compares, ``==``) finds the same, without making the key anew. The cache dicts only grow
 * while a dump is read, so a value found stays valid. */
#define RECENT 4
typedef struct {
    PyObject *keys[RECENT]; /* new references, or NULL */
    PyObject *values[RECENT]; /* borrowed from the cache dict */
    int next;
} Recent;

typedef struct {
    Recent shapes, sizes, dtypes, frames;
} Recents;

static void recent_clear(Recent *recent) {
    for (int i = 0; i < RECENT; i++) Py_CLEAR(recent->keys[i]);
}

/* table.get(key) for a key just made (a new reference, consumed; NULL when it could not be made),
 * remembered in ``recent`` when found: the cached, already checked value, or NULL (no error). Borrowed. */
static PyObject *cached(PyObject *table, PyObject *key, Recent *recent) {
    if (key == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *found = lookup(table, key);
    if (found == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    int slot = recent->next;
    recent->next = (slot + 1) % RECENT;
    Py_XSETREF(recent->keys[slot], key);
    recent->values[slot] = found;
    return found;
}

/* 1 when a and b are equal as a dict lookup compares keys; 0 when not, or when they cannot be compared. */
static int same(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    int equal = PyObject_RichCompareBool(a, b, Py_EQ);
    if (equal < 0) PyErr_Clear();
    return equal > 0;
}

static int same_items(PyObject *raw, PyObject *key, int depth);

/* 1 when items[0:size] equal ``key`` (a tuple) item by item; when depth is 2, each item is a list or
 * tuple that equals the tuple at its place in ``key`` item by item. */
static int same_array(PyObject *const *items, Py_ssize_t size, PyObject *key, int depth) {
    if (!PyTuple_CheckExact(key) || size != PyTuple_GET_SIZE(key)) return 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *expected = PyTuple_GET_ITEM(key, i);
        if (!(depth > 1 ? same_items(items[i], expected, depth - 1) : same(items[i], expected))) return 0;
    }
    return 1;
}

/* 1 when ``raw`` (a list or tuple) equals ``key`` as same_array compares: what tuple(raw) (or, when
 * depth is 2, tuple(map(tuple, raw))) would equal. */
static int same_items(PyObject *raw, PyObject *key, int depth) {
    if (!PyList_CheckExact(raw) && !PyTuple_CheckExact(raw)) return 0;
    return same_array(PySequence_Fast_ITEMS(raw), PySequence_Fast_GET_SIZE(raw), key, depth);
}

/* The value a recent key equal to items[0:size] (see same_array) found; NULL (no error) when none is.
 * Borrowed. */
static PyObject *recent_match(Recent *recent, PyObject *const *items, Py_ssize_t size, int depth) {
    for (int i = 0; i < RECENT; i++)
        if (recent->keys[i] != NULL && same_array(items, size, recent->keys[i], depth)) return recent->values[i];
    return NULL;
}

/* tuple(map(tuple, value)) as a lookup key; NULL (no error) when an item is not iterable. New reference. */
static PyObject *tuple_of_tuples(PyObject *value) {
    Py_ssize_t size = PySequence_Fast_GET_SIZE(value);
    PyObject *key = PyTuple_New(size);
    if (key == NULL) return NULL;
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *inner = PySequence_Tuple(PySequence_Fast_GET_ITEM(value, i));
        if (inner == NULL) {
            Py_DECREF(key);
            return NULL;
        }
        PyTuple_SET_ITEM(key, i, inner);
    }
    return key;
}

/* The cached sizes (depth 2) or dtypes (depth 1) for a list already read; NULL when not cached. Borrowed. */
static PyObject *known_items(PyObject *table, Recent *recent, PyObject *value, int depth) {
    if (!PyList_CheckExact(value) && !PyTuple_CheckExact(value)) return NULL;
    PyObject *found = recent_match(recent, PySequence_Fast_ITEMS(value), PySequence_Fast_GET_SIZE(value), depth);
    if (found != NULL) return found;
    return cached(table, depth > 1 ? tuple_of_tuples(value) : PySequence_Tuple(value), recent);
}

/* The shared tuple of frames for a stack already read (reader._frames' cache); NULL when not cached.
 * Borrowed. An empty stack is the empty tuple. */
static PyObject *known_frames(PyObject *frame_tuples, Recent *recent, PyObject *value, PyObject *empty) {
    if (!PyList_CheckExact(value) && !PyTuple_CheckExact(value)) return NULL;
    Py_ssize_t size = PySequence_Fast_GET_SIZE(value);
    if (size == 0) return empty;
    PyObject *const *items = PySequence_Fast_ITEMS(value);
    for (int r = 0; r < RECENT; r++) { /* the same frame dicts as a recent stack: its frames */
        PyObject *ids = recent->keys[r];
        if (ids == NULL || PyTuple_GET_SIZE(ids) != size) continue;
        Py_ssize_t i = 0;
        while (i < size && PyLong_AsVoidPtr(PyTuple_GET_ITEM(ids, i)) == (void *)items[i]) i++;
        if (i == size) return recent->values[r];
    }
    PyObject *ids = PyTuple_New(size);
    for (Py_ssize_t i = 0; ids != NULL && i < size; i++) {
        PyObject *id = PyLong_FromVoidPtr(items[i]);
        if (id == NULL) Py_CLEAR(ids);
        else PyTuple_SET_ITEM(ids, i, id);
    }
    return cached(frame_tuples, ids, recent);
}

/* The remembered shape of an entry whose repeating fields are values[0:count]; NULL when not
 * remembered. Borrowed. */
static PyObject *known_shape(PyObject *shapes, Recent *recent, PyObject *const *values, int count) {
    PyObject *found = recent_match(recent, values, count, 1);
    if (found != NULL) return found;
    PyObject *key = PyTuple_New(count);
    for (int i = 0; key != NULL && i < count; i++) PyTuple_SET_ITEM(key, i, Py_NewRef(values[i]));
    return cached(shapes, key, recent);
}

/* One entry as reader._read_entry_fast reads it, but only when every repeating field is already in
 * the caches: a new row (a plain tuple of Entry's fields), or NULL with no error set. */
static PyObject *read_row(PyObject *item, PyObject *rank, PyObject *const *keys, PyObject *shapes, PyObject *sizes,
                          PyObject *dtypes, PyObject *frame_tuples, PyObject *empty, Recents *recents) {
    PyObject *values[FAST_KEY_COUNT];
    if (!PyDict_CheckExact(item)) return NULL;
    for (int i = 0; i < FAST_KEY_COUNT; i++) {
        values[i] = PyDict_GetItemWithError(item, keys[i]); /* borrowed: the dict keeps them alive */
        if (values[i] == NULL) {
            PyErr_Clear();
            return NULL;
        }
    }
    /* record_id, pg_id, collective_seq_id, p2p_seq_id, op_id, time_created_ns */
    for (int i = 0; i < 6; i++)
        if (!is_count(values[i])) return NULL;
    PyObject *started = values[6], *completed = values[7], *duration = values[8];
    if (started != Py_None && !is_count(started)) return NULL;
    if (completed != Py_None && !is_count(completed)) return NULL;
    if (duration != Py_None && !(PyFloat_CheckExact(duration) && isfinite(PyFloat_AS_DOUBLE(duration))))
        return NULL;
    for (int i = 9; i < 13; i++)
        if (!PyList_CheckExact(values[i]) && !PyTuple_CheckExact(values[i])) return NULL;
    /* retired, is_p2p, timeout_ms, thread_id, thread_name */
    if (!PyBool_Check(values[17]) || !PyBool_Check(values[18]) || !PyLong_CheckExact(values[19]) ||
        !PyUnicode_CheckExact(values[20]) || !PyUnicode_CheckExact(values[21]))
        return NULL;
    PyObject *shape = known_shape(shapes, &recents->shapes, values + 14, FAST_KEY_COUNT - 14);
    if (shape == NULL || !PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) != 11) return NULL;
    PyObject *sizes_in = known_items(sizes, &recents->sizes, values[9], 2);
    PyObject *sizes_out = sizes_in == NULL ? NULL : known_items(sizes, &recents->sizes, values[10], 2);
    PyObject *dtypes_in = sizes_out == NULL ? NULL : known_items(dtypes, &recents->dtypes, values[11], 1);
    PyObject *dtypes_out = dtypes_in == NULL ? NULL : known_items(dtypes, &recents->dtypes, values[12], 1);
    PyObject *frames = dtypes_out == NULL ? NULL : known_frames(frame_tuples, &recents->frames, values[13], empty);
    if (frames == NULL) return NULL;
    PyObject *zero_is_none[2] = {started, completed}; /* `started or None`: 0 means unknown */
    for (int i = 0; i < 2; i++)
        if (zero_is_none[i] != Py_None && PyObject_Not(zero_is_none[i]) == 1) zero_is_none[i] = Py_None;
    PyObject *row = PyTuple_Pack(
        27, rank, PyTuple_GET_ITEM(shape, 0), PyTuple_GET_ITEM(shape, 1), values[1], values[0], values[2], values[3],
        values[4], PyTuple_GET_ITEM(shape, 2), PyTuple_GET_ITEM(shape, 3), PyTuple_GET_ITEM(shape, 4),
        PyTuple_GET_ITEM(shape, 5), sizes_in, sizes_out, dtypes_in, dtypes_out, PyTuple_GET_ITEM(shape, 6),
        PyTuple_GET_ITEM(shape, 7), values[5], zero_is_none[0], zero_is_none[1], duration, PyTuple_GET_ITEM(shape, 8),
        PyTuple_GET_ITEM(shape, 9), PyTuple_GET_ITEM(shape, 10), frames, Py_None);
    if (row == NULL) PyErr_Clear();
    return row;
}

/* ``keys`` as the dump spells them: the key objects of its first entry where equal. A dump's pickle
 * holds each key once, so every entry's dict then finds them by identity, without comparing text. */
static void own_keys(PyObject *entries, PyObject *const *keys, PyObject **out) {
    for (int i = 0; i < FAST_KEY_COUNT; i++) out[i] = keys[i];
    if (PyList_GET_SIZE(entries) == 0 || !PyDict_CheckExact(PyList_GET_ITEM(entries, 0))) return;
    PyObject *first = PyList_GET_ITEM(entries, 0), *key, *value;
    Py_ssize_t position = 0;
    while (PyDict_Next(first, &position, &key, &value)) {
        if (!PyUnicode_CheckExact(key)) continue;
        for (int i = 0; i < FAST_KEY_COUNT; i++)
            if (out[i] == keys[i] && key != keys[i] && PyUnicode_Compare(key, keys[i]) == 0) out[i] = key;
    }
}

PyDoc_STRVAR(read_rows_doc,
             "read_rows(entries, start, rank, keys, shapes, sizes, dtypes, frame_tuples, entry_type, out) -> int\n\n"
             "Read entries[start:] as reader._read_entry_fast would, appending each row (made an\n"
             "``entry_type`` when that is not None) to ``out``, up to the first entry whose repeating\n"
             "fields are not cached yet; return that entry's index (len(entries) when none).");

static PyObject *read_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("read_rows", nargs, 10)) return NULL;
    PyObject *entries = args[0], *rank = args[2], *keys = args[3], *shapes = args[4], *sizes = args[5];
    PyObject *dtypes = args[6], *frame_tuples = args[7], *entry_type = args[8], *out = args[9];
    Py_ssize_t index = PyLong_AsSsize_t(args[1]);
    if (index == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(entries) || !PyList_Check(out) || !PyDict_CheckExact(shapes) ||
        !PyDict_CheckExact(sizes) || !PyDict_CheckExact(dtypes) || !PyDict_CheckExact(frame_tuples) ||
        !PyTuple_CheckExact(keys) || PyTuple_GET_SIZE(keys) != FAST_KEY_COUNT ||
        (entry_type != Py_None && !(PyType_Check(entry_type) &&
                                    PyType_IsSubtype((PyTypeObject *)entry_type, &PyTuple_Type)))) {
        PyErr_SetString(PyExc_TypeError, "read_rows: bad arguments");
        return NULL;
    }
    PyObject *const *key_items = PySequence_Fast_ITEMS(keys);
    for (int i = 0; i < FAST_KEY_COUNT; i++)
        if (!PyUnicode_CheckExact(key_items[i])) {
            PyErr_SetString(PyExc_TypeError, "read_rows: keys must be strings");
            return NULL;
        }
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL) return NULL;
    PyObject *keys_here[FAST_KEY_COUNT];
    own_keys(entries, key_items, keys_here);
    Recents recents = {0};
    PyObject *result = NULL;
    for (; index >= 0 && index < PyList_GET_SIZE(entries); index++) {
        PyObject *item = PyList_GET_ITEM(entries, index);
        Py_INCREF(item);
        PyObject *row = read_row(item, rank, keys_here, shapes, sizes, dtypes, frame_tuples, empty, &recents);
        Py_DECREF(item);
        if (row == NULL) break;
        if (entry_type != Py_None) {
            PyObject *wrapped = PyTuple_Pack(1, row);
            Py_DECREF(row);
            if (wrapped == NULL) goto finish;
            row = PyTuple_Type.tp_new((PyTypeObject *)entry_type, wrapped, NULL); /* tuple.__new__(Entry, row) */
            Py_DECREF(wrapped);
            if (row == NULL) goto finish;
        }
        int appended = PyList_Append(out, row);
        Py_DECREF(row);
        if (appended < 0) goto finish;
    }
    result = PyLong_FromSsize_t(index);
finish:
    Py_DECREF(empty);
    recent_clear(&recents.shapes);
    recent_clear(&recents.sizes);
    recent_clear(&recents.dtypes);
    recent_clear(&recents.frames);
    return result;
}

PyDoc_STRVAR(entries_from_columns_doc,
             "entries_from_columns(entry_type, columns) -> list\n\n"
             "job._entries_from_columns: one ``entry_type`` (a tuple subclass) per row of ``columns``, a list\n"
             "of equally long tuples, one per field.");

static PyObject *entries_from_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type) ||
        !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "entries_from_columns(entry_type, columns)");
        return NULL;
    }
    PyTypeObject *entry_type = (PyTypeObject *)args[0];
    PyObject *columns = args[1];
    Py_ssize_t fields = PyList_GET_SIZE(columns), rows = fields ? -1 : 0;
    for (Py_ssize_t f = 0; f < fields; f++) {
        PyObject *column = PyList_GET_ITEM(columns, f);
        if (!PyTuple_CheckExact(column) || (rows >= 0 && PyTuple_GET_SIZE(column) != rows)) {
            PyErr_SetString(PyExc_ValueError, "entries_from_columns: columns must be tuples of one length");
            return NULL;
        }
        rows = PyTuple_GET_SIZE(column);
    }
    PyObject *entries = PyList_New(rows);
    if (entries == NULL) return NULL;
    for (Py_ssize_t r = 0; r < rows; r++) {
        /* as tuple.__new__(entry_type, row) does it: allocate the subclass, then fill it */
        PyObject *entry = entry_type->tp_alloc(entry_type, fields);
        if (entry == NULL) {
            Py_DECREF(entries);
            return NULL;
        }
        for (Py_ssize_t f = 0; f < fields; f++)
            PyTuple_SET_ITEM(entry, f, Py_NewRef(PyTuple_GET_ITEM(PyList_GET_ITEM(columns, f), r)));
        PyList_SET_ITEM(entries, r, entry);
    }
    return entries;
}

PyDoc_STRVAR(canonical_column_doc,
             "canonical_column(column, canonical) -> tuple\n\n"
             "job._canonical_column: ``column`` (a tuple) with each str and tuple in it replaced by the equal\n"
             "one ``canonical`` (a dict, value -> itself, filled as it goes) already holds.");

static PyObject *canonical_column(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("canonical_column", nargs, 2)) return NULL;
    PyObject *column = args[0], *canonical = args[1];
    if (!PyTuple_CheckExact(column) || !PyDict_CheckExact(canonical)) {
        PyErr_SetString(PyExc_TypeError, "canonical_column(column: tuple, canonical: dict)");
        return NULL;
    }
    /* a column repeats a few values: the last ones met, and the canonical ones they stand for */
    PyObject *met[RECENT] = {NULL}, *stands_for[RECENT] = {NULL};
    int next = 0;
    Py_ssize_t size = PyTuple_GET_SIZE(column);
    PyObject *out = PyTuple_New(size);
    for (Py_ssize_t i = 0; out != NULL && i < size; i++) {
        PyObject *value = PyTuple_GET_ITEM(column, i), *shared = value;
        if (PyUnicode_CheckExact(value) || PyTuple_CheckExact(value)) {
            int r = 0;
            while (r < RECENT && met[r] != value) r++;
            if (r < RECENT) {
                shared = stands_for[r];
            } else {
                shared = PyDict_SetDefault(canonical, value, value); /* borrowed: the dict holds it */
                if (shared == NULL) { /* unhashable: it stays as it is */
                    PyErr_Clear();
                    shared = value;
                }
                met[next] = value; /* borrowed: the column holds it */
                stands_for[next] = shared;
                next = (next + 1) % RECENT;
            }
        }
        PyTuple_SET_ITEM(out, i, Py_NewRef(shared));
    }
    return out;
}

/* ---- matching ------------------------------------------------------------------------------------ */

/* Indices of Entry's fields, checked against the entries: every entry must be a tuple this long. */
static int read_indices(PyObject *tuple, Py_ssize_t *indices, Py_ssize_t count, Py_ssize_t *needed) {
    if (!PyTuple_CheckExact(tuple) || PyTuple_GET_SIZE(tuple) != count) {
        PyErr_SetString(PyExc_TypeError, "bad tuple of entry field indices");
        return -1;
    }
    *needed = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        indices[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(tuple, i));
        if (indices[i] == -1 && PyErr_Occurred()) return -1;
        if (indices[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "negative entry field index");
            return -1;
        }
        if (indices[i] + 1 > *needed) *needed = indices[i] + 1;
    }
    return 0;
}

static int is_entry(PyObject *entry, Py_ssize_t needed) {
    if (PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) >= needed) return 1;
    PyErr_SetString(PyExc_TypeError, "not an entry");
    return 0;
}

/* table[key], made by make() when absent. Borrowed; NULL on error. */
static PyObject *get_or_make(PyObject *table, PyObject *key, PyObject *(*make)(Py_ssize_t)) {
    PyObject *found = PyDict_GetItemWithError(table, key);
    if (found != NULL || PyErr_Occurred()) return found;
    PyObject *made = make(0);
    if (made == NULL) return NULL;
    int set = PyDict_SetItem(table, key, made);
    Py_DECREF(made);
    return set < 0 ? NULL : made;
}

static PyObject *new_dict(Py_ssize_t unused) {
    (void)unused;
    return PyDict_New();
}

/* The span of collective seqs seen of (rank, group): widen covered[key] = [first, last] to seq. */
static int widen_span(PyObject *covered, PyObject *key, PyObject *seq) {
    PyObject *span = PyDict_GetItemWithError(covered, key);
    if (span == NULL) {
        if (PyErr_Occurred()) return -1;
        span = PyList_New(2);
        if (span == NULL) return -1;
        Py_INCREF(seq);
        Py_INCREF(seq);
        PyList_SET_ITEM(span, 0, seq);
        PyList_SET_ITEM(span, 1, seq);
        int set = PyDict_SetItem(covered, key, span);
        Py_DECREF(span);
        return set;
    }
    if (!PyList_CheckExact(span) || PyList_GET_SIZE(span) != 2) {
        PyErr_SetString(PyExc_TypeError, "a covered span must be a list of two seqs");
        return -1;
    }
    int above = PyObject_RichCompareBool(seq, PyList_GET_ITEM(span, 1), Py_GT);
    if (above < 0) return -1;
    if (above) return PyList_SetItem(span, 1, Py_NewRef(seq));
    int below = PyObject_RichCompareBool(seq, PyList_GET_ITEM(span, 0), Py_LT);
    if (below < 0) return -1;
    return below ? PyList_SetItem(span, 0, Py_NewRef(seq)) : 0;
}

PyDoc_STRVAR(bucket_collectives_doc,
             "bucket_collectives(entries, rank, groups_by_name, collectives, covered, fields) -> list\n\n"
             "match._bucket_collectives: file each collective entry of one rank under its (group, seq)\n"
             "and widen its (rank, group) span; return the rank's p2p entries, in order.");

static PyObject *bucket_collectives(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("bucket_collectives", nargs, 6)) return NULL;
    PyObject *entries = args[0], *rank = args[1], *groups_by_name = args[2], *collectives = args[3];
    PyObject *covered = args[4];
    Py_ssize_t fields[3], needed; /* group_name, is_p2p, collective_seq */
    if (!PyList_CheckExact(entries) || !PyDict_Check(groups_by_name) || !PyDict_Check(collectives) ||
        !PyDict_Check(covered)) {
        PyErr_SetString(PyExc_TypeError, "bucket_collectives: bad arguments");
        return NULL;
    }
    if (read_indices(args[5], fields, 3, &needed) < 0) return NULL;
    PyObject *p2p = PyList_New(0);
    if (p2p == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
        PyObject *entry = Py_NewRef(PyList_GET_ITEM(entries, i));
        PyObject *key = NULL, *span_key = NULL;
        int ok = 0;
        if (!is_entry(entry, needed)) goto next;
        int is_p2p = PyObject_IsTrue(PyTuple_GET_ITEM(entry, fields[1]));
        if (is_p2p < 0) goto next;
        if (is_p2p) {
            ok = PyList_Append(p2p, entry) == 0;
            goto next;
        }
        PyObject *group = PyDict_GetItemWithError(groups_by_name, PyTuple_GET_ITEM(entry, fields[0]));
        if (group == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, PyTuple_GET_ITEM(entry, fields[0]));
            goto next;
        }
        PyObject *seq = PyTuple_GET_ITEM(entry, fields[2]);
        if ((key = PyTuple_Pack(2, group, seq)) == NULL) goto next;
        PyObject *by_rank = get_or_make(collectives, key, new_dict);
        PyObject *list = by_rank == NULL ? NULL : get_or_make(by_rank, rank, PyList_New);
        if (list == NULL || PyList_Append(list, entry) < 0) goto next;
        if ((span_key = PyTuple_Pack(2, rank, group)) == NULL) goto next;
        ok = widen_span(covered, span_key, seq) == 0;
    next:
        Py_XDECREF(key);
        Py_XDECREF(span_key);
        Py_DECREF(entry);
        if (!ok) {
            Py_DECREF(p2p);
            return NULL;
        }
    }
    return p2p;
}

PyDoc_STRVAR(scan_op_doc,
             "scan_op(entries_by_rank, fields, completed, scheduled, untracked_backends) -> tuple | None\n\n"
             "match._scan_in_python for an op where every rank holds one entry: (first time, alike,\n"
             "pending, creation times, states); None when some rank holds several (a coalesced group).");

static PyObject *scan_op(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("scan_op", nargs, 5)) return NULL;
    PyObject *by_rank = args[0], *completed = args[2], *scheduled = args[3], *untracked = args[4];
    /* time_created_ns, op, input_sizes, input_dtypes, state, backend, closed_by */
    Py_ssize_t fields[7], needed;
    if (!PyDict_Check(by_rank) || !PyTuple_Check(untracked)) {
        PyErr_SetString(PyExc_TypeError, "scan_op: bad arguments");
        return NULL;
    }
    if (read_indices(args[1], fields, 7, &needed) < 0) return NULL;
    Py_ssize_t position = 0, pending = 0, count = 0;
    PyObject *rank, *entries, *first_time = NULL, *reference = NULL;
    int alike = 1;
    if (PyDict_GET_SIZE(by_rank) == 0) Py_RETURN_NONE;
    PyObject *created_ns = PyList_New(PyDict_GET_SIZE(by_rank)), *states = PyList_New(PyDict_GET_SIZE(by_rank));
    if (created_ns == NULL || states == NULL) goto error;
    /* Nothing here runs Python code that could change the dict: entries hold plain values. */
    while (PyDict_Next(by_rank, &position, &rank, &entries)) {
        if (!PyList_CheckExact(entries) || PyList_GET_SIZE(entries) != 1) {
            Py_DECREF(created_ns);
            Py_DECREF(states);
            Py_RETURN_NONE;
        }
        PyObject *head = PyList_GET_ITEM(entries, 0);
        if (!is_entry(head, needed)) goto error;
        PyObject *created = PyTuple_GET_ITEM(head, fields[0]);
        PyList_SET_ITEM(created_ns, count, Py_NewRef(created));
        if (first_time == NULL) {
            first_time = created;
        } else {
            int earlier = PyObject_RichCompareBool(created, first_time, Py_LT);
            if (earlier < 0) goto error;
            if (earlier) first_time = created;
        }
        if (reference == NULL) {
            reference = head;
        } else if (alike) {
            for (int i = 1; i < 4 && alike; i++) {
                int differs = PyObject_RichCompareBool(PyTuple_GET_ITEM(head, fields[i]),
                                                       PyTuple_GET_ITEM(reference, fields[i]), Py_NE);
                if (differs < 0) goto error;
                if (differs) alike = 0;
            }
        }
        PyObject *last = PyTuple_GET_ITEM(head, fields[6]);
        if (last == Py_None) last = head;
        else if (!is_entry(last, needed)) goto error;
        PyObject *state = PyTuple_GET_ITEM(last, fields[4]);
        PyList_SET_ITEM(states, count++, Py_NewRef(state));
        int done = PyObject_RichCompareBool(state, completed, Py_EQ);
        if (done < 0) goto error;
        if (done) continue;
        /* tracks_completion(last): a backend that records completion, or a state past scheduled */
        int untracked_backend = PySequence_Contains(untracked, PyTuple_GET_ITEM(last, fields[5]));
        if (untracked_backend < 0) goto error;
        int is_scheduled = untracked_backend ? PyObject_RichCompareBool(state, scheduled, Py_EQ) : 0;
        if (is_scheduled < 0) goto error;
        if (!untracked_backend || !is_scheduled) pending++;
    }
    if (count != PyList_GET_SIZE(created_ns)) {
        PyErr_SetString(PyExc_RuntimeError, "scan_op: the op's entries changed while it was scanned");
        goto error;
    }
    return Py_BuildValue("(OOnNN)", first_time, alike ? Py_True : Py_False, pending, created_ns, states);
error:
    Py_XDECREF(created_ns);
    Py_XDECREF(states);
    return NULL;
}


/* ---- laying out --------------------------------------------------------------------------------- */

static PyObject *str_op_key;

#define MAX_LOOK_FIELDS 16

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

/* A Slice (a tuple subclass) of six items, as tuple.__new__(Slice, items) makes it. Steals the refs. */
static PyObject *new_slice(PyTypeObject *type, PyObject *start, PyObject *end, PyObject *look, PyObject *head,
                           PyObject *last, PyObject *flows) {
    PyObject *made = start && end && flows ? type->tp_alloc(type, 6) : NULL;
    if (made == NULL) {
        Py_XDECREF(start);
        Py_XDECREF(end);
        Py_XDECREF(flows);
        Py_DECREF(look);
        Py_DECREF(head);
        Py_DECREF(last);
        return NULL;
    }
    PyTuple_SET_ITEM(made, 0, start);
    PyTuple_SET_ITEM(made, 1, end);
    PyTuple_SET_ITEM(made, 2, look);
    PyTuple_SET_ITEM(made, 3, head);
    PyTuple_SET_ITEM(made, 4, last);
    PyTuple_SET_ITEM(made, 5, flows);
    return made;
}

PyDoc_STRVAR(lay_out_collectives_doc,
             "lay_out_collectives(items, position, free, late, slices, context) -> (position, free, late)\n\n"
             "streams._group's common case, from ``position`` on: a completed collective a rank issued as one\n"
             "entry, on a stream nothing holds, enqueued by the thread of the last enqueue, whose looks are\n"
             "made (and no role to add). Its slice goes to ``slices``, its enqueue to the thread's instants,\n"
             "its lateness to the points where it changes, as streams does; stops at the first item that\n"
             "is not so. An op whose looks are not made yet has them made by ``prepare(op, entries)`` (last in\n"
             "the context; true: worth a second look), once. Lateness is measured on the group's clock: the\n"
             "rank's runs ``late_offset`` (last in the context) ahead of it.");

static PyObject *lay_out_collectives(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("lay_out_collectives", nargs, 6)) return NULL;
    PyObject *items = args[0], *slices = args[4];
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    long long free_at = PyLong_AsLongLong(args[2]);
    double last_late = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    PyTypeObject *slice_type;
    long long offset, launch_base;
    PyObject *points, *thread_id, *thread_name, *instants, *last_looks, *enqueue_looks, *references, *roles;
    PyObject *entry_fields, *look_fields, *prepare;
    long long late_offset;
    double step;
    if (!PyList_CheckExact(items) || !PyList_CheckExact(slices) ||
        !PyArg_ParseTuple(args[5], "O!LLO!OOO!O!O!O!OO!O!dOL;lay_out_collectives: bad context", &PyType_Type,
                          &slice_type, &offset, &launch_base, &PyList_Type, &points, &thread_id, &thread_name,
                          &PyList_Type, &instants, &PyDict_Type, &last_looks, &PyDict_Type, &enqueue_looks,
                          &PyDict_Type, &references, &roles, &PyTuple_Type, &entry_fields, &PyTuple_Type,
                          &look_fields, &step, &prepare, &late_offset))
        return NULL;
    if (!PyAnySet_Check(roles)) {
        PyErr_SetString(PyExc_TypeError, "lay_out_collectives: the rank's roles must be a set of op keys");
        return NULL;
    }
    Py_ssize_t fields[6], looked[MAX_LOOK_FIELDS], needed, look_needed;
    Py_ssize_t look_count = PyTuple_GET_SIZE(look_fields);
    if (read_indices(entry_fields, fields, 6, &needed) < 0) return NULL;
    if (look_count > MAX_LOOK_FIELDS || read_indices(look_fields, looked, look_count, &look_needed) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "too many look fields");
        return NULL;
    }
    if (look_needed > needed) needed = look_needed;
    const Py_ssize_t created_at = fields[0], started_at = fields[1], completed_at = fields[2], closed_at = fields[3];
    const Py_ssize_t thread_id_at = fields[4], thread_name_at = fields[5];
    Py_ssize_t count = PyList_GET_SIZE(items);
    for (; position < count; position++) {
        PyObject *item = PyList_GET_ITEM(items, position);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) break;
        PyObject *op = PyTuple_GET_ITEM(item, 0), *entries = PyTuple_GET_ITEM(item, 1);
        if (!PyList_CheckExact(entries) || PyList_GET_SIZE(entries) != 1) break;
        PyObject *entry = PyList_GET_ITEM(entries, 0);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < needed) break;
        long long created, started = 0, completed;
        PyObject *started_value = PyTuple_GET_ITEM(entry, started_at);
        if (PyTuple_GET_ITEM(entry, closed_at) != Py_None || !int_field(PyTuple_GET_ITEM(entry, created_at), &created) ||
            !int_field(PyTuple_GET_ITEM(entry, completed_at), &completed) || completed == 0 ||
            (started_value != Py_None && !int_field(started_value, &started)))
            break;
        if (!same(PyTuple_GET_ITEM(entry, thread_id_at), thread_id) ||
            !same(PyTuple_GET_ITEM(entry, thread_name_at), thread_name))
            break;
        /* last_looks holds collectives only: a look found there says the op is one */
        PyObject *op_key = PyObject_GetAttr(op, str_op_key);
        if (op_key == NULL) return NULL;
        long long key;
        PyObject *look = NULL, *enqueue_look = NULL, *reference = NULL;
        int fast = int_field(op_key, &key);
        if (fast && PySet_GET_SIZE(roles) > 0) { /* a role of this rank in the op: its look is Python's */
            fast = PySet_Contains(roles, op_key) == 0;
            PyErr_Clear();
        }
        /* the first rank to meet an op has its looks made (``prepare``), once, and tries again */
        for (int attempt = 0; fast; attempt++) {
            PyObject *cached = PyDict_GetItemWithError(last_looks, op_key);
            int found = cached != NULL && PyTuple_CheckExact(cached) && PyTuple_GET_SIZE(cached) == 2;
            if (found) {
                PyObject *before = PyTuple_GET_ITEM(cached, 0);
                found = PyTuple_Check(before) && PyTuple_GET_SIZE(before) >= needed &&
                        (PyTuple_GET_ITEM(before, started_at) == Py_None) == (started_value == Py_None);
                for (Py_ssize_t i = 0; found && before != entry && i < look_count; i++)
                    found = same(PyTuple_GET_ITEM(before, looked[i]), PyTuple_GET_ITEM(entry, looked[i]));
                look = PyTuple_GET_ITEM(cached, 1);
            }
            if (found) found = (enqueue_look = PyDict_GetItemWithError(enqueue_looks, op_key)) != NULL;
            /* when its members enqueued it (None: it has one member, and no lateness) */
            if (found) found = (reference = PyDict_GetItemWithError(references, op_key)) != NULL;
            if (found || attempt > 0 || PyErr_Occurred()) {
                fast = found;
                break;
            }
            PyObject *made = PyObject_CallFunctionObjArgs(prepare, op, entries, NULL);
            if (made == NULL) {
                Py_DECREF(op_key);
                return NULL;
            }
            fast = PyObject_IsTrue(made) == 1;
            Py_DECREF(made);
        }
        long long late_reference = 0;
        int members = fast && reference != Py_None;
        if (members) fast = int_field(reference, &late_reference);
        Py_DECREF(op_key);
        if (PyErr_Occurred()) return NULL;
        if (!fast) break;
        /* as streams._ran: from its start (or its enqueue, where start events are off), no earlier than
         * the stream was free, to its completion; everything on the common clock */
        long long created_here = created - offset;
        long long start = started_value != Py_None && started != 0 ? started - offset : created_here;
        if (start < free_at) start = free_at;
        long long done = completed - offset;
        long long end = done > start ? done : start + 1;
        free_at = end;
        PyObject *flow = PyLong_FromLongLong(launch_base + key), *flows = flow ? PyTuple_New(1) : NULL;
        if (flows == NULL) {
            Py_XDECREF(flow);
            return NULL;
        }
        PyTuple_SET_ITEM(flows, 0, flow);
        Py_INCREF(flows); /* one reference for each of the two slices */
        /* times the entry holds already (the rank's clock is the common one) are shared, not made anew */
        PyObject *created_value = PyTuple_GET_ITEM(entry, created_at);
        PyObject *completed_value = PyTuple_GET_ITEM(entry, completed_at);
        PyObject *ran = new_slice(
            slice_type,
            offset == 0 && start == started && started_value != Py_None ? Py_NewRef(started_value)
            : offset == 0 && start == created ? Py_NewRef(created_value) : PyLong_FromLongLong(start),
            offset == 0 && end == completed ? Py_NewRef(completed_value) : PyLong_FromLongLong(end),
            Py_NewRef(look), Py_NewRef(entry), Py_NewRef(entry), flows);
        PyObject *enqueued = new_slice(slice_type,
                                       offset == 0 ? Py_NewRef(created_value) : PyLong_FromLongLong(created_here),
                                       Py_NewRef(Py_None), Py_NewRef(enqueue_look), Py_NewRef(Py_None),
                                       Py_NewRef(Py_None), flows);
        int failed = ran == NULL || enqueued == NULL || PyList_Append(slices, ran) < 0 ||
                     PyList_Append(instants, enqueued) < 0;
        Py_XDECREF(ran);
        Py_XDECREF(enqueued);
        if (failed) return NULL;
        if (members) {
            /* as Looks.lateness: ms after the members' median, never below 0, in steps */
            double late = (double)(created - late_offset - late_reference) / 1e6;
            double value = late > 0 ? nearbyint(late / step) * step : 0.0;
            if (value != last_late) {
                PyObject *point = Py_BuildValue("(Ld)", created_here, value);
                if (point == NULL || PyList_Append(points, point) < 0) {
                    Py_XDECREF(point);
                    return NULL;
                }
                Py_DECREF(point);
                last_late = value;
            }
        }
    }
    return Py_BuildValue("(nLd)", position, free_at, last_late);
}

static PyObject *str_group, *str_first_time_ns;

PyDoc_STRVAR(by_group_doc,
             "by_group(items, created_index) -> (dict, set)\n\n"
             "streams.lay_out's partition: a rank's (op, entries) items by op.group, in the order given, and the\n"
             "groups whose items are not in the order the rank enqueued them (entries[0]'s creation time, or\n"
             "op.first_time_ns where it has no entry).");

/* When a rank enqueued its part in an op: its first entry's creation time, or the op's first_time_ns where
 * it has no entry. New reference; NULL with an error set. */
static PyObject *created_of(PyObject *item, Py_ssize_t created_at) {
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2 || !PyList_Check(PyTuple_GET_ITEM(item, 1))) {
        PyErr_SetString(PyExc_TypeError, "by_group: items must be (op, entries) tuples");
        return NULL;
    }
    PyObject *entries = PyTuple_GET_ITEM(item, 1);
    if (!PyList_GET_SIZE(entries)) return PyObject_GetAttr(PyTuple_GET_ITEM(item, 0), str_first_time_ns);
    PyObject *entry = PyList_GET_ITEM(entries, 0);
    return is_entry(entry, created_at + 1) ? Py_NewRef(PyTuple_GET_ITEM(entry, created_at)) : NULL;
}

/* What by_group remembers of a group it met (held): its list (borrowed from the dict) and when the rank
 * enqueued its last item there (``created``, or ``created_object`` where that is not a small int). */
typedef struct {
    PyObject *group, *list, *created_object;
    long long created;
} GroupSeen;

#define GROUPS_SEEN 16

static PyObject *by_group(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("by_group", nargs, 2)) return NULL;
    PyObject *items = args[0];
    Py_ssize_t created_at = PyLong_AsSsize_t(args[1]);
    if (created_at == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "by_group: items must be a list");
        return NULL;
    }
    /* a rank's ops are in a few groups: the last ones met are found by identity, without hashing */
    GroupSeen seen[GROUPS_SEEN] = {{0}};
    int seen_count = 0;
    PyObject *groups = PyDict_New(), *unordered = PySet_New(NULL), *result = NULL;
    if (groups == NULL || unordered == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        PyObject *created = created_of(item, created_at);
        if (created == NULL) goto done;
        long long created_value = 0;
        int small = int_field(created, &created_value);
        PyObject *group = PyObject_GetAttr(PyTuple_GET_ITEM(item, 0), str_group);
        if (group == NULL) {
            Py_DECREF(created);
            goto done;
        }
        GroupSeen *known = NULL;
        for (int k = 0; k < seen_count && known == NULL; k++)
            if (seen[k].group == group) known = &seen[k];
        if (known == NULL) {
            PyObject *list = PyDict_GetItemWithError(groups, group);
            int failed = PyErr_Occurred() != NULL;
            if (!failed && list == NULL) {
                list = PyList_New(0);
                failed = list == NULL || PyDict_SetItem(groups, group, list) < 0;
                Py_XDECREF(list); /* the dict holds it */
            }
            if (failed) {
                Py_DECREF(group);
                Py_DECREF(created);
                goto done;
            }
            /* a group equal to one met but not the same object shares its list, and what came before */
            for (int k = 0; k < seen_count && known == NULL; k++)
                if (seen[k].list == list) known = &seen[k];
        }
        if (known == NULL) {
            PyObject *list = PyDict_GetItem(groups, group); /* found or made just above */
            GroupSeen *slot = &seen[seen_count < GROUPS_SEEN ? seen_count++ : (int)(i % GROUPS_SEEN)];
            Py_CLEAR(slot->created_object);
            /* the list is met for the first time, or again after its slot was taken: what came before
             * in it says when the rank enqueued its last item */
            Py_XSETREF(slot->group, Py_NewRef(group)); /* held: no other object takes its address */
            slot->list = list;
            if (PyList_GET_SIZE(list) > 0) {
                slot->created_object = created_of(PyList_GET_ITEM(list, PyList_GET_SIZE(list) - 1), created_at);
                if (slot->created_object == NULL) {
                    Py_DECREF(group);
                    Py_DECREF(created);
                    goto done;
                }
            }
            known = slot;
        }
        Py_DECREF(group);
        /* was the group's previous item enqueued later than this one? */
        int earlier = 0;
        if (PyList_GET_SIZE(known->list) > 0) {
            if (known->created_object == NULL && small)
                earlier = created_value < known->created;
            else {
                PyObject *before = known->created_object;
                PyObject *made = before == NULL ? PyLong_FromLongLong(known->created) : NULL;
                earlier = before || made ? PyObject_RichCompareBool(created, before ? before : made, Py_LT) : -1;
                Py_XDECREF(made);
            }
        }
        Py_CLEAR(known->created_object);
        if (small)
            known->created = created_value;
        else
            known->created_object = Py_NewRef(created);
        Py_DECREF(created);
        if (earlier < 0 || (earlier && PySet_Add(unordered, known->group) < 0) || PyList_Append(known->list, item) < 0)
            goto done;
    }
    result = PyTuple_Pack(2, groups, unordered);
done:
    for (int k = 0; k < seen_count; k++) {
        Py_XDECREF(seen[k].group);
        Py_XDECREF(seen[k].created_object);
    }
    Py_XDECREF(groups);
    Py_XDECREF(unordered);
    return result;
}

PyDoc_STRVAR(ops_by_rank_doc,
             "ops_by_rank(ops) -> dict\n\n"
             "timeline.ops_by_rank of every rank: rank -> [(op, its entries)] in the order of ``ops``, and\n"
             "(op, []) for each rank in op.missing.");

static PyObject *str_entries, *str_missing;

/* index[rank].append((op, entries)); 0, or -1 with an error set. Steals no reference. */
static int index_append(PyObject *index, PyObject *rank, PyObject *op, PyObject *entries) {
    PyObject *list = PyDict_GetItemWithError(index, rank);
    if (list == NULL) {
        if (PyErr_Occurred()) return -1;
        list = PyList_New(0);
        if (list == NULL) return -1;
        int failed = PyDict_SetItem(index, rank, list);
        Py_DECREF(list); /* the dict holds it */
        if (failed < 0) return -1;
    }
    PyObject *item = PyTuple_Pack(2, op, entries);
    if (item == NULL) return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

static PyObject *ops_by_rank(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("ops_by_rank", nargs, 1)) return NULL;
    PyObject *ops = args[0];
    if (!PyList_CheckExact(ops)) {
        PyErr_SetString(PyExc_TypeError, "ops_by_rank: ops must be a list");
        return NULL;
    }
    PyObject *index = PyDict_New();
    if (index == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        PyObject *entries = PyObject_GetAttr(op, str_entries), *missing = NULL, *none = NULL;
        int failed = entries == NULL || !PyDict_CheckExact(entries);
        if (!failed) {
            Py_ssize_t position = 0;
            PyObject *rank, *parts;
            while (!failed && PyDict_Next(entries, &position, &rank, &parts))
                failed = index_append(index, rank, op, parts) < 0;
        }
        if (!failed) {
            missing = PyObject_GetAttr(op, str_missing);
            failed = missing == NULL || !PyTuple_CheckExact(missing);
            for (Py_ssize_t k = 0; !failed && k < PyTuple_GET_SIZE(missing); k++) {
                failed = (none = PyList_New(0)) == NULL ||
                         index_append(index, PyTuple_GET_ITEM(missing, k), op, none) < 0;
                Py_CLEAR(none);
            }
        }
        Py_XDECREF(entries);
        Py_XDECREF(missing);
        if (failed) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "ops_by_rank: an op's entries or missing ranks");
            Py_DECREF(index);
            return NULL;
        }
    }
    return index;
}

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

/* The encoded bytes the writer remembers under key; NULL (no error) when absent: the fallback decides. */
static PyObject *bytes_in(PyObject *table, PyObject *key) {
    PyObject *found = lookup(table, key);
    return found != NULL && PyBytes_CheckExact(found) ? found : NULL;
}

static PyObject *str_end, *str_encoded, *str_timed;

/* The writer's state, unpacked from the context tuple (see PerfettoWriter._fast_context). */
typedef struct {
    PyObject *token, *packet_head, *begin, *instant, *end_event, *new_interned;
    PyObject *op_ids, *record_ids, *threads;
    PyObject *created_head, *started_head, *completed_head, *duration_head;
    PyObject *packet_tag, *event_tag, *flow_tag, *interned_tag, *encode_look;
    PyObject *last_thread_name, *last_thread_id, *last_thread; /* the last thread met, and its bytes (borrowed) */
    Py_ssize_t launches; /* flows of the slices written that stand for an entry (a launch's other end) */
    Py_ssize_t op_id, record_id, created, started, completed, duration, thread_name, thread_id;
    Py_ssize_t entry_size; /* an entry must be at least this long to hold all of the above */
} Context;

static int read_context(PyObject *tuple, Context *context) {
    PyObject *heads, *fields;
    if (!PyArg_ParseTuple(tuple, "OSSSSO!O!O!O!O!SSSSOO!;encode_slices: bad context", &context->token,
                          &context->packet_head, &context->begin, &context->instant, &context->end_event,
                          &PyList_Type, &context->new_interned, &PyDict_Type, &context->op_ids, &PyDict_Type,
                          &context->record_ids, &PyDict_Type, &context->threads, &PyTuple_Type, &heads,
                          &context->packet_tag, &context->event_tag, &context->flow_tag, &context->interned_tag,
                          &context->encode_look, &PyTuple_Type, &fields))
        return -1;
    context->last_thread_name = context->last_thread_id = context->last_thread = NULL;
    context->launches = 0;
    if (!PyArg_ParseTuple(heads, "SSSS;encode_slices: bad fact heads", &context->created_head,
                          &context->started_head, &context->completed_head, &context->duration_head))
        return -1;
    Py_ssize_t indices[8];
    if (read_indices(fields, indices, 8, &context->entry_size) < 0) return -1;
    context->op_id = indices[0];
    context->record_id = indices[1];
    context->created = indices[2];
    context->started = indices[3];
    context->completed = indices[4];
    context->duration = indices[5];
    context->thread_name = indices[6];
    context->thread_id = indices[7];
    return 0;
}

/* A rank's ids and times (PerfettoWriter._facts), when every piece is already known. 1: done; 0: not
 * on the fast path; -1: error. */
static int put_facts(Buffer *event, Context *context, PyObject *head, PyObject *last, int timed) {
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
    if (thread_name == context->last_thread_name && thread_id == context->last_thread_id) {
        thread = context->last_thread;  /* a rank's entries share their thread's strings */
    } else if (PyUnicode_GET_LENGTH(thread_name) || PyUnicode_GET_LENGTH(thread_id)) {
        PyObject *key = PyTuple_Pack(2, thread_name, thread_id);
        if (key == NULL) return -1;
        thread = bytes_in(context->threads, key);
        Py_DECREF(key);
        if (thread == NULL) return 0;
        context->last_thread_name = thread_name, context->last_thread_id = thread_id, context->last_thread = thread;
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

/* A slice's own flows (Slice.flows: a tuple of ints) after its event: -1 error, 0 not on the fast path. */
static int put_flows(Buffer *event, Context *context, PyObject *flows) {
    if (!PyTuple_CheckExact(flows)) return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(flows); i++) {
        unsigned long long flow;
        if (as_u64(PyTuple_GET_ITEM(flows, i), &flow) < 0) return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(flows); i++) {
        unsigned long long flow;
        unsigned char little[8];
        as_u64(PyTuple_GET_ITEM(flows, i), &flow);
        for (int b = 0; b < 8; b++) little[b] = (unsigned char)(flow >> (8 * b));
        if (buffer_put_bytes(event, context->flow_tag) < 0 || buffer_put(event, (char *)little, 8) < 0) return -1;
    }
    return 1;
}

/* One slice's two packets into ``out``, or an instant's one (where it stands for no entry). A look not
 * encoded yet is encoded by ``encode_look`` (the writer's _look), and the names it interned go into this
 * packet. 1: a slice; 2: an instant; 0: not on the fast path (nothing written); -1: error. */
static int put_slice(Buffer *out, Buffer *event, Context *context, PyObject *item) {
    /* a Slice is a tuple: (start, end, look, head, last, flows) */
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 6) return 0;
    PyObject *start_value = PyTuple_GET_ITEM(item, 0), *end_value = PyTuple_GET_ITEM(item, 1);
    PyObject *look = PyTuple_GET_ITEM(item, 2), *head = PyTuple_GET_ITEM(item, 3), *last = PyTuple_GET_ITEM(item, 4);
    PyObject *flows = PyTuple_GET_ITEM(item, 5);
    unsigned long long start, end = 0;
    int instant = end_value == Py_None;
    event->len = 0;
    if ((!instant && as_u64(end_value, &end) < 0) || as_u64(start_value, &start) < 0) return 0;
    if (instant && (head != Py_None || last != Py_None)) return 0; /* an instant with facts: Python's */
    PyObject *encoded = PyObject_GetAttr(look, str_encoded);
    if (encoded == NULL) return -1;
    if (!PyTuple_CheckExact(encoded) || PyTuple_GET_SIZE(encoded) != 2 || PyTuple_GET_ITEM(encoded, 0) != context->token) {
        Py_DECREF(encoded);
        if ((encoded = PyObject_CallOneArg(context->encode_look, look)) == NULL) return -1;
        if (!PyBytes_CheckExact(encoded)) {
            Py_DECREF(encoded);
            PyErr_SetString(PyExc_TypeError, "encode_slices: a look must encode to bytes");
            return -1;
        }
        PyObject *pair = PyTuple_Pack(2, context->token, encoded);
        Py_DECREF(encoded);
        if (pair == NULL) return -1;
        encoded = pair;
    }
    PyObject *chunk = PyTuple_GET_ITEM(encoded, 1);
    int result = 0;
    if (!PyBytes_CheckExact(chunk)) goto done;
    if (buffer_put_bytes(event, instant ? context->instant : context->begin) < 0 || buffer_put_bytes(event, chunk) < 0)
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
    int flowed = put_flows(event, context, flows);
    if (flowed < 0) goto error;
    if (flowed == 0) goto done;
    /* the names the look's encoding interned, as InternedData in this packet (then cleared) */
    Py_ssize_t interned_len = 0, pending = PyList_GET_SIZE(context->new_interned);
    for (Py_ssize_t i = 0; i < pending; i++) {
        PyObject *part = PyList_GET_ITEM(context->new_interned, i);
        if (!PyBytes_CheckExact(part)) goto done;
        interned_len += PyBytes_GET_SIZE(part);
    }
    Py_ssize_t interned_size = pending ? PyBytes_GET_SIZE(context->interned_tag) +
                                             varint_size((unsigned long long)interned_len) + interned_len : 0;
    /* Begin (or instant): Trace.packet { packet head, timestamp, [interned], track_event { event } } */
    Py_ssize_t packet_size = PyBytes_GET_SIZE(context->packet_head) + varint_size(start) + interned_size +
                             PyBytes_GET_SIZE(context->event_tag) + varint_size((unsigned long long)event->len) +
                             event->len;
    if (buffer_put_bytes(out, context->packet_tag) < 0 || buffer_put_varint(out, (unsigned long long)packet_size) < 0 ||
        buffer_put_bytes(out, context->packet_head) < 0 || buffer_put_varint(out, start) < 0)
        goto error;
    if (pending) {
        if (buffer_put_bytes(out, context->interned_tag) < 0 ||
            buffer_put_varint(out, (unsigned long long)interned_len) < 0)
            goto error;
        for (Py_ssize_t i = 0; i < pending; i++)
            if (buffer_put_bytes(out, PyList_GET_ITEM(context->new_interned, i)) < 0) goto error;
        if (PyList_SetSlice(context->new_interned, 0, pending, NULL) < 0) goto error;
    }
    if (buffer_put_bytes(out, context->event_tag) < 0 || buffer_put_varint(out, (unsigned long long)event->len) < 0 ||
        buffer_put(out, event->data, event->len) < 0)
        goto error;
    if (!instant) {
        /* End: Trace.packet { packet head, timestamp, end event } */
        packet_size = PyBytes_GET_SIZE(context->packet_head) + varint_size(end) + PyBytes_GET_SIZE(context->end_event);
        if (buffer_put_bytes(out, context->packet_tag) < 0 ||
            buffer_put_varint(out, (unsigned long long)packet_size) < 0 ||
            buffer_put_bytes(out, context->packet_head) < 0 || buffer_put_varint(out, end) < 0 ||
            buffer_put_bytes(out, context->end_event) < 0)
            goto error;
    }
    if (head != Py_None) context->launches += PyTuple_GET_SIZE(flows);
    result = instant ? 2 : 1;
    goto done;
error:
    result = -1;
done:
    Py_DECREF(encoded);
    return result;
}

PyDoc_STRVAR(encode_slices_doc,
             "encode_slices(slices, context, fallback) -> (bytes, slice count, marker count, launch flows)\n\n"
             "The packets of ``slices`` in order, as PerfettoWriter._slice_packets writes them; each slice\n"
             "the fast path does not cover is encoded by ``fallback(slice)``.");

static PyObject *encode_slices(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!takes("encode_slices", nargs, 3)) return NULL;
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
        } else if (done == 2) {
            markers++;
        }
        Py_DECREF(item);
        if (done < 0) goto finish;
    }
    if (PyErr_Occurred()) goto finish;
    result = Py_BuildValue("(y#nnn)", out.data ? out.data : "", out.len, slices, markers, context.launches);
finish:
    Py_DECREF(iterator);
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
    if (!takes("scan_pickle", nargs, 3)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    long max_depth = PyLong_AsLong(args[1]);
    long long max_nodes = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *data = view.buf;
    Py_ssize_t end = view.len, pos = 0, max_memo = view.len;
    ShapeStack stack = {NULL, NULL, NULL, 0, 0};
    Py_ssize_t *marks = NULL, mark_len = 0, mark_cap = 0;
    unsigned char *memo_depth = NULL;
    long long *memo_nodes = NULL; /* -1: not defined */
    Py_ssize_t *memo_ident = NULL, memo_cap = 0, memo_count = 0;
    /* shared[k]: container k was fetched from the memo or duplicated; at most one container an opcode */
    unsigned char *shared = PyMem_Calloc((size_t)end + 2, 1);
    Py_ssize_t made = 0;
    if (shared == NULL) {
        PyBuffer_Release(&view);
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
    PyBuffer_Release(&view);
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

static PyMethodDef methods[] = {
    {"read_rows", (PyCFunction)(void (*)(void))read_rows, METH_FASTCALL, read_rows_doc},
    {"entries_from_columns", (PyCFunction)(void (*)(void))entries_from_columns, METH_FASTCALL,
     entries_from_columns_doc},
    {"canonical_column", (PyCFunction)(void (*)(void))canonical_column, METH_FASTCALL, canonical_column_doc},
    {"bucket_collectives", (PyCFunction)(void (*)(void))bucket_collectives, METH_FASTCALL, bucket_collectives_doc},
    {"scan_op", (PyCFunction)(void (*)(void))scan_op, METH_FASTCALL, scan_op_doc},
    {"encode_slices", (PyCFunction)(void (*)(void))encode_slices, METH_FASTCALL, encode_slices_doc},
    {"scan_pickle", (PyCFunction)(void (*)(void))scan_pickle, METH_FASTCALL, scan_pickle_doc},
    {"lay_out_collectives", (PyCFunction)(void (*)(void))lay_out_collectives, METH_FASTCALL,
     lay_out_collectives_doc},
    {"by_group", (PyCFunction)(void (*)(void))by_group, METH_FASTCALL, by_group_doc},
    {"ops_by_rank", (PyCFunction)(void (*)(void))ops_by_rank, METH_FASTCALL, ops_by_rank_doc},
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
    if ((str_end = PyUnicode_InternFromString("end")) == NULL ||
        (str_encoded = PyUnicode_InternFromString("encoded")) == NULL ||
        (str_timed = PyUnicode_InternFromString("timed")) == NULL ||
        (str_op_key = PyUnicode_InternFromString("op_key")) == NULL ||
        (str_group = PyUnicode_InternFromString("group")) == NULL ||
        (str_first_time_ns = PyUnicode_InternFromString("first_time_ns")) == NULL ||
        (str_entries = PyUnicode_InternFromString("entries")) == NULL ||
        (str_missing = PyUnicode_InternFromString("missing")) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
