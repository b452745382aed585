// The DLPack ABI (dlpack.h v0.8, the version torch and numpy export through __dlpack__): the few
// structs a consumer reads. A capsule named "dltensor" holds a DLManagedTensor*; the consumer
// renames it "used_dltensor" and calls the tensor's deleter when it is done with the memory.
#pragma once

#include <cstdint>

namespace tightfit::python::dlpack {

enum device_type : std::int32_t { cpu = 1, cuda_host = 3 };
enum type_code : std::uint8_t {
  int_ = 0,
  uint_ = 1,
  float_ = 2,
  bfloat_ = 4,
  complex_ = 5,
  bool_ = 6
};

struct device {
  std::int32_t type;
  std::int32_t id;
};

struct data_type {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct tensor {
  void* data;
  device dev;
  std::int32_t ndim;
  data_type dtype;
  std::int64_t* shape;
  std::int64_t* strides;  ///< in elements; null: row-major contiguous
  std::uint64_t byte_offset;
};

struct managed_tensor {
  tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(managed_tensor* self);
};

}  // namespace tightfit::python::dlpack
