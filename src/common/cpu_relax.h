// CpuRelax: one spin-wait hint to the CPU (x86 PAUSE, Arm YIELD), for the
// bounded polling loops that wait microseconds for another thread or the
// network instead of sleeping. Thread-safe (touches no memory).
#ifndef HIXL_COMMON_CPU_RELAX_H_
#define HIXL_COMMON_CPU_RELAX_H_

namespace hixl {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace hixl

#endif  // HIXL_COMMON_CPU_RELAX_H_
