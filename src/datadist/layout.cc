// KV-cache layout arithmetic (see layout.h).
#include "datadist/layout.h"

#include "datadist/status_util.h"

namespace llm_datadist::internal {
namespace {

constexpr uint64_t kMaxBytes = 1ull << 50;  // far above any real tensor, far below overflow

std::string Range(std::pair<int32_t, int32_t> r) {
  return "{" + std::to_string(r.first) + ", " + std::to_string(r.second) + "}";
}

}  // namespace

Status MakeLayout(uint32_t num_tensors, int32_t data_type, const std::vector<int64_t>& shape,
                  Layout& out) {
  if (num_tensors == 0 || num_tensors > kMaxTensors) {
    return ParamInvalid("num_tensors is " + std::to_string(num_tensors) + "; it must be 1.." +
                        std::to_string(kMaxTensors));
  }
  size_t elem = DataTypeSize(data_type);
  if (elem == 0) return ParamInvalid("unknown data type " + std::to_string(data_type));
  if (shape.empty() || shape.size() > kMaxDims) {
    return ParamInvalid("shape must have 1.." + std::to_string(kMaxDims) + " dimensions");
  }
  uint64_t entry = elem;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0 || static_cast<uint64_t>(shape[i]) > kMaxBytes) {
      return ParamInvalid("shape[" + std::to_string(i) + "] is " + std::to_string(shape[i]) +
                          "; every dimension must be > 0");
    }
    if (i == 0) continue;
    if (entry > kMaxBytes / static_cast<uint64_t>(shape[i])) {
      return ParamInvalid("tensor size overflows");
    }
    entry *= static_cast<uint64_t>(shape[i]);
  }
  uint64_t entries = static_cast<uint64_t>(shape[0]);
  if (entry > kMaxBytes / entries) return ParamInvalid("tensor size overflows");
  Layout l;
  l.num_tensors = num_tensors;
  l.data_type = data_type;
  l.shape = shape;
  l.entries = entries;
  l.entry_bytes = entry;
  l.tensor_bytes = entry * entries;
  out = std::move(l);
  return Status();
}

Status ResolveLayers(std::pair<int32_t, int32_t> range, uint32_t num_tensors,
                     int32_t tpl, const char* side, TensorSpan& out) {
  if (tpl <= 0 || static_cast<uint32_t>(tpl) > num_tensors || num_tensors % tpl != 0) {
    return ParamInvalid("tensor_num_per_layer " + std::to_string(tpl) + " does not divide the " +
                        side + " cache's " + std::to_string(num_tensors) + " tensors");
  }
  const int32_t layers = static_cast<int32_t>(num_tensors / tpl);
  if (range.first == -1 && range.second == -1) range = {0, layers - 1};
  if (range.first < 0 || range.second < range.first || range.second >= layers) {
    return ParamInvalid(std::string(side) + " layer range " + Range(range) +
                        " is not within the cache's layers {0, " + std::to_string(layers - 1) +
                        "} (inclusive {first, last}, or {-1, -1} for all)");
  }
  out.first = static_cast<uint32_t>(range.first) * tpl;
  out.count = static_cast<uint32_t>(range.second - range.first + 1) * tpl;
  out.first_layer = range.first;
  out.last_layer = range.second;
  return Status();
}

Status CheckSameEntries(const Layout& local, const Layout& remote) {
  if (local.data_type != remote.data_type) {
    return ParamInvalid("data types differ: local " + std::to_string(local.data_type) +
                        ", remote " + std::to_string(remote.data_type));
  }
  bool same = local.shape.size() == remote.shape.size();
  for (size_t i = 1; same && i < local.shape.size(); ++i) same = local.shape[i] == remote.shape[i];
  if (!same) {
    auto dims = [](const Layout& l) {
      std::string s = "[";
      for (size_t i = 0; i < l.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(l.shape[i]);
      return s + "]";
    };
    return ParamInvalid("shapes differ beyond the first dimension: local " + dims(local) +
                        ", remote " + dims(remote));
  }
  return Status();
}

std::vector<std::pair<uint64_t, uint64_t>> Runs(const std::vector<uint64_t>& blocks) {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i + 1;
    while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
    runs.emplace_back(blocks[i], j - i);
    i = j;
  }
  return runs;
}

Status BuildBlockDescs(const std::vector<uint64_t>& local_addrs, const Layout& local,
                       TensorSpan local_span, const std::vector<uint64_t>& local_blocks,
                       const std::vector<uint64_t>& remote_addrs, const Layout& remote,
                       TensorSpan remote_span, const std::vector<uint64_t>& remote_blocks,
                       bool dest_is_local, std::vector<hixl::TransferOpDesc>& out) {
  if (local_span.count != remote_span.count) {
    return ParamInvalid("layer ranges name different numbers of tensors: " +
                        std::to_string(local_span.count) + " locally, " +
                        std::to_string(remote_span.count) + " remotely");
  }
  if (Status s = CheckSameEntries(local, remote); !s.ok()) return s;
  if (local_blocks.size() != remote_blocks.size()) {
    return ParamInvalid("block lists differ in length: " + std::to_string(local_blocks.size()) +
                        " local, " + std::to_string(remote_blocks.size()) + " remote");
  }
  if (local_blocks.empty()) return ParamInvalid("the block lists are empty");
  const size_t n = local_blocks.size();
  for (size_t i = 0; i < n; ++i) {
    if (local_blocks[i] >= local.entries) {
      return ParamInvalid("local block " + std::to_string(local_blocks[i]) + " (index " +
                          std::to_string(i) + ") is out of range: the cache has " +
                          std::to_string(local.entries) + " blocks");
    }
    if (remote_blocks[i] >= remote.entries) {
      return ParamInvalid("remote block " + std::to_string(remote_blocks[i]) + " (index " +
                          std::to_string(i) + ") is out of range: the cache has " +
                          std::to_string(remote.entries) + " blocks");
    }
  }
  {  // Each destination block is written once.
    const auto& dst = dest_is_local ? local_blocks : remote_blocks;
    std::vector<bool> seen(dest_is_local ? local.entries : remote.entries, false);
    for (size_t i = 0; i < n; ++i) {
      if (seen[dst[i]]) {
        return ParamInvalid("destination block " + std::to_string(dst[i]) +
                            " appears twice in the block list");
      }
      seen[dst[i]] = true;
    }
  }
  // Runs where both lists advance by one.
  std::vector<std::pair<size_t, size_t>> runs;  // (start index, length)
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && local_blocks[j] == local_blocks[j - 1] + 1 &&
           remote_blocks[j] == remote_blocks[j - 1] + 1)
      ++j;
    runs.emplace_back(i, j - i);
    i = j;
  }
  const uint64_t eb = local.entry_bytes;
  out.reserve(out.size() + runs.size() * local_span.count);
  for (uint32_t t = 0; t < local_span.count; ++t) {
    const uint64_t la = local_addrs[local_span.first + t];
    const uint64_t ra = remote_addrs[remote_span.first + t];
    for (auto [start, len] : runs) {
      out.push_back({static_cast<uintptr_t>(la + local_blocks[start] * eb),
                     static_cast<uintptr_t>(ra + remote_blocks[start] * eb),
                     static_cast<size_t>(len * eb)});
    }
  }
  return Status();
}

Status BuildEntryDescs(const std::vector<uint64_t>& local_addrs, const Layout& local,
                       TensorSpan local_span, uint64_t local_index,
                       const std::vector<uint64_t>& remote_addrs, const Layout& remote,
                       TensorSpan remote_span, uint64_t remote_index, int64_t size,
                       std::vector<hixl::TransferOpDesc>& out) {
  if (local_span.count != remote_span.count) {
    return ParamInvalid("layer ranges name different numbers of tensors: " +
                        std::to_string(local_span.count) + " locally, " +
                        std::to_string(remote_span.count) + " remotely");
  }
  if (local.data_type != remote.data_type) return CheckSameEntries(local, remote);
  if (local_index >= local.entries) {
    return ParamInvalid("local batch index " + std::to_string(local_index) +
                        " is out of range: the cache has " + std::to_string(local.entries));
  }
  if (remote_index >= remote.entries) {
    return ParamInvalid("remote batch index " + std::to_string(remote_index) +
                        " is out of range: the cache has " + std::to_string(remote.entries));
  }
  uint64_t len = 0;
  if (size == -1) {
    if (Status s = CheckSameEntries(local, remote); !s.ok()) {
      return ParamInvalid(s.message() + " (give a size to move part of an entry)");
    }
    len = local.entry_bytes;
  } else {
    if (size <= 0) return ParamInvalid("size must be > 0, or -1 for a whole batch entry");
    len = static_cast<uint64_t>(size);
    if (len > local.entry_bytes || len > remote.entry_bytes) {
      return ParamInvalid("size " + std::to_string(size) +
                          " is larger than a batch entry of the cache (local " +
                          std::to_string(local.entry_bytes) + " bytes, remote " +
                          std::to_string(remote.entry_bytes) + " bytes)");
    }
  }
  for (uint32_t t = 0; t < local_span.count; ++t) {
    out.push_back(
        {static_cast<uintptr_t>(local_addrs[local_span.first + t] + local_index * local.entry_bytes),
         static_cast<uintptr_t>(remote_addrs[remote_span.first + t] +
                                remote_index * remote.entry_bytes),
         static_cast<size_t>(len)});
  }
  return Status();
}

}  // namespace llm_datadist::internal
