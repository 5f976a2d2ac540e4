#pragma once
// IDX files, the format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/):
//
//   [4 bytes]         0x00 0x00 <type> <ndims>
//   [4 * ndims bytes] the sizes, big-endian u32, outermost first
//   [rest]            the elements in row-major order, big-endian
//
// Either plain or gzip-compressed (told apart by the first bytes, whatever the file's name).
#include <cstddef>
#include <cstdint>
#include <string>

#include "tandem/core/tensor.h"

namespace tandem::data {

// Reads an IDX file. Element types map to the closest tandem dtype: 0x08 (u8) -> u8,
// 0x09 (i8), 0x0B (i16), 0x0C (i32) -> i32, 0x0D (f32) -> f32, 0x0E (f64) -> f64.
// A wrong magic, 0 or more than 4 dims, a zero size, a tensor over 4 GiB, a truncated file or
// bytes after the data are ValueErrors naming the file (and the expected and actual sizes).
Tensor read_idx(const std::string& path);
// The same from a whole file's bytes, plain or gzip; `source` names it in error messages.
Tensor parse_idx(const uint8_t* data, size_t size, const std::string& source = "<buffer>");

struct FashionMnist {
  Tensor images;  // (N, 1, 28, 28) f32 in [0, 1]
  Tensor labels;  // (N,) i64 in [0, 10)
};
inline constexpr int64_t kFashionMnistClasses = 10;
// "T-shirt/top", "Trouser", ..., "Ankle boot"; throws an IndexError outside [0, 10).
const char* fashion_mnist_class_name(int64_t label);

// Loads the training set (60000 images) or the test set (10000) from `dir`, which holds
// {train,t10k}-{images-idx3,labels-idx1}-ubyte, each plain or with .gz. An empty `dir` means
// default_fashion_mnist_dir().
FashionMnist load_fashion_mnist(const std::string& dir = "", bool train = true);

// Where the data is when no directory is given, the first of: $TANDEM_DATA_DIR/fashion-mnist,
// $TANDEM_DATA_DIR itself, and where Debian's package dataset-fashion-mnist installs it. A
// ValueError lists the places looked in when none holds the files.
std::string default_fashion_mnist_dir();

}  // namespace tandem::data
