// KV-cache layout arithmetic: validated cache shapes, layer ranges, and the
// engine descriptors of a block or batch-entry transfer (contiguous runs of
// blocks merged, one descriptor per tensor per run).
// Thread safety: stateless functions.
#ifndef HIXL_DATADIST_LAYOUT_H_
#define HIXL_DATADIST_LAYOUT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hixl/hixl.h"
#include "llm_datadist/llm_datadist.h"

namespace llm_datadist::internal {

inline constexpr uint32_t kMaxTensors = 1u << 16;
inline constexpr size_t kMaxDims = 16;

// A cache's shape, checked: every dimension > 0, sizes without overflow.
struct Layout {
  uint32_t num_tensors = 0;
  int32_t data_type = 0;
  std::vector<int64_t> shape;
  uint64_t entries = 0;       // shape[0]: batch entries or blocks
  uint64_t entry_bytes = 0;   // bytes of one entry of one tensor
  uint64_t tensor_bytes = 0;  // entries * entry_bytes
};

Status MakeLayout(uint32_t num_tensors, int32_t data_type, const std::vector<int64_t>& shape,
                  Layout& out);

// The tensors [first, first + count) an inclusive layer range names.
struct TensorSpan {
  uint32_t first = 0;
  uint32_t count = 0;
  int32_t first_layer = 0;
  int32_t last_layer = 0;
};
// side: "source"/"destination", for the message.
Status ResolveLayers(std::pair<int32_t, int32_t> range, uint32_t num_tensors,
                     int32_t tensor_num_per_layer, const char* side, TensorSpan& out);

// Checks that two caches hold the same kind of entry (data type and the
// dimensions after the first), as a block copy between them needs.
Status CheckSameEntries(const Layout& local, const Layout& remote);

// Block transfer: local_blocks[i] <-> remote_blocks[i] for every tensor of
// the spans (of equal count). dest_is_local: which side's list must have no
// duplicates. Appends descriptors.
Status BuildBlockDescs(const std::vector<uint64_t>& local_addrs, const Layout& local,
                       TensorSpan local_span, const std::vector<uint64_t>& local_blocks,
                       const std::vector<uint64_t>& remote_addrs, const Layout& remote,
                       TensorSpan remote_span, const std::vector<uint64_t>& remote_blocks,
                       bool dest_is_local, std::vector<hixl::TransferOpDesc>& out);

// Whole-cache transfer of one batch entry per tensor: `size` bytes (-1: the
// whole entry) of local entry local_index <-> remote entry remote_index.
Status BuildEntryDescs(const std::vector<uint64_t>& local_addrs, const Layout& local,
                       TensorSpan local_span, uint64_t local_index,
                       const std::vector<uint64_t>& remote_addrs, const Layout& remote,
                       TensorSpan remote_span, uint64_t remote_index, int64_t size,
                       std::vector<hixl::TransferOpDesc>& out);

// Contiguous runs of a block list: (first block, count) pairs in list order.
std::vector<std::pair<uint64_t, uint64_t>> Runs(const std::vector<uint64_t>& blocks);

}  // namespace llm_datadist::internal

#endif  // HIXL_DATADIST_LAYOUT_H_
