// The census's native reader: reads every plain tensor of a census in one C++ pass.
//
// Built on demand against the torch the user has (gpu_mem_track/native/build.py), loaded
// only when its ABI number and torch's version match and it reads a few tensors as torch
// does (gpu_mem_track/native/__init__.py). Python reads of a tensor's data pointer,
// version or requires_grad cost 85-190 ns each through torch's bindings; here all of a
// tensor's facts cost some tens of ns together (mostly waiting for memory), so a census of
// 100,000 small tensors no longer costs several times a bare gc.get_objects().
//
// A Scan is made from the census's candidate objects (a list, each object once) and keeps
// no reference to them: it records each object's address, and the caller keeps the list
// alive while it asks the Scan (settle, groups, lookup). Only objects whose type is exactly torch.Tensor
// or nn.Parameter are read; everything else goes to the census's general path.
//
// Codes, per object:
//   DROP      a plain tensor on another device (not meta): not counted
//   BULK      a plain tensor counted here: strided, with a storage at a non-null address,
//             on the census's device, and not a leaf with a gradient
//   GENERAL   anything else (another class, meta, sparse, a leaf with a gradient, no
//             storage, an error while reading): the census's Python path decides
//   EXCLUDED  an id the caller excluded (its own aliases of saved tensors)
//   MOVED     BULK until settle() gave it to the general path (its storage is used by a
//             general-path tensor, by a labelled tensor that does not own it, or by a
//             view whose base is elsewhere)
//   REACHED   BULK until settle() learnt the general path holds it already
//   MEMBER    BULK, sharing its storage with a better-ranked BULK tensor (a view): owns
//             nothing
//
// A leaf's gradient is counted with it when simple (simple_grad): its own object's record
// when that is among the objects (gradients() names them for the caller's labels), else a
// record after the objects' (kind gradient_kind), dropped if the general path reaches the
// leaf (it then reads .grad itself).
#include <Python.h>

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <cstring>
#include <string>
#include <vector>

#ifndef GPU_MEM_TRACK_TORCH
#error "build with -DGPU_MEM_TRACK_TORCH=\"<torch.__version__>\" (gpu_mem_track/native/build.py does)"
#endif

namespace {

constexpr int kAbi = 2;

enum Code : uint8_t { DROP = 0, BULK = 1, GENERAL = 2, EXCLUDED = 3, MOVED = 4, REACHED = 5, MEMBER = 6 };

struct Rec {
  uintptr_t obj = 0;   // the object's address (Python's id)
  uintptr_t ptr = 0;   // the storage's data pointer
  uintptr_t impl = 0;  // the TensorImpl
  uintptr_t base = 0;  // a view's base's TensorImpl, else 0
  int64_t nbytes = 0;  // the storage's bytes
  int64_t numel = 0;
  int64_t shape_at = 0;  // where its sizes start in Scan::sizes
  int32_t ndim = 0;
  int16_t dtype = 0;
  uint8_t parameter = 0;
  uint8_t code = GENERAL;
  uint8_t view = 0;
  uint8_t shares = 0;  // its storage has other holders (another tensor, perhaps)
  int8_t kind = -1;  // the kind code a gradient record counts as (else its class's)
  int64_t of = -1;   // a gradient record: the index of its leaf
};

// A leaf's gradient read with it (a simple one, see simple_grad).
struct Grad {
  size_t leaf;
  uintptr_t impl, ptr;
  int64_t nbytes;
};

// Open addressing, linear probing; key 0 is "empty" (no address or pointer is 0 here).
// Key and value share a slot, so an access costs one cache miss; reset() keeps the memory.
// A 64 Kibit filter answers most misses of a small map without hashing into it (most
// lookups ask a map of a few hundred keys about each of the census's tensors).
class FlatMap {
 public:
  explicit FlatMap(size_t expected = 0) { reset(expected); }
  void reset(size_t expected) {
    size_t capacity = 16;
    while (capacity < expected * 2 + 2) capacity <<= 1;
    slots_.assign(capacity, Slot{0, -1});
    mask_ = capacity - 1;
    filter_.assign(kFilterWords, 0);
  }
  // The value slot of key, inserted with -1 when absent.
  int64_t& slot(uintptr_t key) {
    const uint64_t h = hash(key);
    filter_[(h >> 48) >> 6] |= uint64_t{1} << ((h >> 48) & 63);
    size_t at = static_cast<size_t>(h) & mask_;
    while (slots_[at].key != 0 && slots_[at].key != key) at = (at + 1) & mask_;
    slots_[at].key = key;
    return slots_[at].value;
  }
  int64_t get(uintptr_t key) const {
    const uint64_t h = hash(key);
    if (!(filter_[(h >> 48) >> 6] & (uint64_t{1} << ((h >> 48) & 63)))) return -1;
    size_t at = static_cast<size_t>(h) & mask_;
    while (slots_[at].key != 0) {
      if (slots_[at].key == key) return slots_[at].value;
      at = (at + 1) & mask_;
    }
    return -1;
  }

 private:
  static constexpr size_t kFilterWords = 1024;  // 65,536 bits: 8 KiB
  struct Slot {
    uintptr_t key;
    int64_t value;
  };
  static uint64_t hash(uintptr_t key) {
    uint64_t k = key;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    return k ^ (k >> 33);
  }
  std::vector<Slot> slots_;
  std::vector<uint64_t> filter_;
  size_t mask_ = 0;
};

// Memory kept from one census to the next (the GIL serialises every use): fresh pages
// for a few MB of records per census would cost more than reading the tensors.
struct Spare {
  std::vector<Rec>* recs = nullptr;
  std::vector<int64_t>* sizes = nullptr;
  FlatMap storages;
};
Spare spare;

struct ScanObject {
  PyObject_HEAD
  std::vector<Rec>* recs;
  std::vector<int64_t>* sizes;
  std::vector<uintptr_t>* objs;  // each object's address, for lookup()
  std::vector<std::pair<int64_t, int64_t>>* found;  // (leaf, its gradient's object) indices
  Py_ssize_t objects;  // records of objects; gradient records follow them
  Py_ssize_t views;  // MEMBER records: tensors sharing a storage resolved here
};

void scan_dealloc(ScanObject* self) {
  if (spare.recs == nullptr) {
    spare.recs = self->recs;  // kept for the next census
  } else {
    delete self->recs;
  }
  if (spare.sizes == nullptr) {
    spare.sizes = self->sizes;
  } else {
    delete self->sizes;
  }
  delete self->objs;
  delete self->found;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// The set or other iterable of ints ``ids`` as a FlatMap of keys (value 1).
bool read_ids(PyObject* ids, FlatMap** out) {
  *out = nullptr;
  if (ids == Py_None) return true;
  Py_ssize_t size = PyObject_Length(ids);
  if (size < 0) return false;
  auto* map = new FlatMap(static_cast<size_t>(size));
  PyObject* iter = PyObject_GetIter(ids);
  if (iter == nullptr) {
    delete map;
    return false;
  }
  PyObject* item;
  while ((item = PyIter_Next(iter)) != nullptr) {
    uintptr_t key = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(item));
    Py_DECREF(item);
    if (PyErr_Occurred()) {
      PyErr_Clear();  // not an int (a storage key the general path made up): never ours
      continue;
    }
    if (key != 0) map->slot(key) = 1;
  }
  Py_DECREF(iter);
  if (PyErr_Occurred()) {
    delete map;
    return false;
  }
  *out = map;
  return true;
}

// A gradient counted here: dense, alone on its storage (no other tensor holds it, so it
// shares with nothing), not a view, on its leaf's device, with its leaf's shape and dtype
// (which torch requires of a gradient anyway), at a non-null address.
bool simple_grad(const at::Tensor& leaf, const at::Tensor& grad) {
  if (grad.layout() != c10::kStrided || !grad.has_storage() || grad.is_view() || grad.requires_grad()) return false;
  if (grad.device() != leaf.device() || grad.scalar_type() != leaf.scalar_type()) return false;
  if (grad.sizes() != leaf.sizes() || grad.storage().use_count() != 1) return false;
  const c10::StorageImpl* held = grad.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
  return held != nullptr && held->data_ptr().get() != nullptr;
}

void read_tensor(PyObject* obj, const c10::Device& target, Rec& rec, std::vector<int64_t>& sizes,
                 std::vector<Grad>& grads, size_t index) {
  const at::Tensor& tensor = THPVariable_Unpack(obj);
  if (!tensor.defined()) return;
  rec.impl = reinterpret_cast<uintptr_t>(tensor.unsafeGetTensorImpl());
  const c10::Device device = tensor.device();
  if (device.type() == c10::DeviceType::Meta) return;
  if (device != target) {
    rec.code = DROP;
    return;
  }
  if (tensor.layout() != c10::kStrided || !tensor.has_storage()) return;
  // A leaf's gradient is a tensor of its own that may exist only in C++: read here when
  // simple (see simple_grad), else the general path reads it (.grad). A non-leaf's .grad
  // is never read, by either path.
  if (tensor.requires_grad() && tensor.is_leaf()) {
    const at::Tensor& grad = tensor.grad();
    if (grad.defined()) {
      if (!simple_grad(tensor, grad)) return;
      const c10::StorageImpl* held = grad.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
      grads.push_back(Grad{index, reinterpret_cast<uintptr_t>(grad.unsafeGetTensorImpl()),
                           reinterpret_cast<uintptr_t>(held->data_ptr().get()), static_cast<int64_t>(held->nbytes())});
    }
  }
  const c10::StorageImpl* storage = tensor.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
  if (storage == nullptr) return;
  const uintptr_t ptr = reinterpret_cast<uintptr_t>(storage->data_ptr().get());
  if (ptr == 0) return;
  const c10::IntArrayRef shape = tensor.sizes();
  rec.ptr = ptr;
  rec.shares = tensor.storage().use_count() > 1 ? 1 : 0;
  rec.nbytes = static_cast<int64_t>(storage->nbytes());
  rec.numel = tensor.numel();
  rec.dtype = static_cast<int16_t>(tensor.scalar_type());
  rec.view = tensor.is_view() ? 1 : 0;
  if (rec.view) rec.base = reinterpret_cast<uintptr_t>(tensor._base().unsafeGetTensorImpl());
  rec.shape_at = static_cast<int64_t>(sizes.size());
  rec.ndim = static_cast<int32_t>(shape.size());
  sizes.insert(sizes.end(), shape.begin(), shape.end());
  rec.code = BULK;
}

// A view whose base is not among the objects read goes to the general path from the
// start: it finds the base (``_base``) and lets it own the storage, so a named view is
// named "(view)" there. One pass over the records with the bases asked in a small map.
void general_orphan_views(std::vector<Rec>& recs) {
  size_t views = 0;
  for (const Rec& rec : recs) views += rec.code == BULK && rec.view;
  if (views == 0) return;
  FlatMap bases(views);
  for (const Rec& rec : recs)
    if (rec.code == BULK && rec.view && rec.base != 0) bases.slot(rec.base) = 0;
  for (const Rec& rec : recs)
    if (rec.impl != 0 && bases.get(rec.impl) == 0) bases.slot(rec.impl) = 1;
  for (Rec& rec : recs)
    if (rec.code == BULK && rec.view && (rec.base == 0 || bases.get(rec.base) != 1)) rec.code = GENERAL;
}

// The leaves' gradients: a gradient whose object is among the objects read is noted in
// ``found`` (the caller labels it); any other gets a record of its own after the objects'
// (kind ``gradient_kind``, its leaf's shape and dtype, ``of`` its leaf).
void attach_gradients(std::vector<Rec>& recs, const std::vector<Grad>& grads,
                      std::vector<std::pair<int64_t, int64_t>>& found, int8_t gradient_kind) {
  if (grads.empty()) return;
  FlatMap own(grads.size());
  for (const Grad& grad : grads) own.slot(grad.impl) = -2;
  const size_t count = recs.size();
  for (size_t i = 0; i < count; i++)  // a gradient's own object, when among those read
    if (recs[i].impl != 0 && own.get(recs[i].impl) == -2) own.slot(recs[i].impl) = static_cast<int64_t>(i);
  for (const Grad& grad : grads) {
    if (recs[grad.leaf].code != BULK) continue;
    const int64_t object = own.get(grad.impl);
    if (object >= 0) {
      found.emplace_back(static_cast<int64_t>(grad.leaf), object);
      continue;
    }
    Rec record = recs[grad.leaf];  // its shape and dtype
    record.obj = 0;
    record.impl = grad.impl;
    record.ptr = grad.ptr;
    record.nbytes = grad.nbytes;
    record.base = 0;
    record.view = 0;
    record.shares = 0;
    record.parameter = 0;
    record.kind = gradient_kind;
    record.of = static_cast<int64_t>(grad.leaf);
    recs.push_back(record);
  }
}

// Scan(objects, tensor_type, parameter_type, device, exclude_ids_or_None, gradient_kind)
int scan_init(ScanObject* self, PyObject* args, PyObject* kwargs) {
  PyObject *objects, *tensor_type, *parameter_type, *exclude;
  const char* device_text;
  int gradient_kind;
  if (!PyArg_ParseTuple(args, "O!OOsOi", &PyList_Type, &objects, &tensor_type, &parameter_type, &device_text,
                        &exclude, &gradient_kind))
    return -1;
  FlatMap* excluded = nullptr;
  if (!read_ids(exclude, &excluded)) return -1;
  std::vector<Grad> grads;
  try {
    const c10::Device target{std::string(device_text)};
    grads.clear();
    Py_ssize_t count = PyList_GET_SIZE(objects);
    self->recs->assign(static_cast<size_t>(count), Rec{});
    self->sizes->clear();
    self->sizes->reserve(static_cast<size_t>(count) * 2);
    for (Py_ssize_t i = 0; i < count; i++) {
      PyObject* obj = PyList_GET_ITEM(objects, i);
      Rec& rec = (*self->recs)[static_cast<size_t>(i)];
      rec.obj = reinterpret_cast<uintptr_t>(obj);
      PyObject* cls = reinterpret_cast<PyObject*>(Py_TYPE(obj));
      if (cls != tensor_type && cls != parameter_type) continue;  // GENERAL
      if (excluded != nullptr && excluded->get(rec.obj) == 1) {
        rec.code = EXCLUDED;
        continue;
      }
      rec.parameter = cls == parameter_type ? 1 : 0;
      try {
        read_tensor(obj, target, rec, *self->sizes, grads, static_cast<size_t>(i));
      } catch (...) {
        rec.code = GENERAL;
        rec.ptr = 0;
      }
    }
  } catch (const std::exception& error) {
    delete excluded;
    PyErr_SetString(PyExc_ValueError, error.what());
    return -1;
  }
  delete excluded;
  general_orphan_views(*self->recs);
  self->objects = static_cast<Py_ssize_t>(self->recs->size());
  self->objs->resize(self->recs->size());
  for (size_t i = 0; i < self->recs->size(); i++) (*self->objs)[i] = (*self->recs)[i].obj;
  self->found->clear();
  try {
    attach_gradients(*self->recs, grads, *self->found, static_cast<int8_t>(gradient_kind));
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_MemoryError, error.what());
    return -1;
  }
  return 0;
}

PyObject* scan_new(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<ScanObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->recs = spare.recs != nullptr ? spare.recs : new std::vector<Rec>();
  self->sizes = spare.sizes != nullptr ? spare.sizes : new std::vector<int64_t>();
  spare.recs = nullptr;
  spare.sizes = nullptr;
  self->objs = new std::vector<uintptr_t>();
  self->found = new std::vector<std::pair<int64_t, int64_t>>();
  self->objects = 0;
  self->views = 0;
  return reinterpret_cast<PyObject*>(self);
}

// codes(): bytes, one code per object.
PyObject* scan_codes(ScanObject* self, PyObject*) {
  const auto& recs = *self->recs;
  PyObject* out = PyBytes_FromStringAndSize(nullptr, self->objects);
  if (out == nullptr) return nullptr;
  char* data = PyBytes_AS_STRING(out);
  for (Py_ssize_t i = 0; i < self->objects; i++) data[i] = static_cast<char>(recs[static_cast<size_t>(i)].code);
  return out;
}

// general(): bytes, 1 where the object goes to the general path now (for itertools.compress).
PyObject* scan_general(ScanObject* self, PyObject*) {
  const auto& recs = *self->recs;
  PyObject* out = PyBytes_FromStringAndSize(nullptr, self->objects);
  if (out == nullptr) return nullptr;
  char* data = PyBytes_AS_STRING(out);
  for (Py_ssize_t i = 0; i < self->objects; i++) data[i] = recs[static_cast<size_t>(i)].code == GENERAL ? 1 : 0;
  return out;
}

// gradients() -> [(leaf index, gradient index)]: leaves whose gradient's object is among
// the objects (the caller labels it a gradient and names it after the leaf).
PyObject* scan_gradients(ScanObject* self, PyObject*) {
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(self->found->size()));
  if (out == nullptr) return nullptr;
  for (size_t k = 0; k < self->found->size(); k++) {
    const auto& pair = (*self->found)[k];
    PyObject* item = Py_BuildValue("(LL)", static_cast<long long>(pair.first), static_cast<long long>(pair.second));
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(k), item);
  }
  return out;
}

// lookup(ids): for each id, True when its object is counted here (BULK or MEMBER). One
// pass over the records with the asked ids in a small map: ask in batches, not one by one.
PyObject* scan_lookup(ScanObject* self, PyObject* ids) {
  const auto& recs = *self->recs;
  PyObject* seq = PySequence_Fast(ids, "lookup() takes a sequence of ids");
  if (seq == nullptr) return nullptr;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  FlatMap asked(static_cast<size_t>(count));
  std::vector<uintptr_t> keys(static_cast<size_t>(count), 0);
  for (Py_ssize_t i = 0; i < count; i++) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    uintptr_t key = PyLong_Check(item) ? reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(item)) : 0;
    if (PyErr_Occurred()) {
      PyErr_Clear();  // not an address: never ours
      key = 0;
    }
    keys[static_cast<size_t>(i)] = key;
    if (key != 0) asked.slot(key) = 0;
  }
  Py_DECREF(seq);
  if (count > 0) {  // over the addresses alone (8 B each), reading a record only on a hit
    const auto& objs = *self->objs;
    for (size_t i = 0; i < objs.size(); i++) {
      if (asked.get(objs[i]) != 0) continue;
      const uint8_t code = recs[i].code;
      if (code == BULK || code == MEMBER) asked.slot(objs[i]) = 1;
    }
  }
  PyObject* out = PyList_New(count);
  if (out == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < count; i++) {
    const uintptr_t key = keys[static_cast<size_t>(i)];
    PyObject* flag = key != 0 && asked.get(key) == 1 ? Py_True : Py_False;
    Py_INCREF(flag);
    PyList_SET_ITEM(out, i, flag);
  }
  return out;
}

// Lower is the better owner: a parameter before a tensor, a base before a view, the
// larger tensor, the first found (the census's Python ranking for unlabelled tensors).
bool better(const Rec& a, size_t ia, const Rec& b, size_t ib) {
  if (a.parameter != b.parameter) return a.parameter > b.parameter;
  if (a.view != b.view) return a.view < b.view;
  if (a.numel != b.numel) return a.numel > b.numel;
  return ia < ib;
}

// settle(owner_keys, reached_ids, labelled_ids) -> list of indices moved to the general path.
//
// A storage one BULK tensor alone uses stays BULK, unless the general path uses it too
// (owner_keys) or the tensor is a view (its base lies elsewhere: the general path finds
// it). Of a storage several BULK tensors share, the best-ranked owns it and the others
// become MEMBERs (views); all move to the general path instead when the general path
// uses the storage, when the caller labelled one of them but the owner (it ranks and
// names by labels), or when a view's base is not among them.
PyObject* scan_settle(ScanObject* self, PyObject* args) {
  PyObject *owner_keys, *reached_ids, *labelled_ids;
  if (!PyArg_ParseTuple(args, "OOO", &owner_keys, &reached_ids, &labelled_ids)) return nullptr;
  FlatMap *owners = nullptr, *reached = nullptr, *labelled = nullptr;
  if (!read_ids(owner_keys, &owners) || !read_ids(reached_ids, &reached) || !read_ids(labelled_ids, &labelled)) {
    delete owners;
    delete reached;
    delete labelled;
    return nullptr;
  }
  auto& recs = *self->recs;
  self->views = 0;
  if (reached != nullptr) {
    for (Rec& rec : recs)
      if (rec.code == BULK && rec.obj != 0 && reached->get(rec.obj) == 1) rec.code = REACHED;
  }
  // A gradient record (never moved: it has no object) is dropped when the general path
  // counts its storage already: it reached the leaf and read its .grad, or holds the
  // gradient's own object.
  const size_t objects = static_cast<size_t>(self->objects);
  for (size_t i = objects; i < recs.size(); i++) {
    Rec& grad = recs[i];
    if (grad.code != BULK) continue;
    if (recs[static_cast<size_t>(grad.of)].code == REACHED || (owners && owners->get(grad.ptr) == 1))
      grad.code = EXCLUDED;
  }
  // A storage whose only holder is its tensor (use count 1) is shared with no other
  // tensor; the others go through a map: the first sight of a storage keeps its index,
  // a second sight lists both.
  size_t holders = 0;
  for (const Rec& rec : recs) holders += rec.code == BULK && rec.shares;
  FlatMap& first = spare.storages;
  first.reset(holders);
  std::vector<int64_t> shared;
  for (size_t i = 0; i < recs.size(); i++) {
    if (recs[i].code != BULK || !recs[i].shares) continue;
    int64_t& seen = first.slot(recs[i].ptr);
    if (seen == -1) {
      seen = static_cast<int64_t>(i);
    } else {
      if (seen >= 0) shared.push_back(seen);
      shared.push_back(static_cast<int64_t>(i));
      seen = -2;
    }
  }
  std::vector<uint8_t> in_shared(recs.size(), 0);
  for (int64_t i : shared) in_shared[static_cast<size_t>(i)] = 1;
  PyObject* moved = PyList_New(0);
  bool failed = moved == nullptr;
  auto move = [&](size_t i) {
    recs[i].code = MOVED;
    PyObject* index = PyLong_FromSsize_t(static_cast<Py_ssize_t>(i));
    if (index == nullptr || PyList_Append(moved, index) < 0) failed = true;
    Py_XDECREF(index);
  };
  for (size_t i = 0; i < recs.size() && !failed; i++) {
    const Rec& rec = recs[i];
    if (rec.code == BULK && !in_shared[i] && (rec.view || (owners && owners->get(rec.ptr) == 1))) move(i);
  }
  std::sort(shared.begin(), shared.end(), [&recs](int64_t a, int64_t b) {
    const Rec &x = recs[static_cast<size_t>(a)], &y = recs[static_cast<size_t>(b)];
    return x.ptr != y.ptr ? x.ptr < y.ptr : a < b;
  });
  FlatMap members;
  for (size_t at = 0; at < shared.size() && !failed;) {
    size_t end = at;
    while (end < shared.size() && recs[static_cast<size_t>(shared[end])].ptr == recs[static_cast<size_t>(shared[at])].ptr) end++;
    const uintptr_t ptr = recs[static_cast<size_t>(shared[at])].ptr;
    bool give_up = owners && owners->get(ptr) == 1;
    // is a view's base among the storage's tensors? (a map for a storage of many views)
    const bool many = end - at > 16;
    if (many) {
      members.reset(end - at);
      for (size_t k = at; k < end; k++) members.slot(recs[static_cast<size_t>(shared[k])].impl) = 1;
    }
    auto member = [&](uintptr_t impl) {
      if (many) return members.get(impl) == 1;
      for (size_t m = at; m < end; m++)
        if (recs[static_cast<size_t>(shared[m])].impl == impl) return true;
      return false;
    };
    size_t best = static_cast<size_t>(shared[at]);
    for (size_t k = at; k < end && !give_up; k++) {
      const size_t j = static_cast<size_t>(shared[k]);
      const Rec& rec = recs[j];
      if (rec.view && !member(rec.base)) give_up = true;  // its base is elsewhere
      if (better(rec, j, recs[best], best)) best = j;
    }
    // A label (a kind or a name the program gives) ranks and names: resolved here only
    // when the owner is the one labelled tensor (a named base and its unnamed views),
    // as a label can only raise a tensor's rank.
    for (size_t k = at; k < end && !give_up && labelled; k++) {
      const size_t j = static_cast<size_t>(shared[k]);
      if (j != best && labelled->get(recs[j].obj) == 1) give_up = true;
    }
    for (size_t k = at; k < end; k++) {
      const size_t j = static_cast<size_t>(shared[k]);
      if (give_up) {
        move(j);
      } else if (j != best) {
        recs[j].code = MEMBER;
        self->views++;
      }
    }
    at = end;
  }
  delete owners;
  delete reached;
  delete labelled;
  if (failed || PyList_Sort(moved) < 0) {  // in the objects' order, as the Python bulk gives them
    Py_XDECREF(moved);
    return nullptr;
  }
  return moved;
}

struct GroupKey {
  int64_t kind, dtype, nbytes;
  const int64_t* shape;
  int32_t ndim;
  bool operator==(const GroupKey& o) const {
    return kind == o.kind && dtype == o.dtype && nbytes == o.nbytes && ndim == o.ndim &&
           std::memcmp(shape, o.shape, sizeof(int64_t) * static_cast<size_t>(ndim)) == 0;
  }
};

uint64_t key_hash(const GroupKey& key) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  };
  mix(static_cast<uint64_t>(key.kind));
  mix(static_cast<uint64_t>(key.dtype));
  mix(static_cast<uint64_t>(key.nbytes));
  mix(static_cast<uint64_t>(key.ndim));
  for (int32_t d = 0; d < key.ndim; d++) mix(static_cast<uint64_t>(key.shape[d]));
  return h;
}

// groups(tensor_kind, parameter_kind, kinds) -> (entries, where, gradients)
//   entries: [(index of an object of its dtype, kind, shape tuple, storage bytes, count)], one
//   per distinct (kind, dtype, shape, bytes) among the owners counted here; kinds: {id: kind}
//   for the tensors the caller labelled; where: {id: entry number} for those counted here;
//   gradients: {leaf's id: entry number} for the gradients counted here without an object.
// table[id of the object at address] = entry; false (a Python error set) when it fails.
bool note_entry(PyObject* table, uintptr_t address, int64_t entry) {
  PyObject* key = PyLong_FromVoidPtr(reinterpret_cast<void*>(address));
  PyObject* value = PyLong_FromLongLong(entry);
  const bool done = key != nullptr && value != nullptr && PyDict_SetItem(table, key, value) == 0;
  Py_XDECREF(key);
  Py_XDECREF(value);
  return done;
}

PyObject* scan_groups(ScanObject* self, PyObject* args) {
  long long tensor_kind, parameter_kind;
  PyObject* kinds;
  if (!PyArg_ParseTuple(args, "LLO!", &tensor_kind, &parameter_kind, &PyDict_Type, &kinds)) return nullptr;
  FlatMap labelled(static_cast<size_t>(PyDict_Size(kinds)));
  {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kinds, &pos, &key, &value)) {
      uintptr_t id = reinterpret_cast<uintptr_t>(PyLong_AsVoidPtr(key));
      long long kind = PyLong_AsLongLong(value);
      if (PyErr_Occurred()) return nullptr;
      if (id != 0) labelled.slot(id) = kind;
    }
  }
  const auto& recs = *self->recs;
  const int64_t* sizes = self->sizes->data();
  std::vector<GroupKey> keys;
  std::vector<int64_t> counts, firsts;
  std::vector<std::vector<int64_t>> buckets(1024);
  size_t bucket_mask = buckets.size() - 1;
  PyObject* where = PyDict_New();
  PyObject* grads_where = PyDict_New();
  if (where == nullptr || grads_where == nullptr) {
    Py_XDECREF(where);
    Py_XDECREF(grads_where);
    return nullptr;
  }
  for (size_t i = 0; i < recs.size(); i++) {
    const Rec& rec = recs[i];
    if (rec.code != BULK) continue;
    int64_t kind = rec.kind >= 0 ? rec.kind : rec.parameter ? parameter_kind : tensor_kind;
    const int64_t given = rec.obj != 0 ? labelled.get(rec.obj) : -1;  // -1: not labelled; -2: named, kind kept
    const bool named = given != -1;
    if (given >= 0) kind = given;
    GroupKey key{kind, rec.dtype, rec.nbytes, sizes + rec.shape_at, rec.ndim};
    auto& bucket = buckets[key_hash(key) & bucket_mask];
    int64_t found = -1;
    for (int64_t at : bucket)
      if (keys[static_cast<size_t>(at)] == key) {
        found = at;
        break;
      }
    if (found < 0) {
      found = static_cast<int64_t>(keys.size());
      keys.push_back(key);
      counts.push_back(0);
      firsts.push_back(rec.of >= 0 ? rec.of : static_cast<int64_t>(i));  // an object of its dtype
      bucket.push_back(found);
      if (keys.size() > buckets.size() * 2) {  // grow: rehash the distinct keys
        buckets.assign(buckets.size() * 4, {});
        bucket_mask = buckets.size() - 1;
        for (size_t k = 0; k < keys.size(); k++)
          buckets[key_hash(keys[k]) & bucket_mask].push_back(static_cast<int64_t>(k));
      }
    }
    counts[static_cast<size_t>(found)]++;
    // a gradient record: its leaf's id -> its entry (for the name); a named tensor's id too
    if ((rec.of >= 0 && !note_entry(grads_where, recs[static_cast<size_t>(rec.of)].obj, found)) ||
        (named && !note_entry(where, rec.obj, found))) {
      Py_DECREF(where);
      Py_DECREF(grads_where);
      return nullptr;
    }
  }
  PyObject* entries = PyList_New(static_cast<Py_ssize_t>(keys.size()));
  if (entries == nullptr) {
    Py_DECREF(where);
    Py_DECREF(grads_where);
    return nullptr;
  }
  for (size_t k = 0; k < keys.size(); k++) {
    const GroupKey& key = keys[k];
    PyObject* shape = PyTuple_New(key.ndim);
    if (shape == nullptr) {
      Py_DECREF(entries);
      Py_DECREF(where);
      Py_DECREF(grads_where);
      return nullptr;
    }
    for (int32_t d = 0; d < key.ndim; d++) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(key.shape[d]));
    PyObject* entry = Py_BuildValue("(LLNLL)", static_cast<long long>(firsts[k]), static_cast<long long>(key.kind),
                                    shape, static_cast<long long>(key.nbytes), static_cast<long long>(counts[k]));
    if (entry == nullptr) {
      Py_DECREF(entries);
      Py_DECREF(where);
      Py_DECREF(grads_where);
      return nullptr;
    }
    PyList_SET_ITEM(entries, static_cast<Py_ssize_t>(k), entry);
  }
  return Py_BuildValue("(NNN)", entries, where, grads_where);
}

PyObject* scan_views(ScanObject* self, void*) { return PyLong_FromSsize_t(self->views); }

// untrack(refs): take weak references without a callback out of the collector's lists
// (they can be in no cycle), so scans of the young objects never read them.
PyObject* untrack(PyObject*, PyObject* refs) {
  PyObject* seq = PySequence_Fast(refs, "untrack() takes a sequence of weak references");
  if (seq == nullptr) return nullptr;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  Py_ssize_t done = 0;
  for (Py_ssize_t i = 0; i < count; i++) {
    PyObject* ref = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyWeakref_CheckRefExact(ref)) continue;
    if (reinterpret_cast<PyWeakReference*>(ref)->wr_callback != nullptr) continue;
    if (PyObject_GC_IsTracked(ref)) {
      PyObject_GC_UnTrack(ref);
      done++;
    }
  }
  Py_DECREF(seq);
  return PyLong_FromSsize_t(done);
}

// refs(objects) -> list: a weak reference without a callback to each object, taken out of
// the collector's lists (as untrack does), in one pass. Each new reference may start a
// collection, whose callbacks run Python code (gc.get_objects() included): the list is
// made only once every reference is, so no half-filled list is ever visible, and the
// objects' list is read afresh at each step.
PyObject* refs(PyObject*, PyObject* objects) {
  if (!PyList_Check(objects)) {
    PyErr_SetString(PyExc_TypeError, "refs() takes a list");
    return nullptr;
  }
  std::vector<PyObject*> made;
  made.reserve(static_cast<size_t>(PyList_GET_SIZE(objects)));
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objects); i++) {
    PyObject* obj = PyList_GET_ITEM(objects, i);
    Py_INCREF(obj);
    PyObject* ref = PyWeakref_NewRef(obj, nullptr);
    Py_DECREF(obj);
    if (ref == nullptr) {
      for (PyObject* held : made) Py_DECREF(held);
      return nullptr;
    }
    if (PyObject_GC_IsTracked(ref)) PyObject_GC_UnTrack(ref);
    made.push_back(ref);
  }
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(made.size()));
  if (out == nullptr) {
    for (PyObject* held : made) Py_DECREF(held);
    return nullptr;
  }
  for (size_t i = 0; i < made.size(); i++) PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), made[i]);
  return out;
}

// pick(objects, tensor_types, owner_types) -> (tensors, owners): the objects of a list
// whose exact type is in the set tensor_types, and those whose exact type is in the set
// owner_types, each in list order: the finder's first heap walk, one pass in C.
PyObject* pick(PyObject*, PyObject* args) {
  PyObject *objects, *tensor_types, *owner_types;
  if (!PyArg_ParseTuple(args, "O!OO:pick", &PyList_Type, &objects, &tensor_types, &owner_types)) return nullptr;
  if (!PyAnySet_Check(tensor_types) || !PyAnySet_Check(owner_types)) {
    PyErr_SetString(PyExc_TypeError, "pick() takes two sets of types");
    return nullptr;
  }
  PyObject* tensors = PyList_New(0);
  PyObject* owners = PyList_New(0);
  if (tensors == nullptr || owners == nullptr) {
    Py_XDECREF(tensors);
    Py_XDECREF(owners);
    return nullptr;
  }
  // each type's answer, asked of the sets once: a small table by the type's address
  constexpr size_t SLOTS = 512;
  PyTypeObject* types[SLOTS] = {};
  int kinds[SLOTS] = {};  // 0 neither, 1 tensor, 2 owner
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(objects); i++) {
    PyObject* obj = PyList_GET_ITEM(objects, i);
    PyTypeObject* type = Py_TYPE(obj);
    const size_t slot = (reinterpret_cast<uintptr_t>(type) >> 4) % SLOTS;
    if (types[slot] != type) {
      int is_tensor = PySet_Contains(tensor_types, reinterpret_cast<PyObject*>(type));
      int is_owner = is_tensor == 0 ? PySet_Contains(owner_types, reinterpret_cast<PyObject*>(type)) : 0;
      if (is_tensor < 0 || is_owner < 0) {
        Py_DECREF(tensors);
        Py_DECREF(owners);
        return nullptr;
      }
      types[slot] = type;
      kinds[slot] = is_tensor ? 1 : (is_owner ? 2 : 0);
    }
    const int kind = kinds[slot];
    if (kind != 0 && PyList_Append(kind == 1 ? tensors : owners, obj) < 0) {
      Py_DECREF(tensors);
      Py_DECREF(owners);
      return nullptr;
    }
  }
  PyObject* result = PyTuple_Pack(2, tensors, owners);
  Py_DECREF(tensors);
  Py_DECREF(owners);
  return result;
}

// alive(refs) -> (objects, live): the objects the weak references still refer to, in
// order, and None when every one does, else bytes with 1 for each live reference.
PyObject* alive(PyObject*, PyObject* refs) {
  if (!PyList_Check(refs)) {
    PyErr_SetString(PyExc_TypeError, "alive() takes a list of weak references");
    return nullptr;
  }
  const Py_ssize_t count = PyList_GET_SIZE(refs);
  std::vector<PyObject*> objects(static_cast<size_t>(count), nullptr);
  Py_ssize_t live = 0;
  for (Py_ssize_t i = 0; i < count; i++) {
    PyObject* ref = PyList_GET_ITEM(refs, i);
    if (!PyWeakref_Check(ref)) {
      for (PyObject* held : objects) Py_XDECREF(held);
      PyErr_SetString(PyExc_TypeError, "alive() takes a list of weak references");
      return nullptr;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyObject* obj = nullptr;  // a new reference, or NULL when dead
    if (PyWeakref_GetRef(ref, &obj) < 0) {
      for (PyObject* held : objects) Py_XDECREF(held);
      return nullptr;
    }
#else
    PyObject* obj = PyWeakref_GET_OBJECT(ref);  // borrowed, Py_None when dead
    if (obj == Py_None) {
      obj = nullptr;
    } else {
      Py_INCREF(obj);
    }
#endif
    if (obj != nullptr) {
      objects[static_cast<size_t>(i)] = obj;
      live++;
    }
  }
  PyObject* out = PyList_New(live);
  PyObject* mask = live == count ? Py_None : PyBytes_FromStringAndSize(nullptr, count);
  if (out == nullptr || mask == nullptr) {
    Py_XDECREF(out);
    for (PyObject* held : objects) Py_XDECREF(held);
    return nullptr;
  }
  if (mask == Py_None) Py_INCREF(mask);
  Py_ssize_t at = 0;
  for (Py_ssize_t i = 0; i < count; i++) {
    PyObject* obj = objects[static_cast<size_t>(i)];
    if (mask != Py_None) PyBytes_AS_STRING(mask)[i] = obj != nullptr ? 1 : 0;
    if (obj != nullptr) PyList_SET_ITEM(out, at++, obj);  // the reference taken above
  }
  return Py_BuildValue("(NN)", out, mask);
}

PyMethodDef module_methods[] = {
    {"untrack", untrack, METH_O, "untrack(refs) -> count: weak references out of the collector's lists"},
    {"refs", refs, METH_O, "refs(objects) -> list: weak references, out of the collector's lists"},
    {"pick", pick, METH_VARARGS,
     "pick(objects, tensor_types, owner_types) -> (tensors, owners): by exact type, in order"},
    {"alive", alive, METH_O, "alive(refs) -> (objects, None or bytes): what weak references still refer to"},
    {nullptr, nullptr, 0, nullptr}};

PyMethodDef scan_methods[] = {
    {"codes", reinterpret_cast<PyCFunction>(scan_codes), METH_NOARGS, "bytes: each object's code"},
    {"general", reinterpret_cast<PyCFunction>(scan_general), METH_NOARGS,
     "bytes: 1 where an object goes to the general path"},
    {"lookup", reinterpret_cast<PyCFunction>(scan_lookup), METH_O,
     "lookup(ids) -> [bool]: whether each id's object is counted here"},
    {"settle", reinterpret_cast<PyCFunction>(scan_settle), METH_VARARGS,
     "settle(owner_keys, reached_ids, labelled_ids) -> [index]: objects moved to the general path"},
    {"groups", reinterpret_cast<PyCFunction>(scan_groups), METH_VARARGS,
     "groups(tensor_kind, parameter_kind, {id: kind}) -> (entries, {id: entry}, {leaf id: entry})"},
    {"gradients", reinterpret_cast<PyCFunction>(scan_gradients), METH_NOARGS,
     "gradients() -> [(leaf index, gradient index)]: gradients that are among the objects"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef scan_getset[] = {
    {"views", reinterpret_cast<getter>(scan_views), nullptr, "tensors sharing a storage resolved here", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject ScanType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "census_scan", "The census's native reader.", -1, module_methods};

}  // namespace

PyMODINIT_FUNC PyInit_census_scan(void) {
  ScanType.tp_name = "census_scan.Scan";
  ScanType.tp_basicsize = sizeof(ScanObject);
  ScanType.tp_flags = Py_TPFLAGS_DEFAULT;
  ScanType.tp_doc = "Scan(objects, tensor_type, parameter_type, device, exclude_ids)";
  ScanType.tp_new = scan_new;
  ScanType.tp_init = reinterpret_cast<initproc>(scan_init);
  ScanType.tp_dealloc = reinterpret_cast<destructor>(scan_dealloc);
  ScanType.tp_methods = scan_methods;
  ScanType.tp_getset = scan_getset;
  if (PyType_Ready(&ScanType) < 0) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  Py_INCREF(&ScanType);
  if (PyModule_AddObject(module, "Scan", reinterpret_cast<PyObject*>(&ScanType)) < 0 ||
      PyModule_AddIntConstant(module, "ABI", kAbi) < 0 ||
      PyModule_AddStringConstant(module, "TORCH", GPU_MEM_TRACK_TORCH) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
