// keel_cuda_emu.h: what a CUDA C kernel source needs to compile as C++ for
// the CPU and run there, one block at a time, every thread of a block a
// fiber. The emulator's NVRTC (nvrtc.c) puts this header before a kernel
// source and compiles it with g++ into a shared object; its driver
// (cuda.c) loads that and calls keel_emu_launch for every cuLaunchKernel.
//
// What it models: threadIdx, blockIdx, blockDim, gridDim; __syncthreads
// (all live threads of the block); warp shuffles and __syncwarp (all live
// lanes of the warp, in lock step: every lane's n-th shuffle meets the
// other lanes' n-th); __shared__ (one copy per block); IEEE float32 and
// float64 arithmetic with no contraction (NVRTC --fmad=false). What it
// checks and reports as a launch failure: a warp whose lanes wait at
// different barriers (one at a shuffle, another at __syncthreads), a
// shuffle that reads a lane which has exited or is at another shuffle,
// a block larger than the kernel's __launch_bounds__ or 1024 threads.
// What it does not model: timing, races between blocks (blocks run one
// after another), the device's expf/logf rounding (glibc's here).
//
// Only x86-64 Linux: the fiber switch is twenty lines of assembly.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <mutex>

#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// One launch runs at a time in a module (keel_emu_launch holds a lock), so
// a block's shared memory is a plain static, in a section of its own that
// is set to 0xff (NaN as floats) before every block: a read of shared
// memory the block has not written shows, as it would on a GPU, where it
// holds whatever the last block left.
#define __shared__ static __attribute__((section("keel_emu_shared"), aligned(16)))
// KEEL_CUDA_EMU tells a kernel source it is compiled by the emulator:
// prelude.cuh's KEEL_DYNAMIC_SHARED then takes the launch's dynamic shared
// memory from keel_emu::dyn_shared (set to 0xff before every block, as the
// static shared memory is) instead of an extern __shared__ array.
#define KEEL_CUDA_EMU 1
extern "C" char __start_keel_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_keel_emu_shared[] __attribute__((weak, visibility("hidden")));

struct uint3 {
  unsigned int x, y, z;
};
typedef uint3 dim3;
// CUDA's vectors of two and four floats, 8- and 16-byte aligned as on the
// device, and its alignment attribute.
struct __attribute__((aligned(8))) float2 {
  float x, y;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
#define __align__(n) __attribute__((aligned(n)))

namespace keel_emu {

enum State { RUNNABLE, WAIT_WARP, WAIT_BLOCK, DONE };

// Fiber is one thread of the block being run.
struct Fiber {
  void* sp;       // saved stack pointer while switched out
  uint3 tid;      // threadIdx
  int lane, warp;
  State state;
  unsigned shfl;  // shuffles done so far (the lock-step check)
  bool at_shfl;   // waiting at a shuffle (else at __syncwarp), while WAIT_WARP
};

// Warp holds the values lanes exchange at a shuffle: two sets, used in
// turn, so a lane that runs ahead to its next shuffle cannot overwrite a
// value another lane has not read yet (between them lies a barrier).
struct Warp {
  uint64_t val[2][32];
  unsigned tag[2][32];  // the writer's shuffle count + 1; 0 = not written
  int at_warp, at_block;  // lanes waiting at each kind of barrier
  int live;               // lanes not yet exited
  int lo, hi;             // its threads: fibers[lo, hi)
};

constexpr int kMaxThreads = 1024;
constexpr size_t kStack = 256 << 10;  // per fiber, with a guard page below

struct Runner {
  Fiber fibers[kMaxThreads];
  Warp warps[kMaxThreads / 32];
  char* stacks = nullptr;  // kMaxThreads stacks, mapped once
  int guarded = 0;         // stacks given their guard page so far
  void* sched_sp = nullptr;
  Fiber* cur = nullptr;
  void (*thunk)(void**) = nullptr;
  void** params = nullptr;
  uint3 block_idx, block_dim, grid_dim;
  int at_block = 0;  // threads of the block waiting at __syncthreads
  bool failed = false;
  char err[512];
};

// runner is the module's one runner; launches take turns (launch_mu).
inline Runner* runner = nullptr;
inline std::mutex launch_mu;

// dyn_shared is the current launch's dynamic shared memory, dyn_bytes
// long, 16-byte aligned and ending where a page without access begins, so
// that a kernel reading past what its launch gave it faults. The mapping
// (dyn_map, dyn_pages pages and the guard) is kept between launches and
// grown as asked.
inline unsigned char* dyn_shared = nullptr;
inline unsigned char* dyn_map = nullptr;
inline unsigned long dyn_bytes = 0, dyn_pages = 0;

}  // namespace keel_emu

#define threadIdx (keel_emu::runner->cur->tid)
#define blockIdx (keel_emu::runner->block_idx)
#define blockDim (keel_emu::runner->block_dim)
#define gridDim (keel_emu::runner->grid_dim)
#define warpSize 32

// keel_emu_swap saves the callee-saved registers on the current stack,
// stores the stack pointer in *save and continues on the stack new_sp (as
// saved by an earlier swap or laid out by keel_emu::start). The SSE and
// x87 control words are not switched: no kernel can change them.
extern "C" void keel_emu_swap(void** save, void* new_sp);
asm(R"(
  .text
  .globl keel_emu_swap
  .hidden keel_emu_swap
  .type keel_emu_swap, @function
keel_emu_swap:
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
  .size keel_emu_swap, .-keel_emu_swap
)");

namespace keel_emu {

inline void fail(const char* fmt, int a, int b, int c) {
  Runner* r = runner;
  if (!r->failed) {
    r->failed = true;
    snprintf(r->err, sizeof r->err, fmt, a, b, c);
  }
}

inline bool reverse_order();

// pick chooses the fiber to run after f (of warp wp) has parked or
// exited: if that completed a warp barrier, the barrier's lanes are
// released and the first of them runs; otherwise the next runnable lane
// after f, in the run order; otherwise none (nullptr: back to the
// scheduler). Switching lane to lane, not through the scheduler, halves
// the switches a shuffle costs.
inline Fiber* pick(Runner* r, Fiber* f, Warp* wp) {
  const bool rev = reverse_order();
  if (wp->at_warp > 0 && wp->at_warp == wp->live) {
    // Lock step: every lane at the same kind of warp barrier, the same
    // shuffle by count.
    const Fiber* ref = nullptr;
    for (int i = wp->lo; i < wp->hi; i++) {
      const Fiber* g = &r->fibers[i];
      if (g->state != WAIT_WARP) continue;
      if (!ref) ref = g;
      else if (g->at_shfl != ref->at_shfl || g->shfl != ref->shfl) {
        fail("warp %d: lane %d and lane %d wait at different warp barriers (a shuffle against __syncwarp, or "
             "another shuffle)",
             (int)(wp->lo / 32), ref->lane, g->lane);
        return nullptr;
      }
    }
    Fiber* first = nullptr;
    for (int k = 0; k < wp->hi - wp->lo; k++) {
      Fiber* g = &r->fibers[rev ? wp->hi - 1 - k : wp->lo + k];
      if (g->state == WAIT_WARP) {
        g->state = RUNNABLE;
        if (!first) first = g;
      }
    }
    wp->at_warp = 0;
    return first;
  }
  const int i = (int)(f - r->fibers);
  if (rev) {
    for (int j = i - 1; j >= wp->lo; j--)
      if (r->fibers[j].state == RUNNABLE) return &r->fibers[j];
  } else {
    for (int j = i + 1; j < wp->hi; j++)
      if (r->fibers[j].state == RUNNABLE) return &r->fibers[j];
  }
  return nullptr;
}

// yield parks the current fiber in state s and switches to the next one
// (pick) or the scheduler; it comes back when its barrier is released.
inline void yield(State s, bool shuffle = false) {
  Runner* r = runner;
  Fiber* f = r->cur;
  Warp* wp = &r->warps[f->warp];
  f->state = s;
  f->at_shfl = shuffle;
  if (s == WAIT_WARP) wp->at_warp++;
  else wp->at_block++;
  Fiber* g = r->failed ? nullptr : pick(r, f, wp);
  if (g == f) {
    f->state = RUNNABLE;
    return;
  }
  r->cur = g;
  keel_emu_swap(&f->sp, g ? g->sp : r->sched_sp);
}

[[noreturn]] inline void fiber_main() {
  Runner* r = runner;
  r->thunk(r->params);
  r = runner;
  Fiber* f = r->cur;
  Warp* wp = &r->warps[f->warp];
  f->state = DONE;
  wp->live--;
  Fiber* g = r->failed ? nullptr : pick(r, f, wp);
  r->cur = g;
  void* dead;
  keel_emu_swap(&dead, g ? g->sp : r->sched_sp);
  __builtin_unreachable();
}

// start lays out fiber i's stack so that the first swap into it returns
// into fiber_main with the stack aligned as after a call. The stacks'
// tops are staggered by 192 bytes a fiber: stacks a power of two apart
// would put every fiber's hot frames in the same cache sets.
inline void start(Runner* r, int i) {
  char* top = r->stacks + (size_t)(i + 1) * kStack - (size_t)(i % 21) * 192;
  uint64_t* sp = (uint64_t*)top;
  *--sp = 0;                              // fiber_main's return address: none
  *--sp = (uint64_t)&fiber_main;          // where the swap's ret goes
  for (int k = 0; k < 6; k++) *--sp = 0;  // rbp rbx r12 r13 r14 r15
  r->fibers[i].sp = sp;
}

inline Runner* get_runner() {
  if (runner) return runner;
  Runner* r = new Runner();
  size_t bytes = (size_t)kMaxThreads * kStack;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    delete r;
    return nullptr;
  }
  r->stacks = (char*)m;
  runner = r;
  return r;
}

// reverse_order is set by KEEL_CUDA_EMU_ORDER=reverse: threads and warps
// are then run last first, so that a missing barrier which one order
// hides shows in the other.
inline bool reverse_order() {
  static int rev = -1;
  if (rev < 0) {
    const char* s = getenv("KEEL_CUDA_EMU_ORDER");
    rev = s && strcmp(s, "reverse") == 0;
  }
  return rev;
}

// run_warp runs the live lanes of warp w until every one has exited or
// waits at __syncthreads (the lanes hand over to each other, releasing
// warp barriers as they fill). It returns false (and records why) when
// the lanes wait at different kinds of barrier.
inline bool run_warp(Runner* r, int w) {
  Warp* wp = &r->warps[w];
  const bool rev = reverse_order();
  Fiber* first = nullptr;
  for (int k = 0; k < wp->hi - wp->lo && !first; k++) {
    Fiber* g = &r->fibers[rev ? wp->hi - 1 - k : wp->lo + k];
    if (g->state == RUNNABLE) first = g;
  }
  if (first) {
    r->cur = first;
    keel_emu_swap(&r->sched_sp, first->sp);
  }
  if (r->failed) return false;
  if (wp->at_warp > 0) {
    fail("warp %d: %d lanes wait at a shuffle or __syncwarp while %d wait at __syncthreads", w, wp->at_warp,
         wp->at_block);
    return false;
  }
  return true;
}

// run_block runs one block to the end: its warps in turn up to the next
// __syncthreads, which releases all the block's live threads at once.
inline bool run_block(Runner* r) {
  const int n = (int)(r->block_dim.x * r->block_dim.y * r->block_dim.z);
  // Guard pages are set as stacks come into use: each splits the mapping,
  // and the kernel only needs as many as its largest block.
  for (; r->guarded < n; r->guarded++) mprotect(r->stacks + (size_t)r->guarded * kStack, 4096, PROT_NONE);
  for (int i = 0; i < n; i++) {
    Fiber* f = &r->fibers[i];
    f->tid.x = i % r->block_dim.x;
    f->tid.y = i / r->block_dim.x % r->block_dim.y;
    f->tid.z = i / (r->block_dim.x * r->block_dim.y);
    f->lane = i % 32;
    f->warp = i / 32;
    f->state = RUNNABLE;
    f->shfl = 0;
    start(r, i);
  }
  if (__start_keel_emu_shared != __stop_keel_emu_shared)
    memset(__start_keel_emu_shared, 0xff, __stop_keel_emu_shared - __start_keel_emu_shared);
  if (dyn_bytes > 0) memset(dyn_shared, 0xff, dyn_bytes);
  const int nw = (n + 31) / 32;
  memset(r->warps, 0, sizeof(Warp) * nw);
  for (int k = 0; k < nw; k++) {
    Warp* wp = &r->warps[k];
    wp->lo = k * 32;
    wp->hi = wp->lo + 32 < n ? wp->lo + 32 : n;
    wp->live = wp->hi - wp->lo;
  }
  for (;;) {
    for (int k = 0; k < nw; k++)
      if (!run_warp(r, reverse_order() ? nw - 1 - k : k)) return false;
    int waiting = 0;
    for (int k = 0; k < nw; k++) {
      waiting += r->warps[k].at_block;
      r->warps[k].at_block = 0;
    }
    if (waiting == 0) return true;
    for (int i = 0; i < n; i++)
      if (r->fibers[i].state == WAIT_BLOCK) r->fibers[i].state = RUNNABLE;
  }
}

// abandon leaves a fiber that has found its launch failed: back to the
// scheduler for good, so that it computes nothing from a wrong value.
[[noreturn]] inline void abandon() {
  Runner* r = runner;
  r->cur = nullptr;
  void* dead;
  keel_emu_swap(&dead, r->sched_sp);
  __builtin_unreachable();
}

// Shuffles move up to 8 bytes of any trivially copyable type.
template <typename T>
inline T exchange(unsigned mask, T v, int src, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
  Runner* r = runner;
  Fiber* f = r->cur;
  Warp* w = &r->warps[f->warp];
  const int set = f->shfl & 1;
  const unsigned tag = f->shfl + 1;
  f->shfl++;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  w->val[set][f->lane] = bits;
  w->tag[set][f->lane] = tag;
  yield(WAIT_WARP, true);
  if (mask != 0xffffffffu) {
    fail("a shuffle with mask %#x (lane %d, warp %d): the emulator models full warps only", (int)mask, f->lane, f->warp);
    abandon();
  }
  if (width <= 0 || width > 32 || (width & (width - 1))) {
    fail("shuffle width %d (lane %d, warp %d): not a power of two up to 32", width, f->lane, f->warp);
    abandon();
  }
  if (src < 0 || src >= 32 || w->tag[set][src] != tag) {
    fail("lane %d of warp %d shuffles from lane %d, which has exited or is at another shuffle", f->lane, f->warp, src);
    abandon();
  }
  T out;
  memcpy(&out, &w->val[set][src], sizeof(T));
  return out;
}

}  // namespace keel_emu

inline void __syncthreads() { keel_emu::yield(keel_emu::WAIT_BLOCK); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) {
    keel_emu::fail("__syncwarp with mask %#x (lane %d, warp %d): the emulator models full warps only", (int)mask,
                   keel_emu::runner->cur->lane, keel_emu::runner->cur->warp);
    keel_emu::abandon();
  }
  keel_emu::yield(keel_emu::WAIT_WARP);
}

// A source lane outside the caller's group of width lanes gives the
// caller's own value, as CUDA defines it.
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int laneMask, int width = 32) {
  const int lane = keel_emu::runner->cur->lane;
  const int base = lane & ~(width - 1), src = lane ^ (laneMask & 31);
  return keel_emu::exchange(mask, v, src >= base + width ? lane : src, width);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int srcLane, int width = 32) {
  const int lane = keel_emu::runner->cur->lane;
  return keel_emu::exchange(mask, v, (lane & ~(width - 1)) + (srcLane & (width - 1)), width);
}
// __any_sync: whether pred holds on any lane, on every lane (an OR over
// the warp by shuffles; the emulator models full warps).
inline int __any_sync(unsigned mask, int pred) {
  int v = pred != 0;
  for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(mask, v, o);
  return v;
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = keel_emu::runner->cur->lane;
  const int base = lane & ~(width - 1), src = lane + (int)delta;
  return keel_emu::exchange(mask, v, src < base + width ? src : lane, width);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = keel_emu::runner->cur->lane;
  const int base = lane & ~(width - 1), src = lane - (int)delta;
  return keel_emu::exchange(mask, v, src >= base ? src : lane, width);
}

// The device's bit casts and correctly rounded operations.
namespace keel_emu {
template <typename To, typename From>
inline To bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From), "bit cast between sizes");
  To out;
  memcpy(&out, &v, sizeof out);
  return out;
}
}  // namespace keel_emu
inline float __int_as_float(int i) { return keel_emu::bit_cast<float>(i); }
inline float __uint_as_float(unsigned u) { return keel_emu::bit_cast<float>(u); }
inline int __float_as_int(float f) { return keel_emu::bit_cast<int>(f); }
inline unsigned __float_as_uint(float f) { return keel_emu::bit_cast<unsigned>(f); }
inline long long __double_as_longlong(double d) { return keel_emu::bit_cast<long long>(d); }
inline double __longlong_as_double(long long i) { return keel_emu::bit_cast<double>(i); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }

// CUDA's min and max take mixed integer types and floats alike.
template <typename A, typename B>
inline typename std::common_type<A, B>::type min(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  if constexpr (std::is_floating_point<C>::value) return fmin((C)a, (C)b);
  else return (C)b < (C)a ? (C)b : (C)a;
}
template <typename A, typename B>
inline typename std::common_type<A, B>::type max(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  if constexpr (std::is_floating_point<C>::value) return fmax((C)a, (C)b);
  else return (C)a < (C)b ? (C)b : (C)a;
}

namespace keel_emu {

// call unpacks the driver's parameter array into a kernel's arguments.
template <typename... A, size_t... I>
inline void call_with(void (*k)(A...), void** p, std::index_sequence<I...>) {
  k(*static_cast<typename std::remove_reference<A>::type*>(p[I])...);
}
template <typename... A>
inline void call(void (*k)(A...), void** p) {
  call_with(k, p, std::index_sequence_for<A...>{});
}

// pack copies the values of a launch's parameters into 8-byte slots (a
// graph's copy of them), returning their number, or -1 if more than cap.
template <typename... A, size_t... I>
inline int pack_with(void (*)(A...), void** p, unsigned long* out, int cap, std::index_sequence<I...>) {
  static_assert(((sizeof(typename std::remove_reference<A>::type) <= 8) && ...), "a kernel parameter over 8 bytes");
  if ((int)sizeof...(A) > cap) return -1;
  ((out[I] = 0, memcpy(&out[I], p[I], sizeof(typename std::remove_reference<A>::type))), ...);
  return (int)sizeof...(A);
}
template <typename... A>
inline int pack(void (*k)(A...), void** p, unsigned long* out, int cap) {
  return pack_with(k, p, out, cap, std::index_sequence_for<A...>{});
}

}  // namespace keel_emu

// keel_emu_launch runs a kernel (its thunk) over the grid, blocks one after
// another, each with shared bytes of dynamic shared memory. It returns 0,
// or -1 with a message in err.
extern "C" __attribute__((visibility("default"))) int keel_emu_launch(void (*thunk)(void**), void** params,
                                                                      unsigned gx, unsigned gy, unsigned gz,
                                                                      unsigned bx, unsigned by, unsigned bz,
                                                                      unsigned shared, char* err, int errlen) {
  using namespace keel_emu;
  std::lock_guard<std::mutex> lock(launch_mu);
  const unsigned long n = (unsigned long)bx * by * bz;
  if (n == 0 || n > (unsigned long)kMaxThreads) {
    snprintf(err, errlen, "block of %u×%u×%u threads (1 to %d)", bx, by, bz, kMaxThreads);
    return -1;
  }
  Runner* r = get_runner();
  if (!r) {
    snprintf(err, errlen, "cannot map the fibers' stacks");
    return -1;
  }
  const unsigned long rounded = (shared + 15ul) / 16 * 16, pages = (rounded + 4095) / 4096;
  if (pages > dyn_pages) {
    if (dyn_map) munmap(dyn_map, (dyn_pages + 1) * 4096);
    void* m = mmap(nullptr, (pages + 1) * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      dyn_map = nullptr, dyn_pages = 0;
      snprintf(err, errlen, "cannot map %u bytes of dynamic shared memory", shared);
      return -1;
    }
    dyn_map = (unsigned char*)m, dyn_pages = pages;
    mprotect(dyn_map + pages * 4096, 4096, PROT_NONE);
  }
  dyn_shared = dyn_map ? dyn_map + dyn_pages * 4096 - rounded : nullptr;
  dyn_bytes = shared;
  r->thunk = thunk;
  r->params = params;
  r->failed = false;
  r->grid_dim = {gx, gy, gz};
  r->block_dim = {bx, by, bz};
  for (unsigned z = 0; z < gz; z++)
    for (unsigned y = 0; y < gy; y++)
      for (unsigned x = 0; x < gx; x++) {
        r->block_idx = {x, y, z};
        if (!run_block(r)) {
          snprintf(err, errlen, "block (%u,%u,%u): %s", x, y, z, r->err);
          return -1;
        }
      }
  return 0;
}
