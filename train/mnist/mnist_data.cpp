// mnist_data.cpp — the idx reader of hvd-mnist (mnist_data.hpp).
#include "mnist_data.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

namespace mnist {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr int64_t kPixels = kRows * kCols;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// A file read through zlib: gzipped or plain (gzread passes plain files through).
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {
    errno = 0;
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr)
      throw DataError(path_ +
                      ": cannot open: " + (errno != 0 ? std::strerror(errno) : "out of memory"));
    (void)gzbuffer(file_, 1 << 17);
  }
  ~Reader() {
    if (file_ != nullptr) (void)gzclose(file_);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }

  // Up to n bytes into buf; fewer only where the data ends. A read error, a corrupt gzip stream
  // or one cut short throws.
  size_t read(void* buf, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, size_t{1} << 30));
      const int got = gzread(file_, static_cast<char*>(buf) + done, chunk);
      if (got < 0) throw failure();
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    if (done < n) {
      // The end of the data: zlib says Z_BUF_ERROR when it came in the middle of a gzip stream.
      int code = Z_OK;
      (void)gzerror(file_, &code);
      if (code == Z_BUF_ERROR)
        throw DataError(path_ + ": truncated: the gzip stream ends before its end marker");
      if (code != Z_OK) throw failure();
    }
    return done;
  }

  // Reads exactly `n` bytes of the body that follows the header, growing the buffer only as the
  // data actually arrives (a header announcing absurd counts cannot make us allocate them).
  std::vector<uint8_t> read_body(uint64_t n, const std::string& what) {
    std::vector<uint8_t> out;
    while (out.size() < n) {
      const size_t old = out.size();
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - old, uint64_t{1} << 22));
      out.resize(old + chunk);
      const size_t got = read(out.data() + old, chunk);
      out.resize(old + got);
      if (got < chunk) break;
    }
    if (out.size() < n)
      throw DataError(path_ + ": truncated: its header announces " + what + " (" +
                      std::to_string(n) + " bytes after the header) but only " +
                      std::to_string(out.size()) + " bytes follow");
    uint8_t extra = 0;
    if (read(&extra, 1) != 0)
      throw DataError(path_ + ": has more data than its header announces (" + what + ")");
    return out;
  }

 private:
  DataError failure() const {
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code == Z_ERRNO) return DataError(path_ + ": read error: " + std::strerror(errno));
    std::string text = message != nullptr ? message : "zlib error";
    if (text.rfind(path_ + ": ", 0) == 0) text.erase(0, path_.size() + 2);  // zlib names the file
    return DataError(path_ + ": cannot read: " + text +
                     (code == Z_DATA_ERROR ? " (a corrupt gzip file)" : ""));
  }

  std::string path_;
  gzFile file_ = nullptr;
};

// Reads the header's `words` big-endian 32-bit words; a short file is a clear error.
std::vector<uint32_t> read_header(Reader& r, size_t words, const char* kind) {
  std::vector<uint8_t> raw(words * 4);
  const size_t got = r.read(raw.data(), raw.size());
  if (got < raw.size())
    throw DataError(r.path() + ": truncated: " + std::to_string(got) + " bytes, shorter than the " +
                    std::to_string(raw.size()) + "-byte header of an idx " + kind + " file");
  std::vector<uint32_t> out(words);
  for (size_t i = 0; i < words; ++i) out[i] = be32(raw.data() + 4 * i);
  return out;
}

void check_magic(const Reader& r, uint32_t magic, uint32_t expected, const char* kind) {
  if (magic == expected) return;
  std::string hint;
  if (magic == kImagesMagic) hint = " (an image file where labels were expected)";
  if (magic == kLabelsMagic) hint = " (a label file where images were expected)";
  throw DataError(r.path() + ": not an idx " + kind + " file: magic number " + hex32(magic) +
                  ", expected " + hex32(expected) + hint);
}

struct Raw {
  std::string path;
  uint64_t count = 0;
  std::vector<uint8_t> bytes;
};

Raw read_images(const std::string& path) {
  Reader r(path);
  const std::vector<uint32_t> h = read_header(r, 4, "image (idx3-ubyte)");
  check_magic(r, h[0], kImagesMagic, "image (idx3-ubyte)");
  if (h[2] != kRows || h[3] != kCols)
    throw DataError(path + ": images are " + std::to_string(h[2]) + "x" + std::to_string(h[3]) +
                    ", expected " + std::to_string(kRows) + "x" + std::to_string(kCols));
  if (h[1] == 0) throw DataError(path + ": holds no images");
  Raw raw{path, h[1], {}};
  raw.bytes = r.read_body(raw.count * kPixels, std::to_string(raw.count) + " images of 28x28");
  return raw;
}

Raw read_labels(const std::string& path) {
  Reader r(path);
  const std::vector<uint32_t> h = read_header(r, 2, "label (idx1-ubyte)");
  check_magic(r, h[0], kLabelsMagic, "label (idx1-ubyte)");
  if (h[1] == 0) throw DataError(path + ": holds no labels");
  Raw raw{path, h[1], {}};
  raw.bytes = r.read_body(raw.count, std::to_string(raw.count) + " labels");
  for (size_t i = 0; i < raw.bytes.size(); ++i)
    if (raw.bytes[i] >= kClasses)
      throw DataError(path + ": label " + std::to_string(raw.bytes[i]) + " at index " +
                      std::to_string(i) + " is not a class 0-9");
  return raw;
}

// dir/name, else dir/name.gz; an error saying how to get the files when neither is there.
std::string find_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {name, name + ".gz"}) {
    std::error_code ec;
    const fs::path p = fs::path(dir) / candidate;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  throw DataError("'" + dir + "' has no " + name + " (nor " + name +
                  ".gz): run scripts/make-mnist.sh (it writes build/data/mnist-digits) or point "
                  "--data-dir at a directory of MNIST or Fashion-MNIST idx files");
}

Dataset load_set(const std::string& dir, const std::string& prefix, int64_t limit) {
  const Raw images = read_images(find_file(dir, prefix + "-images-idx3-ubyte"));
  const Raw labels = read_labels(find_file(dir, prefix + "-labels-idx1-ubyte"));
  if (images.count != labels.count)
    throw DataError(images.path + " holds " + std::to_string(images.count) + " images but " +
                    labels.path + " holds " + std::to_string(labels.count) + " labels");
  int64_t n = static_cast<int64_t>(images.count);
  if (limit > 0) n = std::min(n, limit);
  Dataset set;
  set.images_path = images.path;
  set.labels_path = labels.path;
  // from_blob borrows the bytes; to() copies them into tensors of their own.
  auto* pixels = const_cast<uint8_t*>(images.bytes.data());
  auto* classes = const_cast<uint8_t*>(labels.bytes.data());
  set.images = torch::from_blob(pixels, {n, 1, kRows, kCols}, torch::kUInt8)
                   .to(torch::kFloat32)
                   .div_(255.0)
                   .sub_(kMean)
                   .div_(kStd);
  set.labels = torch::from_blob(classes, {n}, torch::kUInt8).to(torch::kInt64);
  return set;
}

}  // namespace

Data load(const std::string& dir, int64_t train_limit, int64_t validation_limit) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError("data directory '" + dir + "' " +
                    (fs::exists(dir, ec) ? "is not a directory" : "does not exist") +
                    ": run scripts/make-mnist.sh (it writes build/data/mnist-digits) or point "
                    "--data-dir at a directory of MNIST or Fashion-MNIST idx files");
  Data data;
  data.train = load_set(dir, "train", train_limit);
  data.validation = load_set(dir, "t10k", validation_limit);
  return data;
}

}  // namespace mnist
