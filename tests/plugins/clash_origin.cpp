// One C++ function defined by two libraries, as Gloo's are by Debian's libgloo and by PyTorch's
// libtorch_cpu.so: the clash test plugin links the one built with HVD_TEST_CLASH_ORIGIN=1, the
// unit tests (the application) the one built with 2. The plugin must call its own.
namespace hvd_test {
int clash_origin();
int clash_origin() { return HVD_TEST_CLASH_ORIGIN; }
}  // namespace hvd_test
