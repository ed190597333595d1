// harness.cu -- host-side test driver for aesgcm_math.cuh (no GPU needed).
//
// Build: nvcc -x cu -std=c++17 -O2 -o harness harness.cu   (a plain C++ compiler works too)
//
// Reads one command per line on stdin and answers one line per command on stdout. Byte strings
// are lowercase hex, "-" for empty. tests/test_kernel_harness.py drives it and checks every answer
// against the `cryptography` package and the GCM specification's test vectors.
//
//   layout                                      -> key-context and geometry constants
//   sbox                                        -> the 256 S-box bytes
//   clmul32 A B                                 -> 64-bit carry-less product (hex words in/out)
//   gfmul X Y                                   -> X*Y in GF(2^128), GCM byte order
//   gfpow X E                                   -> X^E (E decimal)
//   ctrblock J0 C                               -> counter block of data block C (inc32)
//   aes KEY BLOCK                               -> AES-256 encryption of one block
//   ref enc|dec KEY IV AAD TEXT                 -> TEXT' TAG: serial GCM (a plain oracle)
//   tiled enc|dec K T FT KEY IV AAD TEXT        -> TEXT' TAG: the kernel's tiled decomposition
//   batch enc|dec K T FT KEY PREFIX DIGEST CHUNK_SIZE TOTAL LAST_LEN FIRST NCHUNKS INPUT
//                                               -> OUTPUT STATUS,...: a whole emulated launch of
//                                                  gcm_setup + gcm_chunks + gcm_finalize
//   msgs enc|dec K T FT KEYS N (KEY IV AAD TEXT [TAG])...
//                                               -> per message OUTPUT TAG|STATUS, then stray=N:
//                                                  gcm_setup per key + gcm_msgs +
//                                                  gcm_msgs_finalize (stray: output bytes
//                                                  outside the messages that lost their poison)
//
// The emulation runs the same __host__ __device__ functions as the kernels, in loops instead of
// threads; the CTA and warp reductions are XORs, which the loops do directly.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "aesgcm_math.cuh"

using namespace gcmk;

namespace {

struct HostTable {
    const u32* t;
    u32 operator()(u32 x) const { return t[x]; }
};

std::vector<u32> make_table() {
    std::vector<u32> t(256);
    for (u32 x = 0; x < 256; ++x) {
        t[x] = aes_te0(x);
    }
    return t;
}

bool from_hex(const std::string& s, std::vector<u8>& out) {
    out.clear();
    if (s == "-") {
        return true;
    }
    if (s.size() % 2 != 0) {
        return false;
    }
    for (size_t i = 0; i < s.size(); i += 2) {
        const std::string byte = s.substr(i, 2);
        char* end = nullptr;
        const unsigned long v = std::strtoul(byte.c_str(), &end, 16);
        if (end != byte.c_str() + 2) {
            return false;
        }
        out.push_back(static_cast<u8>(v));
    }
    return true;
}

std::string to_hex(const u8* p, size_t n) {
    if (n == 0) {
        return "-";
    }
    static const char* digits = "0123456789abcdef";
    std::string s;
    s.reserve(2 * n);
    for (size_t i = 0; i < n; ++i) {
        s.push_back(digits[p[i] >> 4]);
        s.push_back(digits[p[i] & 15]);
    }
    return s;
}

std::string to_hex(const std::vector<u8>& v) { return to_hex(v.data(), v.size()); }

gf128 gf_from_hex16(const std::vector<u8>& b) { return gf_from_bytes(b.data()); }

std::string gf_to_hex(const gf128& x) {
    u32 L[4];
    gf_to_le_words(x, L);
    u8 b[16];
    for (int i = 0; i < 4; ++i) {
        store_le32(b + 4 * i, L[i]);
    }
    return to_hex(b, 16);
}

gf128 ghash_bytes(gf128 y, const gf128& h, const std::vector<u8>& data) {
    return gcm_ghash_bytes(data.data(), data.size(), y, h);
}

struct KeyState {
    u32 rk[kAesRoundKeyWords];
    gf128 h;
};

KeyState key_state(const std::vector<u8>& key, const HostTable& te) {
    KeyState ks;
    u32 kw[8];
    for (int i = 0; i < 8; ++i) {
        kw[i] = load_le32(key.data() + 4 * i);
    }
    aes256_expand_key(kw, ks.rk, te);
    const u32 zero[4] = {0, 0, 0, 0};
    u32 hb[4];
    aes256_encrypt(ks.rk, zero, hb, te);
    ks.h = gf_from_le_words(hb);
    return ks;
}

void derive_j0(const KeyState& ks, const std::vector<u8>& iv, u32 j0[4]) {
    gcm_j0(iv.data(), iv.size(), ks.h, j0);
}

void tag_bytes(const u32 tag[4], u8 out[16]) {
    for (int i = 0; i < 4; ++i) {
        store_le32(out + 4 * i, tag[i]);
    }
}

// Plain serial GCM: the oracle the tiled path is compared with (besides `cryptography`).
std::string cmd_ref(bool enc, const std::vector<u8>& key, const std::vector<u8>& iv,
                    const std::vector<u8>& aad, const std::vector<u8>& text, const HostTable& te) {
    const KeyState ks = key_state(key, te);
    u32 j0[4];
    derive_j0(ks, iv, j0);
    std::vector<u8> out(text.size());
    for (size_t c = 0; 16 * c < text.size(); ++c) {
        u32 ctr[4], k[4];
        gcm_counter_block(j0, c, ctr);
        aes256_encrypt(ks.rk, ctr, k, te);
        u8 kb[16];
        tag_bytes(k, kb);
        for (size_t i = 0; i < 16 && 16 * c + i < text.size(); ++i) {
            out[16 * c + i] = text[16 * c + i] ^ kb[i];
        }
    }
    const std::vector<u8>& ct = enc ? out : text;
    gf128 y = ghash_bytes(gf_zero(), ks.h, aad);
    y = ghash_bytes(y, ks.h, ct);
    y = gf_mul(gf_xor(y, gf_length_block(aad.size(), ct.size())), ks.h);
    u32 yl[4], ek[4], tag[4];
    gf_to_le_words(y, yl);
    aes256_encrypt(ks.rk, j0, ek, te);
    for (int i = 0; i < 4; ++i) {
        tag[i] = yl[i] ^ ek[i];
    }
    u8 tb[16];
    tag_bytes(tag, tb);
    return to_hex(out) + " " + to_hex(tb, 16);
}

// Thread t's powers, straight from a vector of H^1..H^CT.
struct VecPowers {
    const std::vector<gf128>* hpow;  // hpow[e-1] = H^e
    u32 K, T, t;
    gf128 operator()(int i) const {
        return (*hpow)[gcm_thread_power(K, T, static_cast<u32>(i), t) - 1];
    }
};

struct VecPartials {
    const std::vector<gf128>* p;
    gf128 operator()(u64 tau) const { return (*p)[tau]; }
};

struct VecGPowers {
    const std::vector<gf128>* g;
    gf128 operator()(u32 e) const { return (*g)[e]; }
};

template <int K>
std::string cmd_tiled_k(bool enc, u32 T, u32 FT, const std::vector<u8>& key,
                        const std::vector<u8>& iv, const std::vector<u8>& aad,
                        const std::vector<u8>& text, const HostTable& te) {
    const KeyState ks = key_state(key, te);
    const u32 ct = static_cast<u32>(K) * T;
    std::vector<gf128> hpow(ct);
    for (u32 e = 1; e <= ct; ++e) {
        hpow[e - 1] = gf_pow(ks.h, e);
    }
    const gf128 g = gf_pow(ks.h, ct);
    std::vector<gf128> gpow(FT + 1);
    for (u32 e = 0; e <= FT; ++e) {
        gpow[e] = gf_pow(g, e);
    }
    GcmMessage m;
    std::vector<u8> out(text.size());
    m.src = text.data();
    m.dst = out.data();
    m.len = text.size();
    derive_j0(ks, iv, m.j0);
    const u64 ntiles = gcm_tiles(m.len, ct);
    std::vector<gf128> partials(ntiles);
    for (u64 tau = 0; tau < ntiles; ++tau) {
        gf128 share = gf_zero();
        for (u32 t = 0; t < T; ++t) {
            const VecPowers hp{&hpow, static_cast<u32>(K), T, t};
            share = gf_xor(share, gcm_tile_thread<K>(m, enc, tau, ntiles, T, t, ks.rk, te, hp));
        }
        partials[tau] = share;
    }
    gf128 gc = gf_zero();
    for (u32 t = 0; t < FT; ++t) {
        gc = gf_xor(gc, gcm_combine_thread(VecPartials{&partials}, ntiles, FT, t,
                                           VecGPowers{&gpow}));
    }
    gf128 ga = ghash_bytes(gf_zero(), ks.h, aad);
    const gf128 hn = gf_pow(ks.h, gcm_text_blocks(m.len));
    u32 ek[4], tag[4];
    aes256_encrypt(ks.rk, m.j0, ek, te);
    gcm_tag_words(gc, ga, aad.size(), m.len, ks.h, hn, ek, tag);
    u8 tb[16];
    tag_bytes(tag, tb);
    return to_hex(out) + " " + to_hex(tb, 16);
}

// Thread t's powers of H, from a key context built by setup_powers (as CtxPowers on the GPU).
template <int K>
struct CtxHostPowers {
    const u32* ctx;
    u32 T, t;
    gf128 operator()(int i) const {
        return ctx_load(ctx, ctx_thread_power_offset(K, T, static_cast<u32>(i), t));
    }
};

template <int K>
std::string cmd_batch_k(bool enc, u32 T, u32 FT, const std::vector<u8>& key, u32 prefix,
                        const std::vector<u8>& digest, u32 chunk_size, u64 total, u64 last_len,
                        u64 first, u32 nchunks, const std::vector<u8>& input,
                        const HostTable& te) {
    const u32 ct = static_cast<u32>(K) * T;
    // gcm_setup: thread 0 makes the key schedule, then the CTA's threads share the powers
    // (emulated with 7 "threads" so the striding is exercised).
    std::vector<u32> ctx(ctx_words(ct));
    setup_key_schedule(key.data(), ctx.data(), te);
    const u32 setup_threads = 7;
    for (u32 t = 0; t < setup_threads; ++t) {
        setup_powers(ctx.data(), ct, gcm_text_blocks(chunk_size), gcm_text_blocks(last_len), t,
                     setup_threads);
    }
    // Output size: enc turns plaintext into ct||tag records, dec the reverse.
    u64 text_bytes = 0;
    for (u32 i = 0; i < nchunks; ++i) {
        text_bytes += (first + i + 1 == total) ? last_len : chunk_size;
    }
    const u64 recs = static_cast<u64>(nchunks) * 16ull;
    const u64 out_len = enc ? text_bytes + recs : text_bytes;
    const u64 in_len = enc ? text_bytes : text_bytes + recs;
    if (input.size() != in_len) {
        return "error input-length";
    }
    std::vector<u8> out(out_len, 0xa5);  // poisoned: the launch must overwrite every byte
    Batch b;
    b.in = input.data();
    b.out = out.data();
    b.first_chunk = first;
    b.total_chunks = total;
    b.last_len = last_len;
    b.nchunks = nchunks;
    b.chunk_size = chunk_size;
    b.id_prefix = prefix;
    b.encrypt = enc ? 1u : 0u;
    b.tiles_full = static_cast<u32>(gcm_tiles(chunk_size, ct));
    b.tiles_last = static_cast<u32>(gcm_tiles(last_len, ct));
    // gcm_chunks: every work item, every thread; the CTA reduction is the XOR.
    const u64 items = batch_items(b);
    std::vector<u32> partials(4 * items);
    for (u64 q = 0; q < items; ++q) {
        u32 local;
        u64 tile;
        batch_item(b, q, &local, &tile);
        const GcmMessage m = batch_message(b, local);
        gf128 share = gf_zero();
        for (u32 t = 0; t < T; ++t) {
            const CtxHostPowers<K> hp{ctx.data(), T, t};
            share = gf_xor(share, gcm_tile_thread<K>(m, enc, tile, batch_chunk_tiles(b, local), T,
                                                     t, ctx.data() + kCtxRoundKeys, te, hp));
        }
        for (int w = 0; w < 4; ++w) {
            partials[4 * q + w] = share.w[w];
        }
    }
    // gcm_finalize: per chunk, FT combine threads, then the tag and the verdict.
    std::string status;
    for (u32 local = 0; local < nchunks; ++local) {
        const BatchPartials parts{partials.data(), static_cast<u64>(local) * b.tiles_full};
        gf128 gc = gf_zero();
        for (u32 t = 0; t < FT; ++t) {
            gc = gf_xor(gc, gcm_combine_thread(parts, batch_chunk_tiles(b, local), FT, t,
                                               CtxGPowers{ctx.data(), ct}));
        }
        const u32 bad = finalize_chunk(b, local, gc, ctx.data(), digest.data(), te);
        if (bad != 0u && !enc) {
            const GcmMessage m = batch_message(b, local);
            std::memset(m.dst, 0, m.len);
        }
        status += (local ? "," : "") + std::to_string(bad);
    }
    return to_hex(out) + " " + status;
}

// One message of a "msgs" command: key index, nonce, AAD, text, and the tag when opening.
struct HostMsg {
    u32 key;
    std::vector<u8> iv, aad, text, tag;
};

// A whole emulated launch of gcm_setup (per key) + gcm_msgs + gcm_msgs_finalize. The messages'
// texts go into one input buffer at 16-byte aligned offsets with a gap before each (their tags
// after them when opening), the outputs into one poisoned output buffer laid out the same way.
// The work items are visited last to first, as a persistent grid may.
template <int K>
std::string cmd_msgs_k(bool enc, u32 T, u32 FT, const std::vector<std::vector<u8>>& keys,
                       const std::vector<HostMsg>& msgs, const HostTable& te) {
    const u32 ct = static_cast<u32>(K) * T;
    const u32 words = ctx_words(ct);
    std::vector<u32> ctxs(words * keys.size());
    for (size_t k = 0; k < keys.size(); ++k) {
        u32* ctx = ctxs.data() + words * k;
        setup_key_schedule(keys[k].data(), ctx, te);
        for (u32 t = 0; t < 5; ++t) {
            setup_powers(ctx, ct, 0, 0, t, 5);
        }
    }
    const u32 n = static_cast<u32>(msgs.size());
    std::vector<u32> desc(kMsgWords * n);
    std::vector<u8> aad;
    u64 in_at = 0, out_at = 0, item = 0;
    auto put64 = [&](u32 m, u32 off, u64 v) {
        desc[kMsgWords * m + off] = static_cast<u32>(v);
        desc[kMsgWords * m + off + 1] = static_cast<u32>(v >> 32);
    };
    auto align16 = [](u64 v) { return (v + 15ull) & ~15ull; };
    for (u32 m = 0; m < n; ++m) {
        const HostMsg& h = msgs[m];
        const u64 len = h.text.size();
        in_at = align16(in_at) + 16ull * (m % 3);  // gaps of 0, 16, 32 bytes
        out_at = align16(out_at) + 16ull * ((m + 1) % 3);
        put64(m, kMsgSrc, in_at);
        put64(m, kMsgDst, out_at);
        put64(m, kMsgTag, (enc ? out_at : in_at) + len);
        put64(m, kMsgLen, len);
        put64(m, kMsgItem, item);
        desc[kMsgWords * m + kMsgKey] = h.key;
        for (int w = 0; w < 3; ++w) {
            desc[kMsgWords * m + kMsgIv + w] = load_le32(h.iv.data() + 4 * w);
        }
        desc[kMsgWords * m + kMsgAad] = static_cast<u32>(aad.size());
        desc[kMsgWords * m + kMsgAadLen] = static_cast<u32>(h.aad.size());
        aad.insert(aad.end(), h.aad.begin(), h.aad.end());
        // Each AAD starts 16-byte aligned (the device reads its blocks as vectors), with
        // bytes between AADs that no message may read.
        aad.resize(align16(aad.size()) + 16ull * (m % 2));
        in_at += len + (enc ? 0 : 16);
        out_at += len + (enc ? 16 : 0);
        item += gcm_tiles(len, ct);
    }
    std::vector<u8> in(in_at + 1, 0x5c), out(out_at + 1, 0xa5);
    for (u32 m = 0; m < n; ++m) {
        const u64 at = msg_u64(desc.data() + kMsgWords * m, kMsgSrc);
        std::memcpy(in.data() + at, msgs[m].text.data(), msgs[m].text.size());
        if (!enc) {
            std::memcpy(in.data() + at + msgs[m].text.size(), msgs[m].tag.data(), 16);
        }
    }
    aad.push_back(0);  // never an empty vector
    MsgBatch b;
    b.src = in.data();
    b.dst = out.data();
    b.desc = desc.data();
    b.aad = aad.data();
    b.nmsgs = n;
    b.encrypt = enc ? 1u : 0u;
    b.ct = ct;
    std::vector<u32> partials(4 * (item + 1));
    for (u64 q = item; q-- > 0;) {
        const u32 m = msg_of_item(b, q);
        const u32* ctx = ctxs.data() + words * msg_desc(b, m)[kMsgKey];
        const GcmMessage g = msg_message(b, m);
        gf128 share = gf_zero();
        for (u32 t = 0; t < T; ++t) {
            const CtxHostPowers<K> hp{ctx, T, t};
            share = gf_xor(share, gcm_tile_thread<K>(g, enc, q - msg_first_item(b, m),
                                                     msg_tiles(b, m), T, t, ctx + kCtxRoundKeys,
                                                     te, hp));
        }
        for (int w = 0; w < 4; ++w) {
            partials[4 * q + w] = share.w[w];
        }
    }
    std::string result;
    for (u32 m = 0; m < n; ++m) {
        const u32* ctx = ctxs.data() + words * msg_desc(b, m)[kMsgKey];
        const BatchPartials parts{partials.data(), msg_first_item(b, m)};
        gf128 gc = gf_zero();
        for (u32 t = 0; t < FT; ++t) {
            gc = gf_xor(gc, gcm_combine_thread(parts, msg_tiles(b, m), FT, t,
                                               CtxGPowers{ctx, ct}));
        }
        const u32 bad = finalize_message(b, m, gc, ctx, te);
        const GcmMessage g = msg_message(b, m);
        if (bad != 0u && !enc) {
            std::memset(g.dst, 0, g.len);
        }
        result += (m ? " " : "") + to_hex(g.dst, g.len) + " ";
        result += enc ? to_hex(msg_tag_ptr(b, m), 16) : std::to_string(bad);
    }
    // Every output byte outside the messages' texts (and tags) keeps its poison.
    std::vector<u8> mine(out.size(), 0);
    for (u32 m = 0; m < n; ++m) {
        const u32* d = msg_desc(b, m);
        const u64 len = msg_u64(d, kMsgLen);
        std::memset(mine.data() + msg_u64(d, kMsgDst), 1, len);
        if (enc) {
            std::memset(mine.data() + msg_u64(d, kMsgTag), 1, 16);
        }
    }
    size_t stray = 0;
    for (size_t i = 0; i < out.size(); ++i) {
        stray += (mine[i] == 0 && out[i] != 0xa5) ? 1 : 0;
    }
    return result + " stray=" + std::to_string(stray);
}

u32 parse_u32(const std::string& s) { return static_cast<u32>(std::stoul(s, nullptr, 0)); }
u64 parse_u64(const std::string& s) { return static_cast<u64>(std::stoull(s, nullptr, 0)); }

std::string run(const std::vector<std::string>& a, const HostTable& te) {
    const std::string& cmd = a[0];
    std::vector<u8> x, y, z, w;
    if (cmd == "layout" && a.size() == 1) {
        return "ctx_hpow=" + std::to_string(kCtxHPow) + " combine_threads=" +
               std::to_string(kCombineThreads) + " ctx_words_1024=" +
               std::to_string(ctx_words(1024)) + " aad_bytes=" + std::to_string(kFormatAadBytes) +
               " msg_words=" + std::to_string(kMsgWords);
    }
    if (cmd == "sbox" && a.size() == 1) {
        u8 s[256];
        for (u32 i = 0; i < 256; ++i) {
            s[i] = static_cast<u8>(aes_sbox(i));
        }
        return to_hex(s, 256);
    }
    if (cmd == "clmul32" && a.size() == 3) {
        const u64 r = clmul32(parse_u32(a[1]), parse_u32(a[2]));
        char buf[32];
        std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
        return buf;
    }
    if (cmd == "gfmul" && a.size() == 3 && from_hex(a[1], x) && from_hex(a[2], y) &&
        x.size() == 16 && y.size() == 16) {
        return gf_to_hex(gf_mul(gf_from_hex16(x), gf_from_hex16(y)));
    }
    if (cmd == "gfpow" && a.size() == 3 && from_hex(a[1], x) && x.size() == 16) {
        return gf_to_hex(gf_pow(gf_from_hex16(x), parse_u64(a[2])));
    }
    if (cmd == "ctrblock" && a.size() == 3 && from_hex(a[1], x) && x.size() == 16) {
        u32 j0[4], out[4];
        for (int i = 0; i < 4; ++i) {
            j0[i] = load_le32(x.data() + 4 * i);
        }
        gcm_counter_block(j0, parse_u64(a[2]), out);
        u8 ob[16];
        tag_bytes(out, ob);
        return to_hex(ob, 16);
    }
    if (cmd == "aes" && a.size() == 3 && from_hex(a[1], x) && from_hex(a[2], y) &&
        x.size() == 32 && y.size() == 16) {
        const KeyState ks = key_state(x, te);
        u32 in[4], out[4];
        for (int i = 0; i < 4; ++i) {
            in[i] = load_le32(y.data() + 4 * i);
        }
        aes256_encrypt(ks.rk, in, out, te);
        u8 ob[16];
        tag_bytes(out, ob);
        return to_hex(ob, 16);
    }
    if (cmd == "ref" && a.size() == 6 && from_hex(a[2], x) && from_hex(a[3], y) &&
        from_hex(a[4], z) && from_hex(a[5], w) && x.size() == 32 && !y.empty()) {
        return cmd_ref(a[1] == "enc", x, y, z, w, te);
    }
    if (cmd == "tiled" && a.size() == 9 && from_hex(a[5], x) && from_hex(a[6], y) &&
        from_hex(a[7], z) && from_hex(a[8], w) && x.size() == 32 && !y.empty()) {
        const bool enc = a[1] == "enc";
        const u32 K = parse_u32(a[2]), T = parse_u32(a[3]), FT = parse_u32(a[4]);
        if (T == 0 || FT == 0 || FT > kCombineThreads) {
            return "error geometry";
        }
        switch (K) {
            case 1: return cmd_tiled_k<1>(enc, T, FT, x, y, z, w, te);
            case 2: return cmd_tiled_k<2>(enc, T, FT, x, y, z, w, te);
            case 4: return cmd_tiled_k<4>(enc, T, FT, x, y, z, w, te);
            case 8: return cmd_tiled_k<8>(enc, T, FT, x, y, z, w, te);
            default: return "error K";
        }
    }
    if (cmd == "batch" && a.size() == 14 && from_hex(a[5], x) && from_hex(a[7], y) &&
        from_hex(a[13], z) && x.size() == 32 && y.size() == 32) {
        const bool enc = a[1] == "enc";
        const u32 K = parse_u32(a[2]), T = parse_u32(a[3]), FT = parse_u32(a[4]);
        const u32 prefix = parse_u32(a[6]);
        const u32 chunk_size = parse_u32(a[8]);
        const u64 total = parse_u64(a[9]), last_len = parse_u64(a[10]), first = parse_u64(a[11]);
        const u32 nchunks = parse_u32(a[12]);
        if (T == 0 || FT == 0 || FT > kCombineThreads || chunk_size == 0 ||
            chunk_size % 16 != 0 || nchunks == 0 || first + nchunks > total ||
            last_len > chunk_size) {
            return "error geometry";
        }
        switch (K) {
            case 1: return cmd_batch_k<1>(enc, T, FT, x, prefix, y, chunk_size, total, last_len,
                                          first, nchunks, z, te);
            case 4: return cmd_batch_k<4>(enc, T, FT, x, prefix, y, chunk_size, total, last_len,
                                          first, nchunks, z, te);
            default: return "error K";
        }
    }
    if (cmd == "msgs" && a.size() >= 7) {
        // msgs enc|dec K T FT KEYS(hex, 32 bytes each) N then, per message:
        //   KEY_INDEX IV AAD TEXT (and TAG when opening)
        const bool enc = a[1] == "enc";
        const u32 K = parse_u32(a[2]), T = parse_u32(a[3]), FT = parse_u32(a[4]);
        if (!from_hex(a[5], x) || x.empty() || x.size() % 32 != 0) {
            return "error keys";
        }
        std::vector<std::vector<u8>> keys;
        for (size_t k = 0; k < x.size(); k += 32) {
            keys.emplace_back(x.begin() + k, x.begin() + k + 32);
        }
        const u32 n = parse_u32(a[6]);
        const size_t per = enc ? 4 : 5;
        if (n == 0 || a.size() != 7 + per * n || T == 0 || FT == 0 || FT > kCombineThreads) {
            return "error geometry";
        }
        std::vector<HostMsg> msgs(n);
        for (u32 m = 0; m < n; ++m) {
            const size_t at = 7 + per * m;
            HostMsg& h = msgs[m];
            h.key = parse_u32(a[at]);
            if (h.key >= keys.size() || !from_hex(a[at + 1], h.iv) || h.iv.size() != 12 ||
                !from_hex(a[at + 2], h.aad) || !from_hex(a[at + 3], h.text) ||
                (!enc && (!from_hex(a[at + 4], h.tag) || h.tag.size() != 16))) {
                return "error message";
            }
        }
        switch (K) {
            case 1: return cmd_msgs_k<1>(enc, T, FT, keys, msgs, te);
            case 4: return cmd_msgs_k<4>(enc, T, FT, keys, msgs, te);
            default: return "error K";
        }
    }
    return "error usage";
}

}  // namespace

int main() {
    // The harness assumes a little-endian host, as the GPU is.
    const u32 probe = 1;
    u8 first_byte;
    std::memcpy(&first_byte, &probe, 1);
    if (first_byte != 1) {
        std::fprintf(stderr, "harness: big-endian host not supported\n");
        return 2;
    }
    const std::vector<u32> table = make_table();
    const HostTable te{table.data()};
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream ss(line);
        std::vector<std::string> args;
        std::string tok;
        while (ss >> tok) {
            args.push_back(tok);
        }
        if (args.empty()) {
            continue;
        }
        std::cout << run(args, te) << '\n' << std::flush;
    }
    return 0;
}
