// hash_math.cuh -- SHA-256 and BLAKE3 arithmetic for gpucc's model-digest kernels.
//
// Every function is __host__ __device__: sha256.cu and blake3.cu run them on the GPU, and
// hash_harness.cu runs the very same code on the host, where tests/test_hash_harness.py checks
// it against hashlib and the blake3 package.
//
// Work items ("jobs") are what one GPU thread does; the kernels only map thread indices to jobs:
//
//   sha256_shard_job   one whole shard (FIPS 180-4 padding included) -> 8 big-endian words
//   blake3_chunk_job   one 1024-byte BLAKE3 chunk -> its chaining value (or the root hash
//                      when the input is a single chunk)
//   blake3_parent_job  one node of one tree level: the parent of two chaining values, or a
//                      lone right-most value carried up unchanged
//
// Pairing adjacent nodes level by level, carrying an odd last node up, builds exactly BLAKE3's
// left-complete tree: the left subtree of every node holds the largest power of two chunks
// that is smaller than the node's chunk count.

#ifndef GPUCC_HASH_MATH_CUH
#define GPUCC_HASH_MATH_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#if defined(__CUDA_ARCH__)
#define HASHK_HD __host__ __device__ __forceinline__
#else
#define HASHK_HD __host__ __device__ inline
#endif
#else
#define HASHK_HD inline
#endif

namespace hashk {

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

// --- shared helpers ---------------------------------------------------------------------------

HASHK_HD u32 rotr32(u32 x, u32 n) { return (x >> n) | (x << (32u - n)); }

HASHK_HD u32 load_be32(const u8* p) {
    return (static_cast<u32>(p[0]) << 24) | (static_cast<u32>(p[1]) << 16) |
           (static_cast<u32>(p[2]) << 8) | static_cast<u32>(p[3]);
}

HASHK_HD u32 load_le32(const u8* p) {
    return static_cast<u32>(p[0]) | (static_cast<u32>(p[1]) << 8) |
           (static_cast<u32>(p[2]) << 16) | (static_cast<u32>(p[3]) << 24);
}

// Copy up to 64 bytes of a block into 16 little-endian words, zero-filling the rest. Aligned
// full blocks (16-byte aligned) take whole-word loads; anything else goes byte by byte.
HASHK_HD void load_block_le(const u8* p, u32 n, u32 w[16]) {
    if (n == 64 && (reinterpret_cast<u64>(p) & 15u) == 0) {
        const u32* q = reinterpret_cast<const u32*>(p);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            w[i] = q[i];  // both targets are little-endian
        }
        return;
    }
#pragma unroll
    for (u32 i = 0; i < 16; ++i) {
        u32 x = 0;
#pragma unroll
        for (u32 b = 0; b < 4; ++b) {
            const u32 at = 4 * i + b;
            x |= (at < n ? static_cast<u32>(p[at]) : 0u) << (8 * b);
        }
        w[i] = x;
    }
}

// --- SHA-256 (FIPS 180-4) --------------------------------------------------------------------

#if defined(__CUDA_ARCH__)
__constant__ u32 SHA256_K[64] = {
#else
static const u32 SHA256_K[64] = {
#endif
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u};

HASHK_HD void sha256_init(u32 h[8]) {
    h[0] = 0x6a09e667u;
    h[1] = 0xbb67ae85u;
    h[2] = 0x3c6ef372u;
    h[3] = 0xa54ff53au;
    h[4] = 0x510e527fu;
    h[5] = 0x9b05688cu;
    h[6] = 0x1f83d9abu;
    h[7] = 0x5be0cd19u;
}

// One compression of a block given as 16 big-endian message words.
HASHK_HD void sha256_compress(u32 h[8], const u32 m[16]) {
    u32 w[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        w[i] = m[i];
    }
    u32 a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        u32 wi;
        if (i < 16) {
            wi = w[i];
        } else {
            const u32 w15 = w[(i - 15) & 15], w2 = w[(i - 2) & 15];
            const u32 s0 = rotr32(w15, 7) ^ rotr32(w15, 18) ^ (w15 >> 3);
            const u32 s1 = rotr32(w2, 17) ^ rotr32(w2, 19) ^ (w2 >> 10);
            wi = w[i & 15] + s0 + w[(i - 7) & 15] + s1;
            w[i & 15] = wi;
        }
        const u32 t1 = k + (rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25)) + ((e & f) ^ (~e & g)) +
                       SHA256_K[i] + wi;
        const u32 t2 =
            (rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

HASHK_HD void sha256_load_block(const u8* p, u32 m[16]) {
    if ((reinterpret_cast<u64>(p) & 15u) == 0) {
        const u32* q = reinterpret_cast<const u32*>(p);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const u32 x = q[i];
            m[i] = (x >> 24) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            m[i] = load_be32(p + 4 * i);
        }
    }
}

// SHA-256 of len bytes at p (the whole message: padding and length appended here).
HASHK_HD void sha256_message(const u8* p, u64 len, u32 out[8]) {
    sha256_init(out);
    u32 m[16];
    u64 done = 0;
    for (; done + 64 <= len; done += 64) {
        sha256_load_block(p + done, m);
        sha256_compress(out, m);
    }
    // Tail: the remaining 0..63 bytes, 0x80, zeros, the 64-bit bit length; one or two blocks.
    const u32 rest = static_cast<u32>(len - done);
    const u32 blocks = rest < 56 ? 1 : 2;
    const u32 length_at = blocks * 64 - 8;
    const u64 bits = len * 8;
    const u8* tail = p + done;
    for (u32 b = 0; b < blocks; ++b) {
#pragma unroll
        for (u32 i = 0; i < 16; ++i) {
            u32 x = 0;
#pragma unroll
            for (u32 k = 0; k < 4; ++k) {
                const u32 at = 64 * b + 4 * i + k;
                u32 byte = 0;
                if (at < rest) {
                    byte = tail[at];
                } else if (at == rest) {
                    byte = 0x80u;
                } else if (at >= length_at) {
                    byte = static_cast<u32>(bits >> (8 * (7 - (at - length_at)))) & 0xffu;
                }
                x = (x << 8) | byte;
            }
            m[i] = x;
        }
        sha256_compress(out, m);
    }
}

// Job i of a sharded launch: shard i is len[i] bytes at base + offset[i].
HASHK_HD void sha256_shard_job(const u8* base, const u64* offset, const u64* len, u32 i, u32* out) {
    sha256_message(base + offset[i], len[i], out + 8 * i);
}

// --- BLAKE3 ----------------------------------------------------------------------------------

enum : u32 {
    B3_CHUNK_START = 1u,
    B3_CHUNK_END = 2u,
    B3_PARENT = 4u,
    B3_ROOT = 8u,
    B3_CHUNK_LEN = 1024u,
};

HASHK_HD u32 b3_iv(int i) {
    switch (i) {
        case 0: return 0x6A09E667u;
        case 1: return 0xBB67AE85u;
        case 2: return 0x3C6EF372u;
        case 3: return 0xA54FF53Au;
        case 4: return 0x510E527Fu;
        case 5: return 0x9B05688Cu;
        case 6: return 0x1F83D9ABu;
        default: return 0x5BE0CD19u;
    }
}

HASHK_HD void b3_g(u32 v[16], int a, int b, int c, int d, u32 x, u32 y) {
    v[a] = v[a] + v[b] + x;
    v[d] = rotr32(v[d] ^ v[a], 16);
    v[c] = v[c] + v[d];
    v[b] = rotr32(v[b] ^ v[c], 12);
    v[a] = v[a] + v[b] + y;
    v[d] = rotr32(v[d] ^ v[a], 8);
    v[c] = v[c] + v[d];
    v[b] = rotr32(v[b] ^ v[c], 7);
}

// The message permutation applied after each round: word i becomes word B3_PERM(i).
HASHK_HD void b3_permute(u32 m[16]) {
    const u32 t0 = m[2], t1 = m[6], t2 = m[3], t3 = m[10], t4 = m[7], t5 = m[0], t6 = m[4],
              t7 = m[13], t8 = m[1], t9 = m[11], t10 = m[12], t11 = m[5], t12 = m[9], t13 = m[14],
              t14 = m[15], t15 = m[8];
    m[0] = t0;
    m[1] = t1;
    m[2] = t2;
    m[3] = t3;
    m[4] = t4;
    m[5] = t5;
    m[6] = t6;
    m[7] = t7;
    m[8] = t8;
    m[9] = t9;
    m[10] = t10;
    m[11] = t11;
    m[12] = t12;
    m[13] = t13;
    m[14] = t14;
    m[15] = t15;
}

// Compression; writes the 8-word chaining value (the first 32 bytes of the output).
HASHK_HD void b3_compress(const u32 cv[8], const u32 block[16], u64 counter, u32 block_len,
                          u32 flags, u32 out[8]) {
    u32 v[16], m[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        m[i] = block[i];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[i] = cv[i];
        v[8 + i] = i < 4 ? b3_iv(i) : 0u;
    }
    v[12] = static_cast<u32>(counter);
    v[13] = static_cast<u32>(counter >> 32);
    v[14] = block_len;
    v[15] = flags;
#pragma unroll
    for (int r = 0; r < 7; ++r) {
        b3_g(v, 0, 4, 8, 12, m[0], m[1]);
        b3_g(v, 1, 5, 9, 13, m[2], m[3]);
        b3_g(v, 2, 6, 10, 14, m[4], m[5]);
        b3_g(v, 3, 7, 11, 15, m[6], m[7]);
        b3_g(v, 0, 5, 10, 15, m[8], m[9]);
        b3_g(v, 1, 6, 11, 12, m[10], m[11]);
        b3_g(v, 2, 7, 8, 13, m[12], m[13]);
        b3_g(v, 3, 4, 9, 14, m[14], m[15]);
        b3_permute(m);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        out[i] = v[i] ^ v[8 + i];
    }
}

// Chaining value of one chunk (len 0..1024 bytes; 0 only for the empty input). With root set
// (the input is this single chunk) the result is the hash itself.
HASHK_HD void b3_chunk_cv(const u8* p, u32 len, u64 chunk_index, bool root, u32 out[8]) {
    u32 cv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        cv[i] = b3_iv(i);
    }
    const u32 blocks = len == 0 ? 1 : (len + 63) / 64;
    u32 m[16];
    for (u32 b = 0; b < blocks; ++b) {
        const u32 n = len - 64 * b < 64 ? len - 64 * b : 64;
        load_block_le(p + 64 * b, n, m);
        u32 flags = 0;
        if (b == 0) {
            flags |= B3_CHUNK_START;
        }
        if (b + 1 == blocks) {
            flags |= B3_CHUNK_END | (root ? B3_ROOT : 0u);
        }
        b3_compress(cv, m, chunk_index, n, flags, cv);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        out[i] = cv[i];
    }
}

HASHK_HD void b3_parent_cv(const u32 left[8], const u32 right[8], bool root, u32 out[8]) {
    u32 m[16], key[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        m[i] = left[i];
        m[8 + i] = right[i];
        key[i] = b3_iv(i);
    }
    b3_compress(key, m, 0, 64, B3_PARENT | (root ? B3_ROOT : 0u), out);
}

HASHK_HD u64 b3_chunks(u64 len) { return len == 0 ? 1 : (len + B3_CHUNK_LEN - 1) / B3_CHUNK_LEN; }

// The last index i with start[i] <= j, for ascending start[0..n) with start[0] == 0.
HASHK_HD u32 find_owner(const u64* start, u32 n, u64 j) {
    u32 lo = 0, hi = n;
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if (start[mid] <= j) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Chunk job j of a launch over nfiles inputs: input f is len[f] bytes at base + offset[f], and
// its chunks are jobs chunk_start[f] .. chunk_start[f] + b3_chunks(len[f]).
HASHK_HD void blake3_chunk_job(const u8* base, const u64* offset, const u64* len,
                               const u64* chunk_start, u32 nfiles, u64 j, u32* cvs) {
    const u32 f = find_owner(chunk_start, nfiles, j);
    const u64 c = j - chunk_start[f];
    const u64 total = len[f];
    const u64 at = c * B3_CHUNK_LEN;
    const u32 n = static_cast<u32>(total - at < B3_CHUNK_LEN ? total - at : B3_CHUNK_LEN);
    b3_chunk_cv(base + offset[f] + at, n, c, b3_chunks(total) == 1, cvs + 8 * j);
}

// Parent job j of one tree level over nlists inputs: list f holds in_count[f] >= 2 values at
// in_start[f] and writes ceil(in_count[f] / 2) values at out_start[f] (out_start[0] == 0,
// ascending). A level that leaves one value in a list computes that list's root.
HASHK_HD void blake3_parent_job(const u32* in, u32* out, const u64* in_start, const u64* in_count,
                                const u64* out_start, u32 nlists, u64 j) {
    const u32 f = find_owner(out_start, nlists, j);
    const u64 k = j - out_start[f];
    const u64 left = in_start[f] + 2 * k;
    const u32* l = in + 8 * left;
    u32* o = out + 8 * j;
    if (2 * k + 1 < in_count[f]) {
        b3_parent_cv(l, l + 8, in_count[f] == 2, o);
    } else {
        for (int i = 0; i < 8; ++i) {
            o[i] = l[i];
        }
    }
}

}  // namespace hashk

#endif  // GPUCC_HASH_MATH_CUH
