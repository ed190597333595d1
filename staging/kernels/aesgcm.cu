// aesgcm.cu -- gpucc's AES-256-GCM kernels for sealed datasets (format v1, docs/FORMAT.md).
//
// Launched by staging/gpu.py (datasets) and staging/gpu_messages.py (message batches) through
// cupy.RawModule:
//
//   gcm_setup     one CTA per key: round keys, H, the powers of H and of G = H^CT, H^n.
//   gcm_chunks    the fused pass: AES-256-CTR and the GHASH shares of many chunks in one launch.
//                 A persistent grid walks the work items (chunk, tile) of a batch; each CTA
//                 builds its bank-replicated T-table once and reuses it for every item.
//   gcm_finalize  one CTA per chunk: combines the chunk's tile shares, computes the tag, writes it
//                 (sealing) or compares it in constant time (opening), writes a status word, and
//                 zeroes the plaintext of a chunk whose tag failed.
//   gcm_msgs, gcm_msgs_finalize
//                 the same two passes over a batch of independent messages, each with its own
//                 key context, nonce, AAD and buffers (the encrypted gradient exchange).
//
// The arithmetic and the work decomposition live in aesgcm_math.cuh, shared with the host
// harness (harness.cu) that CI runs without a GPU. See docs/GPU.md for the design.

#include "aesgcm_math.cuh"

using namespace gcmk;

#ifndef GCMK_K
#define GCMK_K 4  // blocks per thread per tile
#endif
#define GCMK_MAX_THREADS 256
#define GCMK_MAX_WARPS (GCMK_MAX_THREADS / 32)

// T-table replicated once per shared-memory bank: entry x of lane l lives at word 32*x + l, so
// lane l always reads the same bank, (table/4 + l) mod 32, whatever x is. A warp's 32 lookups
// hit 32 different banks whatever the indices: no bank conflicts, hence no data-dependent
// shared-memory timing.
//
// The lookup is addressed in the 32-bit shared window: the address of this lane's copy of
// entry 0 is computed once, and a lookup is one multiply-add (x * 128 + lane_addr, an IMAD on
// the FMA pipe) and one LDS. Combined with the one-instruction byte extracts of aes256_encrypt
// (PRMT, or IMAD.HI for the top byte) that is two instructions of address arithmetic per lookup,
// at most one of them on the ALU pipe. (Indexing the table through a generic pointer costs four:
// shift, scale, mask-and-merge the lane, add the window base; three of them on the ALU pipe.)
// (volatile: the compiler must not move a lookup across the barrier that publishes the table.)
// (GCMK_LDS_U32 is the one load a CPU execution of these sources must provide itself: PTX
// cannot run there. On the GPU it is exactly the inline PTX below.)
#ifndef GCMK_LDS_U32
#define GCMK_LDS_U32(v, addr) asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr))
#endif
struct BankTable {
    u32 lane_addr;  // shared-window address of this lane's copy of entry 0
    __device__ __forceinline__ u32 operator()(u32 x) const {
        u32 v;
        GCMK_LDS_U32(v, lane_addr + (x << 7));
        return v;
    }
};

__device__ __forceinline__ BankTable bank_table(const u32* tbl) {
    return BankTable{static_cast<u32>(__cvta_generic_to_shared(tbl)) + 4u * (threadIdx.x & 31u)};
}

// Thread t's powers of H, read from the key context through the read-only cache: for a given i
// the 32 lanes of a warp read 32 consecutive powers (one contiguous 512-byte run), the same ones
// for every tile, so after the first tile they come from L1.
struct CtxPowers {
    const u32* ctx;
    u32 T;
    u32 t;
    __device__ __forceinline__ gf128 operator()(int i) const {
        const u32 off = ctx_thread_power_offset(GCMK_K, T, static_cast<u32>(i), t);
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(ctx + off));
        gf128 r;
        r.w[0] = v.x;
        r.w[1] = v.y;
        r.w[2] = v.z;
        r.w[3] = v.w;
        return r;
    }
};

// The same, for a context at word offset `base` of an array of contexts (the array pointer stays
// a kernel parameter, so only the offset takes a register).
struct CtxPowersAt {
    const u32* ctxs;
    u32 base;
    u32 T;
    u32 t;
    __device__ __forceinline__ gf128 operator()(int i) const {
        const u32 off = base + ctx_thread_power_offset(GCMK_K, T, static_cast<u32>(i), t);
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(ctxs + off));
        gf128 r;
        r.w[0] = v.x;
        r.w[1] = v.y;
        r.w[2] = v.z;
        r.w[3] = v.w;
        return r;
    }
};

// A plain 256-entry table, for code where a single thread does the lookups (setup, tags): one
// active lane cannot conflict with itself.
struct PlainTable {
    const u32* t;
    __device__ __forceinline__ u32 operator()(u32 x) const { return t[x]; }
};

__device__ __forceinline__ void build_bank_table(u32* tbl) {
    const u32 lane = threadIdx.x & 31u;
    for (u32 x = threadIdx.x; x < 256u; x += blockDim.x) {
        const u32 v = aes_te0(x);
        // Each lane starts at its own bank so the warp's 32 stores never collide either.
        for (u32 l = 0; l < 32u; ++l) {
            tbl[(x << 5) | ((l + lane) & 31u)] = v;
        }
    }
}

__device__ __forceinline__ void build_plain_table(u32* tbl) {
    for (u32 x = threadIdx.x; x < 256u; x += blockDim.x) {
        tbl[x] = aes_te0(x);
    }
}

__device__ __forceinline__ gf128 warp_xor(gf128 v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            v.w[w] ^= __shfl_xor_sync(0xffffffffu, v.w[w], off);
        }
    }
    return v;
}

// XOR of v over the whole CTA, valid in warp 0 (all lanes) on return. red: [GCMK_MAX_WARPS][4].
__device__ __forceinline__ gf128 cta_xor(gf128 v, u32 (*red)[4]) {
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    v = warp_xor(v);
    if (lane == 0u) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            red[warp][w] = v.w[w];
        }
    }
    __syncthreads();
    gf128 r = gf_zero();
    if (warp == 0u) {
        if (lane < (blockDim.x >> 5)) {
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                r.w[w] = red[lane][w];
            }
        }
        r = warp_xor(r);
    }
    return r;
}

// Thread 0 stores the CTA's GHASH share of work item q (after the CTA reduction).
__device__ __forceinline__ void store_share(const gf128& share, u32 (*red)[4], u32* partials,
                                            u64 q) {
    const gf128 sum = cta_xor(share, red);
    if (threadIdx.x == 0u) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            partials[4ull * q + w] = sum.w[w];
        }
    }
}

// Leave no key material or GHASH shares in shared memory for later kernels to find.
// red_words: the double-buffered reduction scratch, 2 * GCMK_MAX_WARPS * 4 words.
__device__ __forceinline__ void scrub_shared(u32* rk, u32* red_words) {
    __syncthreads();
    for (u32 i = threadIdx.x; i < static_cast<u32>(kAesRoundKeyWords); i += blockDim.x) {
        rk[i] = 0u;
    }
    for (u32 i = threadIdx.x; i < 2u * GCMK_MAX_WARPS * 4u; i += blockDim.x) {
        red_words[i] = 0u;
    }
}

// The whole CTA zeroes len bytes at dst (16-byte aligned): a text whose tag failed.
__device__ __forceinline__ void cta_zero(u8* dst, u64 len) {
    const u64 vecs = len >> 4;
    uint4 zero;
    zero.x = zero.y = zero.z = zero.w = 0u;
    for (u64 v = threadIdx.x; v < vecs; v += blockDim.x) {
        reinterpret_cast<uint4*>(dst)[v] = zero;
    }
    for (u64 i = (vecs << 4) + threadIdx.x; i < len; i += blockDim.x) {
        dst[i] = 0u;
    }
}

// Thread 0 clears a finalize kernel's reduction scratch (GHASH shares).
__device__ __forceinline__ void clear_red(u32 (*red)[4]) {
    if (threadIdx.x == 0u) {
        for (int w = 0; w < GCMK_MAX_WARPS; ++w) {
            red[w][0] = red[w][1] = red[w][2] = red[w][3] = 0u;
        }
    }
}

__device__ __forceinline__ Batch make_batch(const u8* in, u8* out, u64 first_chunk,
                                            u64 total_chunks, u64 last_len, u32 nchunks,
                                            u32 chunk_size, u32 id_prefix, u32 encrypt,
                                            u32 tiles_full, u32 tiles_last) {
    Batch b;
    b.in = in;
    b.out = out;
    b.first_chunk = first_chunk;
    b.total_chunks = total_chunks;
    b.last_len = last_len;
    b.nchunks = nchunks;
    b.chunk_size = chunk_size;
    b.id_prefix = id_prefix;
    b.encrypt = encrypt;
    b.tiles_full = tiles_full;
    b.tiles_last = tiles_last;
    return b;
}

// ---------------------------------------------------------------------------------------------

// key: 32-byte chunk key (device memory; the caller zeroes it after this kernel).
// ctx: ctx_words(ct) words. Launch: 1 CTA of 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    gcm_setup(const u8* __restrict__ key, u32* __restrict__ ctx, u32 ct, u64 n_full, u64 n_last) {
    __shared__ u32 table[256];
    build_plain_table(table);
    __syncthreads();
    if (threadIdx.x == 0u) {
        const PlainTable te{table};
        setup_key_schedule(key, ctx, te);
    }
    __syncthreads();
    setup_powers(ctx, ct, n_full, n_last, threadIdx.x, blockDim.x);
}

// The fused CTR + GHASH pass over a batch. Launch: blockDim = T (a multiple of 32, <= 256) with
// GCMK_K * T == the ct given to gcm_setup; any grid size (the host uses a persistent grid of
// 4 CTAs per SM: 33 KB of shared memory and at most 64 registers per thread let 4 CTAs of 256
// threads share an SM). partials: one 16-byte share per work item.
extern "C" __global__ void __launch_bounds__(GCMK_MAX_THREADS, 4)
    gcm_chunks(const u8* __restrict__ in, u8* __restrict__ out, const u32* __restrict__ ctx,
               u32* __restrict__ partials, u64 first_chunk, u64 total_chunks, u64 last_len,
               u32 nchunks, u32 chunk_size, u32 id_prefix, u32 encrypt, u32 tiles_full,
               u32 tiles_last) {
    __shared__ u32 table[256 * 32];
    __shared__ u32 rk[kAesRoundKeyWords];
    __shared__ u32 red[2][GCMK_MAX_WARPS][4];

    const Batch b = make_batch(in, out, first_chunk, total_chunks, last_len, nchunks, chunk_size,
                               id_prefix, encrypt, tiles_full, tiles_last);
    const u32 T = blockDim.x, t = threadIdx.x;

    build_bank_table(table);
    for (u32 i = t; i < static_cast<u32>(kAesRoundKeyWords); i += T) {
        rk[i] = ctx[kCtxRoundKeys + i];
    }
    __syncthreads();
    const CtxPowers hp{ctx, T, t};

    const BankTable te = bank_table(table);
    const u64 items = batch_items(b);
    u32 parity = 0;
    for (u64 q = blockIdx.x; q < items; q += gridDim.x) {
        u32 local;
        u64 tile;
        batch_item(b, q, &local, &tile);
        const GcmMessage m = batch_message(b, local);
        const gf128 share = gcm_tile_thread<GCMK_K>(m, b.encrypt != 0u, tile,
                                                    batch_chunk_tiles(b, local), T, t, rk, te, hp);
        // Double-buffered reduction scratch: one barrier per item is enough.
        store_share(share, red[parity], partials, q);
        parity ^= 1u;
    }

    scrub_shared(rk, &red[0][0][0]);
}

// Tags and verdicts. Launch: one CTA per chunk of the batch, kCombineThreads (256) threads.
// digest: the 32-byte header digest (the AAD prefix). status: one word per chunk of the batch,
// 0 = authentic (or sealed), 1 = tag mismatch (that chunk's plaintext is zeroed here).
extern "C" __global__ void __launch_bounds__(kCombineThreads)
    gcm_finalize(const u8* __restrict__ in, u8* __restrict__ out, const u32* __restrict__ ctx,
                 const u32* __restrict__ partials, const u8* __restrict__ digest,
                 u32* __restrict__ status, u64 first_chunk, u64 total_chunks, u64 last_len,
                 u32 nchunks, u32 chunk_size, u32 id_prefix, u32 encrypt, u32 tiles_full,
                 u32 tiles_last, u32 ct) {
    __shared__ u32 table[256];
    __shared__ u32 red[GCMK_MAX_WARPS][4];
    __shared__ u32 failed;

    const Batch b = make_batch(in, out, first_chunk, total_chunks, last_len, nchunks, chunk_size,
                               id_prefix, encrypt, tiles_full, tiles_last);
    const u32 local = blockIdx.x;
    const u32 t = threadIdx.x;
    build_plain_table(table);

    const BatchPartials parts{partials, static_cast<u64>(local) * tiles_full};
    const CtxGPowers gpow{ctx, ct};
    const gf128 share =
        gcm_combine_thread(parts, batch_chunk_tiles(b, local), blockDim.x, t, gpow);
    const gf128 gc = cta_xor(share, red);  // includes the barrier that publishes `table`

    if (t == 0u) {
        const PlainTable te{table};
        const u32 bad = finalize_chunk(b, local, gc, ctx, digest, te);
        status[local] = bad;
        failed = bad;
    }
    __syncthreads();
    if (failed != 0u && encrypt == 0u) {
        // Never leave unverified plaintext behind: zero the whole chunk on the device.
        const GcmMessage m = batch_message(b, local);
        cta_zero(m.dst, m.len);
    }
    clear_red(red);
}

// ---------------------------------------------------------------------------------------------
// Message batches (gradient exchange): many messages under many keys in one launch pair.

__device__ __forceinline__ MsgBatch make_msg_batch(const u8* src, u8* dst, const u32* desc,
                                                   const u8* aad, u32 nmsgs, u32 encrypt,
                                                   u32 ct) {
    MsgBatch b;
    b.src = src;
    b.dst = dst;
    b.desc = desc;
    b.aad = aad;
    b.nmsgs = nmsgs;
    b.encrypt = encrypt;
    b.ct = ct;
    return b;
}

// The fused CTR + GHASH pass over a message batch: gcm_chunks' persistent grid, with the round
// keys reloaded into shared memory when a work item's key differs from the previous one (every
// thread of a CTA works on the same item, so the reload and its barrier are uniform).
// ctxs: one key context of ctx_words(K * blockDim.x) words per key, built by gcm_setup.
// items: the work items of the batch (the sum of the messages' tiles). Launch: blockDim = T
// (a multiple of 32, <= 256), any grid.
extern "C" __global__ void __launch_bounds__(GCMK_MAX_THREADS, 4)
    gcm_msgs(const u8* __restrict__ src, u8* __restrict__ dst, const u32* __restrict__ ctxs,
             u32* __restrict__ partials, const u32* __restrict__ desc, const u8* __restrict__ aad,
             u32 nmsgs, u64 items, u32 encrypt) {
    __shared__ u32 table[256 * 32];
    __shared__ u32 rk[kAesRoundKeyWords];
    __shared__ u32 red[2][GCMK_MAX_WARPS][4];
    __shared__ u32 msg;     // the current item's message
    __shared__ u32 loaded;  // the key whose round keys are in rk

    const u32 T = blockDim.x, t = threadIdx.x;
    const u32 ct = GCMK_K * T;
    const u32 words = ctx_words(ct);
    const MsgBatch b = make_msg_batch(src, dst, desc, aad, nmsgs, encrypt, ct);

    build_bank_table(table);
    if (t == 0u) {
        loaded = 0xffffffffu;
    }
    __syncthreads();
    const BankTable te = bank_table(table);
    u32 parity = 0;
    for (u64 q = blockIdx.x; q < items; q += gridDim.x) {
        // One thread finds the item's message; the barrier that publishes it also orders every
        // read of the previous item's round keys (and of `msg`) before the writes below.
        const u32 before = loaded;
        if (t == 0u) {
            msg = msg_of_item(b, q);
        }
        __syncthreads();
        const u32 m = msg;
        const u32 key = msg_desc(b, m)[kMsgKey];
        const u32 base = key * words;  // word offset of the key's context (host-checked < 2^32)
        if (key != before) {  // uniform: every thread of the CTA is on the same item
            for (u32 i = t; i < static_cast<u32>(kAesRoundKeyWords); i += T) {
                rk[i] = ctxs[base + kCtxRoundKeys + i];
            }
            if (t == 0u) {
                loaded = key;
            }
            __syncthreads();
        }
        const CtxPowersAt hp{ctxs, base, T, t};
        const GcmMessage g = msg_message(b, m);
        const u64 tile = q - msg_first_item(b, m);
        const gf128 share =
            gcm_tile_thread<GCMK_K>(g, b.encrypt != 0u, tile, msg_tiles(b, m), T, t, rk, te, hp);
        store_share(share, red[parity], partials, q);
        parity ^= 1u;
    }

    scrub_shared(rk, &red[0][0][0]);
}

// Tags and verdicts of a message batch. Launch: one CTA per message, kCombineThreads threads.
// ct: K * (the blockDim of gcm_msgs). status: one word per message, 0 = authentic (or sealed),
// 1 = tag mismatch (that message's output is zeroed here).
extern "C" __global__ void __launch_bounds__(kCombineThreads)
    gcm_msgs_finalize(const u8* __restrict__ src, u8* __restrict__ dst,
                      const u32* __restrict__ ctxs, const u32* __restrict__ partials,
                      const u32* __restrict__ desc, const u8* __restrict__ aad,
                      u32* __restrict__ status, u32 nmsgs, u32 encrypt, u32 ct) {
    __shared__ u32 table[256];
    __shared__ u32 red[GCMK_MAX_WARPS][4];
    __shared__ u32 failed;

    const MsgBatch b = make_msg_batch(src, dst, desc, aad, nmsgs, encrypt, ct);
    const u32 m = blockIdx.x;
    const u32 t = threadIdx.x;
    const u32* ctx = ctxs + static_cast<u64>(msg_desc(b, m)[kMsgKey]) * ctx_words(ct);
    build_plain_table(table);

    const BatchPartials parts{partials, msg_first_item(b, m)};
    const CtxGPowers gpow{ctx, ct};
    const gf128 share = gcm_combine_thread(parts, msg_tiles(b, m), blockDim.x, t, gpow);
    const gf128 gc = cta_xor(share, red);  // includes the barrier that publishes `table`

    if (t == 0u) {
        const PlainTable te{table};
        const u32 bad = finalize_message(b, m, gc, ctx, te);
        status[m] = bad;
        failed = bad;
    }
    __syncthreads();
    if (failed != 0u && encrypt == 0u) {
        const GcmMessage g = msg_message(b, m);
        cta_zero(g.dst, g.len);
    }
    clear_red(red);
}

// ---------------------------------------------------------------------------------------------

// Thread t's powers of H computed on demand (the self-test has no key context).
struct OnTheFlyPowers {
    gf128 h;
    u32 T;
    u32 t;
    __device__ __forceinline__ gf128 operator()(int i) const {
        return gf_pow(h, gcm_thread_power(GCMK_K, T, static_cast<u32>(i), t));
    }
};

struct OnTheFlyGPowers {
    gf128 g;
    __device__ __forceinline__ gf128 operator()(u32 e) const { return gf_pow(g, e); }
};

// One plain GCM message of any IV and AAD length through the same device code as the staging
// kernels (bank-replicated T-table, gcm_tile_thread, the CTA reductions, the tile combine).
// For known-answer self-tests and the test suite, not for throughput.
// Launch: 1 CTA of 64 threads. partials: gcm_tiles(len, GCMK_K * 64) * 4 words.
extern "C" __global__ void __launch_bounds__(64)
    gcm_selftest(const u8* __restrict__ key, const u8* __restrict__ iv, u64 iv_len,
                 const u8* __restrict__ aad, u64 aad_len, const u8* __restrict__ src,
                 u8* __restrict__ dst, u64 len, u32 encrypt, u32* __restrict__ partials,
                 u8* __restrict__ tag_out) {
    __shared__ u32 table[256 * 32];
    __shared__ u32 rk[kAesRoundKeyWords];
    __shared__ u32 red[2][GCMK_MAX_WARPS][4];
    __shared__ u32 hj[8];  // H (natural order), J0

    const u32 T = blockDim.x, t = threadIdx.x;
    build_bank_table(table);
    __syncthreads();
    const BankTable te = bank_table(table);
    if (t == 0u) {
        u32 kw[8];
        for (int i = 0; i < 8; ++i) {
            kw[i] = load_le32(key + 4 * i);
        }
        aes256_expand_key(kw, rk, te);
        const u32 zero[4] = {0u, 0u, 0u, 0u};
        u32 hb[4];
        aes256_encrypt(rk, zero, hb, te);
        const gf128 h = gf_from_le_words(hb);
        u32 j0[4];
        gcm_j0(iv, iv_len, h, j0);
        for (int w = 0; w < 4; ++w) {
            hj[w] = h.w[w];
            hj[4 + w] = j0[w];
        }
    }
    __syncthreads();
    gf128 h;
    GcmMessage m;
    for (int w = 0; w < 4; ++w) {
        h.w[w] = hj[w];
        m.j0[w] = hj[4 + w];
    }
    m.src = src;
    m.dst = dst;
    m.len = len;
    const u32 ct = GCMK_K * T;
    const u64 ntiles = gcm_tiles(len, ct);
    const OnTheFlyPowers hp{h, T, t};
    u32 parity = 0;
    for (u64 tau = 0; tau < ntiles; ++tau) {
        const gf128 share = gcm_tile_thread<GCMK_K>(m, encrypt != 0u, tau, ntiles, T, t, rk, te, hp);
        const gf128 sum = cta_xor(share, red[parity]);
        if (t == 0u) {
            for (int w = 0; w < 4; ++w) {
                partials[4ull * tau + w] = sum.w[w];
            }
        }
        parity ^= 1u;
    }
    __syncthreads();  // the tile shares in global memory are visible to the whole CTA
    const BatchPartials parts{partials, 0ull};
    const gf128 share = gcm_combine_thread(parts, ntiles, T, t, OnTheFlyGPowers{gf_pow(h, ct)});
    const gf128 gc = cta_xor(share, red[parity]);
    if (t == 0u) {
        const gf128 ga = gcm_ghash_bytes(aad, aad_len, gf_zero(), h);
        const gf128 hn = gf_pow(h, gcm_text_blocks(len));
        u32 ekj0[4], tag[4];
        aes256_encrypt(rk, m.j0, ekj0, te);
        gcm_tag_words(gc, ga, aad_len, len, h, hn, ekj0, tag);
        for (int i = 0; i < 16; ++i) {
            tag_out[i] = static_cast<u8>(tag[i >> 2] >> (8 * (i & 3)));
        }
    }
    scrub_shared(rk, &red[0][0][0]);  // its barrier orders every read of hj before this
    if (t < 8u) {
        hj[t] = 0u;
    }
}
