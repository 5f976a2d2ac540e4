// Linear regression on random data, trained with autograd and a hand-written SGD step.
// This is the example in the README; ctest runs it, and it exits nonzero unless the loss goes down.
#include <cstdio>

#include "tandem/core/kernels.h"
#include "tandem/tandem.h"

using namespace tandem;

int main() {
  manual_seed(0);
  Tensor x = randn({256, 8});                                         // (N, D) inputs
  Tensor y = matmul(x, randn({8, 1})) + 0.5 + 0.1 * randn({256, 1});  // (N, 1) noisy targets
  Tensor w = zeros({8, 1}).requires_grad_();                          // (D, 1) weights to learn
  Tensor b = zeros({1}).requires_grad_();                             // (1,) bias
  double first_loss = 0, loss_value = 0;
  for (int step = 0; step < 100; ++step) {
    Tensor loss = mean(pow(matmul(x, w) + b - y, 2.0));  // mean squared error
    loss.backward();
    {
      NoGradGuard no_grad;  // the update is not part of the graph
      for (Tensor* p : {&w, &b}) {
        kernels::add_(*p, p->grad(), -0.1);  // p -= lr * dloss/dp
        p->set_grad(Tensor());               // clear for the next step
      }
    }
    loss_value = loss.item();
    if (step == 0) first_loss = loss_value;
    if (step % 20 == 0 || step == 99) std::printf("step %3d  loss %.5f\n", step, loss_value);
  }
  return loss_value < 0.1 * first_loss ? 0 : 1;  // training failed if the loss did not drop 10x
}
