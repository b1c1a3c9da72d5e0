// The one doctest main shared by every test binary.
//
// ctest runs each TEST_CASE on its own through a `--test-case=NAME` filter
// (doctest_discover_tests). doctest itself reports success when a filter matches no test case,
// so a name that CMake or doctest mangles (a ';' splits a CMake list, for one) would turn into a
// ctest entry that runs nothing and passes. This main fails such a run instead.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

namespace {

struct RunCounter : doctest::IReporter {
  static inline bool ended = false;
  static inline unsigned passing_filters = 0;

  explicit RunCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    ended = true;
    passing_filters = stats.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

DOCTEST_REGISTER_LISTENER("regen_run_counter", 1, RunCounter);

bool has_test_case_filter(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    while (*a == '-') ++a;
    if (std::strncmp(a, "test-case=", 10) == 0 || std::strncmp(a, "tc=", 3) == 0 ||
        std::strncmp(a, "dt-test-case=", 13) == 0 || std::strncmp(a, "dt-tc=", 6) == 0)
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;
  if (rc == 0 && RunCounter::ended && RunCounter::passing_filters == 0 &&
      has_test_case_filter(argc, argv)) {
    std::fprintf(stderr,
                 "doctest_main: the --test-case filter matched no test case (a test name with ';' "
                 "or another character that CMake or doctest rewrites?)\n");
    return 1;
  }
  return rc;
}
