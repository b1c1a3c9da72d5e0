// The packed GEMM's register tile for AVX-512 (packed_tile_simd.h): 8 rows x 3 zmm. CMake compiles
// this file alone with -mavx512f -mfma on x86-64; packed_tile.cpp calls it only on CPUs that
// report AVX-512F. Nothing here may be shared with other translation units (see
// packed_tile_simd.h), hence the file-local vector types (packed_tile_zmm.h).
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>

#include "regen/kernels/cpu/packed_tile_simd.h"
#include "regen/kernels/cpu/packed_tile_zmm.h"

namespace regen::cpu::packed {

template <class T>
TileFn<T> avx512_tile() {
  return &simd::run_tile<Zmm<T>, kMR, T>;
}
template TileFn<float> avx512_tile<float>();
template TileFn<double> avx512_tile<double>();

}  // namespace regen::cpu::packed
#endif
