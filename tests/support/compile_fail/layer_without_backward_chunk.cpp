// Must not compile: a layer without backward_chunk is rejected by DecoderLayer where
// decoder_model<B, L> is named, not deep inside compute_gradients.
#include "tightfit/backend/reference.hpp"
#include "tightfit/nn/model.hpp"

using be_t = tightfit::reference_backend<double>;
using tightfit::index_t;
using cview = tightfit::matrix_view<const double>;

struct forward_only_layer {
  static std::vector<tightfit::param_spec> parameter_table(const tightfit::model_config&) {
    return {};
  }
  forward_only_layer(tightfit::parameter_set<be_t>&, const tightfit::model_config&, index_t) {}
  void forward(be_t&, const tightfit::sequence_batch&, cview, tightfit::matrix_view<double>,
               index_t, bool) {}
  void begin_backward(be_t&, const tightfit::sequence_batch&, cview, index_t,
                      tightfit::layer_grad_mode) {}
#ifdef TIGHTFIT_COMPILE_FAIL_CONTROL
  void backward_chunk(be_t&, const tightfit::sequence_batch&, cview, cview, index_t, index_t,
                      tightfit::matrix_view<double>, tightfit::layer_grad_mode) {}
#endif
  void end_backward(be_t&) {}
};

int main() {
  be_t be;
  tightfit::model_config cfg;
  tightfit::decoder_model<be_t, forward_only_layer> model(be, cfg);
  return static_cast<int>(model.parameters().size());
}
