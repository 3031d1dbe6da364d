// The CUDA caching allocator's statistics, read without building torch's statistics dict.
//
// torch._C._cuda_memoryStats(index) calls c10::cuda::CUDACachingAllocator::getDeviceStats
// (the allocator in c10::cuda::CUDACachingAllocator::allocator) and turns the whole
// DeviceStats into a nested dict of about 200 Python objects: 11.4 us a call on an H200,
// after every line the runner traces. read(index) makes the same call on the same
// allocator and returns the five figures the runner's CUDA sampler needs, as one tuple.
//
// No CUDA header is needed: the allocator is reached through c10's DeviceAllocator
// interface (c10/core/CachingDeviceAllocator.h), as c10::GetAllocator(kCUDA), and used
// only when it is the very object c10::cuda::CUDACachingAllocator::allocator holds (the
// one torch reads; a pluggable allocator swapped in replaces only that one, and then
// read() raises). Linked against libc10 and libc10_cuda only; built on demand against the
// user's torch (gpu_mem_track/native/build.py), loaded and checked against torch's dict
// by gpu_mem_track/native/cudastats.py.
//
// read() never initialises CUDA: before torch has set up the allocator for the device,
// getDeviceStats raises (c10::Error "Invalid device argument"), and so does read().
#include <Python.h>

#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <cstdint>
#include <exception>

#ifndef GPU_MEM_TRACK_TORCH
#error "build with -DGPU_MEM_TRACK_TORCH=\"<torch.__version__>\" (gpu_mem_track/native/build.py does)"
#endif

// Declared here rather than through c10/cuda/CUDACachingAllocator.h, which needs the CUDA
// runtime's headers: a variable's linker name does not depend on its type, and only its
// address is compared below.
namespace c10::cuda::CUDACachingAllocator {
class CUDAAllocator;
extern std::atomic<CUDAAllocator*> allocator;
}  // namespace c10::cuda::CUDACachingAllocator

namespace {

constexpr int kAbi = 1;

// The allocator torch's dict reads, and the same object as a DeviceAllocator, found once
// and again whenever c10::cuda::CUDACachingAllocator::allocator changes.
const void* resolved_for = nullptr;
c10::DeviceAllocator* resolved = nullptr;

c10::DeviceAllocator* device_allocator() {
  const void* current = c10::cuda::CUDACachingAllocator::allocator.load();
  if (current != resolved_for || resolved == nullptr) {
    resolved = nullptr;
    resolved_for = current;
    auto* found = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA));
    // Equal addresses: the same object, so found is the allocator torch's dict reads
    // (a different object, or this one at another offset, would not compare equal).
    if (found != nullptr && static_cast<const void*>(found) == current) {
      resolved = found;
    }
  }
  return resolved;
}

PyObject* read(PyObject* /*module*/, PyObject* arg) {
  const long index = PyLong_AsLong(arg);
  if (index == -1 && PyErr_Occurred()) {
    return nullptr;
  }
  if (index < 0 || index > 127) {
    PyErr_Format(PyExc_ValueError, "device index %ld out of range", index);
    return nullptr;
  }
  using c10::CachingDeviceAllocator::StatType;
  constexpr auto all = static_cast<size_t>(StatType::AGGREGATE);
  int64_t figures[5];
  try {
    c10::DeviceAllocator* allocator = device_allocator();
    if (allocator == nullptr) {
      PyErr_SetString(
          PyExc_RuntimeError,
          "the CUDA allocator torch reads is not the one registered for cuda (a pluggable allocator?)");
      return nullptr;
    }
    const auto stats = allocator->getDeviceStats(static_cast<c10::DeviceIndex>(index));
    figures[0] = stats.allocated_bytes[all].current;
    figures[1] = stats.allocated_bytes[all].peak;
    figures[2] = stats.reserved_bytes[all].current;
    figures[3] = stats.reserved_bytes[all].peak;
    figures[4] = stats.allocation[all].allocated + stats.allocation[all].freed;
  } catch (const c10::Error& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what_without_backtrace());
    return nullptr;
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
  PyObject* result = PyTuple_New(5);
  if (result == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < 5; ++i) {
    PyObject* number = PyLong_FromLongLong(figures[i]);
    if (number == nullptr) {
      Py_DECREF(result);
      return nullptr;
    }
    PyTuple_SET_ITEM(result, i, number);
  }
  return result;
}

PyMethodDef methods[] = {
    {"read", read, METH_O,
     "read(index) -> (allocated, allocated_peak, reserved, reserved_peak, events): bytes, and the\n"
     "allocations plus frees counted, of the CUDA caching allocator's statistics of device index\n"
     "(the 'all' pool), as torch._C._cuda_memoryStats(index) gives them. RuntimeError before torch\n"
     "has set up the allocator for that device, or when another allocator is in use."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef definition = {PyModuleDef_HEAD_INIT, "cuda_stats",
                          "The CUDA caching allocator's statistics, read without torch's dict.", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_cuda_stats() {
  PyObject* module = PyModule_Create(&definition);
  if (module == nullptr) {
    return nullptr;
  }
  if (PyModule_AddIntConstant(module, "ABI", kAbi) < 0 ||
      PyModule_AddStringConstant(module, "TORCH", GPU_MEM_TRACK_TORCH) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
