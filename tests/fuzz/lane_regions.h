// The fake region table fuzz_lane checks tcp data-lane requests against, and
// that make_seeds builds its lane seeds for. Addresses are never
// dereferenced: only the validator sees them.
#ifndef HIXL_TESTS_FUZZ_LANE_REGIONS_H_
#define HIXL_TESTS_FUZZ_LANE_REGIONS_H_

#include <cstddef>
#include <cstdint>

#include "hixl/hixl.h"

namespace hixl_fuzz {

struct LaneRegion {
  uint64_t addr;
  uint64_t len;
  uint32_t perms;
};

// Two adjacent regions (a request spanning both lies in neither), a
// write-only one larger than the largest slice, and one ending just short of
// the top of the address space.
inline constexpr LaneRegion kLaneRegions[] = {
    {0x7f0000000000, 0x10000, hixl::MEM_PERM_READ_WRITE},
    {0x7f0000010000, 0x2000, hixl::MEM_PERM_READ},
    {0x7f0000100000, 0x4001000, hixl::MEM_PERM_WRITE},
    {0xffffffffffff0000, 0xf000, hixl::MEM_PERM_READ_WRITE},
};

}  // namespace hixl_fuzz

#endif  // HIXL_TESTS_FUZZ_LANE_REGIONS_H_
