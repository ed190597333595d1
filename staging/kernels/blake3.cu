// blake3.cu -- BLAKE3 of whole inputs on the GPU (gpucc model digests).
//
// blake3_chunks compresses every 1024-byte chunk of every input in parallel (one thread per
// chunk), writing chaining values; blake3_parents then runs once per tree level, each thread
// merging one adjacent pair (or carrying a lone last value up), until every input has one
// value: its hash. The arithmetic is in hash_math.cuh, checked on the host by hash_harness.cu.

#include "hash_math.cuh"

typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(128)
    blake3_chunks(const unsigned char* __restrict__ base, const u64* __restrict__ offset,
                  const u64* __restrict__ len, const u64* __restrict__ chunk_start,
                  unsigned int nfiles, u64 total, unsigned int* __restrict__ cvs) {
    const u64 j = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j < total) {
        hashk::blake3_chunk_job(base, offset, len, chunk_start, nfiles, j, cvs);
    }
}

extern "C" __global__ void __launch_bounds__(128)
    blake3_parents(const unsigned int* __restrict__ in, unsigned int* __restrict__ out,
                   const u64* __restrict__ in_start, const u64* __restrict__ in_count,
                   const u64* __restrict__ out_start, unsigned int nlists, u64 total) {
    const u64 j = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (j < total) {
        hashk::blake3_parent_job(in, out, in_start, in_count, out_start, nlists, j);
    }
}
