// The packed GEMM's register tiles (packed_gemm.h): the portable one, and the choice among them.
// The SIMD tiles live in packed_tile_avx2.cpp, packed_tile_avx512.cpp and (the bf16 pair tile)
// packed_tile_avx512bf16.cpp, compiled with their own -m flags (CMakeLists.txt defines
// REGEN_PACKED_TILES_X86 here when it builds them), so a build for x86-64-v3 still runs the
// AVX-512 tile on a CPU that has it, and a -march=native build runs wherever its other code does.
// The choice is made once, from __builtin_cpu_supports. Every tile gives the same bits
// (packed_gemm.h, "Determinism"); the portable one can differ where the compiler does not fuse its
// multiply-adds. Test: tests/test_packed_tile.cpp.
#include <atomic>
#include <cstdlib>
#include <string>

#include "regen/kernels/cpu/packed_gemm.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu::packed {

#ifdef REGEN_PACKED_TILES_X86
template <class T>
TileFn<T> avx2_tile();  // packed_tile_avx2.cpp
template <class T>
TileFn<T> avx512_tile();                // packed_tile_avx512.cpp
TileFn<float> avx512_bf16_pair_tile();  // packed_tile_avx512bf16.cpp
#endif

namespace {

// Portable tile with the same summation order (one accumulator per element, k in order).
template <class T, int NV>
void generic_tile(int64_t kc, const T* a, const T* b, const Run<T>* runs, int nruns, int64_t rows,
                  int64_t ld, bool accumulate, const T* bias) {
  constexpr int NR = NV * kLanes<T>;
  T acc[kMR][NR] = {};
  for (int64_t k = 0; k < kc; ++k, a += kMR, b += NR)
    for (int i = 0; i < kMR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[i] * b[j];
  for (int64_t i = 0; i < rows; ++i)
    for (int s = 0; s < nruns; ++s)
      for (int64_t j = runs[s].start; j < runs[s].end; ++j) {
        T* p = runs[s].p + i * ld + (j - runs[s].start);
        T r = acc[i][j];
        if (accumulate)
          r = *p + r;
        else if (bias)
          r = r + bias[i];
        *p = r;
      }
}

template <class T>
void generic_run_tile(int nv, int64_t kc, const T* a, const T* b, const Run<T>* runs, int nruns,
                      int64_t rows, int64_t ld, bool accumulate, const T* bias) {
  switch (nv) {
    case 1:
      generic_tile<T, 1>(kc, a, b, runs, nruns, rows, ld, accumulate, bias);
      break;
    case 2:
      generic_tile<T, 2>(kc, a, b, runs, nruns, rows, ld, accumulate, bias);
      break;
    default:
      generic_tile<T, 3>(kc, a, b, runs, nruns, rows, ld, accumulate, bias);
      break;
  }
}

bool cpu_has(Isa isa) {
  switch (isa) {
#ifdef REGEN_PACKED_TILES_X86
    case Isa::avx512_bf16:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512bf16");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f");
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    case Isa::avx512_bf16:
    case Isa::avx512:
    case Isa::avx2:
      return false;
#endif
    case Isa::generic:
      return true;
  }
  return false;
}

Isa choose_isa() {
  const char* forced = std::getenv("REGEN_CPU_ISA");
  if (forced == nullptr || *forced == '\0') {
    for (Isa isa : {Isa::avx512_bf16, Isa::avx512, Isa::avx2})
      if (cpu_has(isa)) return isa;
    return Isa::generic;
  }
  const std::string name = forced;
  for (Isa isa : {Isa::avx512_bf16, Isa::avx512, Isa::avx2, Isa::generic}) {
    if (name != isa_name(isa)) continue;
    REGEN_CHECK(cpu_has(isa), "REGEN_CPU_ISA=", name,
                ": this CPU (or this build) has no such tile; leave REGEN_CPU_ISA unset to let "
                "regen choose");
    return isa;
  }
  REGEN_CHECK(false, "REGEN_CPU_ISA=", name, " is not one of avx512bf16, avx512, avx2, generic");
  return Isa::generic;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512_bf16:
      return "avx512bf16";
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    case Isa::generic:
      return "generic";
  }
  return "?";
}

namespace {
std::atomic<int> forced_isa{-1};  // ScopedTileIsa's choice, or -1
}  // namespace

Isa tile_isa() {
  static const Isa isa = choose_isa();
  const int forced = forced_isa.load(std::memory_order_relaxed);
  return forced < 0 ? isa : static_cast<Isa>(forced);
}

ScopedTileIsa::ScopedTileIsa(Isa isa) : previous_(forced_isa.load()) {
  REGEN_CHECK(cpu_has(isa), "ScopedTileIsa: this CPU (or this build) has no ", isa_name(isa),
              " tile");
  forced_isa.store(static_cast<int>(isa));
}

ScopedTileIsa::~ScopedTileIsa() {
  forced_isa.store(previous_);
}

template <class T>
TileFn<T> tile_kernel(Isa isa) {
  if (!cpu_has(isa)) return nullptr;
  switch (isa) {
#ifdef REGEN_PACKED_TILES_X86
    case Isa::avx512_bf16:
    case Isa::avx512:
      return avx512_tile<T>();
    case Isa::avx2:
      return avx2_tile<T>();
#endif
    default:
      return &generic_run_tile<T>;
  }
}
template TileFn<float> tile_kernel<float>(Isa);
template TileFn<double> tile_kernel<double>(Isa);

TileFn<float> bf16_pair_tile(Isa isa) {
#ifdef REGEN_PACKED_TILES_X86
  if (isa == Isa::avx512_bf16 && cpu_has(isa)) return avx512_bf16_pair_tile();
#endif
  (void)isa;
  return nullptr;
}

}  // namespace regen::cpu::packed

namespace regen::cpu {
std::string cpu_tile_name() {
  return packed::isa_name(packed::tile_isa());
}
}  // namespace regen::cpu
