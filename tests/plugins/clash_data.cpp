// Data of a library that both the clashcopy test plugin and the unit tests (the application)
// use: the unit tests read it, so their executable copies it into itself (a copy relocation),
// as an MPI program does MPI_COMM_WORLD and a C++ program std::cout.
namespace hvd_test {
extern int clash_data;
int clash_data = 7;
}  // namespace hvd_test
