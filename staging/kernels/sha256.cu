// sha256.cu -- SHA-256 of many shards in parallel (gpucc model digests).
//
// SHA-256 is serial within a message, so the parallelism is across shards: one thread hashes
// one whole shard and a warp hashes 32 shards side by side. Shards are described by byte
// offsets into one device buffer (16-byte aligned offsets take whole-word loads). The
// arithmetic is in hash_math.cuh, checked on the host by hash_harness.cu.

#include "hash_math.cuh"

typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(128)
    sha256_shards(const unsigned char* __restrict__ base, const u64* __restrict__ offset,
                  const u64* __restrict__ len, unsigned int count, unsigned int* __restrict__ out) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) {
        hashk::sha256_shard_job(base, offset, len, i, out);
    }
}
