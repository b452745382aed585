// Must not compile: a backend without adam_update computes gradients (it is a
// TransformerBackend) but is rejected by OptimizerBackend when an Adam rule is applied with it.
#include "tightfit/backend/reference.hpp"
#include "tightfit/optim/update_rules.hpp"

struct gradients_only_backend : tightfit::reference_backend<double> {
#ifndef TIGHTFIT_COMPILE_FAIL_CONTROL  // the control keeps the inherited adam_update
  template <class... A>
  void adam_update(A&&...) = delete;
#endif
};
static_assert(tightfit::TransformerBackend<gradients_only_backend>);

int main() {
  gradients_only_backend be;
  auto p = be.allocate<double>(4), g = be.allocate<double>(4);
  std::vector<tightfit::buffer_t<gradients_only_backend>> state;
  state.push_back(be.allocate<double>(4));
  state.push_back(be.allocate<double>(4));
  tightfit::adam_update_rule{}.apply(be, p.span(), std::span<const double>(g.span()),
                                     std::span(state), 1, 1.0, false);
}
