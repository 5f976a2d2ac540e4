// The distributed tests run under mpirun (every rank runs every test, in the same order) or alone
// as a world of one.
#include <gtest/gtest.h>

#include "tandem/dist/process_group.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tandem::dist::init();
  int status = RUN_ALL_TESTS();
  tandem::dist::finalize();
  return status;
}
