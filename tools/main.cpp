// The `regen` tool: the command line of cli.h with the built-in models and planners.
#include "regen/tools/cli.h"

int main(int argc, char** argv) {
  return regen::tool::run_cli(argc, argv);
}
