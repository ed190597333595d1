// hash_harness.cu -- host-side test driver for hash_math.cuh (no GPU needed).
//
// Build: nvcc -x cu -std=c++17 -O2 -o hash_harness hash_harness.cu   (a C++ compiler works too)
//
// Reads one command per line on stdin and answers one line per command on stdout. Byte strings
// are lowercase hex, "-" for empty; lists are comma-separated decimals. The launches are
// emulated with the same job functions the kernels run, in loops instead of threads.
// tests/test_hash_harness.py checks every answer against hashlib and the blake3 package.
//
//   sha256 DATA                       -> SHA-256 of DATA
//   shards OFFSETS LENGTHS BUFFER     -> SHA-256 of each shard of BUFFER (a sha256_shards launch)
//   b3chunk DATA INDEX ROOT           -> chaining value of one chunk (ROOT 0 or 1)
//   blake3 OFFSETS LENGTHS BUFFER     -> BLAKE3 of each input of BUFFER (a blake3_chunks launch
//                                        and one blake3_parents launch per tree level)
//
// Built with -DHASH_HARNESS_LIBRARY -shared instead, it exports the three kernels as host
// functions that loop over the grid (hh_sha256_shards, hh_blake3_chunks, hh_blake3_parents), so
// a stand-in for CuPy can run staging/model/digest_gpu.py's launches without a GPU.

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "hash_math.cuh"

using namespace hashk;

namespace {

bool from_hex(const std::string& s, std::vector<u8>& out) {
    out.clear();
    if (s == "-") {
        return true;
    }
    if (s.size() % 2 != 0) {
        return false;
    }
    out.reserve(s.size() / 2 + 16);
    for (size_t i = 0; i < s.size(); i += 2) {
        unsigned v = 0;
        if (std::sscanf(s.c_str() + i, "%2x", &v) != 1) {
            return false;
        }
        out.push_back(static_cast<u8>(v));
    }
    return true;
}

bool from_list(const std::string& s, std::vector<u64>& out) {
    out.clear();
    if (s == "-") {
        return true;
    }
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.empty()) {
            return false;
        }
        out.push_back(std::stoull(item));
    }
    return true;
}

std::string words_hex(const u32* w, bool big_endian) {
    std::string s;
    char buf[3];
    for (int i = 0; i < 8; ++i) {
        for (int b = 0; b < 4; ++b) {
            const int shift = big_endian ? 24 - 8 * b : 8 * b;
            std::snprintf(buf, sizeof buf, "%02x", (w[i] >> shift) & 0xffu);
            s += buf;
        }
    }
    return s;
}

// A 16-byte aligned copy of the buffer, so offsets decide the alignment the jobs see.
struct Aligned {
    std::vector<u64> store;
    const u8* data(const std::vector<u8>& src) {
        store.assign(src.size() / 8 + 2, 0);
        u8* p = reinterpret_cast<u8*>(store.data());
        p += (16 - (reinterpret_cast<u64>(p) & 15u)) & 15u;
        for (size_t i = 0; i < src.size(); ++i) {
            p[i] = src[i];
        }
        return p;
    }
};

bool in_bounds(const std::vector<u64>& off, const std::vector<u64>& len, size_t size) {
    if (off.size() != len.size()) {
        return false;
    }
    for (size_t i = 0; i < off.size(); ++i) {
        if (off[i] > size || len[i] > size - off[i]) {
            return false;
        }
    }
    return true;
}

std::string blake3_launch(const u8* base, const std::vector<u64>& off,
                          const std::vector<u64>& len) {
    const u32 n = static_cast<u32>(off.size());
    std::vector<u64> chunk_start(n);
    u64 total = 0;
    for (u32 f = 0; f < n; ++f) {
        chunk_start[f] = total;
        total += b3_chunks(len[f]);
    }
    std::vector<u32> cvs(8 * total);
    for (u64 j = 0; j < total; ++j) {
        blake3_chunk_job(base, off.data(), len.data(), chunk_start.data(), n, j, cvs.data());
    }
    // Per input: where its current values are and how many there are.
    std::vector<u64> at(chunk_start), count(n);
    for (u32 f = 0; f < n; ++f) {
        count[f] = b3_chunks(len[f]);
    }
    std::vector<u32> in(cvs);
    for (;;) {
        std::vector<u64> in_start, in_count, out_start;
        std::vector<u32> owner;
        u64 out_total = 0;
        for (u32 f = 0; f < n; ++f) {
            if (count[f] > 1) {
                owner.push_back(f);
                in_start.push_back(at[f]);
                in_count.push_back(count[f]);
                out_start.push_back(out_total);
                out_total += (count[f] + 1) / 2;
            }
        }
        if (owner.empty()) {
            break;
        }
        std::vector<u32> out(8 * out_total);
        for (u64 j = 0; j < out_total; ++j) {
            blake3_parent_job(in.data(), out.data(), in_start.data(), in_count.data(),
                              out_start.data(), static_cast<u32>(owner.size()), j);
        }
        // Inputs that are done keep their value: copy them along into the next level's array.
        std::vector<u32> next(out);
        for (u32 f = 0; f < n; ++f) {
            if (count[f] == 1) {
                const u64 k = next.size() / 8;
                next.insert(next.end(), in.begin() + 8 * at[f], in.begin() + 8 * at[f] + 8);
                at[f] = k;
            }
        }
        for (size_t i = 0; i < owner.size(); ++i) {
            at[owner[i]] = out_start[i];
            count[owner[i]] = (in_count[i] + 1) / 2;
        }
        in.swap(next);
    }
    std::string line;
    for (u32 f = 0; f < n; ++f) {
        line += (f ? "," : "") + words_hex(in.data() + 8 * at[f], false);
    }
    return line;
}

[[maybe_unused]] std::string run(const std::string& command) {
    std::stringstream in(command);
    std::string op;
    in >> op;
    Aligned aligned;
    if (op == "sha256") {
        std::string hex;
        std::vector<u8> data;
        if (!(in >> hex) || !from_hex(hex, data)) {
            return "error bad arguments";
        }
        u32 out[8];
        sha256_message(aligned.data(data), data.size(), out);
        return words_hex(out, true);
    }
    if (op == "shards" || op == "blake3") {
        std::string offs, lens, hex;
        std::vector<u64> off, len;
        std::vector<u8> data;
        if (!(in >> offs >> lens >> hex) || !from_list(offs, off) || !from_list(lens, len) ||
            !from_hex(hex, data) || !in_bounds(off, len, data.size())) {
            return "error bad arguments";
        }
        const u8* base = aligned.data(data);
        if (op == "blake3") {
            return blake3_launch(base, off, len);
        }
        std::vector<u32> out(8 * off.size());
        std::string line;
        for (u32 i = 0; i < off.size(); ++i) {
            sha256_shard_job(base, off.data(), len.data(), i, out.data());
            line += (i ? "," : "") + words_hex(out.data() + 8 * i, true);
        }
        return line;
    }
    if (op == "b3chunk") {
        std::string hex;
        u64 index = 0;
        int root = 0;
        std::vector<u8> data;
        if (!(in >> hex >> index >> root) || !from_hex(hex, data) || data.size() > B3_CHUNK_LEN) {
            return "error bad arguments";
        }
        u32 out[8];
        b3_chunk_cv(aligned.data(data), static_cast<u32>(data.size()), index, root != 0, out);
        return words_hex(out, false);
    }
    return "error unknown command";
}

}  // namespace

#if defined(HASH_HARNESS_LIBRARY)
extern "C" {
void hh_sha256_shards(const u8* base, const u64* offset, const u64* len, u32 count, u32* out) {
    for (u32 i = 0; i < count; ++i) {
        sha256_shard_job(base, offset, len, i, out);
    }
}
void hh_blake3_chunks(const u8* base, const u64* offset, const u64* len, const u64* chunk_start,
                      u32 nfiles, u64 total, u32* cvs) {
    for (u64 j = 0; j < total; ++j) {
        blake3_chunk_job(base, offset, len, chunk_start, nfiles, j, cvs);
    }
}
void hh_blake3_parents(const u32* in, u32* out, const u64* in_start, const u64* in_count,
                       const u64* out_start, u32 nlists, u64 total) {
    for (u64 j = 0; j < total; ++j) {
        blake3_parent_job(in, out, in_start, in_count, out_start, nlists, j);
    }
}
}
#else
int main() {
    std::ios::sync_with_stdio(false);
    std::string line;
    while (std::getline(std::cin, line)) {
        std::cout << run(line) << '\n';
    }
    return 0;
}
#endif
