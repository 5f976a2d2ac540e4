// Uses an installed tandem: f(x) = sum(x^3 + 2x), so df/dx = 3x^2 + 2.
#include <cmath>
#include <cstdio>
#include <vector>

#include "tandem/tandem.h"

int main() {
  tandem::Tensor x = tandem::tensor({1.0, 2.0, 3.0}).requires_grad_();  // (3,)
  tandem::Tensor f = tandem::sum(tandem::pow(x, 3.0) + 2.0 * x);
  f.backward();
  std::vector<double> grad = x.grad().to_vector<double>();
  std::printf("f = %g, df/dx = [%g, %g, %g]\n", f.item(), grad[0], grad[1], grad[2]);
  bool ok = std::fabs(f.item() - 48.0) < 1e-4;  // 1+8+27 + 2*(1+2+3)
  for (int i = 0; i < 3; ++i) ok = ok && std::fabs(grad[i] - (3.0 * (i + 1) * (i + 1) + 2.0)) < 1e-4;
  if (!ok) std::printf("unexpected values\n");
  return ok ? 0 : 1;
}
