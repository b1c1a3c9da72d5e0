// `regen demo`: allocates a few tensors and prints the allocator's statistics.
#include <cstdio>

#include "regen/core/tensor.h"
#include "tools/command.h"

namespace {
void setup(CLI::App& app) {
  app.callback([] {
    using namespace regen;
    CachingAllocator& a = allocator_for(Device::cpu());
    Generator g(0);
    CategoryScope scope(Category::activation);
    Tensor x = uniform({256, 1024}, -1, 1, g);
    MemoryStats s = a.stats();
    std::printf("allocated %s reserved %s\n", format_bytes(s.allocated.current).c_str(),
                format_bytes(s.reserved.current).c_str());
  });
}
REGEN_COMMAND("demo", "allocate tensors and print allocator statistics", setup);
}  // namespace
