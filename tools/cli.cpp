// The regen command line (cli.h): builds the CLI11 tree from the registered subcommands
// (command.h) and turns every error into one message on stderr and an exit status, as getopt and
// argparse programs do: 2 for a usage error (an unknown command or flag, a missing or bad value:
// CLI11's parse errors), 1 for an error while running (regen::Error, running out of host memory),
// 0 for success and for --help.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <string>

#include "regen/core/error.h"
#include "regen/tools/cli.h"
#include "tools/command.h"
#include "tools/common.h"
#include "tools/distributed.h"

namespace regen::tool {
namespace {
constexpr int kUsageError = 2;
}  // namespace

std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}

namespace {

// The command line, run in `job`: every error becomes one message on stderr, named after the rank
// under mpirun, and an exit status.
int run_commands(int argc, char** argv, JobScope& job) {
  const std::string prefix = job.error_prefix();
  CLI::App app{"regen: deep-learning training with built-in rematerialization"};
  // Before the subcommands are added: they copy their parent's failure message.
  app.failure_message([prefix](const CLI::App* a, const CLI::Error& e) {
    std::string msg = cli_failure_message(a, e);
    const std::string head = "regen: error: ";
    if (!prefix.empty() && msg.rfind(head, 0) == 0) msg.insert(head.size(), prefix);
    return msg;
  });
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "show help for every subcommand");
  const std::string exit_status =
      "Exit status: 0 on success, 1 when a run fails (the message says why), 2 for a usage error "
      "(an unknown command or flag, a missing or bad value).";
  app.footer(exit_status);
  std::map<std::string, CLI::App*> groups;
  std::vector<Command> list = commands();
  std::sort(list.begin(), list.end(),
            [](const Command& a, const Command& b) { return a.path < b.path; });
  for (const Command& c : list) {
    CLI::App* parent = &app;
    std::string name = c.path;
    const auto space = c.path.find(' ');
    if (space != std::string::npos) {
      const std::string group = c.path.substr(0, space);
      name = c.path.substr(space + 1);
      auto it = groups.find(group);
      if (it == groups.end()) {
        CLI::App* g = app.add_subcommand(group, group + " subcommands");
        g->require_subcommand(1);
        it = groups.emplace(group, g).first;
      }
      parent = it->second;
    }
    CLI::App* sub = parent->add_subcommand(name, c.description);
    sub->footer(exit_status);
    c.setup(*sub);
  }
  // Under mpirun: once every rank's flags parsed, before any command runs, the ranks must have
  // been given the same command (a rank with other steps or another batch would wait forever).
  const std::vector<std::string> args(argv + 1, argv + argc);
  app.parse_complete_callback([args] { check_same_command_line(args); });
  // An unknown command is named as such (CLI11 would say only that one is required).
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::fprintf(stderr,
                   "regen: error: %sunknown command '%s'; the commands are %s (regen --help)\n",
                   prefix.c_str(), argv[1], join_names(names).c_str());
      return kUsageError;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the help (status 0) or the failure message; its own statuses (105, 109...)
    // are its internals.
    return app.exit(e) == 0 ? 0 : kUsageError;
  } catch (const regen::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "regen: error: %s%s\n", prefix.c_str(), e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "regen: error: %sout of host memory (std::bad_alloc): the batch or the model is "
                 "too large for this machine's memory; try a smaller --batch\n",
                 prefix.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "regen: error: %s%s\n", prefix.c_str(), e.what());
    return 1;
  }
  return 0;
}

}  // namespace

namespace {

// What std::terminate does in the tool: an exception that could not be caught where it was
// thrown (out of an OpenMP region's threads, a destructor or a noexcept function) still becomes
// one message and exit status 1, as a caught one does; anything else aborts as before.
[[noreturn]] void report_terminate() {
  const char* what = nullptr;
  std::string message;
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      what =
          "out of host memory (std::bad_alloc): the batch or the model is too large for this "
          "machine's memory; try a smaller --batch";
    } catch (const std::exception& x) {
      message = x.what();
      what = message.c_str();
    } catch (...) {
    }
  }
  if (what == nullptr) std::abort();
  std::fflush(stdout);
  std::fprintf(stderr, "regen: error: %s\n", what);
  std::_Exit(1);
}

}  // namespace

int run_cli(int argc, char** argv) {
  std::set_terminate(report_terminate);
  std::unique_ptr<JobScope> job;
  try {
    job = std::make_unique<JobScope>();  // MPI first, under mpirun (tools/distributed.h)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regen: error: %s\n", e.what());
    return 1;
  }
  return job->finish(run_commands(argc, argv, *job));
}

}  // namespace regen::tool
