// DistributedSampler (declared in ddp.h): each rank's share of a dataset, the same order on every rank.
#include "tandem/core/random.h"
#include "tandem/dist/ddp.h"

namespace tandem::dist {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : dataset_size_(dataset_size), rank_(rank), world_size_(world_size), shuffle_(shuffle), seed_(seed),
      drop_last_(drop_last) {
  TANDEM_CHECK_AS(ValueError, world_size >= 1 && rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank,
                  " is not in a world of ", world_size);
  TANDEM_CHECK_AS(ValueError, dataset_size >= 0, "DistributedSampler: negative dataset size");
  num_samples_ = drop_last ? dataset_size / world_size : (dataset_size + world_size - 1) / world_size;
}

int64_t DistributedSampler::num_real_samples() const {
  // This rank takes positions rank, rank + world, ... of the padded order; those below the
  // dataset size are real.
  int64_t real = dataset_size_ > rank_ ? (dataset_size_ - rank_ + world_size_ - 1) / world_size_ : 0;
  return std::min(real, num_samples_);
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  if (shuffle_) {
    Generator gen(seed_ + static_cast<uint64_t>(epoch));
    order = randperm(dataset_size_, &gen).to_vector<int64_t>();
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) order[i] = i;
  }
  int64_t total = num_samples_ * world_size_;
  // Pad by wrapping around (a dataset smaller than the world repeats as often as needed).
  for (int64_t i = dataset_size_; i < total && dataset_size_ > 0; ++i) order.push_back(order[i % dataset_size_]);
  std::vector<int64_t> mine;
  for (int64_t i = rank_; i < total; i += world_size_) mine.push_back(order[i]);
  return mine;
}

}  // namespace tandem::dist
