#pragma once
// A gate that holds a CUDA stream until the host opens it: hold() enqueues a one-thread kernel that
// spins on a flag in host-mapped memory, open() sets the flag. Inside a graph capture the kernel is
// captured, so every replay is held at that point. Tests use it to make GPU work that cannot finish
// until they say so (a collective that runs past the timeout) and then let it finish, so the
// process still ends cleanly. Without CUDA headers.
namespace tandem::dist::testing {

class HostGate {
 public:
  HostGate();   // closed; allocates the flag (not during a capture)
  ~HostGate();  // opens the gate, then frees the flag once the device is done with it
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;

  void hold(void* stream);  // a cudaStream_t: its later work waits until open()
  void open();

 private:
  volatile int* flag_ = nullptr;  // host-mapped: the kernel reads it through device_flag_
  int* device_flag_ = nullptr;
};

}  // namespace tandem::dist::testing
