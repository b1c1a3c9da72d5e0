// The regen command line. Subcommands are added by later layers; `demo` shows the allocator.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "core/tensor.h"

int main(int argc, char** argv) {
  CLI::App app{"regen: training with built-in rematerialization"};
  app.require_subcommand(1);
  auto* demo = app.add_subcommand("demo", "allocate tensors and print allocator statistics");
  demo->callback([] {
    using namespace regen;
    CachingAllocator& a = allocator_for(Device::cpu());
    Generator g(0);
    CategoryScope scope(Category::activation);
    Tensor x = uniform({256, 1024}, -1, 1, g);
    MemoryStats s = a.stats();
    std::printf("allocated %s reserved %s\n", format_bytes(s.allocated.current).c_str(),
                format_bytes(s.reserved.current).c_str());
  });
  CLI11_PARSE(app, argc, argv);
  return 0;
}
