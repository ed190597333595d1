// cudacpu.h -- run gpucc's CUDA sources on the CPU, for the test suite (no GPU, no driver).
//
// Force-included (g++ -include) in front of the exact source text the runtime hands NVRTC,
// compiled with __CUDA_ARCH__ defined, so the device branches of the __host__ __device__ code
// are the ones built. It provides the CUDA built-ins that source uses:
//
// * threadIdx, blockIdx, blockDim, gridDim: the state of the thread (fiber) running now.
// * __shared__: a static in the cudacpu_shm section. Blocks run one after another, so one copy
//   serves every block; it is filled with random bytes before each block, so a read of shared
//   memory nobody wrote gives a wrong answer rather than yesterday's value.
// * __syncthreads: a real barrier over the block's threads. Threads that reach different
//   barriers, or a barrier some threads of the block have exited past, are an error.
// * __shfl_xor_sync: an exchange among a warp's 32 lanes; the mask must name every lane and
//   every lane must be at the same shuffle.
// * __ldg and vector accesses: a load at an address that is not a multiple of its size is an
//   error (a misaligned-address fault on a GPU).
// * __byte_perm, __funnelshift_l, __brev, __umulhi, __cvta_generic_to_shared, and the kernels'
//   one inline PTX load (GCMK_LDS_U32), by their PTX definitions.
//
// Each block's threads run as fibers (ucontext) on the calling OS thread. The scheduler runs one
// warp at a time as far as CUDA lets it run ahead of the others (to its next barrier, its lanes
// to their next shuffle), in a seeded random warp order per barrier interval, so shared memory
// reused without a barrier is overwritten before a slower warp reads it.
//
// Race detection (CUDACPU_RACECHECK builds, compiled with -fsanitize=thread but linked without
// its runtime: the instrumentation calls the __tsan_* hooks below): every access to shared
// memory is recorded per 32-bit word; a write and another thread's access of the same word in
// the same barrier interval is an error, as compute-sanitizer's racecheck reports it. Every other
// access must fall in the thread's own stack, this library's data or one of the allocations the
// launch's pointer arguments point into (compute-sanitizer's memcheck).
//
// ThreadSanitizer builds (CUDACPU_THREADS, linked with its runtime): every thread of a block is
// an OS thread instead, a lane runs holding its warp's lock, and barriers and shuffles are
// mutex and condition-variable hand-offs, so ThreadSanitizer itself reports unordered accesses
// between warps. A fault found there aborts the process (OS threads cannot be abandoned).
//
// Observers (Config::after_block, Config::trace; the test suite's view of what no output shows):
// shared memory as each block left it, with the poison it started from, and per thread a hash
// of every access the instrumented build sees (region, offset or bank, size, direction), so a
// test can assert that nothing secret survives a block and that no address depends on secrets.
//
// Errors stop the launch: cudacpu_launch_* returns nonzero with the first error's text.

#ifndef GPUCC_CUDACPU_H
#define GPUCC_CUDACPU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define CUDACPU_NOSAN __attribute__((no_sanitize_thread, noinline))

struct uint3 {
    unsigned int x, y, z;
};
typedef uint3 dim3;
struct __attribute__((aligned(16))) uint4 {
    unsigned int x, y, z, w;
};

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __constant__
#define __shared__ static __attribute__((section("cudacpu_shm")))

namespace cudacpu {

enum State { kRunnable, kAtShfl, kAtBarrier, kDone };

// Fiber contexts: ucontext under AddressSanitizer (which follows swapcontext) and on other
// machines; on x86-64 a plain switch of the callee-saved registers and the stack pointer
// (swapcontext makes two signal-mask system calls per switch, and a block's warp shuffles
// switch thousands of times).
#if defined(__SANITIZE_ADDRESS__) || !defined(__x86_64__)
struct Context {
    ucontext_t uc;
};
inline void ctx_switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
inline void ctx_make(Context* c, char* stack, size_t size, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
#else
struct Context {
    void* sp;
};
extern "C" void cudacpu_switch(void** save, void* to);
asm(R"(
    .text
    .p2align 4
    .type cudacpu_switch,@function
cudacpu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudacpu_switch, .-cudacpu_switch
)");
inline void ctx_switch(Context* from, Context* to) { cudacpu_switch(&from->sp, to->sp); }
inline void ctx_make(Context* c, char* stack, size_t size, void (*entry)()) {
    uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~static_cast<uintptr_t>(15);
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;                            // the entry's return address: it never returns
    *--sp = reinterpret_cast<void*>(entry);     // where the first switch "returns" to
    for (int i = 0; i < 6; ++i) {
        *--sp = nullptr;                        // rbp, rbx, r12-r15
    }
    c->sp = sp;
}
#endif

struct Thread {
    uint3 idx;
    Context ctx;
    State state;
    const void* site;  // the barrier or shuffle it waits at
    unsigned shfl_mask, shfl_value, shfl_lane_mask, shfl_out;
    unsigned id;  // linear thread index in the block
};

struct Config {  // filled by the Python side; must match tests/support/cudacpu/backend.py
    unsigned grid[3];
    unsigned block[3];
    unsigned long long seed;
    unsigned racecheck;
    unsigned nbuffers;                  // device buffers the kernel may touch: [lo, hi)
    unsigned long long buffers[64][2];  // (the whole allocations its pointer arguments are in)
    char error[512];
    // Observers (the test suite's; null when unused):
    // after_block(shared memory, the same before the block ran (the poison), their size,
    // linear block index): called when every thread of a block has exited, before anything
    // else touches shared memory (what a later block or kernel on the same SM could read).
    void (*after_block)(const char*, const char*, unsigned long long, unsigned);
    // trace[thread]: a running hash, per linear thread index of the block (over all blocks, in
    // block order), of every memory access the instrumented ("check") build sees: the region
    // (launch buffer i, this thread's stack, shared memory, ...), the offset in it, the size and
    // the direction. Shared-memory accesses contribute their bank when trace_banks is set and
    // no address at all otherwise.
    unsigned long long* trace;
    unsigned trace_banks;
};

struct Range {
    uintptr_t lo, hi;
};

struct Launch {
    Config* cfg;
    void (*body)(void*);
    void* arg;
    Thread* threads;
    unsigned nthreads;
    char* stacks;
    size_t stack_size;
    Context sched;
    unsigned long long rng;
    unsigned phase;  // barrier intervals so far (all blocks): the race detector's clock
    int failed;
    char* poison;    // shared memory as poisoned before the current block (after_block only)
    Range own[16];   // this library's loaded segments (its globals, __constant__ data)
    unsigned nown;
};

#ifdef CUDACPU_THREADS
inline thread_local Thread* current = nullptr;
#else
inline Thread* current = nullptr;  // one launch at a time per process (checked)
#endif
inline Launch* launch = nullptr;
inline uint3 block_idx, block_dim, grid_dim;

extern "C" char __start_cudacpu_shm[];
extern "C" char __stop_cudacpu_shm[];
// Makes sure the section exists even in sources without shared memory.
static char shm_anchor[16] __attribute__((section("cudacpu_shm"), used));

CUDACPU_NOSAN inline void fail(const char* fmt, unsigned a = 0, unsigned b = 0, unsigned c = 0) {
    Launch* l = launch;
    if (l != nullptr && !l->failed) {
        l->failed = 1;
        snprintf(l->cfg->error, sizeof l->cfg->error, fmt, a, b, c);
        if (current != nullptr) {
            char where[96];
            snprintf(where, sizeof where, " (block %u, thread %u)", block_idx.x, current->idx.x);
            strncat(l->cfg->error, where, sizeof l->cfg->error - strlen(l->cfg->error) - 1);
        }
    }
#ifdef CUDACPU_THREADS
    if (current != nullptr) {  // OS threads cannot be abandoned mid-launch: stop here
        fprintf(stderr, "cudacpu: %s\n", l != nullptr ? l->cfg->error : fmt);
        abort();
    }
#else
    if (current != nullptr) {  // never resumed: the launch is abandoned
        Thread* self = current;
        self->state = kDone;
        ctx_switch(&self->ctx, &l->sched);
    }
#endif
}

CUDACPU_NOSAN inline unsigned long long next_random() {
    unsigned long long x = launch->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    launch->rng = x;
    return x;
}

// --- memory checks (the instrumented build) ----------------------------------------------------

CUDACPU_NOSAN inline bool inside(uintptr_t a, size_t size, uintptr_t lo, uintptr_t hi) {
    return a >= lo && a + size <= hi;
}

// An access outside shared memory must hit the thread's own stack (its local variables), one of
// the launch's device buffers, or this library's own data: anything else is what
// compute-sanitizer's memcheck reports as an out-of-bounds global access.
CUDACPU_NOSAN inline void check_global(uintptr_t a, size_t size) {
    Launch* l = launch;
    // Only this thread's own stack and state: locals are private on a GPU too.
    const uintptr_t stack = reinterpret_cast<uintptr_t>(l->stacks) + l->stack_size * current->id;
    if (inside(a, size, stack, stack + l->stack_size)) {
        return;
    }
    const uintptr_t self = reinterpret_cast<uintptr_t>(current);
    if (inside(a, size, self, self + sizeof(Thread))) {
        return;
    }
    for (unsigned i = 0; i < l->nown; ++i) {
        if (inside(a, size, l->own[i].lo, l->own[i].hi)) {
            return;
        }
    }
    for (unsigned i = 0; i < l->cfg->nbuffers; ++i) {
        if (inside(a, size, l->cfg->buffers[i][0], l->cfg->buffers[i][1])) {
            return;
        }
    }
    fail("out-of-bounds access of %u bytes (address ending %#x): in no buffer of the launch",
         static_cast<unsigned>(size), static_cast<unsigned>(a));
}

CUDACPU_NOSAN inline int find_own_segments(struct dl_phdr_info* info, size_t, void* data) {
    Launch* l = static_cast<Launch*>(data);
    const uintptr_t me = reinterpret_cast<uintptr_t>(&launch);
    bool mine = false;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD && me >= lo && me < lo + ph.p_memsz) {
            mine = true;
        }
    }
    if (!mine) {
        return 0;
    }
    for (int i = 0; i < info->dlpi_phnum && l->nown < 16u; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_LOAD) {
            const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
            l->own[l->nown++] = Range{lo, lo + ph.p_memsz};
        }
    }
    return 1;
}

// --- the race detector ------------------------------------------------------------------------

struct Shadow {
    unsigned phase;    // the barrier interval of the accesses below
    int writer;        // thread that wrote the word in that interval, or -1
    int reader;        // thread that read it, -1 none, -2 several
};

inline Shadow* shadow = nullptr;
inline size_t shadow_words = 0;

// The access trace (Config::trace): where an access falls, as (region, offset), the same for
// every run of the same launch shape whatever the data (buffers are numbered in argument order).
CUDACPU_NOSAN inline void trace_access(uintptr_t a, size_t size, bool write, bool shared,
                                       uintptr_t shm_lo) {
    Launch* l = launch;
    unsigned long long region = 0xff, off = 0;
    if (shared) {
        region = 1;
        off = l->cfg->trace_banks ? ((a - shm_lo) >> 2) & 31u : 0u;
    } else {
        const uintptr_t stack = reinterpret_cast<uintptr_t>(l->stacks) + l->stack_size * current->id;
        const uintptr_t self = reinterpret_cast<uintptr_t>(current);
        if (inside(a, size, stack, stack + l->stack_size)) {
            region = 2;
            off = a - stack;
        } else if (inside(a, size, self, self + sizeof(Thread))) {
            region = 3;
            off = a - self;
        } else {
            for (unsigned i = 0; i < l->nown && region == 0xff; ++i) {
                if (inside(a, size, l->own[i].lo, l->own[i].hi)) {
                    region = 16 + i;
                    off = a - l->own[i].lo;
                }
            }
            for (unsigned i = 0; i < l->cfg->nbuffers && region == 0xff; ++i) {
                if (inside(a, size, l->cfg->buffers[i][0], l->cfg->buffers[i][1])) {
                    region = 64 + i;
                    off = a - l->cfg->buffers[i][0];
                }
            }
        }
    }
    const unsigned long long v = (region << 56) | (static_cast<unsigned long long>(write) << 55) |
                                 (static_cast<unsigned long long>(size & 63u) << 48) |
                                 (off & 0xffffffffffffull);
    unsigned long long& h = l->cfg->trace[current->id];
    h = (h ^ v) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
}

CUDACPU_NOSAN inline void shm_access(const void* p, size_t size, bool write) {
    if (current == nullptr || launch == nullptr || launch->failed) {
        return;
    }
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(__start_cudacpu_shm);
    const uintptr_t hi = reinterpret_cast<uintptr_t>(__stop_cudacpu_shm);
    if (launch->cfg->trace != nullptr) {
        trace_access(a, size, write, a >= lo && a < hi, lo);
    }
    if (a < lo || a >= hi) {
        check_global(a, size);
        return;
    }
    if (shadow == nullptr) {
        return;
    }
    const int me = static_cast<int>(current->id);
    const unsigned now = launch->phase;
    for (uintptr_t w = (a - lo) >> 2; w <= (a + size - 1 - lo) >> 2; ++w) {
        Shadow& s = shadow[w];
        if (s.phase != now) {
            s.phase = now;
            s.writer = -1;
            s.reader = -1;
        }
        const unsigned off = static_cast<unsigned>(w * 4);
        if (s.writer >= 0 && s.writer != me) {
            fail(write ? "shared-memory race: write-after-write at shared offset %#x by "
                         "threads %u and %u with no barrier between"
                       : "shared-memory race: read-after-write at shared offset %#x by "
                         "threads %u and %u with no barrier between",
                 off, static_cast<unsigned>(s.writer), static_cast<unsigned>(me));
            return;
        }
        if (write) {
            if (s.reader == -2 || (s.reader >= 0 && s.reader != me)) {
                fail("shared-memory race: write-after-read at shared offset %#x by thread %u "
                     "(read by thread %u) with no barrier between",
                     off, static_cast<unsigned>(me),
                     static_cast<unsigned>(s.reader == -2 ? 0xffffffffu : s.reader));
                return;
            }
            s.writer = me;
        } else if (s.reader == -1) {
            s.reader = me;
        } else if (s.reader != me) {
            s.reader = -2;
        }
    }
}

// --- fibers, barriers, shuffles ------------------------------------------------------------------

CUDACPU_NOSAN inline void yield_to_scheduler(State st, const void* site) {
    Thread* self = current;
    self->state = st;
    self->site = site;
    ctx_switch(&self->ctx, &launch->sched);
    current = self;
    if (launch->failed) {  // resumed only to be abandoned: never happens, but be safe
        fail("resumed after failure");
    }
}

#ifdef CUDACPU_THREADS
// ThreadSanitizer builds: every thread of a block is an OS thread. A lane runs holding its warp's
// lock (lanes of a warp take turns; warps run concurrently), so ThreadSanitizer reports the
// unordered accesses between warps; the block barrier and the shuffles are mutex/condition
// variable hand-offs, which ThreadSanitizer understands as synchronisation.
struct Sync {
    pthread_mutex_t block;
    pthread_cond_t block_cv;
    unsigned arrived, generation, alive;
    const void* site;
    pthread_mutex_t warp[32];
    pthread_cond_t warp_cv[32];
    unsigned shfl_arrived[32], shfl_generation[32];
};
inline Sync threads_sync;

CUDACPU_NOSAN inline void release_barrier_locked() {
    Sync& S = threads_sync;
    S.arrived = 0;
    S.generation += 1;
    pthread_cond_broadcast(&S.block_cv);
}

CUDACPU_NOSAN inline void syncthreads(const void* site) {
    Sync& S = threads_sync;
    const unsigned w = current->id / 32u;
    pthread_mutex_unlock(&S.warp[w]);
    pthread_mutex_lock(&S.block);
    if (S.arrived == 0u) {
        S.site = site;
    } else if (S.site != site) {
        pthread_mutex_unlock(&S.block);
        fail("divergent __syncthreads: threads wait at different barriers");
    }
    const unsigned generation = S.generation;
    if (++S.arrived == S.alive) {
        release_barrier_locked();
    } else {
        while (generation == S.generation) {
            pthread_cond_wait(&S.block_cv, &S.block);
        }
    }
    pthread_mutex_unlock(&S.block);
    pthread_mutex_lock(&S.warp[w]);
}

CUDACPU_NOSAN inline unsigned shfl_xor(unsigned mask, unsigned v, int lane_mask, int width,
                                       const void*) {
    Sync& S = threads_sync;
    Thread* self = current;
    const unsigned w = self->id / 32u;
    const unsigned first = 32u * w;
    const unsigned lanes = launch->nthreads - first < 32u ? launch->nthreads - first : 32u;
    if (width != 32 || mask != 0xffffffffu || lanes != 32u) {
        fail("__shfl_xor_sync in warp %u: mask %#x does not name the warp's lanes", w, mask);
    }
    self->shfl_value = v;
    self->shfl_lane_mask = static_cast<unsigned>(lane_mask);
    const unsigned generation = S.shfl_generation[w];
    if (++S.shfl_arrived[w] == lanes) {
        for (unsigned i = first; i < first + lanes; ++i) {
            Thread& t = launch->threads[i];
            t.shfl_out = launch->threads[first + (((i - first) ^ t.shfl_lane_mask) & 31u)].shfl_value;
        }
        S.shfl_arrived[w] = 0;
        S.shfl_generation[w] += 1;
        pthread_cond_broadcast(&S.warp_cv[w]);
    } else {
        while (generation == S.shfl_generation[w]) {
            pthread_cond_wait(&S.warp_cv[w], &S.warp[w]);
        }
    }
    return self->shfl_out;
}

CUDACPU_NOSAN inline void* thread_main(void* p) {
    Sync& S = threads_sync;
    Thread* t = static_cast<Thread*>(p);
    current = t;
    const unsigned w = t->id / 32u;
    pthread_mutex_lock(&S.warp[w]);
    launch->body(launch->arg);
    pthread_mutex_unlock(&S.warp[w]);
    pthread_mutex_lock(&S.block);
    S.alive -= 1;
    if (S.arrived != 0u && S.arrived == S.alive) {
        release_barrier_locked();
    }
    pthread_mutex_unlock(&S.block);
    return nullptr;
}
#else
CUDACPU_NOSAN inline void syncthreads(const void* site) { yield_to_scheduler(kAtBarrier, site); }

CUDACPU_NOSAN inline unsigned shfl_xor(unsigned mask, unsigned v, int lane_mask, int width,
                                       const void* site) {
    if (width != 32) {
        fail("__shfl_xor_sync with width %u: only whole warps are supported here",
             static_cast<unsigned>(width));
    }
    Thread* self = current;
    self->shfl_mask = mask;
    self->shfl_value = v;
    self->shfl_lane_mask = static_cast<unsigned>(lane_mask);
    yield_to_scheduler(kAtShfl, site);
    return current->shfl_out;
}
#endif

extern "C" CUDACPU_NOSAN inline void cudacpu_fiber_entry() {
    launch->body(launch->arg);
    Thread* self = current;
    self->state = kDone;
    ctx_switch(&self->ctx, &launch->sched);
}

CUDACPU_NOSAN inline void resume(Thread* t) {
    current = t;
    t->state = kRunnable;
    ctx_switch(&launch->sched, &t->ctx);
    current = nullptr;
}

// Run warp w until each of its lanes waits at a barrier or has exited.
CUDACPU_NOSAN inline void run_warp(unsigned w) {
    Launch* l = launch;
    const unsigned first = 32u * w;
    const unsigned last = first + 32u < l->nthreads ? first + 32u : l->nthreads;
    for (;;) {
        for (unsigned i = first; i < last && !l->failed; ++i) {
            if (l->threads[i].state == kRunnable) {
                resume(&l->threads[i]);
            }
        }
        if (l->failed) {
            return;
        }
        unsigned at_shfl = 0, alive = 0;
        for (unsigned i = first; i < last; ++i) {
            at_shfl += l->threads[i].state == kAtShfl;
            alive += l->threads[i].state != kDone;
        }
        if (at_shfl == 0u) {
            return;
        }
        if (at_shfl != last - first) {
            fail("__shfl_xor_sync in warp %u: %u of its %u lanes arrived, the others are at a "
                 "barrier or have exited", w, at_shfl, last - first);
            return;
        }
        const Thread& t0 = l->threads[first];
        for (unsigned i = first; i < last; ++i) {
            const Thread& t = l->threads[i];
            if (t.shfl_mask != 0xffffffffu || t.shfl_mask != t0.shfl_mask) {
                fail("__shfl_xor_sync in warp %u: mask %#x does not name the warp's lanes",
                     w, t.shfl_mask);
                return;
            }
            if (t.site != t0.site || t.shfl_lane_mask != t0.shfl_lane_mask) {
                fail("__shfl_xor_sync in warp %u: lanes at different shuffles", w);
                return;
            }
        }
        for (unsigned i = first; i < last; ++i) {
            Thread& t = l->threads[i];
            const unsigned src = first + (((i - first) ^ t.shfl_lane_mask) & 31u);
            t.shfl_out = l->threads[src].shfl_value;
            t.state = kRunnable;
        }
    }
}

#ifdef CUDACPU_THREADS
CUDACPU_NOSAN inline void run_block_threads() {
    Launch* l = launch;
    for (char* p = __start_cudacpu_shm; p < __stop_cudacpu_shm; ++p) {
        *p = static_cast<char>(next_random());
    }
    Sync& S = threads_sync;
    S.arrived = 0;
    S.alive = l->nthreads;
    for (unsigned w = 0; w < 32u; ++w) {
        S.shfl_arrived[w] = 0;
    }
    pthread_t* ids = static_cast<pthread_t*>(calloc(l->nthreads, sizeof(pthread_t)));
    for (unsigned i = 0; i < l->nthreads; ++i) {
        if (pthread_create(&ids[i], nullptr, thread_main, &l->threads[i]) != 0) {
            fprintf(stderr, "cudacpu: cannot start thread %u of a block\n", i);
            abort();
        }
    }
    for (unsigned i = 0; i < l->nthreads; ++i) {
        pthread_join(ids[i], nullptr);
    }
    free(ids);
}
#endif

CUDACPU_NOSAN inline void run_block() {
    Launch* l = launch;
#ifdef CUDACPU_THREADS
    if (l != nullptr) {
        run_block_threads();
        return;
    }
#endif
    // Poison shared memory: a read of a word nobody wrote sees random bytes.
    for (char* p = __start_cudacpu_shm; p < __stop_cudacpu_shm; ++p) {
        *p = static_cast<char>(next_random());
    }
    if (l->poison != nullptr) {
        memcpy(l->poison, __start_cudacpu_shm, static_cast<size_t>(__stop_cudacpu_shm -
                                                                   __start_cudacpu_shm));
    }
    l->phase += 1;
    for (unsigned i = 0; i < l->nthreads; ++i) {
        Thread& t = l->threads[i];
        t.state = kRunnable;
        t.site = nullptr;
        ctx_make(&t.ctx, l->stacks + static_cast<size_t>(i) * l->stack_size, l->stack_size,
                 cudacpu_fiber_entry);
    }
    const unsigned warps = (l->nthreads + 31u) / 32u;
    unsigned order[64];
    for (;;) {
        for (unsigned w = 0; w < warps; ++w) {
            order[w] = w;
        }
        for (unsigned w = warps; w > 1; --w) {  // a seeded shuffle of the warp order
            const unsigned j = static_cast<unsigned>(next_random() % w);
            const unsigned tmp = order[w - 1];
            order[w - 1] = order[j];
            order[j] = tmp;
        }
        for (unsigned k = 0; k < warps && !l->failed; ++k) {
            run_warp(order[k]);
        }
        if (l->failed) {
            return;
        }
        unsigned done = 0;
        const void* site = nullptr;
        for (unsigned i = 0; i < l->nthreads; ++i) {
            const Thread& t = l->threads[i];
            if (t.state == kDone) {
                ++done;
            } else if (site == nullptr) {
                site = t.site;
            } else if (t.site != site) {
                fail("divergent __syncthreads: threads %u and %u wait at different barriers",
                     l->threads[0].id, t.id);
                return;
            }
        }
        if (done == l->nthreads) {
            if (l->cfg->after_block != nullptr) {
                l->cfg->after_block(__start_cudacpu_shm, l->poison,
                                    static_cast<unsigned long long>(__stop_cudacpu_shm -
                                                                    __start_cudacpu_shm),
                                    block_idx.x + grid_dim.x * (block_idx.y + grid_dim.y *
                                                                block_idx.z));
            }
            return;
        }
        if (done != 0u) {
            fail("__syncthreads reached by %u threads while %u threads of the block exited",
                 l->nthreads - done, done);
            return;
        }
        l->phase += 1;  // everyone is past the barrier
        for (unsigned i = 0; i < l->nthreads; ++i) {
            l->threads[i].state = kRunnable;
        }
    }
}

CUDACPU_NOSAN inline int run(Config* cfg, void (*body)(void*), void* arg) {
    if (launch != nullptr) {
        snprintf(cfg->error, sizeof cfg->error, "a launch is already running in this library");
        return 1;
    }
    cfg->error[0] = '\0';
    const unsigned nthreads = cfg->block[0] * cfg->block[1] * cfg->block[2];
    if (nthreads == 0u || nthreads > 1024u || cfg->grid[0] * cfg->grid[1] * cfg->grid[2] == 0u) {
        snprintf(cfg->error, sizeof cfg->error, "invalid launch configuration");
        return 1;
    }
    Launch l{};
    l.cfg = cfg;
    l.body = body;
    l.arg = arg;
    l.nthreads = nthreads;
    l.stack_size = 256u * 1024u;
    l.threads = static_cast<Thread*>(calloc(nthreads, sizeof(Thread)));
    // The fiber stacks, between two inaccessible guard pages: a buffer overrun next to them
    // faults instead of landing in a stack (the bounds check allows a thread its own stack).
    const size_t guard = 64u * 1024u;
    const size_t span = l.stack_size * nthreads + 2u * guard;
    char* region = static_cast<char*>(
        mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (region == MAP_FAILED) {
        snprintf(cfg->error, sizeof cfg->error, "no memory for %u fiber stacks", nthreads);
        free(l.threads);
        return 1;
    }
    mprotect(region + guard, l.stack_size * nthreads, PROT_READ | PROT_WRITE);
    l.stacks = region + guard;
    l.rng = cfg->seed * 0x9E3779B97F4A7C15ull + 1ull;
    const size_t words = (static_cast<size_t>(__stop_cudacpu_shm - __start_cudacpu_shm) + 3u) / 4u;
    Shadow* sh = nullptr;
    if (cfg->racecheck) {
        sh = static_cast<Shadow*>(calloc(words, sizeof(Shadow)));
    }
    for (unsigned i = 0; i < nthreads; ++i) {
        Thread& t = l.threads[i];
        t.id = i;
        t.idx.x = i % cfg->block[0];
        t.idx.y = (i / cfg->block[0]) % cfg->block[1];
        t.idx.z = i / (cfg->block[0] * cfg->block[1]);
    }
#ifdef CUDACPU_THREADS
    pthread_mutex_init(&threads_sync.block, nullptr);
    pthread_cond_init(&threads_sync.block_cv, nullptr);
    for (unsigned w = 0; w < 32u; ++w) {
        pthread_mutex_init(&threads_sync.warp[w], nullptr);
        pthread_cond_init(&threads_sync.warp_cv[w], nullptr);
    }
#endif
    if (cfg->after_block != nullptr) {
        l.poison = static_cast<char*>(malloc(static_cast<size_t>(__stop_cudacpu_shm -
                                                                 __start_cudacpu_shm)));
    }
    dl_iterate_phdr(find_own_segments, &l);
    launch = &l;
    shadow = sh;
    shadow_words = words;
    block_dim = uint3{cfg->block[0], cfg->block[1], cfg->block[2]};
    grid_dim = uint3{cfg->grid[0], cfg->grid[1], cfg->grid[2]};
    for (unsigned z = 0; z < cfg->grid[2] && !l.failed; ++z) {
        for (unsigned y = 0; y < cfg->grid[1] && !l.failed; ++y) {
            for (unsigned x = 0; x < cfg->grid[0] && !l.failed; ++x) {
                block_idx = uint3{x, y, z};
                run_block();
            }
        }
    }
    launch = nullptr;
    shadow = nullptr;
    current = nullptr;
    // Leave nothing of the last block in shared memory for the next launch to find.
    for (char* p = __start_cudacpu_shm; p < __stop_cudacpu_shm; ++p) {
        *p = 0;
    }
    free(sh);
    free(l.poison);
    munmap(region, span);
    free(l.threads);
    return l.failed;
}

// Kernel trampolines (generated by the builder): unpack the argument pointers, as cuLaunchKernel
// does, into a call of the kernel.
template <size_t... I>
struct Indices {};
template <size_t N, size_t... I>
struct MakeIndices : MakeIndices<N - 1, N - 1, I...> {};
template <size_t... I>
struct MakeIndices<0, I...> {
    typedef Indices<I...> type;
};
template <class T>
struct Plain {
    typedef T type;
};

template <class... A>
struct Bound {
    void (*kernel)(A...);
    void** args;
};

// Not instrumented: the argument array lives in the caller's memory. The call goes through a
// volatile pointer so that the (instrumented) kernel is never inlined here.
template <class... A, size_t... I>
CUDACPU_NOSAN void invoke(void (*k)(A...), void** args, Indices<I...>) {
    void (*volatile kernel)(A...) = k;
    kernel(*static_cast<typename Plain<A>::type*>(args[I])...);
}

template <class... A>
CUDACPU_NOSAN void body_of(void* p) {
    Bound<A...>* b = static_cast<Bound<A...>*>(p);
    invoke(b->kernel, b->args, typename MakeIndices<sizeof...(A)>::type());
}

template <class... A>
int launch_kernel(void (*k)(A...), Config* cfg, void** args) {
    Bound<A...> b{k, args};
    return run(cfg, &body_of<A...>, &b);
}

}  // namespace cudacpu

#define threadIdx (::cudacpu::current->idx)
#define blockIdx (::cudacpu::block_idx)
#define blockDim (::cudacpu::block_dim)
#define gridDim (::cudacpu::grid_dim)

// A barrier's (or shuffle's) identity is the address it is called from: threads waiting at
// different __syncthreads calls are divergent.
// The barrier is also a compiler memory barrier at its call site, as __syncthreads is for nvcc:
// without it, g++ may keep a __shared__ variable whose address never escapes in a register
// across the (opaque to it) fiber switch, and another thread's write is never seen.
namespace cudacpu {
__attribute__((noinline)) inline void barrier_here() {
    syncthreads(__builtin_return_address(0));
}
}  // namespace cudacpu
#define __syncthreads()                      \
    do {                                     \
        asm volatile("" ::: "memory");       \
        ::cudacpu::barrier_here();           \
        asm volatile("" ::: "memory");       \
    } while (0)

template <class T>
__attribute__((noinline)) T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    unsigned u;
    memcpy(&u, &v, 4);
    u = ::cudacpu::shfl_xor(mask, u, lane_mask, width, __builtin_return_address(0));
    memcpy(&v, &u, 4);
    return v;
}

template <class T>
inline T __ldg(const T* p) {
    if (reinterpret_cast<uintptr_t>(p) % sizeof(T) != 0u) {
        ::cudacpu::fail("__ldg of %u bytes at %#x: a misaligned address",
                        static_cast<unsigned>(sizeof(T)),
                        static_cast<unsigned>(reinterpret_cast<uintptr_t>(p)));
    }
    return *p;
}

inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
    unsigned r = 0;
    for (int k = 0; k < 4; ++k) {
        const unsigned sel = (s >> (4 * k)) & 7u;
        r |= static_cast<unsigned>((v >> (8 * sel)) & 0xffu) << (8 * k);
    }
    return r;
}

inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
    const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
    return static_cast<unsigned>((v << (shift & 31u)) >> 32);
}

inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) {
        r = (r << 1) | ((x >> i) & 1u);
    }
    return r;
}

inline unsigned __umulhi(unsigned x, unsigned y) {
    return static_cast<unsigned>((static_cast<unsigned long long>(x) * y) >> 32);
}

// The shared window: an address in shared memory is its offset in the cudacpu_shm section.
inline size_t __cvta_generic_to_shared(const void* p) {
    const char* c = static_cast<const char*>(p);
    if (c < ::cudacpu::__start_cudacpu_shm || c >= ::cudacpu::__stop_cudacpu_shm) {
        ::cudacpu::fail("__cvta_generic_to_shared of an address outside shared memory");
    }
    return static_cast<size_t>(c - ::cudacpu::__start_cudacpu_shm);
}

namespace cudacpu {
#ifdef CUDACPU_THREADS
#define CUDACPU_LDS_ATTR inline  // ThreadSanitizer must see the table loads
#else
#define CUDACPU_LDS_ATTR CUDACPU_NOSAN inline
#endif
CUDACPU_LDS_ATTR unsigned lds_u32(unsigned addr) {
    const size_t size = static_cast<size_t>(__stop_cudacpu_shm - __start_cudacpu_shm);
    if ((addr & 3u) != 0u || static_cast<size_t>(addr) + 4u > size) {
        fail("ld.shared.u32 at shared address %#x: misaligned or outside shared memory", addr);
        return 0u;
    }
    const char* p = __start_cudacpu_shm + addr;
    if (shadow != nullptr || (launch != nullptr && launch->cfg->trace != nullptr)) {
        shm_access(p, 4, false);
    }
    unsigned v;
    memcpy(&v, p, 4);
    return v;
}
}  // namespace cudacpu

// The kernels' one inline PTX load, ld.shared.u32 (aesgcm.cu), by its definition.
#define GCMK_LDS_U32(v, addr) ((v) = ::cudacpu::lds_u32(addr))

#ifdef CUDACPU_RACECHECK
// The hooks GCC's -fsanitize=thread instrumentation calls on every memory access of the kernels
// (this library is linked without ThreadSanitizer's runtime: these are the whole runtime).
// An access the compiler emitted as naturally aligned (a uint4, a u64) at an address that is not
// is a misaligned-address fault on a GPU.
namespace cudacpu {
CUDACPU_NOSAN inline void aligned_access(void* p, size_t n, bool write) {
    if (current != nullptr && (reinterpret_cast<uintptr_t>(p) & (n - 1u)) != 0u) {
        fail("misaligned %u-byte access at %#x (a misaligned-address fault on a GPU)",
             static_cast<unsigned>(n), static_cast<unsigned>(reinterpret_cast<uintptr_t>(p)));
    }
    shm_access(p, n, write);
}
}  // namespace cudacpu
#define CUDACPU_HOOK(n)                                                                       \
    extern "C" CUDACPU_NOSAN void __tsan_read##n(void* p) { ::cudacpu::aligned_access(p, n, false); } \
    extern "C" CUDACPU_NOSAN void __tsan_write##n(void* p) { ::cudacpu::aligned_access(p, n, true); } \
    extern "C" CUDACPU_NOSAN void __tsan_unaligned_read##n(void* p) {                          \
        ::cudacpu::shm_access(p, n, false);                                                   \
    }                                                                                         \
    extern "C" CUDACPU_NOSAN void __tsan_unaligned_write##n(void* p) {                         \
        ::cudacpu::shm_access(p, n, true);                                                    \
    }
CUDACPU_HOOK(1)
CUDACPU_HOOK(2)
CUDACPU_HOOK(4)
CUDACPU_HOOK(8)
CUDACPU_HOOK(16)
extern "C" CUDACPU_NOSAN void __tsan_read_range(void* p, size_t n) {
    ::cudacpu::shm_access(p, n, false);
}
extern "C" CUDACPU_NOSAN void __tsan_write_range(void* p, size_t n) {
    ::cudacpu::shm_access(p, n, true);
}
extern "C" CUDACPU_NOSAN void __tsan_func_entry(void*) {}
extern "C" CUDACPU_NOSAN void __tsan_func_exit() {}
extern "C" CUDACPU_NOSAN void __tsan_init() {}
#endif

#endif  // GPUCC_CUDACPU_H
