// The library tests/bad_plugins/missing_dep.cpp links against (see there).
extern "C" __attribute__((visibility("default"))) int trainrun_test_dep_answer(void) { return 7; }
