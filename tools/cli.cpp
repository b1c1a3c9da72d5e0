// The regen command line (cli.h): builds the CLI11 tree from the registered subcommands
// (command.h) and turns every error into one message on stderr and an exit status, as getopt and
// argparse programs do: 2 for a usage error (an unknown command or flag, a missing or bad value:
// CLI11's parse errors), 1 for an error while running (regen::Error, running out of host memory),
// 0 for success and for --help.
#include <algorithm>
#include <cstdio>
#include <map>
#include <new>

#include "regen/core/error.h"
#include "regen/tools/cli.h"
#include "tools/command.h"
#include "tools/common.h"

namespace regen::tool {
namespace {
constexpr int kUsageError = 2;
}  // namespace

std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}

int run_cli(int argc, char** argv) {
  CLI::App app{"regen: deep-learning training with built-in rematerialization"};
  // Before the subcommands are added: they copy their parent's failure message.
  app.failure_message(cli_failure_message);
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
  // An unknown command is named as such (CLI11 would say only that one is required).
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end()) {
      std::fprintf(stderr,
                   "regen: error: unknown command '%s'; the commands are %s (regen --help)\n",
                   argv[1], join_names(names).c_str());
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
    std::fprintf(stderr, "regen: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "regen: error: out of host memory (std::bad_alloc): the batch or the model is too "
                 "large for this machine's memory; try a smaller --batch\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "regen: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace regen::tool
