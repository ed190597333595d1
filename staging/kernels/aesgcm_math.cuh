// aesgcm_math.cuh -- AES-256-GCM arithmetic shared by gpucc's CUDA kernels and the host harness.
//
// Everything here is a __host__ __device__ function so the exact code the GPU runs is also
// compiled for the host by tests/test_kernel_harness.py (nvcc -x cu, no GPU needed) and checked
// against the `cryptography` package and the GCM specification's test vectors.
//
// Conventions
// -----------
// * AES state and round keys are little-endian 32-bit column words: column j of a block is
//   bytes 4j..4j+3 loaded as a little-endian word, i.e. what a plain 32-bit load gives on the GPU.
// * GF(2^128) elements (gf128) are in "natural" polynomial order: bit i of the 128-bit value is
//   the coefficient of x^i, w[0] holding x^0..x^31. GCM's own bit order puts x^0 in the most
//   significant bit of byte 0, so converting a little-endian word L to natural order reverses the
//   bits inside each byte (rev_bits_in_bytes). Reduction is modulo x^128 + x^7 + x^2 + x + 1.
// * The carry-less multiply uses ordinary integer multiplies on operands masked to every fourth
//   bit ("holes"), so no table lookups and no data-dependent branches or addresses: constant time.
// * AES uses one 256-entry 32-bit T-table reached through an accessor (Tab): the device kernel
//   passes a shared-memory table replicated once per bank (every lane reads its own copy, so a
//   warp never has a bank conflict, whatever the data), the harness a plain host array.
//   The table is computed from the S-box, itself computed arithmetically (inverse in GF(2^8) by a
//   fixed exponentiation, then the affine map), so no constant table is typed in by hand.
//
// No standard headers are included: NVRTC (CuPy's compiler) compiles this file as is.

#ifndef GPUCC_AESGCM_MATH_CUH
#define GPUCC_AESGCM_MATH_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#if defined(__CUDA_ARCH__)
#define GCMK_HD __host__ __device__ __forceinline__
#else
// Host pass (the harness): let the host compiler decide; forcing the big AES and GF bodies
// inline into every caller only makes the build slow.
#define GCMK_HD __host__ __device__ inline
#endif
// Templates over an accessor (table, powers, partials) are instantiated with host-only accessors
// by the harness and device-only ones by the kernels; each side only ever calls its own.
#define GCMK_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define GCMK_HD inline
#define GCMK_HD_TEMPLATE
#endif

namespace gcmk {

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

// ---------------------------------------------------------------------------------------------
// Bit and byte helpers (single instructions on the GPU, portable loops on the host).
// ---------------------------------------------------------------------------------------------

// __byte_perm semantics: byte k of the result is byte (s >> 4k) & 7 of the 8-byte value b:a.
GCMK_HD u32 byte_perm(u32 a, u32 b, u32 s) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(a, b, s);
#else
    const u64 v = (static_cast<u64>(b) << 32) | a;
    u32 r = 0;
    for (int k = 0; k < 4; ++k) {
        const u32 sel = (s >> (4 * k)) & 7u;
        r |= static_cast<u32>((v >> (8 * sel)) & 0xffu) << (8 * k);
    }
    return r;
#endif
}

GCMK_HD u32 bswap32(u32 x) { return byte_perm(x, 0u, 0x0123u); }

// Byte k of x as a number 0..255, the AES T-table indices: one instruction each on the GPU.
// Bytes 0-2 are a PRMT (byte k, then three zero bytes); byte 3 is the high word of x * 2^8, an
// IMAD.HI, which runs on the FMA pipe and so takes a quarter of the extracts off the ALU pipe,
// the kernel's busiest (benchmarks/sass_model.py).
GCMK_HD u32 byte0(u32 x) { return byte_perm(x, 0u, 0x4440u); }
GCMK_HD u32 byte1(u32 x) { return byte_perm(x, 0u, 0x4441u); }
GCMK_HD u32 byte2(u32 x) { return byte_perm(x, 0u, 0x4442u); }
GCMK_HD u32 byte3(u32 x) {
#if defined(__CUDA_ARCH__)
    return __umulhi(x, 0x100u);
#else
    return x >> 24;
#endif
}

// Rotate left by 8, 16 or 24 bits (the only rotations AES needs): a byte permutation.
GCMK_HD u32 rotl8(u32 x) { return byte_perm(x, x, 0x2103u); }
GCMK_HD u32 rotl16(u32 x) { return byte_perm(x, x, 0x1032u); }
GCMK_HD u32 rotl24(u32 x) { return byte_perm(x, x, 0x0321u); }

GCMK_HD u32 brev32(u32 x) {
#if defined(__CUDA_ARCH__)
    return __brev(x);
#else
    u32 r = 0;
    for (int i = 0; i < 32; ++i) {
        r = (r << 1) | ((x >> i) & 1u);
    }
    return r;
#endif
}

// Reverse the bit order inside each byte, keep the byte order: GCM order <-> natural order.
GCMK_HD u32 rev_bits_in_bytes(u32 x) { return brev32(bswap32(x)); }

// Funnel shift: the high 32 bits of ((hi:lo) << s), 0 < s < 32.
GCMK_HD u32 shl_funnel(u32 lo, u32 hi, u32 s) {
#if defined(__CUDA_ARCH__)
    return __funnelshift_l(lo, hi, s);
#else
    return (hi << s) | (lo >> (32u - s));
#endif
}

// Little-endian word load/store from bytes (host and device; the device normally uses vectors).
GCMK_HD u32 load_le32(const u8* p) {
    return static_cast<u32>(p[0]) | (static_cast<u32>(p[1]) << 8) | (static_cast<u32>(p[2]) << 16) |
           (static_cast<u32>(p[3]) << 24);
}

GCMK_HD void store_le32(u8* p, u32 v) {
    p[0] = static_cast<u8>(v);
    p[1] = static_cast<u8>(v >> 8);
    p[2] = static_cast<u8>(v >> 16);
    p[3] = static_cast<u8>(v >> 24);
}

// ---------------------------------------------------------------------------------------------
// GF(2^8) and the AES S-box, computed (constant time: no branches or lookups on the data).
// ---------------------------------------------------------------------------------------------

// Multiply by x modulo the AES polynomial x^8 + x^4 + x^3 + x + 1 (0x11b).
GCMK_HD u32 gf8_xtime(u32 a) { return ((a << 1) ^ (0x11bu & (0u - ((a >> 7) & 1u)))) & 0xffu; }

GCMK_HD u32 gf8_mul(u32 a, u32 b) {
    u32 r = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        r ^= a & (0u - (b & 1u));
        b >>= 1;
        a = gf8_xtime(a);
    }
    return r;
}

// Multiplicative inverse as a^254 (= a^(2+4+...+128)); maps 0 to 0 as AES requires.
GCMK_HD u32 gf8_inv(u32 a) {
    u32 p = a;
    u32 r = 1;
#pragma unroll
    for (int i = 1; i < 8; ++i) {
        p = gf8_mul(p, p);  // p = a^(2^i)
        r = gf8_mul(r, p);
    }
    return r;
}

GCMK_HD u32 rotl8_byte(u32 b, int n) { return ((b << n) | (b >> (8 - n))) & 0xffu; }

GCMK_HD u32 aes_sbox(u32 x) {
    const u32 b = gf8_inv(x & 0xffu);
    return b ^ rotl8_byte(b, 1) ^ rotl8_byte(b, 2) ^ rotl8_byte(b, 3) ^ rotl8_byte(b, 4) ^ 0x63u;
}

// The T-table entry for S-box input x, as a little-endian column word: the MixColumns image of
// (S(x), 0, 0, 0), i.e. bytes (2S, S, S, 3S). Rotations by 8/16/24 give the other three tables.
GCMK_HD u32 aes_te0(u32 x) {
    const u32 s = aes_sbox(x);
    const u32 s2 = gf8_xtime(s);
    return s2 | (s << 8) | (s << 16) | ((s2 ^ s) << 24);
}

// The S-box value is byte 1 of the T-table entry.
GCMK_HD_TEMPLATE
template <class Tab>
GCMK_HD u32 sbox_via(const Tab& te, u32 x) {
    return (te(x) >> 8) & 0xffu;
}

GCMK_HD_TEMPLATE
template <class Tab>
GCMK_HD u32 aes_sub_word(const Tab& te, u32 w) {
    return sbox_via(te, w & 0xffu) | (sbox_via(te, (w >> 8) & 0xffu) << 8) |
           (sbox_via(te, (w >> 16) & 0xffu) << 16) | (sbox_via(te, w >> 24) << 24);
}

// ---------------------------------------------------------------------------------------------
// AES-256: key schedule (60 round-key words) and block encryption (14 rounds).
// ---------------------------------------------------------------------------------------------

constexpr int kAesRoundKeyWords = 60;

// key: the 32-byte key as 8 little-endian words. RotWord on a little-endian word is a rotation
// right by 8 bits (= left by 24); Rcon goes into byte 0.
GCMK_HD_TEMPLATE
template <class Tab>
GCMK_HD void aes256_expand_key(const u32 key[8], u32 rk[kAesRoundKeyWords], const Tab& te) {
    for (int i = 0; i < 8; ++i) {
        rk[i] = key[i];
    }
    u32 rcon = 1;
    for (int i = 8; i < kAesRoundKeyWords; ++i) {
        u32 t = rk[i - 1];
        if ((i & 7) == 0) {
            t = aes_sub_word(te, rotl24(t)) ^ rcon;
            rcon = gf8_xtime(rcon);
        } else if ((i & 7) == 4) {
            t = aes_sub_word(te, t);
        }
        rk[i] = rk[i - 8] ^ t;
    }
}

// The last round's output column from the T-table entries of its four input bytes (rows 0-3):
// S(row 0) and S(row 1) are byte 1 of their entries, S(row 2) and S(row 3) byte 2.
GCMK_HD u32 aes_last_column(u32 e0, u32 e1, u32 e2, u32 e3) {
    const u32 lo = byte_perm(e0, e1, 0x4451u);  // bytes 0, 1: S(row 0), S(row 1)
    const u32 hi = byte_perm(e2, e3, 0x6200u);  // bytes 2, 3: S(row 2), S(row 3)
    return byte_perm(lo, hi, 0x7610u);
}

// One block. rk may live anywhere the caller likes (shared memory on the GPU): every thread of a
// warp reads the same round-key word, a broadcast.
GCMK_HD_TEMPLATE
template <class Tab>
GCMK_HD void aes256_encrypt(const u32* rk, const u32 in[4], u32 out[4], const Tab& te) {
    u32 s0 = in[0] ^ rk[0];
    u32 s1 = in[1] ^ rk[1];
    u32 s2 = in[2] ^ rk[2];
    u32 s3 = in[3] ^ rk[3];
#pragma unroll
    for (int r = 1; r < 14; ++r) {
        const u32* k = rk + 4 * r;
        // Output column j takes row i from input column j+i (ShiftRows); the table for row i is
        // the row-0 table rotated left by 8*i bits.
        const u32 t0 = te(byte0(s0)) ^ rotl8(te(byte1(s1))) ^ rotl16(te(byte2(s2))) ^
                       rotl24(te(byte3(s3))) ^ k[0];
        const u32 t1 = te(byte0(s1)) ^ rotl8(te(byte1(s2))) ^ rotl16(te(byte2(s3))) ^
                       rotl24(te(byte3(s0))) ^ k[1];
        const u32 t2 = te(byte0(s2)) ^ rotl8(te(byte1(s3))) ^ rotl16(te(byte2(s0))) ^
                       rotl24(te(byte3(s1))) ^ k[2];
        const u32 t3 = te(byte0(s3)) ^ rotl8(te(byte1(s0))) ^ rotl16(te(byte2(s1))) ^
                       rotl24(te(byte3(s2))) ^ k[3];
        s0 = t0;
        s1 = t1;
        s2 = t2;
        s3 = t3;
    }
    // Last round (no MixColumns): the S-box value is byte 1 and byte 2 of a T-table entry, so
    // three byte permutations gather the four S-box bytes of an output column in place.
    const u32* k = rk + 56;
    out[0] = aes_last_column(te(byte0(s0)), te(byte1(s1)), te(byte2(s2)), te(byte3(s3))) ^ k[0];
    out[1] = aes_last_column(te(byte0(s1)), te(byte1(s2)), te(byte2(s3)), te(byte3(s0))) ^ k[1];
    out[2] = aes_last_column(te(byte0(s2)), te(byte1(s3)), te(byte2(s0)), te(byte3(s1))) ^ k[2];
    out[3] = aes_last_column(te(byte0(s3)), te(byte1(s0)), te(byte2(s1)), te(byte3(s2))) ^ k[3];
}

// ---------------------------------------------------------------------------------------------
// GF(2^128): carry-less multiply with integer multiplies ("holes"), lazy reduction.
// ---------------------------------------------------------------------------------------------

struct gf128 {
    u32 w[4];
};

struct gf256 {  // an unreduced product (degree <= 254)
    u32 w[8];
};

GCMK_HD gf128 gf_zero() {
    gf128 r;
    r.w[0] = r.w[1] = r.w[2] = r.w[3] = 0u;
    return r;
}

GCMK_HD gf128 gf_one() {
    gf128 r = gf_zero();
    r.w[0] = 1u;
    return r;
}

GCMK_HD gf128 gf_xor(const gf128& a, const gf128& b) {
    gf128 r;
    r.w[0] = a.w[0] ^ b.w[0];
    r.w[1] = a.w[1] ^ b.w[1];
    r.w[2] = a.w[2] ^ b.w[2];
    r.w[3] = a.w[3] ^ b.w[3];
    return r;
}

GCMK_HD void gf256_zero(gf256& d) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        d.w[i] = 0u;
    }
}

GCMK_HD u64 mul_wide(u32 a, u32 b) { return static_cast<u64>(a) * static_cast<u64>(b); }

// 32 x 32 -> 64-bit carry-less product. Each operand is split into four parts holding every
// fourth bit (bit positions = i mod 4). In an integer product of two such parts, the bits land on
// positions = i+j mod 4 and at most 8 pairs meet on any position, so the sum there is <= 8 < 16:
// it fits in the 4-bit gap before the next position of the same class and never disturbs it. The
// lowest bit of each group is then the XOR (parity) of the pairs: exactly the carry-less result.
// XOR-ing the four products of one class and masking keeps only those parity bits.
GCMK_HD u64 clmul32(u32 a, u32 b) {
    const u32 m0 = 0x11111111u, m1 = 0x22222222u, m2 = 0x44444444u, m3 = 0x88888888u;
    const u32 a0 = a & m0, a1 = a & m1, a2 = a & m2, a3 = a & m3;
    const u32 b0 = b & m0, b1 = b & m1, b2 = b & m2, b3 = b & m3;
    const u64 z0 = mul_wide(a0, b0) ^ mul_wide(a1, b3) ^ mul_wide(a2, b2) ^ mul_wide(a3, b1);
    const u64 z1 = mul_wide(a0, b1) ^ mul_wide(a1, b0) ^ mul_wide(a2, b3) ^ mul_wide(a3, b2);
    const u64 z2 = mul_wide(a0, b2) ^ mul_wide(a1, b1) ^ mul_wide(a2, b0) ^ mul_wide(a3, b3);
    const u64 z3 = mul_wide(a0, b3) ^ mul_wide(a1, b2) ^ mul_wide(a2, b1) ^ mul_wide(a3, b0);
    return (z0 & 0x1111111111111111ull) | (z1 & 0x2222222222222222ull) |
           (z2 & 0x4444444444444444ull) | (z3 & 0x8888888888888888ull);
}

// 64 x 64 -> 128 (Karatsuba: three 32-bit products). x = x0 + x1*2^32.
GCMK_HD void clmul64(u32 x0, u32 x1, u32 y0, u32 y1, u32 r[4]) {
    const u64 lo = clmul32(x0, y0);
    const u64 hi = clmul32(x1, y1);
    const u64 mid = clmul32(x0 ^ x1, y0 ^ y1) ^ lo ^ hi;
    r[0] = static_cast<u32>(lo);
    r[1] = static_cast<u32>(lo >> 32) ^ static_cast<u32>(mid);
    r[2] = static_cast<u32>(hi) ^ static_cast<u32>(mid >> 32);
    r[3] = static_cast<u32>(hi >> 32);
}

// acc ^= a * b, unreduced (Karatsuba over 64-bit halves: nine 32-bit products in all).
GCMK_HD void gf_mul_acc(const gf128& a, const gf128& b, gf256& acc) {
    u32 lo[4], hi[4], mid[4];
    clmul64(a.w[0], a.w[1], b.w[0], b.w[1], lo);
    clmul64(a.w[2], a.w[3], b.w[2], b.w[3], hi);
    clmul64(a.w[0] ^ a.w[2], a.w[1] ^ a.w[3], b.w[0] ^ b.w[2], b.w[1] ^ b.w[3], mid);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        mid[i] ^= lo[i] ^ hi[i];
    }
    acc.w[0] ^= lo[0];
    acc.w[1] ^= lo[1];
    acc.w[2] ^= lo[2] ^ mid[0];
    acc.w[3] ^= lo[3] ^ mid[1];
    acc.w[4] ^= hi[0] ^ mid[2];
    acc.w[5] ^= hi[1] ^ mid[3];
    acc.w[6] ^= hi[2];
    acc.w[7] ^= hi[3];
}

// Reduce modulo P = x^128 + x^7 + x^2 + x + 1. With d = lo + hi*x^128 (deg hi <= 126):
// hi*x^128 = hi*(1 + x + x^2 + x^7) mod P. That product has degree <= 133; its bits 128..133
// (e = hi>>127 ^ hi>>126 ^ hi>>121, at most 7 bits) fold once more the same way, landing below
// bit 14, so two folds finish the job.
GCMK_HD gf128 gf_reduce(const gf256& d) {
    const u32 h0 = d.w[4], h1 = d.w[5], h2 = d.w[6], h3 = d.w[7];
    gf128 r;
    r.w[0] = d.w[0] ^ h0 ^ (h0 << 1) ^ (h0 << 2) ^ (h0 << 7);
    r.w[1] = d.w[1] ^ h1 ^ shl_funnel(h0, h1, 1) ^ shl_funnel(h0, h1, 2) ^ shl_funnel(h0, h1, 7);
    r.w[2] = d.w[2] ^ h2 ^ shl_funnel(h1, h2, 1) ^ shl_funnel(h1, h2, 2) ^ shl_funnel(h1, h2, 7);
    r.w[3] = d.w[3] ^ h3 ^ shl_funnel(h2, h3, 1) ^ shl_funnel(h2, h3, 2) ^ shl_funnel(h2, h3, 7);
    const u32 e = (h3 >> 31) ^ (h3 >> 30) ^ (h3 >> 25);
    r.w[0] ^= e ^ (e << 1) ^ (e << 2) ^ (e << 7);
    return r;
}

GCMK_HD gf128 gf_mul(const gf128& a, const gf128& b) {
    gf256 d;
    gf256_zero(d);
    gf_mul_acc(a, b, d);
    return gf_reduce(d);
}

// h^e by square-and-multiply. The exponent is public (a block count), never secret.
GCMK_HD gf128 gf_pow(const gf128& h, u64 e) {
    gf128 r = gf_one();
    gf128 b = h;
    while (e != 0ull) {
        if (e & 1ull) {
            r = gf_mul(r, b);
        }
        e >>= 1;
        if (e != 0ull) {
            b = gf_mul(b, b);
        }
    }
    return r;
}

// 16 block bytes, as four little-endian words, to/from natural order.
GCMK_HD gf128 gf_from_le_words(const u32 L[4]) {
    gf128 r;
    r.w[0] = rev_bits_in_bytes(L[0]);
    r.w[1] = rev_bits_in_bytes(L[1]);
    r.w[2] = rev_bits_in_bytes(L[2]);
    r.w[3] = rev_bits_in_bytes(L[3]);
    return r;
}

GCMK_HD void gf_to_le_words(const gf128& x, u32 L[4]) {
    L[0] = rev_bits_in_bytes(x.w[0]);
    L[1] = rev_bits_in_bytes(x.w[1]);
    L[2] = rev_bits_in_bytes(x.w[2]);
    L[3] = rev_bits_in_bytes(x.w[3]);
}

GCMK_HD gf128 gf_from_bytes(const u8* b) {
    u32 L[4];
    for (int i = 0; i < 4; ++i) {
        L[i] = load_le32(b + 4 * i);
    }
    return gf_from_le_words(L);
}

// The GCM length block [len(A) in bits]_64 || [len(C) in bits]_64, both big-endian.
GCMK_HD gf128 gf_length_block(u64 aad_bytes, u64 text_bytes) {
    const u64 a = aad_bytes * 8ull, c = text_bytes * 8ull;
    // Big-endian bytes read as natural order: the word holding bytes 0..3 is the high half of a.
    u32 L[4];
    L[0] = bswap32(static_cast<u32>(a >> 32));
    L[1] = bswap32(static_cast<u32>(a));
    L[2] = bswap32(static_cast<u32>(c >> 32));
    L[3] = bswap32(static_cast<u32>(c));
    return gf_from_le_words(L);
}

// ---------------------------------------------------------------------------------------------
// Counters. J0 is kept as four little-endian words; inc32 acts on the last word, read big-endian.
// ---------------------------------------------------------------------------------------------

// J0 for a 96-bit IV: IV || 0x00000001.
GCMK_HD void gcm_j0_from_iv96(const u32 iv[3], u32 j0[4]) {
    j0[0] = iv[0];
    j0[1] = iv[1];
    j0[2] = iv[2];
    j0[3] = bswap32(1u);
}

// Counter block for data block c (0-based): inc32 applied c+1 times to J0 (only the low 32 bits
// count, modulo 2^32, as SP 800-38D specifies).
GCMK_HD void gcm_counter_block(const u32 j0[4], u64 c, u32 out[4]) {
    out[0] = j0[0];
    out[1] = j0[1];
    out[2] = j0[2];
    out[3] = bswap32(bswap32(j0[3]) + static_cast<u32>(c) + 1u);
}

// The nonce of sealed-format chunk i: dataset_id[0:4] || uint64_be(i), as little-endian words.
GCMK_HD void format_chunk_iv(u32 id_prefix_le, u64 index, u32 iv[3]) {
    iv[0] = id_prefix_le;
    iv[1] = bswap32(static_cast<u32>(index >> 32));
    iv[2] = bswap32(static_cast<u32>(index));
}

// The AAD of sealed-format chunk i: header_digest (32) || uint64_le(i) || final (1): 41 bytes,
// three GHASH blocks (the last one zero-padded).
constexpr u32 kFormatAadBytes = 41;

GCMK_HD gf128 format_chunk_aad_block(const u8 digest[32], u64 index, u32 final_flag, u32 which) {
    if (which < 2u) {
        return gf_from_bytes(digest + 16u * which);
    }
    u32 L[4];
    L[0] = static_cast<u32>(index);
    L[1] = static_cast<u32>(index >> 32);
    L[2] = final_flag & 0xffu;
    L[3] = 0u;
    return gf_from_le_words(L);
}

// GHASH of chunk i's AAD alone.
GCMK_HD gf128 format_chunk_aad_ghash(const u8 digest[32], u64 index, u32 final_flag,
                                     const gf128& h) {
    gf128 y = gf_zero();
    for (u32 a = 0; a < 3u; ++a) {
        y = gf_mul(gf_xor(y, format_chunk_aad_block(digest, index, final_flag, a)), h);
    }
    return y;
}

// ---------------------------------------------------------------------------------------------
// Work decomposition: a chunk's text is cut into "tiles" of CT = K*T blocks (K blocks for each of
// the T threads of a CTA; thread t takes blocks t, t+T, ..., t+(K-1)T of the tile, so every load
// and store of a warp is one contiguous 512-byte run). Tiles are aligned to the END of the text:
// z = NT*CT - n zero blocks are imagined in front of block 0 (leading zero blocks do not change a
// GHASH), so every tile is full and the powers of H a thread needs are fixed for the whole launch.
//
//   GHASH part of the text:  GC = sum_c C_c * H^(n-c)       (c = 0..n-1, so the last gets H^1)
//   thread t of tile tau:    sum_i C_p * H^(CT - (i*T + t))  with p = tau*CT + i*T + t - z
//   tile tau (XOR of its T threads): its blocks weighted as if the text ended with the tile
//   chunk:                   GC = sum_tau P_tau * G^(NT-1-tau), G = H^CT
//
// The combine across tiles is spread over FT threads: thread t takes the tiles at distance
// s = t, t+FT, t+2FT, ... from the end, runs Horner with G^FT and multiplies once by G^t; the
// chunk's GC is the XOR of the FT results. Finally, with A the AAD blocks and L the length block,
//   GHASH(A, C) = (GHASH(A) * H^n  ^  GC  ^  L) * H.
// ---------------------------------------------------------------------------------------------

GCMK_HD u64 gcm_text_blocks(u64 len) { return (len + 15ull) >> 4; }

GCMK_HD u64 gcm_tiles(u64 len, u32 ct) {
    const u64 n = gcm_text_blocks(len);
    return (n + ct - 1ull) / ct;
}

// One GCM message (one chunk) as a kernel thread sees it.
struct GcmMessage {
    const u8* src;  // input text: ciphertext when decrypting, plaintext when encrypting
    u8* dst;        // output text (same length)
    u32 j0[4];      // pre-counter block J0, little-endian words
    u64 len;        // text length in bytes
};

// 16 text bytes at block c: a full vector, or the zero-padded tail of the last block. (Register
// code only, no local arrays: a run-time-indexed array would go to local memory on the GPU.)
GCMK_HD void load_text_block(const u8* src, u64 c, u64 len, u32 L[4]) {
    const u64 off = c * 16ull;
    if (off + 16ull <= len) {
#if defined(__CUDA_ARCH__)
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(src + off));
        L[0] = v.x;
        L[1] = v.y;
        L[2] = v.z;
        L[3] = v.w;
#else
        for (int i = 0; i < 4; ++i) {
            L[i] = load_le32(src + off + 4 * i);
        }
#endif
    } else {
        const u64 valid = len - off;  // 1..15
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            u32 v = 0u;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const u64 j = static_cast<u64>(4 * w + k);
                if (j < valid) {
                    v |= static_cast<u32>(src[off + j]) << (8 * k);
                }
            }
            L[w] = v;
        }
    }
}

// Store block c; for a partial last block, store only the valid bytes and zero the rest of L
// (so the caller may GHASH L as the zero-padded block).
GCMK_HD void store_text_block(u8* dst, u64 c, u64 len, u32 L[4]) {
    const u64 off = c * 16ull;
    if (off + 16ull <= len) {
#if defined(__CUDA_ARCH__)
        uint4 v;
        v.x = L[0];
        v.y = L[1];
        v.z = L[2];
        v.w = L[3];
        *reinterpret_cast<uint4*>(dst + off) = v;
#else
        for (int i = 0; i < 4; ++i) {
            store_le32(dst + off + 4 * i, L[i]);
        }
#endif
    } else {
        const u64 valid = len - off;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            u32 keep = 0u;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const u64 j = static_cast<u64>(4 * w + k);
                if (j < valid) {
                    dst[off + j] = static_cast<u8>(L[w] >> (8 * k));
                    keep |= 0xffu << (8 * k);
                }
            }
            L[w] &= keep;
        }
    }
}

// The fused pass of one thread over one tile: CTR-decrypt (or encrypt) its K blocks and return
// its GHASH share, sum_i C * H^(CT - (i*T + t)), reduced once (aggregated reduction).
// hp(i) must return H^(CT - (i*T + t)). The loop is not unrolled on purpose: one AES block in
// flight per thread keeps the kernel under 128 registers (2 CTAs of 256 threads per SM) without
// spills; the 16 independent table lookups of each round give the memory pipe enough to do.
GCMK_HD_TEMPLATE
template <int K, class Tab, class Powers>
GCMK_HD gf128 gcm_tile_thread(const GcmMessage& m, bool encrypt, u64 tile, u64 ntiles, u32 T,
                              u32 t, const u32* rk, const Tab& te, const Powers& hp) {
    const u64 ct = static_cast<u64>(K) * T;
    const u64 n = gcm_text_blocks(m.len);
    const u64 z = ntiles * ct - n;  // leading imaginary zero blocks
    gf256 acc;
    gf256_zero(acc);
#pragma unroll 1
    for (int i = 0; i < K; ++i) {
        const u64 p = tile * ct + static_cast<u64>(i) * T + t;
        if (p >= z) {
            const u64 c = p - z;
            u32 ctr[4], ks[4], in[4], out[4];
            gcm_counter_block(m.j0, c, ctr);
            aes256_encrypt(rk, ctr, ks, te);
            load_text_block(m.src, c, m.len, in);
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                out[w] = in[w] ^ ks[w];
            }
            // Stores only the valid bytes of a partial last block and zeroes the pad of `out`;
            // load_text_block already zero-padded `in`. Either is then the GHASH input block.
            store_text_block(m.dst, c, m.len, out);
            u32 g[4];  // the ciphertext block: selected word by word (a pointer select would
#pragma unroll      // put both arrays in local memory)
            for (int w = 0; w < 4; ++w) {
                g[w] = encrypt ? out[w] : in[w];
            }
            const gf128 x = gf_from_le_words(g);
            gf_mul_acc(x, hp(i), acc);
        }
    }
    return gf_reduce(acc);
}

// GHASH over arbitrary bytes (zero-padded to whole blocks), continuing from y.
GCMK_HD gf128 gcm_ghash_bytes(const u8* p, u64 len, gf128 y, const gf128& h) {
    const u64 blocks = gcm_text_blocks(len);
    for (u64 c = 0; c < blocks; ++c) {
        u32 L[4];
        load_text_block(p, c, len, L);
        y = gf_mul(gf_xor(y, gf_from_le_words(L)), h);
    }
    return y;
}

// J0 per SP 800-38D: IV || 0^31 || 1 for a 96-bit IV, else GHASH_H(IV || pad || [len(IV)]_64).
// (The sealed format only uses 96-bit IVs; the general case serves the self-test vectors.)
GCMK_HD void gcm_j0(const u8* iv, u64 iv_len, const gf128& h, u32 j0[4]) {
    if (iv_len == 12u) {
        u32 w[3];
        for (int i = 0; i < 3; ++i) {
            w[i] = load_le32(iv + 4 * i);
        }
        gcm_j0_from_iv96(w, j0);
        return;
    }
    gf128 y = gcm_ghash_bytes(iv, iv_len, gf_zero(), h);
    y = gf_mul(gf_xor(y, gf_length_block(0u, iv_len)), h);
    gf_to_le_words(y, j0);
}

// The exponent of H that thread t of a tile needs for its i-th block.
GCMK_HD u32 gcm_thread_power(u32 K, u32 T, u32 i, u32 t) { return K * T - (i * T + t); }

// Share of the tile combine for combine-thread t of FT: tiles at distance s = t + FT*j from the
// end, Horner with G^FT, then one multiply by G^t. partial(tau) returns tile tau's GHASH share,
// gpow(e) returns G^e for e = 0..FT.
GCMK_HD_TEMPLATE
template <class Partials, class GPowers>
GCMK_HD gf128 gcm_combine_thread(const Partials& partial, u64 ntiles, u32 FT, u32 t,
                                 const GPowers& gpow) {
    if (static_cast<u64>(t) >= ntiles) {
        return gf_zero();
    }
    const u64 count = (ntiles - 1ull - t) / FT + 1ull;
    gf128 acc = gf_zero();
    for (u64 j = count; j-- > 0ull;) {
        const u64 s = static_cast<u64>(t) + static_cast<u64>(FT) * j;
        acc = gf_xor(gf_mul(acc, gpow(FT)), partial(ntiles - 1ull - s));
    }
    return gf_mul(acc, gpow(t));
}

// GHASH of the AAD alone (blocks in natural order), Horner: ((A0*H ^ A1)*H ^ ...)*H.
GCMK_HD gf128 gcm_ghash_blocks(const gf128* blocks, u32 count, const gf128& h) {
    gf128 y = gf_zero();
    for (u32 a = 0; a < count; ++a) {
        y = gf_mul(gf_xor(y, blocks[a]), h);
    }
    return y;
}

// Tag = E(K, J0) ^ GHASH(A, C). gc: the text's GHASH share (XOR of all combine threads); ga:
// GHASH of the AAD alone; h, hn: H and H^n (n = text blocks); ekj0: E(K, J0) as little-endian
// words. Returns the tag as little-endian words.
GCMK_HD void gcm_tag_words(const gf128& gc, const gf128& ga, u64 aad_bytes, u64 len,
                           const gf128& h, const gf128& hn, const u32 ekj0[4], u32 tag[4]) {
    gf128 y = gf_xor(gf_xor(gf_mul(ga, hn), gc), gf_length_block(aad_bytes, len));
    y = gf_mul(y, h);
    u32 L[4];
    gf_to_le_words(y, L);
    for (int w = 0; w < 4; ++w) {
        tag[w] = L[w] ^ ekj0[w];
    }
}

// Constant-time tag comparison: OR-accumulate the XOR of all 16 bytes; 0 means equal.
GCMK_HD u32 tag_mismatch(const u32 computed[4], const u8* stored) {
    u32 diff = 0;
    for (int i = 0; i < 16; ++i) {
        diff |= ((computed[i >> 2] >> (8 * (i & 3))) & 0xffu) ^ static_cast<u32>(stored[i]);
    }
    return diff;
}

// ---------------------------------------------------------------------------------------------
// A launch over a batch of consecutive sealed-format chunks.
// ---------------------------------------------------------------------------------------------

struct Batch {
    const u8* in;       // decrypt: ct||tag records (stride chunk_size+16); encrypt: plaintext
    u8* out;            // decrypt: plaintext (stride chunk_size); encrypt: ct||tag records
    u64 first_chunk;    // dataset index of the batch's first chunk
    u64 total_chunks;   // chunks in the whole dataset (the last one is "final")
    u64 last_len;       // plaintext bytes of the dataset's final chunk
    u32 nchunks;        // chunks in this batch
    u32 chunk_size;     // plaintext bytes per full chunk (a multiple of 16)
    u32 id_prefix;      // dataset_id[0:4] as a little-endian word
    u32 encrypt;        // 1: seal, 0: open
    u32 tiles_full;     // tiles of a full chunk
    u32 tiles_last;     // tiles of the final chunk (used when the batch holds it)
};

GCMK_HD bool batch_has_final(const Batch& b) {
    return b.first_chunk + b.nchunks == b.total_chunks;
}

GCMK_HD u64 batch_items(const Batch& b) {
    const u64 full = b.nchunks - (batch_has_final(b) ? 1u : 0u);
    return full * b.tiles_full + (batch_has_final(b) ? b.tiles_last : 0u);
}

GCMK_HD u64 batch_chunk_len(const Batch& b, u32 local) {
    return (b.first_chunk + local + 1ull == b.total_chunks) ? b.last_len
                                                              : static_cast<u64>(b.chunk_size);
}

GCMK_HD u64 batch_chunk_tiles(const Batch& b, u32 local) {
    return (b.first_chunk + local + 1ull == b.total_chunks) ? b.tiles_last : b.tiles_full;
}

// Work item q -> (chunk, tile). Full chunks come first, the (shorter) final chunk last, so
// dividing by the full tile count is right for every item.
GCMK_HD void batch_item(const Batch& b, u64 q, u32* local, u64* tile) {
    u64 c = q / b.tiles_full;
    if (c > static_cast<u64>(b.nchunks) - 1ull) {
        c = static_cast<u64>(b.nchunks) - 1ull;
    }
    *local = static_cast<u32>(c);
    *tile = q - c * b.tiles_full;
}

GCMK_HD u64 record_stride(const Batch& b) { return static_cast<u64>(b.chunk_size) + 16ull; }

GCMK_HD GcmMessage batch_message(const Batch& b, u32 local) {
    GcmMessage m;
    const u64 rec = static_cast<u64>(local) * record_stride(b);
    const u64 txt = static_cast<u64>(local) * b.chunk_size;
    m.src = b.in + (b.encrypt ? txt : rec);
    m.dst = b.out + (b.encrypt ? rec : txt);
    u32 iv[3];
    format_chunk_iv(b.id_prefix, b.first_chunk + local, iv);
    gcm_j0_from_iv96(iv, m.j0);
    m.len = batch_chunk_len(b, local);
    return m;
}

// Where chunk `local`'s tag lives (after its ciphertext in the record).
GCMK_HD const u8* batch_tag_ptr(const Batch& b, u32 local) {
    const u8* rec = (b.encrypt ? static_cast<const u8*>(b.out) : b.in) +
                    static_cast<u64>(local) * record_stride(b);
    return rec + batch_chunk_len(b, local);
}

// Key context layout in device memory (32-bit words), built by gcm_setup for one key and CT.
constexpr u32 kCtxRoundKeys = 0;     // 60 words
constexpr u32 kCtxH = 60;            // H (natural order)
constexpr u32 kCtxHnFull = 64;       // H^(text blocks of a full chunk)
constexpr u32 kCtxHnLast = 68;       // H^(text blocks of the final chunk)
constexpr u32 kCtxHPow = 72;         // H^e at kCtxHPow + 4*(e-1), e = 1..CT
constexpr u32 kCombineThreads = 256; // FT: threads of the combine (finalize) CTA

GCMK_HD u32 ctx_gpow_offset(u32 ct) { return kCtxHPow + 4u * ct; }  // G^e, e = 0..FT
GCMK_HD u32 ctx_words(u32 ct) { return ctx_gpow_offset(ct) + 4u * (kCombineThreads + 1u); }


GCMK_HD gf128 ctx_load(const u32* ctx, u32 off) {
    gf128 r;
    r.w[0] = ctx[off];
    r.w[1] = ctx[off + 1];
    r.w[2] = ctx[off + 2];
    r.w[3] = ctx[off + 3];
    return r;
}

GCMK_HD void ctx_store(u32* ctx, u32 off, const gf128& v) {
    ctx[off] = v.w[0];
    ctx[off + 1] = v.w[1];
    ctx[off + 2] = v.w[2];
    ctx[off + 3] = v.w[3];
}

// Setup, part 1 (one thread): round keys and H = E(K, 0^128).
GCMK_HD_TEMPLATE
template <class Tab>
GCMK_HD void setup_key_schedule(const u8* key, u32* ctx, const Tab& te) {
    u32 kw[8];
    for (int i = 0; i < 8; ++i) {
        kw[i] = load_le32(key + 4 * i);
    }
    aes256_expand_key(kw, ctx + kCtxRoundKeys, te);
    const u32 zero[4] = {0u, 0u, 0u, 0u};
    u32 hb[4];
    aes256_encrypt(ctx + kCtxRoundKeys, zero, hb, te);
    ctx_store(ctx, kCtxH, gf_from_le_words(hb));
}

// Setup, part 2 (thread t of T, after part 1): the powers of H and of G = H^CT.
GCMK_HD void setup_powers(u32* ctx, u32 ct, u64 n_full, u64 n_last, u32 t, u32 T) {
    const gf128 h = ctx_load(ctx, kCtxH);
    for (u32 e = t + 1u; e <= ct; e += T) {
        ctx_store(ctx, kCtxHPow + 4u * (e - 1u), gf_pow(h, e));
    }
    const gf128 g = gf_pow(h, ct);
    for (u32 j = t; j <= kCombineThreads; j += T) {
        ctx_store(ctx, ctx_gpow_offset(ct) + 4u * j, gf_pow(g, j));
    }
    if (t == 0u) {
        ctx_store(ctx, kCtxHnFull, gf_pow(h, n_full));
    }
    if (t == (T > 1u ? 1u : 0u)) {
        ctx_store(ctx, kCtxHnLast, gf_pow(h, n_last));
    }
}

// Where thread t's i-th power lives in the key context.
GCMK_HD u32 ctx_thread_power_offset(u32 K, u32 T, u32 i, u32 t) {
    return kCtxHPow + 4u * (gcm_thread_power(K, T, i, t) - 1u);
}

// G^e from the key context (G = H^CT).
struct CtxGPowers {
    const u32* ctx;
    u32 ct;
    GCMK_HD gf128 operator()(u32 e) const { return ctx_load(ctx, ctx_gpow_offset(ct) + 4u * e); }
};

// Tile partials of chunk `local` of a batch: partials[(local * tiles_full + tau) * 4 ...].
struct BatchPartials {
    const u32* p;
    u64 base;
    GCMK_HD gf128 operator()(u64 tau) const {
        gf128 r;
        const u32* q = p + 4ull * (base + tau);
        r.w[0] = q[0];
        r.w[1] = q[1];
        r.w[2] = q[2];
        r.w[3] = q[3];
        return r;
    }
};

// Finalize one chunk (one thread): tag from the chunk's text GHASH share gc, then either write it
// (sealing) or compare it in constant time (opening). Returns 1 when an opened tag mismatches.
GCMK_HD_TEMPLATE
template <class Tab>
GCMK_HD u32 finalize_chunk(const Batch& b, u32 local, const gf128& gc, const u32* ctx,
                           const u8* digest, const Tab& te) {
    const GcmMessage m = batch_message(b, local);
    const u64 index = b.first_chunk + local;
    const u32 fin = (index + 1ull == b.total_chunks) ? 1u : 0u;
    const gf128 h = ctx_load(ctx, kCtxH);
    const gf128 hn = ctx_load(ctx, fin ? kCtxHnLast : kCtxHnFull);
    const gf128 ga = format_chunk_aad_ghash(digest, index, fin, h);
    u32 ekj0[4];
    aes256_encrypt(ctx + kCtxRoundKeys, m.j0, ekj0, te);
    u32 tag[4];
    gcm_tag_words(gc, ga, kFormatAadBytes, m.len, h, hn, ekj0, tag);
    if (b.encrypt) {
        u8* dst = const_cast<u8*>(batch_tag_ptr(b, local));
        for (int i = 0; i < 16; ++i) {
            dst[i] = static_cast<u8>(tag[i >> 2] >> (8 * (i & 3)));
        }
        return 0u;
    }
    return tag_mismatch(tag, batch_tag_ptr(b, local)) != 0u ? 1u : 0u;
}

// ---------------------------------------------------------------------------------------------
// A launch over a batch of independent messages (the gradient exchange of docs/DDP.md): every
// message has its own key (an index into an array of key contexts built by gcm_setup), its own
// 96-bit nonce and AAD, and its own place in the batch's input and output buffers. The nonce and
// AAD are computed by the host from the message schedule; nothing of them comes from the wire.
//
// Descriptor: kMsgWords 32-bit words per message, u64 fields as (low word, high word).
// ---------------------------------------------------------------------------------------------

constexpr u32 kMsgWords = 16;
constexpr u32 kMsgSrc = 0;      // u64: byte offset of the input text from the batch's src
constexpr u32 kMsgDst = 2;      // u64: byte offset of the output text from the batch's dst
constexpr u32 kMsgTag = 4;      // u64: byte offset of the tag, from dst (sealing) or src (opening)
constexpr u32 kMsgLen = 6;      // u64: text length in bytes
constexpr u32 kMsgItem = 8;     // u64: the message's first work item (tiles of earlier messages)
constexpr u32 kMsgKey = 10;     // index of the message's key context
constexpr u32 kMsgIv = 11;      // 3 words: the 12 nonce bytes as little-endian words
constexpr u32 kMsgAad = 14;     // byte offset of the message's AAD in the batch's AAD bytes
                                // (a multiple of 16: its full blocks are 16-byte vector loads)
constexpr u32 kMsgAadLen = 15;  // AAD length in bytes

struct MsgBatch {
    const u8* src;    // sealing: plaintexts; opening: ciphertexts (and their tags)
    u8* dst;          // sealing: ciphertexts and tags; opening: plaintexts
    const u32* desc;  // nmsgs descriptors
    const u8* aad;    // the AAD bytes of all messages
    u32 nmsgs;
    u32 encrypt;      // 1: seal, 0: open
    u32 ct;           // blocks per tile (K * T), as the key contexts were built for
};

GCMK_HD u64 msg_u64(const u32* d, u32 off) {
    return static_cast<u64>(d[off]) | (static_cast<u64>(d[off + 1u]) << 32);
}

GCMK_HD const u32* msg_desc(const MsgBatch& b, u32 m) { return b.desc + kMsgWords * m; }

GCMK_HD u64 msg_first_item(const MsgBatch& b, u32 m) { return msg_u64(msg_desc(b, m), kMsgItem); }

GCMK_HD u64 msg_tiles(const MsgBatch& b, u32 m) {
    return gcm_tiles(msg_u64(msg_desc(b, m), kMsgLen), b.ct);
}

// The message holding work item q: the last m with first_item(m) <= q (first items never
// decrease; a message without text has no items and shares its first item with the next one).
GCMK_HD u32 msg_of_item(const MsgBatch& b, u64 q) {
    u32 lo = 0u, hi = b.nmsgs;
    while (hi - lo > 1u) {
        const u32 mid = lo + ((hi - lo) >> 1);
        if (msg_first_item(b, mid) <= q) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

GCMK_HD GcmMessage msg_message(const MsgBatch& b, u32 m) {
    const u32* d = msg_desc(b, m);
    GcmMessage g;
    g.src = b.src + msg_u64(d, kMsgSrc);
    g.dst = b.dst + msg_u64(d, kMsgDst);
    const u32 iv[3] = {d[kMsgIv], d[kMsgIv + 1u], d[kMsgIv + 2u]};
    gcm_j0_from_iv96(iv, g.j0);
    g.len = msg_u64(d, kMsgLen);
    return g;
}

GCMK_HD const u8* msg_tag_ptr(const MsgBatch& b, u32 m) {
    const u64 off = msg_u64(msg_desc(b, m), kMsgTag);
    return b.encrypt ? static_cast<const u8*>(b.dst) + off : b.src + off;
}

// Finalize one message (one thread), as finalize_chunk does for a sealed-format chunk: the AAD is
// the message's own bytes and H^n is computed here (message lengths vary within a batch).
// ctx: the message's key context. Returns 1 when an opened tag mismatches.
GCMK_HD_TEMPLATE
template <class Tab>
GCMK_HD u32 finalize_message(const MsgBatch& b, u32 m, const gf128& gc, const u32* ctx,
                             const Tab& te) {
    const u32* d = msg_desc(b, m);
    const GcmMessage g = msg_message(b, m);
    const gf128 h = ctx_load(ctx, kCtxH);
    const gf128 hn = gf_pow(h, gcm_text_blocks(g.len));
    const u64 aad_len = d[kMsgAadLen];
    const gf128 ga = gcm_ghash_bytes(b.aad + d[kMsgAad], aad_len, gf_zero(), h);
    u32 ekj0[4];
    aes256_encrypt(ctx + kCtxRoundKeys, g.j0, ekj0, te);
    u32 tag[4];
    gcm_tag_words(gc, ga, aad_len, g.len, h, hn, ekj0, tag);
    if (b.encrypt) {
        u8* dst = const_cast<u8*>(msg_tag_ptr(b, m));
        for (int i = 0; i < 16; ++i) {
            dst[i] = static_cast<u8>(tag[i >> 2] >> (8 * (i & 3)));
        }
        return 0u;
    }
    return tag_mismatch(tag, msg_tag_ptr(b, m)) != 0u ? 1u : 0u;
}

}  // namespace gcmk

#endif  // GPUCC_AESGCM_MATH_CUH
