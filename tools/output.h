// How the regen subcommands print and where they draw: byte and time formats, whether stdout is a
// terminal, and the python that runs tools/plot.py. Tests: tests/test_cli.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace regen::tool {

std::string gib(int64_t bytes);  // "1.234" (GiB, 2^30 bytes)
// "12.345 ms" below 100 ms, "1234.5 ms" above: enough digits for tiny and large models.
std::string format_ms(double ms);
bool stdout_is_terminal();

// The python that draws plots: $REGEN_PYTHON, else Debian's /usr/bin/python3 (with
// python3-matplotlib) when present, else whatever python3 is first on PATH.
std::string plot_python();
// Runs tools/plot.py with `args` under plot_python(), each argument passed as it is (no shell:
// a path holding spaces, quotes or ';' is a path), and waits for it. Prints the command first.
// Throws regen::Error naming the python when it cannot be started, and the script's exit status
// when it fails (its own message is on stderr above).
void run_plot(const std::vector<std::string>& args);

}  // namespace regen::tool
