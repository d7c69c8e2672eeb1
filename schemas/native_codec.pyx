# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled encoding and decoding of mvlog's rows, keys and change events (schemaless Avro binary).

fastavro resolves each value of a map of unions (value.avsc) one by one through generic schema
dispatch, which costs several microseconds per row; every writer encodes and every reader decodes every
change, so these few fixed shapes are done here directly. The bytes are fastavro's: ``mvlog.schemas.codec``
checks this when it loads (and uses fastavro alone when the check fails or this module is not built).

Encoders return None for any value they do not handle exactly (another mapping type, an int beyond
64 bits, ...), and the caller then takes fastavro's path. Decoders raise ValueError on malformed input.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_Next, PyDict_SetItem, PyDict_Size
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_FromDouble
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.ref cimport PyObject
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void* op)

# Branches of the value union: ["null", "boolean", "long", "double", "string", "bytes"].
cdef enum:
    NULL_BRANCH = 0
    BOOLEAN_BRANCH = 1
    LONG_BRANCH = 2
    DOUBLE_BRANCH = 3
    STRING_BRANCH = 4
    BYTES_BRANCH = 5
    STACK_BYTES = 512  # encoded rows fit on the stack; longer ones move to the heap


# --- encoding ---------------------------------------------------------------------------------------

cdef struct Buffer:
    char* data
    Py_ssize_t size
    Py_ssize_t capacity
    bint on_heap
    char[STACK_BYTES] stack


cdef inline void buffer_init(Buffer* buf) noexcept:
    buf.data = buf.stack
    buf.size = 0
    buf.capacity = STACK_BYTES
    buf.on_heap = False


cdef inline void buffer_free(Buffer* buf) noexcept:
    if buf.on_heap:
        free(buf.data)


cdef int buffer_reserve(Buffer* buf, Py_ssize_t extra) except -1:
    cdef Py_ssize_t needed = buf.size + extra
    cdef Py_ssize_t capacity
    cdef char* grown
    if needed <= buf.capacity:
        return 0
    capacity = buf.capacity * 2
    while capacity < needed:
        capacity *= 2
    if buf.on_heap:
        grown = <char*>realloc(buf.data, capacity)
    else:
        grown = <char*>malloc(capacity)
        if grown != NULL:
            memcpy(grown, buf.data, buf.size)
    if grown == NULL:
        raise MemoryError()
    buf.data = grown
    buf.capacity = capacity
    buf.on_heap = True
    return 0


cdef inline int put_byte(Buffer* buf, char byte) except -1:
    if buf.size + 1 > buf.capacity:
        buffer_reserve(buf, 1)
    buf.data[buf.size] = byte
    buf.size += 1
    return 0


cdef inline int put_varint(Buffer* buf, uint64_t n) except -1:
    """Avro's variable-length encoding of an (already zigzagged) number."""
    if buf.size + 10 > buf.capacity:
        buffer_reserve(buf, 10)
    while n >= 0x80:
        buf.data[buf.size] = <char>((n & 0x7F) | 0x80)
        buf.size += 1
        n >>= 7
    buf.data[buf.size] = <char>n
    buf.size += 1
    return 0


cdef inline int put_raw(Buffer* buf, const char* data, Py_ssize_t length) except -1:
    """A string's or bytes' length, then its bytes."""
    put_varint(buf, (<uint64_t>length) << 1)
    if buf.size + length > buf.capacity:
        buffer_reserve(buf, length)
    memcpy(buf.data + buf.size, data, length)
    buf.size += length
    return 0


cdef inline uint64_t zigzag(int64_t value) noexcept:
    return ((<uint64_t>value) << 1) ^ <uint64_t>(value >> 63)


cdef int put_value(Buffer* buf, object value) except -1:
    """One union value; 1 when written, 0 when the value is not of an exact handled type."""
    cdef type kind = type(value)
    cdef int overflow = 0
    cdef long long number
    cdef Py_ssize_t length
    cdef const char* text
    cdef double real
    if value is None:
        put_byte(buf, NULL_BRANCH)
    elif kind is int:
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow != 0:
            return 0
        put_byte(buf, LONG_BRANCH << 1)
        put_varint(buf, zigzag(number))
    elif kind is str:
        text = PyUnicode_AsUTF8AndSize(value, &length)
        put_byte(buf, STRING_BRANCH << 1)
        put_raw(buf, text, length)
    elif kind is float:
        real = PyFloat_AS_DOUBLE(value)
        put_byte(buf, DOUBLE_BRANCH << 1)
        if buf.size + 8 > buf.capacity:
            buffer_reserve(buf, 8)
        memcpy(buf.data + buf.size, &real, 8)  # little-endian hosts only (checked at import)
        buf.size += 8
    elif kind is bool:
        put_byte(buf, BOOLEAN_BRANCH << 1)
        put_byte(buf, 1 if value is True else 0)
    elif kind is bytes:
        put_byte(buf, BYTES_BRANCH << 1)
        put_raw(buf, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
    else:
        return 0
    return 1


cdef inline int put_label(Buffer* buf, object name) except -1:
    cdef Py_ssize_t length
    cdef const char* text
    if type(name) is not str:
        return 0
    text = PyUnicode_AsUTF8AndSize(name, &length)
    put_raw(buf, text, length)
    return 1


def encode_value_map(object datum):
    """value.avsc bytes of a dict of str -> None/bool/int/float/str/bytes; None for anything else."""
    return value_map_bytes(datum)


cdef object value_map_bytes(object datum):
    cdef Buffer buf
    cdef Py_ssize_t position = 0
    cdef PyObject* name
    cdef PyObject* value
    cdef Py_ssize_t count
    if type(datum) is not dict:
        return None
    count = PyDict_Size(datum)
    buffer_init(&buf)
    try:
        if count:
            put_varint(&buf, (<uint64_t>count) << 1)  # one block: its count, the entries, then 0
            while PyDict_Next(datum, &position, &name, &value):
                if not put_label(&buf, <object>name) or not put_value(&buf, <object>value):
                    return None
        put_byte(&buf, 0)
        return PyBytes_FromStringAndSize(buf.data, buf.size)
    finally:
        buffer_free(&buf)


def encode_key(tuple columns, tuple key):
    """The value map {column: value} of a primary key, columns in key order; None when not handled."""
    return key_bytes(columns, key)


cdef object key_bytes(tuple columns, tuple key):
    cdef Buffer buf
    cdef Py_ssize_t count = len(columns)
    cdef Py_ssize_t i
    if len(key) != count:
        return None
    buffer_init(&buf)
    try:
        if count:
            put_varint(&buf, (<uint64_t>count) << 1)
            for i in range(count):
                if not put_label(&buf, columns[i]) or not put_value(&buf, key[i]):
                    return None
        put_byte(&buf, 0)
        return PyBytes_FromStringAndSize(buf.data, buf.size)
    finally:
        buffer_free(&buf)


# --- decoding ---------------------------------------------------------------------------------------

cdef struct Reader:
    const unsigned char* position
    const unsigned char* end


cdef int64_t read_long(Reader* r) except? -1:
    cdef uint64_t n = 0
    cdef int shift = 0
    cdef unsigned char byte
    while True:
        if r.position >= r.end:
            raise ValueError("unexpected end of data in a varint")
        byte = r.position[0]
        r.position += 1
        if shift == 63 and byte > 1:
            raise ValueError("varint longer than 64 bits")
        n |= (<uint64_t>(byte & 0x7F)) << shift
        if byte < 0x80:
            break
        shift += 7
    return <int64_t>(n >> 1) ^ -<int64_t>(n & 1)


cdef const unsigned char* read_span(Reader* r, Py_ssize_t* length) except NULL:
    cdef int64_t size = read_long(r)
    cdef const unsigned char* start = r.position
    if size < 0 or size > r.end - r.position:
        raise ValueError(f"length {size} beyond the data")
    r.position += size
    length[0] = <Py_ssize_t>size
    return start


cdef object read_string(Reader* r):
    cdef Py_ssize_t length
    cdef const unsigned char* start = read_span(r, &length)
    return PyUnicode_DecodeUTF8(<const char*>start, length, NULL)


# The column names met at each position of a map: rows of one view repeat the same names in the same
# order, so the i-th name is usually the i-th name of the previous row, and that str object is reused.
cdef list _seen_encoded = []
cdef list _seen_names = []
cdef enum:
    SEEN_POSITIONS = 256


cdef object read_name(Reader* r, Py_ssize_t index):
    cdef Py_ssize_t length
    cdef const unsigned char* start = read_span(r, &length)
    cdef bytes seen
    if index < len(_seen_encoded):
        seen = <bytes>_seen_encoded[index]
        if PyBytes_GET_SIZE(seen) == length and memcmp(PyBytes_AS_STRING(seen), start, length) == 0:
            return _seen_names[index]
    name = PyUnicode_DecodeUTF8(<const char*>start, length, NULL)
    if index < len(_seen_encoded):
        _seen_encoded[index] = PyBytes_FromStringAndSize(<const char*>start, length)
        _seen_names[index] = name
    elif index == len(_seen_encoded) and index < SEEN_POSITIONS:
        _seen_encoded.append(PyBytes_FromStringAndSize(<const char*>start, length))
        _seen_names.append(name)
    return name


cdef object read_value(Reader* r):
    cdef int64_t branch = read_long(r)
    cdef Py_ssize_t length
    cdef const unsigned char* start
    cdef double real
    if branch == LONG_BRANCH:
        return PyLong_FromLongLong(read_long(r))
    if branch == STRING_BRANCH:
        return read_string(r)
    if branch == DOUBLE_BRANCH:
        if r.end - r.position < 8:
            raise ValueError("unexpected end of data in a double")
        memcpy(&real, r.position, 8)
        r.position += 8
        return PyFloat_FromDouble(real)
    if branch == NULL_BRANCH:
        return None
    if branch == BOOLEAN_BRANCH:
        if r.position >= r.end:
            raise ValueError("unexpected end of data in a boolean")
        real = r.position[0]
        r.position += 1
        return real != 0
    if branch == BYTES_BRANCH:
        start = read_span(r, &length)
        return PyBytes_FromStringAndSize(<const char*>start, length)
    raise ValueError(f"union branch {branch} out of range")


cdef dict read_map(Reader* r):
    """A map of scalars. It holds no container, so it cannot be part of a reference cycle: it is taken
    off the garbage collector's list at once (as CPython does lazily), which keeps the collector from
    walking every decoded row of a large read again and again (it tripled the cost of a replay)."""
    cdef dict out = {}
    cdef int64_t count
    cdef Py_ssize_t index = 0
    while True:
        count = read_long(r)
        if count == 0:
            PyObject_GC_UnTrack(<void*>out)
            return out
        if count < 0:  # a block with its size in bytes after the count
            count = -count
            read_long(r)
        while count > 0:
            name = read_name(r, index)
            PyDict_SetItem(out, name, read_value(r))
            index += 1
            count -= 1


cdef object read_optional_map(Reader* r):
    cdef int64_t branch = read_long(r)
    if branch == 0:
        return None
    if branch == 1:
        return read_map(r)
    raise ValueError(f"union branch {branch} out of range")


cdef inline void reader_init(Reader* r, bytes data) noexcept:
    r.position = <const unsigned char*>PyBytes_AS_STRING(data)
    r.end = r.position + PyBytes_GET_SIZE(data)


cdef inline int expect_end(Reader* r) except -1:
    if r.position != r.end:
        raise ValueError(f"{r.end - r.position} trailing bytes")
    return 0


def decode_value_map(bytes data):
    """A row or key (value.avsc) as a dict."""
    cdef Reader r
    reader_init(&r, data)
    out = read_map(&r)
    expect_end(&r)
    return out


def decode_change_event(bytes data):
    """A change event (change_event.avsc) as (before, after, op, view, epoch, vnode, txn, ts_ms)."""
    cdef Reader r
    reader_init(&r, data)
    before = read_optional_map(&r)
    after = read_optional_map(&r)
    op = read_string(&r)
    view = read_string(&r)
    epoch = read_long(&r)
    vnode = read_long(&r)
    if not -2147483648 <= vnode <= 2147483647:
        raise ValueError(f"vnode {vnode} is not an Avro int")
    txn = read_string(&r)
    ts_ms = read_long(&r)
    expect_end(&r)
    return before, after, op, view, epoch, vnode, txn, ts_ms


# --- signed rows ------------------------------------------------------------------------------------

cdef int append_row(list columns, tuple names, object epoch, str change_type, object weight, object partition,
                    object offset, object key, dict row) except -1:
    cdef PyObject* value
    cdef Py_ssize_t i
    (<list>columns[0]).append(epoch)
    (<list>columns[1]).append(change_type)
    (<list>columns[2]).append(weight)
    (<list>columns[3]).append(partition)
    (<list>columns[4]).append(offset)
    (<list>columns[5]).append(key)
    for i in range(len(names)):
        value = PyDict_GetItem(row, names[i])
        (<list>columns[6 + i]).append(<object>value if value != NULL else None)
    return 0


def append_signed_rows(list columns, tuple names, object epoch, object partition, object offset, object key,
                       object before, object after):
    """A change as signed rows appended to the column lists of ``mvlog.connectors.spark.change_rows``: the
    retraction of ``before`` (weight -1), then the assertion of ``after`` (+1); columns are the six meta
    columns, then ``names``. Rows must be dicts (as decoded)."""
    if before is not None:
        append_row(columns, names, epoch, "update_preimage" if after is not None else "delete", -1, partition,
                   offset, key, <dict?>before)
    if after is not None:
        append_row(columns, names, epoch, "update_postimage" if before is not None else "insert", 1, partition,
                   offset, key, <dict?>after)


# --- a changelog record, checked --------------------------------------------------------------------

cdef bint key_matches(tuple key_columns, object image, bytes kafka_key) except -1:
    """Whether the key columns of the row image encode to the record's Kafka key."""
    cdef Buffer buf
    cdef Py_ssize_t count = len(key_columns)
    cdef Py_ssize_t i
    cdef PyObject* value
    if image is None or not count:
        return False
    buffer_init(&buf)
    try:
        put_varint(&buf, (<uint64_t>count) << 1)
        for i in range(count):
            value = PyDict_GetItem(<dict>image, key_columns[i])
            if value == NULL or not put_label(&buf, key_columns[i]) or not put_value(&buf, <object>value):
                return False
        put_byte(&buf, 0)
        return buf.size == PyBytes_GET_SIZE(kafka_key) and memcmp(buf.data, PyBytes_AS_STRING(kafka_key), buf.size) == 0
    finally:
        buffer_free(&buf)


def decode_change_record(bytes data, bytes kafka_key, tuple key_columns, str view):
    """(epoch, txn, before, after) of a change event of ``view`` whose row image holds its Kafka key and
    whose op fits its images; ValueError for anything else (the caller then says exactly what is wrong)."""
    cdef Reader r
    reader_init(&r, data)
    before = read_optional_map(&r)
    after = read_optional_map(&r)
    op = read_string(&r)
    if read_string(&r) != view:
        raise ValueError("another view")
    epoch = read_long(&r)
    vnode = read_long(&r)
    if not -2147483648 <= vnode <= 2147483647:
        raise ValueError(f"vnode {vnode} is not an Avro int")
    txn = read_string(&r)
    read_long(&r)
    expect_end(&r)
    if op == "u":
        valid = before is not None and after is not None
    elif op == "c" or op == "r":
        valid = before is None and after is not None
    elif op == "d":
        valid = before is not None and after is None
    else:
        valid = False
    if not valid or not key_matches(key_columns, after if after is not None else before, kafka_key):
        raise ValueError("op, images or key to be checked in full")
    return epoch, txn, before, after


cdef tuple decode_checked(bytes data, bytes kafka_key, tuple key_columns, str view):
    """decode_change_record, or None instead of ValueError."""
    try:
        return decode_change_record(data, kafka_key, key_columns, view)
    except ValueError:
        return None


def decode_change_run(list messages, Py_ssize_t start, tuple key_columns, str view, Py_ssize_t max_bytes,
                      list change_headers):
    """The run of well-formed change events of one epoch and transaction at ``messages[start:]``.

    Returns ``(epoch, txn, [(offset, key, before, after), ...], end)``: the run is ``messages[start:end]``.
    It stops before the first record that is not such an event (a barrier, an error, poison, another
    epoch or transaction), which the caller then handles; an empty run when ``messages[start]`` is one.
    """
    cdef Py_ssize_t i = start
    cdef Py_ssize_t count = len(messages)
    cdef list run = []
    epoch = txn = None
    while i < count:
        message = messages[i]
        if message.error() is not None:
            break
        key = message.key()
        value = message.value()
        if type(key) is not bytes or type(value) is not bytes or message.headers() != change_headers:
            break
        if PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(value) > max_bytes:
            break
        decoded = decode_checked(value, key, key_columns, view)
        if decoded is None:
            break
        if epoch is None:
            epoch, txn = decoded[0], decoded[1]
        elif decoded[0] != epoch or decoded[1] != txn:
            break
        change = (message.offset(), key, decoded[2], decoded[3])
        PyObject_GC_UnTrack(<void*>change)  # of scalars and untracked rows, as read_map says
        run.append(change)
        i += 1
    return epoch, txn, run, i


def append_changes(list columns, tuple names, object epoch, object partition, list changes):
    """append_signed_rows of each ``(offset, key, before, after)`` of an epoch's changes."""
    cdef tuple change
    for change in changes:
        append_signed_rows(columns, names, epoch, partition, change[0], change[1], change[2], change[3])


# --- key-order members (mvlog.key_order) -------------------------------------------------------------

cdef int put_big_endian(Buffer* buf, uint64_t bits) except -1:
    cdef int shift
    if buf.size + 8 > buf.capacity:
        buffer_reserve(buf, 8)
    for shift in range(56, -8, -8):
        buf.data[buf.size] = <char>((bits >> shift) & 0xFF)
        buf.size += 1
    return 0


cdef int put_escaped(Buffer* buf, const char* data, Py_ssize_t length) except -1:
    """Bytes with 0x00 escaped as 0x00 0xFF, terminated by 0x00 0x00."""
    cdef Py_ssize_t i
    if buf.size + 2 * length + 2 > buf.capacity:
        buffer_reserve(buf, 2 * length + 2)
    for i in range(length):
        buf.data[buf.size] = data[i]
        buf.size += 1
        if data[i] == 0:
            buf.data[buf.size] = <char>0xFF
            buf.size += 1
    buf.data[buf.size] = 0
    buf.data[buf.size + 1] = 0
    buf.size += 2
    return 0


cdef int put_ordered(Buffer* buf, object value) except -1:
    """One value's order-preserving encoding; 0 when its type is not handled here."""
    cdef type kind = type(value)
    cdef int overflow = 0
    cdef long long number
    cdef double real
    cdef uint64_t bits
    cdef Py_ssize_t length
    cdef const char* text
    if value is None:
        put_byte(buf, 0x00)
    elif kind is bool:
        put_byte(buf, 0x01)
        put_byte(buf, 1 if value is True else 0)
    elif kind is int:
        number = PyLong_AsLongLongAndOverflow(value, &overflow)
        if overflow != 0:
            return 0
        put_byte(buf, 0x02)
        put_big_endian(buf, (<uint64_t>number) ^ (<uint64_t>1 << 63))
    elif kind is float:
        real = PyFloat_AS_DOUBLE(value)
        memcpy(&bits, &real, 8)
        bits = ~bits if bits >> 63 else bits | (<uint64_t>1 << 63)
        put_byte(buf, 0x03)
        put_big_endian(buf, bits)
    elif kind is str:
        text = PyUnicode_AsUTF8AndSize(value, &length)
        put_byte(buf, 0x04)
        put_escaped(buf, text, length)
    elif kind is bytes:
        put_byte(buf, 0x05)
        put_escaped(buf, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))
    else:
        return 0
    return 1


def order_member(int vnode, tuple key, bytes avro_key):
    """vnode byte + the key's ordered encoding + the Avro key + its length (2 bytes, big-endian); None
    when a value or the sizes are not handled here (the Python path then says why)."""
    return make_member(vnode, key, avro_key)


cdef object make_member(int vnode, tuple key, bytes avro_key):
    cdef Buffer buf
    cdef Py_ssize_t length = PyBytes_GET_SIZE(avro_key)
    if not 0 <= vnode <= 255 or length > 0xFFFF:
        return None
    buffer_init(&buf)
    try:
        put_byte(&buf, <char>vnode)
        for value in key:
            if not put_ordered(&buf, value):
                return None
        if buf.size + length + 2 > buf.capacity:
            buffer_reserve(&buf, length + 2)
        memcpy(buf.data + buf.size, PyBytes_AS_STRING(avro_key), length)
        buf.size += length
        put_byte(&buf, <char>(length >> 8))
        put_byte(&buf, <char>(length & 0xFF))
        return PyBytes_FromStringAndSize(buf.data, buf.size)
    finally:
        buffer_free(&buf)


# --- vnodes (mvlog.vnode) ----------------------------------------------------------------------------

cdef uint32_t CRC_TABLE[256]


cdef void crc_table_init() noexcept:
    cdef uint32_t c
    cdef int n, k
    for n in range(256):
        c = <uint32_t>n
        for k in range(8):
            c = (0xEDB88320 ^ (c >> 1)) if c & 1 else (c >> 1)
        CRC_TABLE[n] = c


crc_table_init()


cdef inline int vnode_of_bytes(bytes key) noexcept:
    """zlib.crc32(key) % 256, as mvlog.vnode computes it."""
    cdef const unsigned char* data = <const unsigned char*>PyBytes_AS_STRING(key)
    cdef Py_ssize_t i
    cdef uint32_t crc = 0xFFFFFFFF
    for i in range(PyBytes_GET_SIZE(key)):
        crc = CRC_TABLE[(crc ^ data[i]) & 0xFF] ^ (crc >> 8)
    return (crc ^ 0xFFFFFFFF) & 0xFF


def vnode_of(bytes key):
    return vnode_of_bytes(key)


def order_members(list keys, list avro_keys, object member_py):
    """order_member of each key and Avro key, the vnode taken from the Avro key; ``member_py(vnode, key,
    avro_key)`` makes the members of keys not handled here."""
    cdef Py_ssize_t i, count = len(keys)
    cdef list members = []
    cdef int vnode
    if len(avro_keys) != count:
        raise ValueError(f"{count} keys but {len(avro_keys)} Avro keys")
    for i in range(count):
        key, avro_key = keys[i], avro_keys[i]
        member = None
        if type(key) is tuple and type(avro_key) is bytes:
            vnode = vnode_of_bytes(<bytes>avro_key)
            member = make_member(vnode, <tuple>key, <bytes>avro_key)
        if member is None:
            member = member_py(vnode_of_py(avro_key), key, avro_key)
        members.append(member)
    return members


cdef object vnode_of_py(object avro_key):
    from mvlog.vnode import vnode_of as python_vnode_of
    return python_vnode_of(avro_key)


# --- a table writer's epoch (mvlog.services.tables.writer) ---------------------------------------------

cdef inline Py_ssize_t op_index(str op) except -1:
    if op == "c":
        return 0
    if op == "u":
        return 1
    if op == "d":
        return 2
    raise ValueError(f"unknown op {op!r}")


def encode_created(dict pending, tuple key_columns, str op, list out, object encode_key_py, object encode_row_py):
    """A first load's changes: ``(key bytes, op, None, row bytes, key)`` of each ``key -> row`` of
    ``pending`` that has a row (None: a delete, of a key that has no row yet). Keys and rows not handled
    here are encoded by ``encode_key_py(key_columns, key)`` and ``encode_row_py(row)``."""
    cdef Py_ssize_t position = 0
    cdef PyObject* key
    cdef PyObject* row
    cdef object kb, rb
    while PyDict_Next(pending, &position, &key, &row):
        if <object>row is None:
            continue
        kb = key_bytes(key_columns, <tuple>key) if type(<object>key) is tuple else None
        if kb is None:
            kb = encode_key_py(key_columns, <object>key)
        rb = value_map_bytes(<object>row)
        if rb is None:
            rb = encode_row_py(<object>row)
        out.append((kb, op, None, rb, <object>key))


def encode_table_changes(list changes, Py_ssize_t start, Py_ssize_t stop, list tails, object make_tail,
                         list row_kv, list order_puts, object on_delete, object member_of, list out):
    """The Kafka records and Redis commands of ``changes[start:stop]``, each change being ``(key bytes,
    op, before, after, key)`` with rows already encoded (None: no row).

    Appends ``(key bytes, vnode, change event)`` to ``out``: the event is the rows' union branches and
    bytes followed by the tail (op, source, ts_ms) ``tails[op * 256 + vnode]``, which ``make_tail(vnode,
    op)`` fills when it is None. A change with a row after appends key bytes and row to ``row_kv`` and
    the key's order member to ``order_puts`` (``member_of(vnode, key, key bytes)`` for keys not handled
    here); a delete calls ``on_delete(vnode, key bytes, before)``.
    """
    cdef tuple change
    cdef bytes kb, tail, value
    cdef object before, after, member
    cdef int vnode
    cdef Py_ssize_t slot, before_size, after_size, tail_size, at
    cdef char* data
    for change in changes[start:stop]:
        kb = <bytes>change[0]
        before = change[2]
        after = change[3]
        vnode = vnode_of_bytes(kb)
        slot = op_index(<str>change[1]) * 256 + vnode
        tail = <bytes>tails[slot]
        if tail is None:
            tail = <bytes>make_tail(vnode, change[1])
            tails[slot] = tail
        if after is None:
            on_delete(vnode, kb, before)
        else:
            row_kv.append(kb)
            row_kv.append(after)
            member = make_member(vnode, <tuple>change[4], kb)
            order_puts.append(member if member is not None else member_of(vnode, change[4], kb))
        before_size = 0 if before is None else PyBytes_GET_SIZE(<bytes>before)
        after_size = 0 if after is None else PyBytes_GET_SIZE(<bytes>after)
        tail_size = PyBytes_GET_SIZE(tail)
        value = PyBytes_FromStringAndSize(NULL, 2 + before_size + after_size + tail_size)
        data = PyBytes_AS_STRING(value)
        data[0] = 0 if before is None else 2
        if before_size:
            memcpy(data + 1, PyBytes_AS_STRING(<bytes>before), before_size)
        at = 1 + before_size
        data[at] = 0 if after is None else 2
        if after_size:
            memcpy(data + at + 1, PyBytes_AS_STRING(<bytes>after), after_size)
        memcpy(data + at + 1 + after_size, PyBytes_AS_STRING(tail), tail_size)
        out.append((kb, vnode, value))


# --- an epoch's Redis commands (mvlog.connectors.redis.streamed_commit) ------------------------------

cdef int put_decimal(Buffer* buf, Py_ssize_t n) except -1:
    """``n`` (>= 0) in ASCII digits."""
    cdef char[24] digits
    cdef int count = 0
    if n == 0:
        return put_byte(buf, 48)
    while n > 0:
        digits[count] = <char>(48 + n % 10)
        n //= 10
        count += 1
    buffer_reserve(buf, count)
    while count > 0:
        count -= 1
        buf.data[buf.size] = digits[count]
        buf.size += 1
    return 0


cdef int put_bulk(Buffer* buf, const char* data, Py_ssize_t length) except -1:
    """A RESP bulk string: ``$<length>\\r\\n<data>\\r\\n``."""
    put_byte(buf, 36)
    put_decimal(buf, length)
    buffer_reserve(buf, length + 4)
    buf.data[buf.size] = 13
    buf.data[buf.size + 1] = 10
    memcpy(buf.data + buf.size + 2, data, length)
    buf.data[buf.size + 2 + length] = 13
    buf.data[buf.size + 3 + length] = 10
    buf.size += length + 4
    return 0


def pack_items(tuple head, list items, Py_ssize_t start, Py_ssize_t stop, bytes each_before):
    """One Redis command in RESP, as ``hiredis.pack_command(head + items[start:stop])`` packs it: the ``head``
    arguments (str or bytes), then the bytes of ``items[start:stop]``, each preceded by ``each_before`` unless
    that is empty (a ZADD's score). The commit of a table's epoch sends some 30k such arguments."""
    cdef Buffer buf
    cdef Py_ssize_t length, count, i
    cdef const char* text
    cdef object arg
    cdef bytes item
    if stop > len(items) or start < 0 or start > stop:
        raise IndexError("pack_items: start and stop must lie within items")
    count = len(head) + (stop - start) * (2 if len(each_before) else 1)
    buffer_init(&buf)
    try:
        put_byte(&buf, 42)
        put_decimal(&buf, count)
        put_byte(&buf, 13)
        put_byte(&buf, 10)
        for arg in head:
            if type(arg) is str:
                text = PyUnicode_AsUTF8AndSize(arg, &length)
            elif type(arg) is bytes:
                text = PyBytes_AS_STRING(<bytes>arg)
                length = PyBytes_GET_SIZE(<bytes>arg)
            else:
                raise TypeError(f"pack_items: a head argument must be str or bytes, not {type(arg).__name__}")
            put_bulk(&buf, text, length)
        for i in range(start, stop):
            item = <bytes?>items[i]
            if len(each_before):
                put_bulk(&buf, PyBytes_AS_STRING(each_before), PyBytes_GET_SIZE(each_before))
            put_bulk(&buf, PyBytes_AS_STRING(item), PyBytes_GET_SIZE(item))
        return PyBytes_FromStringAndSize(buf.data, buf.size)
    finally:
        buffer_free(&buf)


# --- rows written to a table (mvlog.services.tables.writer) ------------------------------------------

cdef enum:
    INT_COLUMN = 0
    FLOAT_COLUMN = 1
    STRING_COLUMN = 2
    BOOLEAN_COLUMN = 3
    BYTES_COLUMN = 4


def normalize_row(object row, tuple columns, tuple key_positions):
    """``(normalized row, key, characters of its text and bytes)`` of a plain row that is valid at a
    glance, else None (the schema then names each problem, or normalizes what this does not take).

    ``columns``: ``(name, kind, nullable)`` per column in schema order (kinds as the enum above). Valid at
    a glance: a dict holding only column names, each value None where nullable or of exactly its column's
    type (an int for a float column too, made a float; no NaN; ints within 64 bits). The normalized row
    has every column, in schema order, absent ones None.
    """
    cdef dict out = {}
    cdef Py_ssize_t found = 0
    cdef Py_ssize_t text = 0
    cdef int overflow = 0
    cdef PyObject* slot
    cdef tuple column
    cdef int kind
    cdef type vtype
    cdef double real
    if type(row) is not dict:
        return None
    for column in columns:
        slot = PyDict_GetItem(<dict>row, column[0])
        if slot == NULL:
            value = None
        else:
            value = <object>slot
            found += 1
        if value is None:
            if not column[2]:
                return None
        else:
            kind = column[1]
            vtype = type(value)
            if kind == INT_COLUMN:
                if vtype is not int:
                    return None
                PyLong_AsLongLongAndOverflow(value, &overflow)
                if overflow != 0:
                    return None
            elif kind == FLOAT_COLUMN:
                if vtype is int:
                    value = float(value)
                elif vtype is not float:
                    return None
                real = PyFloat_AS_DOUBLE(value)
                if real != real:  # NaN
                    return None
            elif kind == STRING_COLUMN:
                if vtype is not str:
                    return None
                text += len(<str>value)
            elif kind == BOOLEAN_COLUMN:
                if vtype is not bool:
                    return None
            elif kind == BYTES_COLUMN:
                if vtype is not bytes and vtype is not bytearray:
                    return None
                text += len(value)
            else:
                return None
        PyDict_SetItem(out, column[0], value)
    if found != PyDict_Size(<dict>row):  # a key that is not a column
        return None
    key = tuple([out[columns[i][0]] for i in key_positions])
    return out, key, text
