#pragma once
#include <algorithm>
#include <numeric>
#include <vector>

#include "emu_graph.h"
namespace cub {
struct DeviceRadixSort {
  template <class K, class V, class N>
  static cudaError_t SortPairs(void* temp, size_t& bytes, const K* kin, K* kout, const V* vin,
                               V* vout, N n, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t = nullptr) {
    if (!temp) {  // a size that grows with n, as CUB's does, so callers must pass n to the query
      bytes = 512 + static_cast<size_t>(n) * (sizeof(K) + sizeof(V));
      return cudaSuccess;
    }
    emu::run_or_record([=] {  // now, or when a captured graph replays (emu_graph.h)
      std::vector<size_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0);
      const K mask = end_bit >= int(sizeof(K) * 8) ? K(~K(0)) : K((K(1) << end_bit) - 1);
      std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
        return ((kin[a] & mask) >> begin_bit) < ((kin[b] & mask) >> begin_bit);
      });
      std::vector<K> k(n);
      std::vector<V> v(n);
      for (N i = 0; i < n; ++i) {
        k[i] = kin[idx[i]];
        v[i] = vin[idx[i]];
      }
      std::copy(k.begin(), k.end(), kout);
      std::copy(v.begin(), v.end(), vout);
    });
    return cudaSuccess;
  }
};
}  // namespace cub
