/* hipress CUDA emulation: run generated CUDA C on the CPU, one thread block at a time.
 *
 * hipress.compll.cuda_emu compiles a generated .cu file as C++ with this header included first
 * (g++ -include), then appends an entry per kernel taking a pointer to its argument struct. What the generated kernels use is
 * all there is here: __global__/__device__, __shared__ arrays, __syncthreads() in code every
 * thread of the block executes, x-dimension indices, __threadfence(), atomicAdd/atomicExch on
 * unsigned ints and the float/int bit casts. Everything else is plain C++.
 *
 * Each thread of a block is a fiber with a stack of its own; a fiber runs until it reaches
 * __syncthreads() or returns, then the next one runs. When every thread of the block waits at the
 * same barrier, all are released; a barrier reached by only some threads (the others returned or
 * wait at another barrier) ends the launch with an error instead of hanging or passing silently.
 * Blocks run one after another. Threads (per barrier phase) and blocks run in the forward order
 * or in a seeded shuffle: a missing barrier shows up as a wrong result in the shuffled order.
 * __shared__ variables are static (one copy per OS thread): blocks never overlap, and several OS
 * threads may run kernels at once.
 *
 * Fibers switch with a few instructions on x86-64 and AArch64, elsewhere (and under
 * HP_EMU_UCONTEXT) with ucontext. Under AddressSanitizer the switches are annotated
 * (__sanitizer_start_switch_fiber) so that it follows the stacks.
 */
#ifndef HP_CUDA_EMU_H
#define HP_CUDA_EMU_H

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>

using std::ceil;
using std::floor;
using std::rint;
using std::trunc;

#if defined(__SANITIZE_ADDRESS__)
#define HP_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HP_EMU_ASAN 1
#endif
#endif
#ifdef HP_EMU_ASAN
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom,
                                               size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                                size_t* size_old);
#endif

#if !defined(HP_EMU_UCONTEXT) && !defined(__x86_64__) && !defined(__aarch64__)
#define HP_EMU_UCONTEXT 1
#endif
#ifdef HP_EMU_UCONTEXT
#include <ucontext.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static thread_local
#define __restrict__ __restrict

struct hp_emu_dim3 {
  unsigned int x, y, z;
};

namespace hp_emu {

enum { READY = 0, WAITING = 1, DONE = 2 };

struct Fiber {
  void* sp;  // saved stack pointer (own switch)
#ifdef HP_EMU_UCONTEXT
  ucontext_t uc;
#endif
  char* stack;
  unsigned int tid;
  int state;
  int site;  // source line of the barrier it waits at
#ifdef HP_EMU_ASAN
  void* fake;
#endif
};

typedef void (*Kernel)(const void* args);

struct Sched {
  Fiber* fibers = nullptr;
  char* stacks = nullptr;
  unsigned int capacity = 0;
  size_t stack_size = 0;
  void* main_sp = nullptr;
#ifdef HP_EMU_UCONTEXT
  ucontext_t main_uc;
#endif
#ifdef HP_EMU_ASAN
  void* main_fake = nullptr;
  const void* main_bottom = nullptr;
  size_t main_size = 0;
#endif
  Fiber* cur = nullptr;
  hp_emu_dim3 block_idx{0, 0, 0}, block_dim{1, 1, 1}, grid_dim{1, 1, 1};
  Kernel kernel = nullptr;
  const void* args = nullptr;
};

static thread_local Sched S;

/* ---- context switch ---- */

#ifndef HP_EMU_UCONTEXT
extern "C" void hp_emu_swap(void** save_sp, void* next_sp);
#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".hidden hp_emu_swap\n"
    ".globl hp_emu_swap\n"
    ".type hp_emu_swap,@function\n"
    "hp_emu_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size hp_emu_swap,.-hp_emu_swap\n");
#elif defined(__aarch64__)
__asm__(
    ".text\n"
    ".hidden hp_emu_swap\n"
    ".globl hp_emu_swap\n"
    ".type hp_emu_swap,%function\n"
    "hp_emu_swap:\n"
    "  sub sp, sp, #176\n"
    "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n  mrs x9, fpcr\n  str x9, [sp, #160]\n"
    "  mov x9, sp\n  str x9, [x0]\n  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n  ldr x9, [sp, #160]\n  msr fpcr, x9\n"
    "  add sp, sp, #176\n"
    "  ret\n"
    ".size hp_emu_swap,.-hp_emu_swap\n");
#endif
#endif

[[noreturn]] static void fiber_main();

#ifdef HP_EMU_UCONTEXT
static void fiber_entry_uc() { fiber_main(); }
#endif

/* A fresh stack whose first switch to it enters fiber_main. */
static void prepare(Fiber* f) {
#ifdef HP_EMU_UCONTEXT
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = f->stack;
  f->uc.uc_stack.ss_size = S.stack_size;
  f->uc.uc_link = nullptr;
  makecontext(&f->uc, fiber_entry_uc, 0);
#else
  uintptr_t top = ((uintptr_t)(f->stack + S.stack_size)) & ~(uintptr_t)15;
  uint64_t* sp = (uint64_t*)top;
#if defined(__x86_64__)
  unsigned int csr;
  unsigned short cw;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  __asm__ volatile("fnstcw %0" : "=m"(cw));
  *--sp = 0;                            // fiber_main's return address (it never returns)
  *--sp = (uint64_t)(uintptr_t)&fiber_main;  // where `ret` goes
  for (int k = 0; k < 6; k++) *--sp = 0;     // rbp rbx r12 r13 r14 r15
  *--sp = (uint64_t)csr | ((uint64_t)cw << 32);
#else
  sp -= 22;  // 176 bytes: x19..x30, d8..d15, fpcr
  memset(sp, 0, 176);
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  sp[11] = (uint64_t)(uintptr_t)&fiber_main;  // x30: where `ret` goes
  sp[20] = fpcr;
#endif
  f->sp = sp;
#endif
}

static inline void to_fiber(Fiber* f) {
  S.cur = f;
#ifdef HP_EMU_ASAN
  __sanitizer_start_switch_fiber(&S.main_fake, f->stack, S.stack_size);
#endif
#ifdef HP_EMU_UCONTEXT
  swapcontext(&S.main_uc, &f->uc);
#else
  hp_emu_swap(&S.main_sp, f->sp);
#endif
#ifdef HP_EMU_ASAN
  __sanitizer_finish_switch_fiber(S.main_fake, nullptr, nullptr);
#endif
}

static inline void fiber_entered(Fiber* f) {
#ifdef HP_EMU_ASAN
  __sanitizer_finish_switch_fiber(f->fake, &S.main_bottom, &S.main_size);
#else
  (void)f;
#endif
}

static inline void to_main(Fiber* f, bool dying) {
#ifdef HP_EMU_ASAN
  __sanitizer_start_switch_fiber(dying ? nullptr : &f->fake, S.main_bottom, S.main_size);
#else
  (void)dying;
#endif
#ifdef HP_EMU_UCONTEXT
  swapcontext(&f->uc, &S.main_uc);
#else
  hp_emu_swap(&f->sp, S.main_sp);
#endif
  fiber_entered(f);
}

[[noreturn]] static void fiber_main() {
  Fiber* f = S.cur;
  fiber_entered(f);
  S.kernel(S.args);
  f->state = DONE;
  to_main(f, true);
  abort();  // a finished fiber is never resumed
}

/* ---- barriers ---- */

static void barrier(int site) {
  Fiber* f = S.cur;
  f->state = WAITING;
  f->site = site;
  to_main(f, false);
}

/* ---- the launch ---- */

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  void shuffle(unsigned int* v, unsigned int n) {
    for (unsigned int k = n; k > 1; k--) {
      const unsigned int j = (unsigned int)(next() % k);
      const unsigned int t = v[k - 1];
      v[k - 1] = v[j];
      v[j] = t;
    }
  }
};

static bool reserve(unsigned int nt, char* err, int errlen) {
  if (nt <= S.capacity) return true;
  const size_t size = (size_t)256 << 10;  // per thread (reserved, touched lazily)
  void* mem = mmap(nullptr, size * nt, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) {
    snprintf(err, (size_t)errlen, "cannot reserve %u fiber stacks", nt);
    return false;
  }
  Fiber* fibers = (Fiber*)calloc(nt, sizeof(Fiber));
  if (fibers == nullptr) {
    munmap(mem, size * nt);
    snprintf(err, (size_t)errlen, "out of memory for %u fibers", nt);
    return false;
  }
  if (S.stacks != nullptr) munmap(S.stacks, S.stack_size * S.capacity);
  free(S.fibers);
  S.stacks = (char*)mem;
  S.fibers = fibers;
  S.stack_size = size;
  S.capacity = nt;
  for (unsigned int t = 0; t < nt; t++) S.fibers[t].stack = S.stacks + size * t;
  return true;
}

/* Runs one block to completion; 0, or 1 with a message in err. */
static int run_block(unsigned int nt, Rng* rng, bool shuffle, unsigned int* order, char* err,
                     int errlen) {
  for (unsigned int t = 0; t < nt; t++) {
    Fiber* f = &S.fibers[t];
    f->tid = t;
    f->state = READY;
    f->site = 0;
    prepare(f);
    order[t] = t;
  }
  for (long long phase = 0;; phase++) {
    if (shuffle) rng->shuffle(order, nt);
    for (unsigned int k = 0; k < nt; k++) {
      Fiber* f = &S.fibers[order[k]];
      if (f->state == READY) to_fiber(f);
    }
    unsigned int waiting = 0, done = 0;
    int site = -1, other = -1;
    for (unsigned int t = 0; t < nt; t++) {
      const Fiber* f = &S.fibers[t];
      if (f->state == DONE) {
        done++;
      } else {
        waiting++;
        if (site < 0) site = f->site;
        else if (f->site != site) other = f->site;
      }
    }
    if (waiting == 0) return 0;
    if (done > 0) {
      snprintf(err, (size_t)errlen,
               "block %u: the __syncthreads() at line %d was reached by %u of %u threads "
               "(the others returned)", S.block_idx.x, site, waiting, nt);
      return 1;
    }
    if (other >= 0) {
      snprintf(err, (size_t)errlen,
               "block %u: threads wait at different __syncthreads() (lines %d and %d)",
               S.block_idx.x, site, other);
      return 1;
    }
    for (unsigned int t = 0; t < nt; t++) S.fibers[t].state = READY;
  }
}

}  // namespace hp_emu

/* ---- what kernels see ---- */

#define threadIdx (hp_emu_dim3{hp_emu::S.cur->tid, 0u, 0u})
#define blockIdx (hp_emu::S.block_idx)
#define blockDim (hp_emu::S.block_dim)
#define gridDim (hp_emu::S.grid_dim)
#define __syncthreads() hp_emu::barrier(__LINE__)
static inline void __threadfence() { __asm__ volatile("" ::: "memory"); }
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  const unsigned int old = *p;
  *p = old + v;
  return old;
}
static inline unsigned int atomicExch(unsigned int* p, unsigned int v) {
  const unsigned int old = *p;
  *p = v;
  return old;
}
static inline float __int_as_float(int x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static inline float __uint_as_float(unsigned int x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static inline unsigned int __float_as_uint(float x) {
  unsigned int u;
  memcpy(&u, &x, 4);
  return u;
}
static inline int __float_as_int(float x) {
  int u;
  memcpy(&u, &x, 4);
  return u;
}
static inline long long __double_as_longlong(double x) {
  long long u;
  memcpy(&u, &x, 8);
  return u;
}
static inline double __longlong_as_double(long long x) {
  double d;
  memcpy(&d, &x, 8);
  return d;
}

namespace hp_emu {
/* Float32 denormals flushed to zero, as inputs and as results (a GPU's .ftz instructions),
 * while `on`: the CPU's floating-point control register, saved and restored by the caller. The
 * fibers of a launch start from the value it has when they are prepared. Returns false where
 * the CPU has no such mode here. */
static bool flush_denormals(bool on, uint64_t* saved) {
#if defined(__x86_64__)
  unsigned int csr;
  __asm__ volatile("stmxcsr %0" : "=m"(csr));
  *saved = csr;
  if (on) {
    csr |= 0x8040u;  // FTZ (bit 15) and DAZ (bit 6)
    __asm__ volatile("ldmxcsr %0" : : "m"(csr));
  }
  return true;
#elif defined(__aarch64__)
  uint64_t fpcr;
  __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
  *saved = fpcr;
  if (on) {
    fpcr |= (uint64_t)1 << 24;  // FZ: flush inputs and results
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
  }
  return true;
#else
  (void)saved;
  return !on;
#endif
}

static void restore_denormals(uint64_t saved) {
#if defined(__x86_64__)
  unsigned int csr = (unsigned int)saved;
  __asm__ volatile("ldmxcsr %0" : : "m"(csr));
#elif defined(__aarch64__)
  __asm__ volatile("msr fpcr, %0" : : "r"(saved));
#else
  (void)saved;
#endif
}
/* The blocks of one launch, one after another (hp_emu_launch). */
static int launch_grid(Kernel kernel, const void* args, unsigned int grid, unsigned int block,
                       unsigned long long seed, int shuffle, char* err, int errlen) {
  if (!reserve(block, err, errlen)) return 1;
  unsigned int* blocks = (unsigned int*)malloc(sizeof(unsigned int) * grid);
  unsigned int* order = (unsigned int*)malloc(sizeof(unsigned int) * block);
  if (blocks == nullptr || order == nullptr) {
    free(blocks);
    free(order);
    snprintf(err, (size_t)errlen, "out of memory");
    return 1;
  }
  Rng rng{seed};
  for (unsigned int b = 0; b < grid; b++) blocks[b] = b;
  if (shuffle) rng.shuffle(blocks, grid);
  S.kernel = kernel;
  S.args = args;
  S.grid_dim = hp_emu_dim3{grid, 1, 1};
  S.block_dim = hp_emu_dim3{block, 1, 1};
  int rc = 0;
  for (unsigned int k = 0; k < grid && rc == 0; k++) {
    S.block_idx = hp_emu_dim3{blocks[k], 0, 0};
    rc = run_block(block, &rng, shuffle != 0, order, err, errlen);
  }
  S.cur = nullptr;
  free(blocks);
  free(order);
  return rc;
}
}  // namespace hp_emu

/* Runs kernel over a grid of `grid` blocks of `block` threads; shuffle != 0 runs blocks and
 * threads in an order drawn from `seed`; ftz != 0 flushes float32 denormals as a GPU's .ftz
 * instructions do. Returns 0, or 1 with a message in err. */
extern "C" int hp_emu_launch(hp_emu::Kernel kernel, const void* args, unsigned int grid,
                             unsigned int block, unsigned long long seed, int shuffle, int ftz,
                             char* err, int errlen) {
  using namespace hp_emu;
  err[0] = '\0';
  if (grid < 1 || block < 1) {
    snprintf(err, (size_t)errlen, "empty launch (grid %u, block %u)", grid, block);
    return 1;
  }
  uint64_t fp_saved = 0;
  if (!flush_denormals(ftz != 0, &fp_saved)) {
    snprintf(err, (size_t)errlen, "flush-to-zero emulation is not supported on this CPU");
    return 1;
  }
  int rc = launch_grid(kernel, args, grid, block, seed, shuffle, err, errlen);
  restore_denormals(fp_saved);
  return rc;
}

#endif
