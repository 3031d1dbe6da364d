// The runner's line sink in C++: the common path of runner/profiler.py's LineProfiler.
//
// LineProfiler.line/_close/_line_row run at every line the runner traces: in Python they
// cost about 3.5 us a line (a monitoring callback, the sink's frames, the statement
// mapping, the aggregates, a timeline row). Core does the same work on the very same
// Python objects (the profiler's frame stack, its per-line aggregate lists, its statement
// tables, its attributes peak/_floor/_significant/_seq/_extras_at) and hands the rare
// cases back to the profiler's own Python code: a code object seen for the first time, a
// line event without its frame, a line's first execution (its timeline cells), an
// execution near the run's peak (_offer), the timeline's extras every extras_every
// seconds, a snapshot window, a census. So the results are the Python path's, event for
// event, and the Python path stays whole for every case Core does not take.
//
// The memory read: the sampler's sample() (a Python call), or, where the sampler is the
// CUDA sampler reading through the native cuda_stats module (its _read), that read called
// directly, with the sampler's reserved/reserved_peak/events set as its sample() sets
// them. Loaded by gpu_mem_track/native/linesink.py; built by build.py (no torch library
// needed).
#include <Python.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <new>
#include <unordered_map>

#ifndef GPU_MEM_TRACK_TORCH
#error "build with -DGPU_MEM_TRACK_TORCH=\"<torch.__version__>\" (gpu_mem_track/native/build.py does)"
#endif

namespace {

constexpr int kAbi = 2;

// Indexes of a frame list and of an aggregate list (runner/profiler.py).
enum { F_CODE, F_FIRST, F_MEMORY, F_HIGH, F_TIME, F_EVENTS, F_LAST, F_RES, F_RES_PEAK };
enum { S_HITS, S_MEMORY, S_INCREMENT, S_PEAK, S_EXACT, S_SECONDS, S_RISE, S_RESERVED, S_WHERE };

PyObject* s_peak;
PyObject* s_floor;
PyObject* s_significant;
PyObject* s_seq;
PyObject* s_extras_at;
PyObject* s_read;
PyObject* s_index;
PyObject* s_reserved;
PyObject* s_reserved_peak;
PyObject* s_events;
PyObject* s_extras;
PyObject* s_add;

// (code object, line) -> its aggregate list in the profiler's _stats (a strong reference):
// found without building the (id(code), line) key tuple at every line.
struct LineKey {
  const void* code;
  long long line;
  bool operator==(const LineKey& other) const { return code == other.code && line == other.line; }
};

struct LineKeyHash {
  size_t operator()(const LineKey& key) const {
    return std::hash<const void*>()(key.code) ^ (std::hash<long long>()(key.line) * 0x9E3779B97F4A7C15ULL);
  }
};

using StatsCache = std::unordered_map<LineKey, PyObject*, LineKeyHash>;

struct Core {
  PyObject_HEAD
  PyObject* profiler;
  PyObject* stack;       // list of frame lists
  PyObject* stats;       // {(id(code), line): aggregate list}
  PyObject* starts;      // {id(code): {line: statement's first line}}
  PyObject* sampler;
  PyObject* sample;      // sampler.sample
  PyObject* clock;
  PyObject* write_text;  // or None
  PyObject* windows;     // or None
  PyObject* on_increment;
  PyObject* threshold;   // int or None
  PyObject* start_time;  // float
  PyObject* extras_every;
  PyObject* rank_cell;   // str
  PyObject* py_line;     // the profiler's Python line(code, lineno)
  PyObject* py_offer;
  PyObject* py_where;
  PyObject* py_start;    // the monitoring engine's Python decision on code not wanted so far
  PyObject* wanted;      // the engine's wanted code objects, {id(code): code}, or None
  PyObject* cached_read; // the sampler's native read, as last looked up
  PyObject* cached_index;
  PyObject* attrs;       // the profiler's __dict__: peak, _floor, _significant, _seq, _extras_at
  PyObject* pending;     // the timeline writer's list of rows waiting (appender()), or None
  PyObject* flush;       // its flush()
  double flush_seconds;
  double flushed;        // monotonic seconds of this core's last flush
  StatsCache* cache;     // see LineKey
  // reserved, reserved_peak, events of the last native read (owned; valid while
  // read_valid: set by a native read, cleared by a sample() in Python)
  PyObject* last[3];
  int read_valid;
  int reserved_flag;
  int on_cuda;
  int native_reads;      // the sampler may read natively (a CudaSampler)
  unsigned long main_thread;
};

// Readings of one sample.
struct Reading {
  long long current, high;
};

// A new list of nine items (the size of a frame and of an aggregate list).
PyObject* list9(PyObject* a, PyObject* b, PyObject* c, PyObject* d, PyObject* e, PyObject* f, PyObject* g,
                PyObject* h, PyObject* i) {
  PyObject* list = PyList_New(9);
  if (list == nullptr) return nullptr;
  PyObject* items[9] = {a, b, c, d, e, f, g, h, i};
  for (Py_ssize_t k = 0; k < 9; ++k) {
    Py_INCREF(items[k]);
    PyList_SET_ITEM(list, k, items[k]);
  }
  return list;
}

int as_ll(PyObject* value, long long* out) {
  *out = PyLong_AsLongLong(value);
  return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

// Set an item of a list to a new int, stealing nothing.
int set_ll(PyObject* list, Py_ssize_t index, long long value) {
  PyObject* number = PyLong_FromLongLong(value);
  if (number == nullptr) return -1;
  return PyList_SetItem(list, index, number);  // steals number
}

int set_item(PyObject* list, Py_ssize_t index, PyObject* value) {
  Py_INCREF(value);
  return PyList_SetItem(list, index, value);
}

int get_attr_ll(PyObject* object, PyObject* name, long long* out) {
  PyObject* value = PyObject_GetAttr(object, name);
  if (value == nullptr) return -1;
  int rc = as_ll(value, out);
  Py_DECREF(value);
  return rc;
}

// An int attribute of the profiler, read from its __dict__ (faster than getattr).
int get_own_ll(Core* self, PyObject* name, long long* out) {
  PyObject* value = PyDict_GetItemWithError(self->attrs, name);
  if (value == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, name);
    return -1;
  }
  return as_ll(value, out);
}

int set_own_ll(Core* self, PyObject* name, long long value) {
  PyObject* number = PyLong_FromLongLong(value);
  if (number == nullptr) return -1;
  int rc = PyDict_SetItem(self->attrs, name, number);
  Py_DECREF(number);
  return rc;
}

double monotonic() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// Hand a formatted row to the timeline: appended to its pending list, flushed within
// flush_seconds (as TimelineWriter.write_text), or given to write_text (another writer).
int write_row(Core* self, PyObject* row) {
  if (self->pending != Py_None) {
    if (PyList_Append(self->pending, row) < 0) return -1;
    double now = monotonic();
    if (now - self->flushed >= self->flush_seconds) {
      self->flushed = now;
      PyObject* done = PyObject_CallNoArgs(self->flush);
      if (done == nullptr) return -1;
      Py_DECREF(done);
    }
    return 0;
  }
  PyObject* done = PyObject_CallOneArg(self->write_text, row);
  if (done == nullptr) return -1;
  Py_DECREF(done);
  return 0;
}

// One reading: the native read where the sampler has one, else sampler.sample().
int take_sample(Core* self, Reading* out) {
  if (self->native_reads) {
    PyObject* read = PyObject_GetAttr(self->sampler, s_read);
    if (read == nullptr) return -1;
    if (read != Py_None) {
      if (read != self->cached_read) {
        PyObject* index = PyObject_GetAttr(self->sampler, s_index);
        if (index == nullptr) {
          Py_DECREF(read);
          return -1;
        }
        Py_XSETREF(self->cached_index, index);
        Py_INCREF(read);
        Py_XSETREF(self->cached_read, read);
      }
      PyObject* figures = PyObject_CallOneArg(read, self->cached_index);
      Py_DECREF(read);
      if (figures == nullptr) return -1;
      if (!PyTuple_Check(figures) || PyTuple_GET_SIZE(figures) != 5) {
        Py_DECREF(figures);
        PyErr_SetString(PyExc_TypeError, "the native read did not return five figures");
        return -1;
      }
      // as CudaSampler.sample() does: reserved, reserved_peak, events follow the read
      if (as_ll(PyTuple_GET_ITEM(figures, 0), &out->current) < 0 ||
          as_ll(PyTuple_GET_ITEM(figures, 1), &out->high) < 0 ||
          PyObject_SetAttr(self->sampler, s_reserved, PyTuple_GET_ITEM(figures, 2)) < 0 ||
          PyObject_SetAttr(self->sampler, s_reserved_peak, PyTuple_GET_ITEM(figures, 3)) < 0 ||
          PyObject_SetAttr(self->sampler, s_events, PyTuple_GET_ITEM(figures, 4)) < 0) {
        Py_DECREF(figures);
        return -1;
      }
      for (int k = 0; k < 3; ++k) Py_XSETREF(self->last[k], Py_NewRef(PyTuple_GET_ITEM(figures, 2 + k)));
      self->read_valid = 1;
      Py_DECREF(figures);
      return 0;
    }
    Py_DECREF(read);
  }
  self->read_valid = 0;
  PyObject* pair = PyObject_CallNoArgs(self->sample);
  if (pair == nullptr) return -1;
  PyObject* seq = PySequence_Fast(pair, "sample() must return (current, high)");
  Py_DECREF(pair);
  if (seq == nullptr) return -1;
  int rc = -1;
  if (PySequence_Fast_GET_SIZE(seq) != 2) {
    PyErr_SetString(PyExc_ValueError, "sample() must return (current, high)");
  } else if (as_ll(PySequence_Fast_GET_ITEM(seq, 0), &out->current) == 0 &&
             as_ll(PySequence_Fast_GET_ITEM(seq, 1), &out->high) == 0) {
    rc = 0;
  }
  Py_DECREF(seq);
  return rc;
}

enum { LAST_RESERVED, LAST_RESERVED_PEAK, LAST_EVENTS };
PyObject* const* last_names[3] = {&s_reserved, &s_reserved_peak, &s_events};

// The sampler's reserved / reserved_peak / events (new reference): as the last native read
// set them, else read from the sampler (what LineProfiler reads).
PyObject* sampler_value(Core* self, int which) {
  if (self->read_valid && self->last[which] != nullptr) return Py_NewRef(self->last[which]);
  return PyObject_GetAttr(self->sampler, *last_names[which]);
}

int sampler_ll(Core* self, int which, long long* out) {
  PyObject* value = sampler_value(self, which);
  if (value == nullptr) return -1;
  int rc = as_ll(value, out);
  Py_DECREF(value);
  return rc;
}

int take_clock(Core* self, double* out) {
  PyObject* now = PyObject_CallNoArgs(self->clock);
  if (now == nullptr) return -1;
  *out = PyFloat_AsDouble(now);
  Py_DECREF(now);
  return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

// A row being formatted: a growing buffer (on the stack while it fits).
struct Row {
  char local[512];
  char* data = local;
  size_t used = 0;
  size_t size = sizeof(local);
  Row() = default;
  Row(const Row&) = delete;
  Row& operator=(const Row&) = delete;
  ~Row() {
    if (data != local) PyMem_Free(data);
  }
  bool reserve(size_t more) {
    if (used + more <= size) return true;
    size_t wanted = (used + more) * 2;
    char* bigger = static_cast<char*>(PyMem_Malloc(wanted));
    if (bigger == nullptr) {
      PyErr_NoMemory();
      return false;
    }
    std::memcpy(bigger, data, used);
    if (data != local) PyMem_Free(data);
    data = bigger;
    size = wanted;
    return true;
  }
  bool text(const char* text, size_t length) {
    if (!reserve(length)) return false;
    std::memcpy(data + used, text, length);
    used += length;
    return true;
  }
  bool chr(char c) { return text(&c, 1); }
  // the digits of value, as str(int) writes them
  bool integer(long long value) {
    char digits[24];
    char* end = digits + sizeof(digits);
    char* at = end;
    unsigned long long magnitude = value < 0 ? 0ULL - static_cast<unsigned long long>(value)
                                             : static_cast<unsigned long long>(value);
    do {
      *--at = static_cast<char>('0' + magnitude % 10);
      magnitude /= 10;
    } while (magnitude);
    if (value < 0) *--at = '-';
    return text(at, static_cast<size_t>(end - at));
  }
  bool str(PyObject* unicode) {
    Py_ssize_t length = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(unicode, &length);
    return utf8 != nullptr && text(utf8, static_cast<size_t>(length));
  }
  // a cell: "" for None, an int's digits, else str(value) (what the f-string writes)
  bool cell(PyObject* value) {
    if (value == Py_None) return true;
    if (PyLong_CheckExact(value)) {
      int overflow = 0;
      long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
      if (!overflow && !(number == -1 && PyErr_Occurred())) return integer(number);
      PyErr_Clear();
    }
    PyObject* text_value = PyObject_Str(value);
    if (text_value == nullptr) return false;
    bool ok = str(text_value);
    Py_DECREF(text_value);
    return ok;
  }
  // f"{seconds:.6f}": correctly rounded (half to even, on the double's exact value)
  bool seconds(double value) {
    int exponent = 0;
    double fraction = std::frexp(value, &exponent);  // value = fraction * 2**exponent
    if (std::isfinite(value) && std::fabs(value) < 1e9) {
      // value = mantissa * 2**shift exactly, mantissa < 2**53
      long long mantissa = static_cast<long long>(std::ldexp(std::fabs(fraction), 53));
      int shift = exponent - 53;
      unsigned __int128 scaled = static_cast<unsigned __int128>(mantissa) * 1000000u;  // < 2**73
      unsigned long long micros;
      if (value == 0.0) {
        micros = 0;
      } else if (shift >= 0) {
        micros = static_cast<unsigned long long>(scaled << shift);  // |value| < 1e9: fits
      } else if (-shift >= 100) {
        micros = 0;  // below half a microsecond
      } else {
        unsigned __int128 quotient = scaled >> -shift;
        unsigned __int128 rest = scaled - (quotient << -shift);
        unsigned __int128 half = static_cast<unsigned __int128>(1) << (-shift - 1);
        if (rest > half || (rest == half && (quotient & 1))) quotient += 1;
        micros = static_cast<unsigned long long>(quotient);
      }
      if (std::signbit(value) && !chr('-')) return false;
      char digits[8];
      unsigned long long part = micros % 1000000u;
      for (int i = 5; i >= 0; --i) {
        digits[i] = static_cast<char>('0' + part % 10);
        part /= 10;
      }
      return integer(static_cast<long long>(micros / 1000000u)) && chr('.') && text(digits, 6);
    }
    char* formatted = PyOS_double_to_string(value, 'f', 6, 0, nullptr);
    if (formatted == nullptr) return false;
    bool ok = text(formatted, std::strlen(formatted));
    PyMem_Free(formatted);
    return ok;
  }
};

// LineProfiler._line_row: one timeline row, formatted as the Python f-string does.
int line_row(Core* self, PyObject* where, long long lineno, long long current, long long increment,
             long long peak, double now) {
  double start = PyFloat_AsDouble(self->start_time);
  double every = PyFloat_AsDouble(self->extras_every);
  if (PyErr_Occurred()) return -1;
  double elapsed = now - start;
  PyObject* extras_at_obj = PyDict_GetItemWithError(self->attrs, s_extras_at);
  if (extras_at_obj == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, s_extras_at);
    return -1;
  }
  double extras_at = PyFloat_AsDouble(extras_at_obj);
  if (extras_at == -1.0 && PyErr_Occurred()) return -1;
  PyObject* driver = Py_None;
  PyObject* rss = Py_None;
  PyObject* extras = nullptr;
  if (elapsed - extras_at >= every) {
    PyObject* value = PyFloat_FromDouble(elapsed);
    if (value == nullptr) return -1;
    int rc = PyDict_SetItem(self->attrs, s_extras_at, value);
    Py_DECREF(value);
    if (rc < 0) return -1;
    extras = PyObject_CallMethodNoArgs(self->sampler, s_extras);
    if (extras == nullptr) return -1;
    if (!PyTuple_Check(extras) || PyTuple_GET_SIZE(extras) != 2) {
      Py_DECREF(extras);
      PyErr_SetString(PyExc_TypeError, "extras() must return (driver, rss)");
      return -1;
    }
    driver = PyTuple_GET_ITEM(extras, 0);
    rss = PyTuple_GET_ITEM(extras, 1);
  }
  long long seq = 0;
  PyObject* reserved = nullptr;
  int rc = -1;
  Row row;
  if (get_own_ll(self, s_seq, &seq) == 0 && set_own_ll(self, s_seq, seq + 1) == 0 &&
      (reserved = sampler_value(self, LAST_RESERVED)) != nullptr) {
    // f"{seq},{elapsed:.6f},{where},{lineno},,{memory},{increment},{peak},{allocated},"
    // f"{reserved},{driver},{rss},{rank}\n"
    bool ok = row.integer(seq + 1) && row.chr(',') && row.seconds(elapsed) && row.chr(',') && row.str(where) &&
              row.chr(',') && row.integer(lineno) && row.text(",,", 2) && row.integer(current) && row.chr(',') &&
              row.integer(increment) && row.chr(',') && row.integer(peak) && row.chr(',') &&
              (!self->on_cuda || row.integer(current)) && row.chr(',') && row.cell(reserved) && row.chr(',') &&
              row.cell(driver) && row.chr(',') && row.cell(rss) && row.chr(',') && row.str(self->rank_cell) &&
              row.chr('\n');
    if (ok) {
      PyObject* text = PyUnicode_DecodeUTF8(row.data, static_cast<Py_ssize_t>(row.used), nullptr);
      if (text != nullptr) {
        rc = write_row(self, text);
        Py_DECREF(text);
      }
    }
  }
  Py_XDECREF(reserved);
  Py_XDECREF(extras);
  return rc;
}

// LineProfiler._close: record the end of the frame's running line. 1 when on_increment
// ran, 0 when not, -1 on an error.
int close_line(Core* self, PyObject* frame, long long current, long long high, double now) {
  PyObject* code = PyList_GET_ITEM(frame, F_CODE);
  PyObject* lineno_obj = PyList_GET_ITEM(frame, F_FIRST);
  long long lineno, before, high_before;
  if (as_ll(lineno_obj, &lineno) < 0 || as_ll(PyList_GET_ITEM(frame, F_MEMORY), &before) < 0 ||
      as_ll(PyList_GET_ITEM(frame, F_HIGH), &high_before) < 0)
    return -1;
  Py_INCREF(code);
  Py_INCREF(lineno_obj);
  int result = -1;
  PyObject* stats = nullptr;
  PyObject* key = nullptr;
  long long increment = current - before;
  long long peak;
  bool exact;
  if (high > high_before) {
    peak = high >= before ? high : before;
    exact = true;
    if (current > peak) peak = current;
  } else {
    peak = before >= current ? before : current;
    exact = false;
    if (high < high_before && high > peak) peak = high;
  }
  long long rise = peak - before;
  do {
    const LineKey line_key{code, lineno};
    auto cached = self->cache->find(line_key);
    if (cached != self->cache->end()) {
      stats = cached->second;
      Py_INCREF(stats);
    }
    PyObject* code_id = stats ? nullptr : PyLong_FromVoidPtr(code);
    if (stats == nullptr && code_id == nullptr) break;
    key = stats ? nullptr : PyTuple_Pack(2, code_id, lineno_obj);
    Py_XDECREF(code_id);
    if (stats == nullptr && key == nullptr) break;
    if (stats == nullptr) stats = PyDict_GetItemWithError(self->stats, key);
    if (stats != nullptr) {
      if (cached == self->cache->end()) {
        Py_INCREF(stats);  // the cache's reference
        self->cache->emplace(line_key, stats);
        Py_INCREF(stats);
      }
    } else {
      if (PyErr_Occurred()) break;
      PyObject* where = PyObject_CallOneArg(self->py_where, code);
      if (where == nullptr) break;
      PyObject* zero = PyLong_FromLong(0);
      PyObject* zero_seconds = PyFloat_FromDouble(0.0);
      stats = (zero && zero_seconds)
                  ? list9(zero, zero, zero, zero, Py_False, zero_seconds, zero, zero, where)
                  : nullptr;
      Py_XDECREF(zero);
      Py_XDECREF(zero_seconds);
      Py_DECREF(where);
      if (stats == nullptr || PyDict_SetItem(self->stats, key, stats) < 0) break;
      Py_INCREF(stats);  // the cache's reference
      self->cache->emplace(line_key, stats);
    }
    if (!PyList_CheckExact(stats) || PyList_GET_SIZE(stats) != 9) {
      PyErr_SetString(PyExc_TypeError, "not an aggregate list of LineProfiler");
      break;
    }
    long long hits, increments, stat_peak, stat_rise;
    if (as_ll(PyList_GET_ITEM(stats, S_HITS), &hits) < 0 ||
        as_ll(PyList_GET_ITEM(stats, S_INCREMENT), &increments) < 0 ||
        as_ll(PyList_GET_ITEM(stats, S_PEAK), &stat_peak) < 0 || as_ll(PyList_GET_ITEM(stats, S_RISE), &stat_rise) < 0)
      break;
    if (set_ll(stats, S_HITS, hits + 1) < 0 || set_ll(stats, S_MEMORY, current) < 0 ||
        set_ll(stats, S_INCREMENT, increments + increment) < 0)
      break;
    if (peak > stat_peak || (peak == stat_peak && exact)) {
      if (set_ll(stats, S_PEAK, peak) < 0 || set_item(stats, S_EXACT, exact ? Py_True : Py_False) < 0) break;
    }
    if (rise > stat_rise && set_ll(stats, S_RISE, rise) < 0) break;
    if (self->reserved_flag && PyList_GET_ITEM(frame, F_RES) != Py_None) {
      long long reserved_peak, frame_res_peak, frame_res, reserved, stat_reserved;
      if (sampler_ll(self, LAST_RESERVED_PEAK, &reserved_peak) < 0 ||
          as_ll(PyList_GET_ITEM(frame, F_RES_PEAK), &frame_res_peak) < 0 ||
          as_ll(PyList_GET_ITEM(stats, S_RESERVED), &stat_reserved) < 0)
        break;
      if (reserved_peak <= frame_res_peak) {
        if (as_ll(PyList_GET_ITEM(frame, F_RES), &frame_res) < 0 ||
            sampler_ll(self, LAST_RESERVED, &reserved) < 0)
          break;
        reserved_peak = reserved > frame_res ? reserved : frame_res;
      }
      if (reserved_peak > stat_reserved && set_ll(stats, S_RESERVED, reserved_peak) < 0) break;
    }
    double seconds = PyFloat_AsDouble(PyList_GET_ITEM(stats, S_SECONDS));
    double started = PyFloat_AsDouble(PyList_GET_ITEM(frame, F_TIME));
    if (PyErr_Occurred()) break;
    PyObject* total = PyFloat_FromDouble(seconds + (now - started));
    if (total == nullptr || PyList_SetItem(stats, S_SECONDS, total) < 0) break;
    if (self->windows != Py_None) {
      PyObject* events = sampler_value(self, LAST_EVENTS);
      if (events == nullptr) break;
      PyObject* frame_events = PyList_GET_ITEM(frame, F_EVENTS);
      int differ = PyObject_RichCompareBool(events, frame_events, Py_NE);
      if (differ < 0) {
        Py_DECREF(events);
        break;
      }
      if (differ) {
        PyObject* done = PyObject_CallMethod(self->windows, "add", "OOOOLL", code, lineno_obj, frame_events, events,
                                             before, current);
        if (done == nullptr) {
          Py_DECREF(events);
          break;
        }
        Py_DECREF(done);
      }
      Py_DECREF(events);
    }
    long long run_peak, significant, floor_;
    if (get_own_ll(self, s_peak, &run_peak) < 0 || get_own_ll(self, s_significant, &significant) < 0 ||
        get_own_ll(self, s_floor, &floor_) < 0)
      break;
    if (peak > run_peak || (rise > significant && peak >= floor_)) {
      PyObject* filename = PyObject_GetAttrString(code, "co_filename");
      if (filename == nullptr) break;
      PyObject* done = PyObject_CallFunction(self->py_offer, "LL(OO)", peak, rise, filename, lineno_obj);
      Py_DECREF(filename);
      if (done == nullptr) break;
      Py_DECREF(done);
    }
    if (self->write_text != Py_None &&
        line_row(self, PyList_GET_ITEM(stats, S_WHERE), lineno, current, increment, peak, now) < 0)
      break;
    result = 0;
    if (self->threshold != Py_None && PyObject_IsTrue(self->on_increment)) {
      // a threshold beyond int64 (--census-threshold 100EiB) is compared as Python does:
      // above it, never reached; below it, always
      int overflow = 0;
      long long threshold = PyLong_AsLongLongAndOverflow(self->threshold, &overflow);
      if (threshold == -1 && PyErr_Occurred()) {
        result = -1;
        break;
      }
      if (overflow < 0 || (overflow == 0 && increment >= threshold)) {
        PyObject* done = PyObject_CallFunction(self->on_increment, "OOL", code, lineno_obj, increment);
        if (done == nullptr) {
          result = -1;
          break;
        }
        Py_DECREF(done);
        result = 1;
      }
    }
  } while (false);
  Py_XDECREF(stats);
  Py_XDECREF(key);
  Py_DECREF(code);
  Py_DECREF(lineno_obj);
  return result;
}

PyObject* fallback_line(Core* self, PyObject* code, PyObject* lineno) {
  PyObject* args[2] = {code, lineno};
  return PyObject_Vectorcall(self->py_line, args, 2, nullptr);
}

// LineProfiler.line
PyObject* do_line(Core* self, PyObject* code, PyObject* lineno_obj) {
  PyObject* code_id = PyLong_FromVoidPtr(code);
  if (code_id == nullptr) return nullptr;
  PyObject* starts = PyDict_GetItemWithError(self->starts, code_id);
  Py_DECREF(code_id);
  if (starts == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    return fallback_line(self, code, lineno_obj);  // first seen: the statement table is parsed there
  }
  if (!PyDict_Check(starts)) return fallback_line(self, code, lineno_obj);
  PyObject* first_obj = lineno_obj;
  if (PyDict_GET_SIZE(starts)) {
    PyObject* found = PyDict_GetItemWithError(starts, lineno_obj);
    if (found != nullptr) {
      first_obj = found;
    } else if (PyErr_Occurred()) {
      return nullptr;
    }
  }
  Py_ssize_t depth = PyList_GET_SIZE(self->stack);
  PyObject* frame = depth ? PyList_GET_ITEM(self->stack, depth - 1) : nullptr;
  if (frame == nullptr || !PyList_CheckExact(frame) || PyList_GET_SIZE(frame) != 9 ||
      PyList_GET_ITEM(frame, F_CODE) != code)
    return fallback_line(self, code, lineno_obj);  // an event the engine did not send
  long long lineno, first;
  if (as_ll(lineno_obj, &lineno) < 0 || as_ll(first_obj, &first) < 0) return nullptr;
  PyObject* running = PyList_GET_ITEM(frame, F_FIRST);
  if (running != Py_None) {
    long long running_first, last;
    if (as_ll(running, &running_first) < 0 || as_ll(PyList_GET_ITEM(frame, F_LAST), &last) < 0) return nullptr;
    if (running_first == first && (lineno != first || last != first)) {
      if (set_item(frame, F_LAST, lineno_obj) < 0) return nullptr;
      Py_RETURN_NONE;
    }
  }
  Py_INCREF(frame);
  Py_INCREF(first_obj);
  PyObject* result = nullptr;
  do {
    Reading reading;
    double now;
    if (take_sample(self, &reading) < 0 || take_clock(self, &now) < 0) break;
    if (running != Py_None) {
      int closed = close_line(self, frame, reading.current, reading.high, now);
      if (closed < 0) break;
      if (closed && (take_sample(self, &reading) < 0 || take_clock(self, &now) < 0)) break;
    }
    PyObject* now_obj = PyFloat_FromDouble(now);
    if (now_obj == nullptr) break;
    if (set_item(frame, F_FIRST, first_obj) < 0 || set_ll(frame, F_MEMORY, reading.current) < 0 ||
        set_ll(frame, F_HIGH, reading.high) < 0 || PyList_SetItem(frame, F_TIME, now_obj) < 0 ||
        set_item(frame, F_LAST, lineno_obj) < 0)
      break;
    if (self->reserved_flag) {
      PyObject* reserved = sampler_value(self, LAST_RESERVED);
      if (reserved == nullptr || PyList_SetItem(frame, F_RES, reserved) < 0) break;
      PyObject* reserved_peak = sampler_value(self, LAST_RESERVED_PEAK);
      if (reserved_peak == nullptr || PyList_SetItem(frame, F_RES_PEAK, reserved_peak) < 0) break;
    }
    if (self->windows != Py_None) {
      PyObject* events = sampler_value(self, LAST_EVENTS);
      if (events == nullptr || PyList_SetItem(frame, F_EVENTS, events) < 0) break;
    }
    result = Py_None;
    Py_INCREF(result);
  } while (false);
  Py_DECREF(first_obj);
  Py_DECREF(frame);
  return result;
}

// LineProfiler.enter
PyObject* do_enter(Core* self, PyObject* code) {
  PyObject* zero = PyLong_FromLong(0);
  PyObject* zero_seconds = PyFloat_FromDouble(0.0);
  PyObject* frame = nullptr;
  if (zero != nullptr && zero_seconds != nullptr)
    frame = list9(code, Py_None, zero, zero, zero_seconds, zero, zero, Py_None, zero);
  Py_XDECREF(zero);
  Py_XDECREF(zero_seconds);
  if (frame == nullptr) return nullptr;
  int rc = PyList_Append(self->stack, frame);
  Py_DECREF(frame);
  if (rc < 0) return nullptr;
  Py_RETURN_NONE;
}

// LineProfiler.leave
PyObject* do_leave(Core* self, PyObject* code) {
  Py_ssize_t depth = PyList_GET_SIZE(self->stack);
  if (depth == 0) Py_RETURN_NONE;
  PyObject* frame = PyList_GET_ITEM(self->stack, depth - 1);
  if (!PyList_Check(frame) || PyList_GET_SIZE(frame) != 9) {
    // not a frame of this module (put there from Python): popped where Python's leave
    // pops it (its first item is code), unrecorded, so finish() cannot loop forever
    PyObject* first = PySequence_GetItem(frame, 0);
    if (first == nullptr) {
      PyErr_Clear();
      Py_RETURN_NONE;
    }
    int same = first == code;
    Py_DECREF(first);
    if (same && PyList_SetSlice(self->stack, depth - 1, depth, nullptr) < 0) return nullptr;
    Py_RETURN_NONE;
  }
  if (PyList_GET_ITEM(frame, F_CODE) != code) Py_RETURN_NONE;
  Py_INCREF(frame);
  if (PyList_SetSlice(self->stack, depth - 1, depth, nullptr) < 0) {
    Py_DECREF(frame);
    return nullptr;
  }
  PyObject* result = nullptr;
  if (PyList_GET_ITEM(frame, F_FIRST) == Py_None) {
    result = Py_None;
    Py_INCREF(result);
  } else {
    Reading reading;
    double now;
    if (take_sample(self, &reading) == 0 && take_clock(self, &now) == 0 &&
        close_line(self, frame, reading.current, reading.high, now) >= 0) {
      result = Py_None;
      Py_INCREF(result);
    }
  }
  Py_DECREF(frame);
  return result;
}

bool on_main(Core* self) { return PyThread_get_thread_ident() == self->main_thread; }

int check_args(Py_ssize_t nargs, Py_ssize_t want, const char* name) {
  if (nargs != want) {
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
    return -1;
  }
  return 0;
}

PyObject* core_line(Core* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_args(nargs, 2, "line") < 0) return nullptr;
  return do_line(self, args[0], args[1]);
}

PyObject* core_enter(Core* self, PyObject* code) { return do_enter(self, code); }

PyObject* core_leave(Core* self, PyObject* code) { return do_leave(self, code); }

// Whether the engine wants code: 1, 0, or -1 with an error. Looked up by the code
// object's id, never by its hash (computed anew from its bytecode and constants, nested
// code objects included, at every lookup: see runner/tracer.py).
int is_wanted(Core* self, PyObject* code) {
  if (self->wanted == Py_None) return 0;
  PyObject* key = PyLong_FromVoidPtr(code);
  if (key == nullptr) return -1;
  int found = PyDict_Contains(self->wanted, key);
  Py_DECREF(key);
  return found;
}

// sys.monitoring's LINE callback: (code, line_number), the main thread only.
PyObject* core_monitor_line(Core* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_args(nargs, 2, "monitor_line") < 0) return nullptr;
  if (!on_main(self)) Py_RETURN_NONE;
  return do_line(self, args[0], args[1]);
}

// sys.monitoring's PY_START/PY_RESUME callback: (code, offset). Code not known to be
// wanted goes to the engine's Python decision (which may DISABLE it), from any thread;
// known code enters the sink from the main thread only.
PyObject* core_monitor_start(Core* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_args(nargs, 2, "monitor_start") < 0) return nullptr;
  int known = is_wanted(self, args[0]);
  if (known < 0) return nullptr;
  if (known) {
    if (!on_main(self)) Py_RETURN_NONE;
    return do_enter(self, args[0]);
  }
  return PyObject_Vectorcall(self->py_start, args, 2, nullptr);
}

// sys.monitoring's PY_THROW callback: (code, offset, exception), a global event (never
// DISABLE): wanted code enters the sink from the main thread only.
PyObject* core_monitor_throw(Core* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_args(nargs, 3, "monitor_throw") < 0) return nullptr;
  int known = is_wanted(self, args[0]);
  if (known < 0) return nullptr;
  if (!known || !on_main(self)) Py_RETURN_NONE;
  return do_enter(self, args[0]);
}

// sys.monitoring's PY_RETURN/PY_YIELD/PY_UNWIND callback: (code, offset, value). PY_UNWIND
// is global: the innermost frame's code answers first, as do_leave leaves nothing else.
PyObject* core_monitor_leave(Core* self, PyObject* const* args, Py_ssize_t nargs) {
  if (check_args(nargs, 3, "monitor_leave") < 0) return nullptr;
  if (!on_main(self)) Py_RETURN_NONE;
  Py_ssize_t depth = PyList_GET_SIZE(self->stack);
  if (depth == 0) Py_RETURN_NONE;
  PyObject* top = PyList_GET_ITEM(self->stack, depth - 1);
  if (PyList_Check(top) && PyList_GET_SIZE(top) == 9 && PyList_GET_ITEM(top, F_CODE) != args[0])
    Py_RETURN_NONE;  // do_leave would leave nothing
  int known = is_wanted(self, args[0]);
  if (known < 0) return nullptr;
  if (!known) Py_RETURN_NONE;
  return do_leave(self, args[0]);
}

PyObject* core_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"profiler", "py_line", "native_reads", "wanted", "py_start", "main_thread", nullptr};
  PyObject *profiler, *py_line, *wanted = Py_None, *py_start = Py_None;
  int native_reads = 0;
  unsigned long main_thread = PyThread_get_thread_ident();
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|pOOk", const_cast<char**>(names), &profiler, &py_line,
                                   &native_reads, &wanted, &py_start, &main_thread))
    return nullptr;
  Core* self = reinterpret_cast<Core*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->cache = new (std::nothrow) StatsCache();
  if (self->cache == nullptr) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  self->native_reads = native_reads;
  self->main_thread = main_thread;
  Py_INCREF(profiler);
  self->profiler = profiler;
  Py_INCREF(py_line);
  self->py_line = py_line;
  Py_INCREF(wanted);
  self->wanted = wanted;
  Py_INCREF(py_start);
  self->py_start = py_start;
  struct {
    PyObject** slot;
    const char* name;
  } fields[] = {
      {&self->stack, "_stack"},       {&self->stats, "_stats"},           {&self->starts, "_starts"},
      {&self->sampler, "_sampler"},   {&self->sample, "_sample"},         {&self->clock, "_clock"},
      {&self->write_text, "_write_text"}, {&self->windows, "_windows"},   {&self->on_increment, "_on_increment"},
      {&self->threshold, "_threshold"}, {&self->start_time, "_start"},    {&self->extras_every, "_extras_every"},
      {&self->rank_cell, "_rank_cell"}, {&self->py_offer, "_offer"},      {&self->py_where, "_where_cells"},
  };
  for (auto& field : fields) {
    *field.slot = PyObject_GetAttrString(profiler, field.name);
    if (*field.slot == nullptr) {
      Py_DECREF(self);
      return nullptr;
    }
  }
  if (!PyList_CheckExact(self->stack) || !PyDict_CheckExact(self->stats) || !PyDict_CheckExact(self->starts) ||
      !PyUnicode_Check(self->rank_cell) || (self->wanted != Py_None && !PyDict_Check(self->wanted))) {
    PyErr_SetString(PyExc_TypeError, "not a LineProfiler this module knows");
    Py_DECREF(self);
    return nullptr;
  }
  self->attrs = PyObject_GenericGetDict(profiler, nullptr);
  if (self->attrs == nullptr || !PyDict_Check(self->attrs)) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "the profiler has no __dict__");
    Py_DECREF(self);
    return nullptr;
  }
  // the timeline writer's own list of pending rows, where it offers it
  Py_INCREF(Py_None);
  self->pending = Py_None;
  Py_INCREF(Py_None);
  self->flush = Py_None;
  if (self->write_text != Py_None) {
    PyObject* timeline = PyObject_GetAttrString(profiler, "_timeline");
    if (timeline == nullptr) {
      Py_DECREF(self);
      return nullptr;
    }
    PyObject* appender = PyObject_GetAttrString(timeline, "appender");
    Py_DECREF(timeline);
    if (appender == nullptr) {
      PyErr_Clear();  // another writer: its write_text
    } else {
      PyObject* offered = PyObject_CallNoArgs(appender);
      Py_DECREF(appender);
      if (offered == nullptr || !PyTuple_Check(offered) || PyTuple_GET_SIZE(offered) != 3 ||
          !PyList_CheckExact(PyTuple_GET_ITEM(offered, 0))) {
        Py_XDECREF(offered);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "appender() must return (list, flush, seconds)");
        Py_DECREF(self);
        return nullptr;
      }
      self->flush_seconds = PyFloat_AsDouble(PyTuple_GET_ITEM(offered, 2));
      if (PyErr_Occurred()) {
        Py_DECREF(offered);
        Py_DECREF(self);
        return nullptr;
      }
      Py_SETREF(self->pending, Py_NewRef(PyTuple_GET_ITEM(offered, 0)));
      Py_SETREF(self->flush, Py_NewRef(PyTuple_GET_ITEM(offered, 1)));
      Py_DECREF(offered);
      self->flushed = monotonic();
    }
  }
  PyObject* value = PyObject_GetAttrString(profiler, "_reserved");
  if (value == nullptr) {
    Py_DECREF(self);
    return nullptr;
  }
  self->reserved_flag = PyObject_IsTrue(value);
  Py_DECREF(value);
  value = PyObject_GetAttrString(profiler, "_on_cuda");
  if (value == nullptr) {
    Py_DECREF(self);
    return nullptr;
  }
  self->on_cuda = PyObject_IsTrue(value);
  Py_DECREF(value);
  return reinterpret_cast<PyObject*>(self);
}

int core_traverse(Core* self, visitproc visit, void* arg) {
  Py_VISIT(self->profiler);
  Py_VISIT(self->stack);
  Py_VISIT(self->stats);
  Py_VISIT(self->starts);
  Py_VISIT(self->sampler);
  Py_VISIT(self->sample);
  Py_VISIT(self->clock);
  Py_VISIT(self->write_text);
  Py_VISIT(self->windows);
  Py_VISIT(self->on_increment);
  Py_VISIT(self->threshold);
  Py_VISIT(self->start_time);
  Py_VISIT(self->extras_every);
  Py_VISIT(self->rank_cell);
  Py_VISIT(self->py_line);
  Py_VISIT(self->py_offer);
  Py_VISIT(self->py_where);
  Py_VISIT(self->py_start);
  Py_VISIT(self->wanted);
  Py_VISIT(self->cached_read);
  Py_VISIT(self->cached_index);
  Py_VISIT(self->attrs);
  for (auto* value : self->last) Py_VISIT(value);
  if (self->cache != nullptr) {
    for (auto& entry : *self->cache) Py_VISIT(entry.second);
  }
  Py_VISIT(self->pending);
  Py_VISIT(self->flush);
  return 0;
}

int core_clear(Core* self) {
  Py_CLEAR(self->profiler);
  Py_CLEAR(self->stack);
  Py_CLEAR(self->stats);
  Py_CLEAR(self->starts);
  Py_CLEAR(self->sampler);
  Py_CLEAR(self->sample);
  Py_CLEAR(self->clock);
  Py_CLEAR(self->write_text);
  Py_CLEAR(self->windows);
  Py_CLEAR(self->on_increment);
  Py_CLEAR(self->threshold);
  Py_CLEAR(self->start_time);
  Py_CLEAR(self->extras_every);
  Py_CLEAR(self->rank_cell);
  Py_CLEAR(self->py_line);
  Py_CLEAR(self->py_offer);
  Py_CLEAR(self->py_where);
  Py_CLEAR(self->py_start);
  Py_CLEAR(self->wanted);
  Py_CLEAR(self->cached_read);
  Py_CLEAR(self->cached_index);
  Py_CLEAR(self->attrs);
  for (auto& value : self->last) Py_CLEAR(value);
  if (self->cache != nullptr) {
    StatsCache* cache = self->cache;
    self->cache = nullptr;
    for (auto& entry : *cache) Py_DECREF(entry.second);
    delete cache;
  }
  Py_CLEAR(self->pending);
  Py_CLEAR(self->flush);
  return 0;
}

void core_dealloc(Core* self) {
  PyObject_GC_UnTrack(self);
  core_clear(self);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyMethodDef core_methods[] = {
    {"line", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(core_line)), METH_FASTCALL,
     "line(code, lineno): LineProfiler.line"},
    {"enter", reinterpret_cast<PyCFunction>(core_enter), METH_O, "enter(code): LineProfiler.enter"},
    {"leave", reinterpret_cast<PyCFunction>(core_leave), METH_O, "leave(code): LineProfiler.leave"},
    {"monitor_line", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(core_monitor_line)),
     METH_FASTCALL, "sys.monitoring LINE callback (the main thread only)"},
    {"monitor_start", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(core_monitor_start)),
     METH_FASTCALL, "sys.monitoring PY_START/PY_RESUME callback"},
    {"monitor_throw", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(core_monitor_throw)),
     METH_FASTCALL, "sys.monitoring PY_THROW callback"},
    {"monitor_leave", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(core_monitor_leave)),
     METH_FASTCALL, "sys.monitoring PY_RETURN/PY_YIELD/PY_UNWIND callback"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject CoreType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* format_seconds(PyObject* /*module*/, PyObject* arg) {
  double value = PyFloat_AsDouble(arg);
  if (value == -1.0 && PyErr_Occurred()) return nullptr;
  Row row;
  if (!row.seconds(value)) return nullptr;
  return PyUnicode_DecodeUTF8(row.data, static_cast<Py_ssize_t>(row.used), nullptr);
}

PyMethodDef module_methods[] = {
    {"format_seconds", format_seconds, METH_O, "format_seconds(x) -> f'{x:.6f}', as the timeline rows write it"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef definition = {PyModuleDef_HEAD_INIT, "line_sink",
                          "The runner's line sink: LineProfiler's common path in C++.", -1, module_methods};

int intern(PyObject** slot, const char* text) {
  *slot = PyUnicode_InternFromString(text);
  return *slot == nullptr ? -1 : 0;
}

}  // namespace

PyMODINIT_FUNC PyInit_line_sink() {
  if (intern(&s_peak, "peak") < 0 || intern(&s_floor, "_floor") < 0 || intern(&s_significant, "_significant") < 0 ||
      intern(&s_seq, "_seq") < 0 || intern(&s_extras_at, "_extras_at") < 0 || intern(&s_read, "_read") < 0 ||
      intern(&s_index, "_index") < 0 || intern(&s_reserved, "reserved") < 0 ||
      intern(&s_reserved_peak, "reserved_peak") < 0 || intern(&s_events, "events") < 0 ||
      intern(&s_extras, "extras") < 0 || intern(&s_add, "add") < 0)
    return nullptr;
  CoreType.tp_name = "line_sink.Core";
  CoreType.tp_basicsize = sizeof(Core);
  CoreType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  CoreType.tp_doc = "Core(profiler, py_line, native_reads=False, wanted=None, py_start=None, main_thread=<this>): wanted a dict {id(code): code}";
  CoreType.tp_new = core_new;
  CoreType.tp_dealloc = reinterpret_cast<destructor>(core_dealloc);
  CoreType.tp_traverse = reinterpret_cast<traverseproc>(core_traverse);
  CoreType.tp_clear = reinterpret_cast<inquiry>(core_clear);
  CoreType.tp_methods = core_methods;
  if (PyType_Ready(&CoreType) < 0) return nullptr;
  PyObject* module = PyModule_Create(&definition);
  if (module == nullptr) return nullptr;
  Py_INCREF(&CoreType);
  if (PyModule_AddObject(module, "Core", reinterpret_cast<PyObject*>(&CoreType)) < 0 ||
      PyModule_AddIntConstant(module, "ABI", kAbi) < 0 ||
      PyModule_AddStringConstant(module, "TORCH", GPU_MEM_TRACK_TORCH) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
