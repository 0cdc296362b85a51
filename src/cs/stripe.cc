#include "cs/stripe.h"

#include <algorithm>
#include <limits>

namespace hixl::cs {

std::vector<std::vector<Piece>> Stripe(const std::vector<Piece>& pieces,
                                       const std::vector<LinkLoad>& links, uint64_t min_piece) {
  std::vector<size_t> up;
  double weight_sum = 0;
  for (size_t k = 0; k < links.size(); ++k) {
    if (links[k].up && links[k].weight > 0) {
      up.push_back(k);
      weight_sum += links[k].weight;
    }
  }
  if (up.empty()) return {};
  std::vector<std::vector<Piece>> out(links.size());
  uint64_t total = 0;
  for (const auto& p : pieces) total += p.len;

  if (up.size() == 1 || total < 2 * min_piece) {
    // Whole, to the link that would be done first with it.
    size_t best = up[0];
    double best_t = std::numeric_limits<double>::max();
    for (size_t k : up) {
      double t = static_cast<double>(links[k].in_flight + total) / links[k].weight;
      if (t < best_t) {
        best_t = t;
        best = k;
      }
    }
    out[best] = pieces;
    return out;
  }

  // Quotas by weight; the last up link takes what rounding left.
  std::vector<uint64_t> quota(links.size(), 0);
  uint64_t given = 0;
  for (size_t i = 0; i < up.size(); ++i) {
    size_t k = up[i];
    uint64_t q =
        i + 1 == up.size()
            ? total - given
            : static_cast<uint64_t>(static_cast<double>(total) * links[k].weight / weight_sum);
    q = std::min(q, total - given);
    quota[k] = q;
    given += q;
  }

  size_t li = 0;  // index into up
  uint64_t filled = 0;
  for (const auto& p : pieces) {
    Piece rest = p;
    while (rest.len > 0) {
      size_t k = up[li];
      uint64_t room = quota[k] > filled ? quota[k] - filled : 0;
      bool last = li + 1 == up.size();
      if (last || rest.len <= room) {
        out[k].push_back(rest);
        filled += rest.len;
        rest.len = 0;
      } else if (room < min_piece) {
        // Too little room for a piece of its own: move on to the next link.
        ++li;
        filled = 0;
        continue;
      } else {
        uint64_t take = room;
        if (rest.len - take < min_piece) take = rest.len;  // no short tail
        out[k].push_back({rest.local, rest.remote, take});
        rest.local += take;
        rest.remote += take;
        rest.len -= take;
        filled += take;
      }
      if (!last && filled >= quota[k]) {
        ++li;
        filled = 0;
      }
    }
  }
  return out;
}

}  // namespace hixl::cs
