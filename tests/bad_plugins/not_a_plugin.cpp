// An ordinary shared library that happens to sit in a plugin directory.
#include <string>

extern "C" __attribute__((visibility("default"))) int trainrun_test_answer(void) { return 42; }

__attribute__((visibility("default"))) std::string trainrun_test_greeting() { return "hello"; }
