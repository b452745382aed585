// Must not compile: a backend whose buffers have only data() and size() (the library also
// default-constructs, moves, views and resets them) is rejected by the Buffer part of
// StorageBackend where decoder_model is named, not deep inside nn/.
#include "tightfit/backend/reference.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/model.hpp"

template <class U>
struct bare_buffer {
  U* data() const { return nullptr; }
  tightfit::index_t size() const { return 0; }
#ifdef TIGHTFIT_COMPILE_FAIL_CONTROL  // the whole Buffer interface: compiles
  bool empty() const {
    return true;
  }
  std::span<U> span() const {
    return {};
  }
  tightfit::matrix_view<U> view(tightfit::index_t r, tightfit::index_t c) const {
    return {nullptr, r, c};
  }
  void reset() {}
#endif
};

struct bare_buffer_backend : tightfit::reference_backend<double> {
  template <class U>
  bare_buffer<U> allocate(tightfit::index_t) {
    return {};
  }
};

int main() {
  bare_buffer_backend be;
  tightfit::model_config cfg;
  tightfit::llama_model<bare_buffer_backend> model(be, cfg);
  return static_cast<int>(model.parameters().size());
}
