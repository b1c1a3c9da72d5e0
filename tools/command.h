// Subcommands of the `regen` tool register themselves from their own files (tools/cmd_*.cpp):
//   REGEN_COMMAND("bench ops", "time GEMM and conv2d on ResNet-152 shapes", setup_fn);
// setup_fn adds options to the CLI11 app it is given and sets its callback. A path with a space
// makes a nested subcommand ("bench ops" is `ops` under `bench`).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace regen::tool {

struct Command {
  std::string path;
  std::string description;
  std::function<void(CLI::App&)> setup;
};

std::vector<Command>& commands();

struct CommandRegistrar {
  CommandRegistrar(std::string path, std::string description, std::function<void(CLI::App&)> f) {
    commands().push_back({std::move(path), std::move(description), std::move(f)});
  }
};

}  // namespace regen::tool

#define REGEN_COMMAND_CAT2(a, b) a##b
#define REGEN_COMMAND_CAT(a, b) REGEN_COMMAND_CAT2(a, b)
#define REGEN_COMMAND(path, description, setup)                                       \
  static ::regen::tool::CommandRegistrar REGEN_COMMAND_CAT(regen_command_, __LINE__)( \
      path, description, setup)
