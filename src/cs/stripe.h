// How one batch is spread over a client's links: each up link gets a share
// of the bytes in proportion to its weight (its measured speed), descriptors
// cut at the share boundaries; a batch too small to be worth cutting goes
// whole to the link that would finish it first.
// Thread safety: stateless functions.
#ifndef HIXL_CS_STRIPE_H_
#define HIXL_CS_STRIPE_H_

#include <cstdint>
#include <vector>

namespace hixl::cs {

struct Piece {
  uint64_t local = 0;
  uint64_t remote = 0;
  uint64_t len = 0;
};

struct LinkLoad {
  bool up = false;
  double weight = 0;       // bytes per second, > 0 for an up link
  uint64_t in_flight = 0;  // bytes posted on it and not finished
};

// Splits `pieces` over the links (result[k]: link k's pieces, in order).
// Batches under 2 * min_piece bytes, or with one up link, are not cut. No
// piece of a cut is shorter than min_piece unless its descriptor was.
// Links that are not up get nothing; with no up link the result is empty.
std::vector<std::vector<Piece>> Stripe(const std::vector<Piece>& pieces,
                                       const std::vector<LinkLoad>& links, uint64_t min_piece);

}  // namespace hixl::cs

#endif  // HIXL_CS_STRIPE_H_
