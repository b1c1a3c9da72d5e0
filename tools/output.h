// How the regen subcommands print and where they draw: byte and time formats, whether stdout is a
// terminal, and the python that runs tools/plot.py. Tests: tests/test_cli.cpp.
#pragma once

#include <cstdint>
#include <string>

namespace regen::tool {

std::string gib(int64_t bytes);  // "1.234" (GiB, 2^30 bytes)
// "12.345 ms" below 100 ms, "1234.5 ms" above: enough digits for tiny and large models.
std::string format_ms(double ms);
bool stdout_is_terminal();

// The python that draws plots: $REGEN_PYTHON, else Debian's /usr/bin/python3 (with
// python3-matplotlib) when present, else whatever python3 is first on PATH.
std::string plot_python();

}  // namespace regen::tool
