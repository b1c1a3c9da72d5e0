// The regen command line as a function. `regen` itself is main() calling it; a program that links
// regen::cli, registers its own models (models/model.h register_model) and planners
// (remat/plan/planner.h register_planner) and then calls it gets every subcommand (train, profile,
// plan, sweep, frontier, bench ...) for them too, through the same code:
//
//   int main(int argc, char** argv) {
//     regen::register_model({"mynet", "my network", preset, build});
//     return regen::tool::run_cli(argc, argv);   // mytool train --model mynet --policy dp ...
//   }
//
// Returns the exit status: 0, 1 for regen's errors (the message on stderr), CLI11's codes for bad
// flags.
#pragma once

namespace regen::tool {

int run_cli(int argc, char** argv);

}  // namespace regen::tool
