// mnist_data.hpp — MNIST / Fashion-MNIST in the idx format, for hvd-mnist.
//
// Reads the four standard files of a directory (train-images-idx3-ubyte,
// train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte), each either plain or
// gzipped with a .gz suffix, checks them (magic numbers, 28x28 images, counts that match between
// images and labels, labels 0-9, sizes that match the headers) and returns normalized tensors.
#ifndef HVD_MNIST_DATA_HPP
#define HVD_MNIST_DATA_HPP

#include <torch/torch.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mnist {

constexpr int64_t kRows = 28;
constexpr int64_t kCols = 28;
constexpr int64_t kClasses = 10;
// The usual MNIST normalization: (x / 255 - kMean) / kStd.
constexpr double kMean = 0.1307;
constexpr double kStd = 0.3081;

// What the loader throws: a one-line message that names the file.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Dataset {
  torch::Tensor images;                  // float32 [n, 1, 28, 28], normalized, on the CPU
  torch::Tensor labels;                  // int64 [n], 0-9
  std::string images_path, labels_path;  // the files read
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

struct Data {
  Dataset train, validation;
};

// Loads `dir`. A limit > 0 keeps only the first `limit` samples of that set (the whole files
// are still read and checked). Throws DataError.
Data load(const std::string& dir, int64_t train_limit = 0, int64_t validation_limit = 0);

}  // namespace mnist

#endif  // HVD_MNIST_DATA_HPP
