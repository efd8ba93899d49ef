#include <ditrl/error.hpp>
#include <ditrl/io/file_descriptor.hpp>
#include <ditrl/io/safetensors.hpp>

#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <boost/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; this reader copies bytes");

namespace ditrl::io {

namespace json = boost::json;

// The bytes of a file (a private, copy-on-write mapping) or of a buffer.
class MappedBytes {
 public:
  static std::shared_ptr<const MappedBytes> map_file(const std::string& path) {
    auto bytes = std::shared_ptr<MappedBytes>(new MappedBytes());
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open safetensors file {}: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      fail("{} is not a regular file", path);
    }
    bytes->size_ = static_cast<size_t>(st.st_size);
    if (bytes->size_ > 0) {
      void* addr = ::mmap(nullptr, bytes->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (addr == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        fail("cannot map safetensors file {} ({} bytes): {}", path, bytes->size_, std::strerror(err));
      }
      bytes->data_ = static_cast<uint8_t*>(addr);
      bytes->mapped_ = true;
    }
    bytes->fd_ = fd;  // kept for copy_out's preads
    return bytes;
  }

  static std::shared_ptr<const MappedBytes> own(std::vector<uint8_t> buffer) {
    auto bytes = std::shared_ptr<MappedBytes>(new MappedBytes());
    bytes->buffer_ = std::move(buffer);
    bytes->data_ = bytes->buffer_.data();
    bytes->size_ = bytes->buffer_.size();
    return bytes;
  }

  ~MappedBytes() {
    if (mapped_) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
  }

  // Copies bytes [offset, offset + n) to `out` with pread: the bytes go from
  // the page cache straight into `out`, so reading a slice maps none of the
  // file into this process (nothing of it counts in its resident set) and
  // the whole-file mapping (whose pages view() may write) is not touched.
  void copy_out(size_t offset, size_t n, uint8_t* out, const std::string& path) const {
    if (fd_ < 0) {
      std::memcpy(out, data_ + offset, n);
      return;
    }
    while (n > 0) {
      const ssize_t got = ::pread(fd_, out, std::min(n, kMaxRead), static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        fail("cannot read {} bytes of {} at {}: {}", n, path, offset, got < 0 ? std::strerror(errno) : "end of file");
      offset += static_cast<size_t>(got);
      out += got;
      n -= static_cast<size_t>(got);
    }
  }
  MappedBytes(const MappedBytes&) = delete;
  MappedBytes& operator=(const MappedBytes&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedBytes() = default;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  int fd_ = -1;
  std::vector<uint8_t> buffer_;
  // Linux reads at most 0x7ffff000 bytes per call; 1 GiB keeps each call whole.
  static constexpr size_t kMaxRead = size_t{1} << 30;
};

namespace {

struct DtypeCode {
  const char* code;
  int bits;
};

// Every code of the format (docs/families.md §8.1).
constexpr DtypeCode kDtypeCodes[] = {
    {"BOOL", 8},    {"U8", 8},   {"I8", 8},      {"I16", 16},    {"U16", 16},        {"F16", 16},
    {"BF16", 16},   {"I32", 32}, {"U32", 32},    {"F32", 32},    {"F64", 64},        {"I64", 64},
    {"U64", 64},    {"C64", 64}, {"F8_E4M3", 8}, {"F8_E5M2", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8},
    {"F8_E8M0", 8}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
};

// Bits per element of a safetensors dtype code; 0 when the code is unknown.
int safetensors_dtype_bits(const std::string& code) {
  for (const DtypeCode& c : kDtypeCodes)
    if (code == c.code) return c.bits;
  return 0;
}

// A non-negative JSON integer that fits `limit`, or fail with `what`.
uint64_t json_count(const json::value& v, uint64_t limit, const std::string& what) {
  if (v.is_uint64()) {
    if (v.get_uint64() <= limit) return v.get_uint64();
  } else if (v.is_int64() && v.get_int64() >= 0 && static_cast<uint64_t>(v.get_int64()) <= limit) {
    return static_cast<uint64_t>(v.get_int64());
  }
  fail("{} must be an integer in [0, {}], got {}", what, limit, json::serialize(v));
}

TensorInfo parse_entry(const std::string& source, const std::string& name, const json::value& value) {
  const std::string where = fmt::format("{}: tensor '{}'", source, name);
  if (!value.is_object()) fail("{} must be an object with dtype, shape and data_offsets", where);
  const json::object& entry = value.get_object();
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) fail("{} has no '{}'", where, key);
  TensorInfo info;
  info.name = name;
  if (!entry.at("dtype").is_string()) fail("{}: dtype must be a string", where);
  info.dtype = std::string(entry.at("dtype").get_string());
  const int bits = safetensors_dtype_bits(info.dtype);
  if (bits == 0) fail("{} has unknown dtype '{}'", where, info.dtype);
  if (!entry.at("shape").is_array()) fail("{}: shape must be an array of dimensions", where);
  // Both the element count and the extent of the non-empty dimensions (what a
  // strided tensor of this shape spans) must fit in int64.
  uint64_t numel = 1, extent = 1;
  bool overflow = false;
  for (const json::value& d : entry.at("shape").get_array()) {
    const uint64_t dim = json_count(d, INT64_MAX, where + ": shape dimension");
    info.shape.push_back(static_cast<int64_t>(dim));
    overflow |= __builtin_mul_overflow(numel, dim, &numel);
    overflow |= __builtin_mul_overflow(extent, std::max<uint64_t>(dim, 1), &extent);
  }
  if (overflow || extent > static_cast<uint64_t>(INT64_MAX))
    fail("{}: shape [{}] is too large", where, fmt::join(info.shape, ", "));
  const json::value& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.get_array().size() != 2) fail("{}: data_offsets must be [begin, end]", where);
  info.begin = json_count(offsets.get_array()[0], UINT64_MAX, where + ": data_offsets begin");
  info.end = json_count(offsets.get_array()[1], UINT64_MAX, where + ": data_offsets end");
  if (info.end < info.begin) fail("{}: data_offsets end {} is before begin {}", where, info.end, info.begin);
  uint64_t total_bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(bits), &total_bits))
    fail("{}: byte size of shape overflows", where);
  if (total_bits % 8 != 0) fail("{}: {} elements of {} are not a whole number of bytes", where, numel, info.dtype);
  if (info.nbytes() != total_bits / 8)
    fail("{}: {} {} of shape [{}] need {} bytes but data_offsets span {}", where, numel, info.dtype,
         fmt::join(info.shape, ", "), total_bits / 8, info.nbytes());
  return info;
}

std::map<std::string, std::string> parse_metadata(const std::string& source, const json::value& value) {
  if (!value.is_object()) fail("{}: __metadata__ must be an object of strings", source);
  std::map<std::string, std::string> out;
  for (const auto& [key, v] : value.get_object()) {
    if (!v.is_string()) fail("{}: __metadata__ value '{}' must be a string", source, std::string(key));
    out[std::string(key)] = std::string(v.get_string());
  }
  return out;
}

json::value parse_json(const std::string& source, std::string_view text, const char* what) {
  json::error_code ec;
  json::value value = json::parse(text, ec);
  if (ec) fail("{}: {} is not valid JSON: {}", source, what, ec.message());
  return value;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

c10::ScalarType safetensors_scalar_type(const std::string& code, const std::string& what) {
  static const std::map<std::string, c10::ScalarType> kTypes = {
      {"BOOL", at::kBool}, {"U8", at::kByte},    {"I8", at::kChar},          {"I16", at::kShort},
      {"I32", at::kInt},   {"I64", at::kLong},   {"F16", at::kHalf},         {"BF16", at::kBFloat16},
      {"F32", at::kFloat}, {"F64", at::kDouble}, {"C64", at::kComplexFloat},
  };
  const auto it = kTypes.find(code);
  if (it == kTypes.end()) fail("{} has dtype {}, which this LibTorch build cannot load", what, code);
  return it->second;
}

namespace {

// The code of a LibTorch dtype; throws for dtypes safetensors cannot store.
std::string safetensors_dtype_code(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kBool:
      return "BOOL";
    case at::kByte:
      return "U8";
    case at::kChar:
      return "I8";
    case at::kShort:
      return "I16";
    case at::kInt:
      return "I32";
    case at::kLong:
      return "I64";
    case at::kHalf:
      return "F16";
    case at::kBFloat16:
      return "BF16";
    case at::kFloat:
      return "F32";
    case at::kDouble:
      return "F64";
    case at::kComplexFloat:
      return "C64";
    default:
      fail("safetensors cannot store dtype {}", c10::toString(dtype));
  }
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : SafetensorsFile(MappedBytes::map_file(path), path) {}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes, const std::string& source) {
  return SafetensorsFile(MappedBytes::own(std::move(bytes)), source);
}

SafetensorsFile::SafetensorsFile(std::shared_ptr<const MappedBytes> bytes, std::string path)
    : path_(std::move(path)), bytes_(std::move(bytes)) {
  const size_t size = bytes_->size();
  if (size < 8)
    fail("{}: {} bytes is too short for a safetensors file (an 8-byte header length comes first)", path_, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes_->data(), 8);
  if (header_len > kSafetensorsMaxHeader)
    fail("{}: header length {} exceeds the {}-byte limit (not a safetensors file?)", path_, header_len,
         kSafetensorsMaxHeader);
  if (header_len > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", path_, header_len, size);
  data_start_ = 8 + header_len;
  const json::value header =
      parse_json(path_, std::string_view(reinterpret_cast<const char*>(bytes_->data()) + 8, header_len), "the header");
  if (!header.is_object()) fail("{}: the header must be a JSON object", path_);
  for (const auto& [key, value] : header.get_object()) {
    const std::string name(key);
    if (name == "__metadata__")
      metadata_ = parse_metadata(path_, value);
    else
      tensors_.push_back(parse_entry(path_, name, value));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const TensorInfo& t : tensors_) {
    if (t.begin != expected)
      fail("{}: tensor '{}' starts at data byte {} but the previous tensor ends at {} ({})", path_, t.name, t.begin,
           expected, t.begin < expected ? "overlap" : "gap");
    expected = t.end;
  }
  if (expected != size - data_start_)
    fail("{}: tensor data ends at byte {} but the file has {} bytes after the header (truncated or trailing data)",
         path_, expected, size - data_start_);
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, i] : index_) out.push_back(name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail("{} has no tensor '{}'", path_, name);
  return tensors_[it->second];
}

at::Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& t = info(name);
  const c10::ScalarType dtype = safetensors_scalar_type(t.dtype, fmt::format("tensor '{}' of {}", name, path_));
  at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(dtype));
  if (t.nbytes() > 0) std::memcpy(out.data_ptr(), bytes_->data() + data_start_ + t.begin, t.nbytes());
  return out;
}

at::Tensor SafetensorsFile::view(const std::string& name) const {
  return view(info(name));
}

at::Tensor SafetensorsFile::view(const TensorInfo& t) const {
  const c10::ScalarType dtype = safetensors_scalar_type(t.dtype, fmt::format("tensor '{}' of {}", t.name, path_));
  uint8_t* ptr = bytes_->data() + data_start_ + t.begin;
  if (t.nbytes() == 0 || reinterpret_cast<uintptr_t>(ptr) % c10::elementSize(dtype) != 0) {
    at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(dtype));
    if (t.nbytes() > 0) std::memcpy(out.data_ptr(), ptr, t.nbytes());
    return out;
  }
  std::shared_ptr<const MappedBytes> keep = bytes_;
  return at::from_blob(
      ptr, t.shape, [keep](void*) mutable { keep.reset(); }, at::TensorOptions().dtype(dtype));
}

at::Tensor SafetensorsFile::read_range(const std::string& name, int64_t begin, int64_t end) const {
  const TensorInfo& t = info(name);
  const c10::ScalarType dtype = safetensors_scalar_type(t.dtype, fmt::format("tensor '{}' of {}", name, path_));
  if (begin < 0 || end < begin || end > t.numel())
    fail("{}: elements [{}, {}) are outside tensor '{}' of {} elements", path_, begin, end, name, t.numel());
  at::Tensor out = at::empty({end - begin}, at::TensorOptions().dtype(dtype));
  read_range_into(name, begin, end, out);
  return out;
}

void SafetensorsFile::read_range_into(const std::string& name, int64_t begin, int64_t end,
                                      const at::Tensor& out) const {
  read_range_into(info(name), begin, end, out);
}

void SafetensorsFile::read_range_into(const TensorInfo& t, int64_t begin, int64_t end, const at::Tensor& out) const {
  const std::string& name = t.name;
  const c10::ScalarType dtype = safetensors_scalar_type(t.dtype, fmt::format("tensor '{}' of {}", name, path_));
  if (begin < 0 || end < begin || end > t.numel())
    fail("{}: elements [{}, {}) are outside tensor '{}' of {} elements", path_, begin, end, name, t.numel());
  if (!out.device().is_cpu() || !out.is_contiguous() || out.scalar_type() != dtype || out.numel() != end - begin)
    fail("{}: tensor '{}' ({}) elements [{}, {}) need a contiguous CPU {} tensor of {} elements, got {} {} of {}",
         path_, name, t.dtype, begin, end, c10::toString(dtype), end - begin, out.device().str(),
         c10::toString(out.scalar_type()), out.numel());
  const size_t element = c10::elementSize(dtype);
  if (end > begin)
    bytes_->copy_out(data_start_ + t.begin + static_cast<size_t>(begin) * element,
                     static_cast<size_t>(end - begin) * element, static_cast<uint8_t*>(out.data_ptr()), path_);
}

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  const bool is_index = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (!is_index) {
    files_.emplace_back(path);
    for (const TensorInfo& t : files_[0].tensors()) shard_of_[t.name] = 0;
    metadata_ = files_[0].metadata();
    return;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open checkpoint index {}", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json::value index = parse_json(path, text, "the index");
  if (!index.is_object() || !index.get_object().contains("weight_map") ||
      !index.get_object().at("weight_map").is_object())
    fail("{}: a checkpoint index needs a \"weight_map\" object (tensor name -> shard file)", path);
  if (const json::value* meta = index.get_object().if_contains("metadata"); meta && meta->is_object())
    for (const auto& [key, v] : meta->get_object())
      metadata_[std::string(key)] = v.is_string() ? std::string(v.get_string()) : json::serialize(v);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::map<std::string, size_t> file_index;
  std::map<std::string, std::string> listed;  // tensor -> shard file name
  for (const auto& [key, v] : index.get_object().at("weight_map").get_object()) {
    if (!v.is_string()) fail("{}: weight_map entry '{}' must name a shard file", path, std::string(key));
    const std::string shard_name(v.get_string());
    listed[std::string(key)] = shard_name;
    if (file_index.count(shard_name)) continue;
    const std::filesystem::path shard_path = dir / shard_name;
    if (!std::filesystem::is_regular_file(shard_path))
      fail("{}: shard '{}' (holding '{}') does not exist at {}", path, shard_name, std::string(key),
           shard_path.string());
    file_index[shard_name] = files_.size();
    files_.emplace_back(shard_path.string());
  }
  for (size_t f = 0; f < files_.size(); ++f)
    for (const TensorInfo& t : files_[f].tensors()) {
      if (shard_of_.count(t.name))
        fail("{}: tensor '{}' is in both {} and {}", path, t.name, files_[shard_of_[t.name]].path(), files_[f].path());
      shard_of_[t.name] = f;
    }
  for (const auto& [name, shard_name] : listed) {
    const auto it = shard_of_.find(name);
    if (it == shard_of_.end() || it->second != file_index.at(shard_name))
      fail("{}: weight_map puts '{}' in {} but that shard has no such tensor", path, name, shard_name);
  }
}

void Checkpoint::regroup(const std::map<std::string, std::vector<StoredRows>>& tensors) {
  if (!presented_.empty()) fail("checkpoint {}: regrouped twice", path_);
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> used;  // stored -> its rows drawn
  std::map<std::string, Presented> out;
  for (const auto& [name, rows] : tensors) {
    if (rows.empty()) fail("checkpoint {}: '{}' is regrouped from no rows", path_, name);
    Presented p;
    int64_t total = 0;
    for (const StoredRows& r : rows) {
      const TensorInfo& stored = shard(r.stored).info(r.stored);
      if (stored.shape.empty()) fail("checkpoint {}: '{}' is a scalar; it has no rows for '{}'", path_, r.stored, name);
      if (r.begin < 0 || r.end <= r.begin || r.end > stored.shape[0])
        fail("checkpoint {}: rows [{}, {}) of '{}' (shape [{}]) for '{}' are not within its {} rows", path_, r.begin,
             r.end, r.stored, fmt::join(stored.shape, ", "), name, stored.shape[0]);
      const std::vector<int64_t> trailing(stored.shape.begin() + 1, stored.shape.end());
      if (p.pieces.empty()) {
        p.info.dtype = stored.dtype;
        p.info.shape = stored.shape;
      } else if (stored.dtype != p.info.dtype ||
                 trailing != std::vector<int64_t>(p.info.shape.begin() + 1, p.info.shape.end())) {
        fail("checkpoint {}: '{}' joins '{}' ({} [{}]) to rows of {} [{}]", path_, name, r.stored, stored.dtype,
             fmt::join(stored.shape, ", "), p.info.dtype, fmt::join(p.info.shape, ", "));
      }
      const uint64_t row_bytes = stored.nbytes() / static_cast<uint64_t>(stored.shape[0]);
      Piece piece{shard_of_.at(r.stored), stored};
      piece.part.shape[0] = r.end - r.begin;
      piece.part.begin = stored.begin + static_cast<uint64_t>(r.begin) * row_bytes;
      piece.part.end = stored.begin + static_cast<uint64_t>(r.end) * row_bytes;
      p.pieces.push_back(piece);
      used[r.stored].emplace_back(r.begin, r.end);
      total += r.end - r.begin;
    }
    p.info.name = name;
    p.info.shape[0] = total;
    if (p.pieces.size() == 1) {
      p.info.begin = p.pieces[0].part.begin;
      p.info.end = p.pieces[0].part.end;
    } else {
      p.info.end = static_cast<uint64_t>(p.info.numel()) *
                   (p.pieces[0].part.nbytes() / static_cast<uint64_t>(p.pieces[0].part.numel()));
    }
    out[name] = std::move(p);
  }
  for (auto& [stored, rows] : used) {
    std::sort(rows.begin(), rows.end());
    int64_t next = 0;
    for (const auto& [begin, end] : rows) {
      if (begin != next)
        fail("checkpoint {}: rows {} of '{}' are {} when it is regrouped", path_,
             begin < next ? fmt::format("[{}, {})", begin, next) : fmt::format("[{}, {})", next, begin), stored,
             begin < next ? "used twice" : "left out");
      next = end;
    }
    if (next != info(stored).shape[0])
      fail("checkpoint {}: rows [{}, {}) of '{}' are left out when it is regrouped", path_, next, info(stored).shape[0],
           stored);
  }
  for (const auto& [stored, rows] : used) hidden_.insert(stored);
  for (const auto& [name, p] : out)
    if (shard_of_.count(name) && !hidden_.count(name))
      fail("checkpoint {}: regrouped '{}' would hide the stored tensor of that name", path_, name);
  presented_ = std::move(out);
}

const Checkpoint::Presented* Checkpoint::presented(const std::string& name) const {
  const auto it = presented_.find(name);
  return it == presented_.end() ? nullptr : &it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : shard_of_)
    if (!hidden_.count(name) && !presented_.count(name)) out.push_back(name);
  for (const auto& [name, p] : presented_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

bool Checkpoint::contains(const std::string& name) const {
  return presented_.count(name) || (shard_of_.count(name) && !hidden_.count(name));
}

const SafetensorsFile& Checkpoint::shard(const std::string& name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) fail("checkpoint {} has no tensor '{}'", path_, name);
  return files_[it->second];
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  if (const Presented* p = presented(name)) return p->info;
  return shard(name).info(name);
}
at::Tensor Checkpoint::get(const std::string& name) const {
  // Several runs are joined into a fresh tensor already; one run is a view of the file.
  if (const Presented* p = presented(name)) return p->pieces.size() == 1 ? view(name).clone() : view(name);
  return shard(name).get(name);
}
at::Tensor Checkpoint::view(const std::string& name) const {
  const Presented* p = presented(name);
  if (!p) return shard(name).view(name);
  if (p->pieces.size() == 1) return files_[p->pieces[0].file].view(p->pieces[0].part);
  std::vector<at::Tensor> parts;
  for (const Piece& piece : p->pieces) parts.push_back(files_[piece.file].view(piece.part));
  return at::cat(parts);
}
at::Tensor Checkpoint::read_range(const std::string& name, int64_t begin, int64_t end) const {
  if (!presented(name)) return shard(name).read_range(name, begin, end);
  const TensorInfo& t = info(name);
  if (begin < 0 || end < begin || end > t.numel())
    fail("{}: elements [{}, {}) are outside tensor '{}' of {} elements", path_, begin, end, name, t.numel());
  at::Tensor out = at::empty({end - begin}, at::TensorOptions().dtype(safetensors_scalar_type(t.dtype, name)));
  read_range_into(name, begin, end, out);
  return out;
}
void Checkpoint::read_range_into(const std::string& name, int64_t begin, int64_t end, const at::Tensor& out) const {
  const Presented* p = presented(name);
  if (!p) return shard(name).read_range_into(name, begin, end, out);
  if (begin < 0 || end < begin || end > p->info.numel() || out.numel() != end - begin)
    fail("{}: elements [{}, {}) of tensor '{}' ({} elements) into {} elements", path_, begin, end, name,
         p->info.numel(), out.numel());
  int64_t first = 0;  // of the current piece, in the presented tensor
  for (const Piece& piece : p->pieces) {
    const int64_t n = piece.part.numel();
    const int64_t from = std::max(begin, first), to = std::min(end, first + n);
    if (from < to)
      files_[piece.file].read_range_into(piece.part, from - first, to - first, out.narrow(0, from - begin, to - from));
    first += n;
  }
}
const std::string& Checkpoint::file_of(const std::string& name) const {
  if (const Presented* p = presented(name)) return files_[p->pieces[0].file].path();
  return shard(name).path();
}
std::optional<uint64_t> Checkpoint::file_offset(const std::string& name) const {
  if (const Presented* p = presented(name)) {
    if (p->pieces.size() != 1) return std::nullopt;
    return files_[p->pieces[0].file].data_start() + p->pieces[0].part.begin;
  }
  const SafetensorsFile& file = shard(name);
  return file.data_start() + file.info(name).begin;
}

at::Tensor map_private(const std::string& path, uint64_t offset, uint64_t bytes, c10::ScalarType dtype) {
  const uint64_t element = c10::elementSize(dtype);
  if (offset % element != 0 || bytes % element != 0)
    fail("{}: bytes [{}, {}) are not whole {} elements", path, offset, offset + bytes, c10::toString(dtype));
  const FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail("cannot open {}: {}", path, std::strerror(errno));
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  const size_t length = offset - start + bytes;
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), static_cast<off_t>(start));
  if (base == MAP_FAILED) return {};  // a file system without mmap: the caller reads instead
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
  ::madvise(base, length, MADV_POPULATE_READ);  // advice: without it the first use faults the pages in
  return at::from_blob(
      static_cast<uint8_t*>(base) + (offset - start), {static_cast<int64_t>(bytes / element)},
      [base, length](void*) { ::munmap(base, length); }, at::TensorOptions().dtype(dtype));
}

uint64_t TensorSpec::nbytes() const {
  uint64_t n = c10::elementSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

// The file's layout: data sorted by dtype alignment (descending) then name,
// the header padded with spaces to a multiple of 8.
struct FileLayout {
  std::string header;             // the JSON text, padded
  std::vector<uint64_t> offsets;  // per spec (in the specs' order), from the start of the file
  uint64_t size = 0;              // of the whole file
};

FileLayout layout_of(const std::vector<TensorSpec>& specs, const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  std::vector<size_t> order(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == "__metadata__") fail("a tensor cannot be named __metadata__");
    if (!seen.insert(specs[i].name).second) fail("tensor '{}' is written twice", specs[i].name);
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&specs](size_t a, size_t b) {
    const size_t sa = c10::elementSize(specs[a].dtype), sb = c10::elementSize(specs[b].dtype);
    return sa != sb ? sa > sb : specs[a].name < specs[b].name;
  });
  json::object header;
  if (!metadata.empty()) {
    json::object meta;
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  FileLayout layout;
  layout.offsets.resize(specs.size());
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorSpec& t = specs[i];
    json::array shape;
    for (int64_t d : t.shape) shape.push_back(d);
    header[t.name] = json::object{{"dtype", safetensors_dtype_code(t.dtype)},
                                  {"shape", std::move(shape)},
                                  {"data_offsets", json::array{offset, offset + t.nbytes()}}};
    layout.offsets[i] = offset;
    offset += t.nbytes();
  }
  layout.header = json::serialize(header);
  layout.header.append((8 - layout.header.size() % 8) % 8, ' ');
  const uint64_t data_start = 8 + layout.header.size();
  for (uint64_t& o : layout.offsets) o += data_start;
  layout.size = data_start + offset;
  return layout;
}

std::vector<TensorSpec> specs_of(const std::vector<at::Tensor>& tensors, const NamedTensors& named) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < named.size(); ++i)
    specs.push_back({named[i].first, tensors[i].scalar_type(), tensors[i].sizes().vec()});
  return specs;
}

std::vector<at::Tensor> cpu_contiguous(const NamedTensors& tensors) {
  std::vector<at::Tensor> out;
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) fail("tensor '{}' is undefined", name);
    out.push_back(tensor.detach().to(at::kCPU).contiguous());
  }
  return out;
}

// The stored bytes of `value` for `spec`: its dtype, its numel, contiguous.
at::Tensor stored_value(const TensorSpec& spec, const at::Tensor& value) {
  int64_t numel = 1;
  for (int64_t d : spec.shape) numel *= d;
  if (!value.defined() || value.numel() != numel)
    fail("tensor '{}': {} values were produced, its shape [{}] holds {}", spec.name,
         value.defined() ? value.numel() : 0, fmt::join(spec.shape, ", "), numel);
  return value.detach().to(at::kCPU).to(spec.dtype).contiguous();
}

void write_all(int fd, const uint8_t* data, uint64_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t put = ::pwrite(fd, data, std::min<uint64_t>(n, uint64_t{1} << 30), static_cast<off_t>(offset));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) fail("cannot write {} bytes to {} at {}: {}", n, path, offset, std::strerror(errno));
    data += put;
    offset += static_cast<uint64_t>(put);
    n -= static_cast<uint64_t>(put);
  }
}

}  // namespace

std::vector<uint8_t> serialize_safetensors(const NamedTensors& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  const std::vector<at::Tensor> values = cpu_contiguous(tensors);
  const std::vector<TensorSpec> specs = specs_of(values, tensors);
  const FileLayout layout = layout_of(specs, metadata);
  std::vector<uint8_t> out(layout.size);
  const uint64_t header_len = layout.header.size();
  std::memcpy(out.data(), &header_len, 8);
  std::memcpy(out.data() + 8, layout.header.data(), layout.header.size());
  for (size_t i = 0; i < values.size(); ++i)
    if (specs[i].nbytes() > 0) std::memcpy(out.data() + layout.offsets[i], values[i].data_ptr(), specs[i].nbytes());
  return out;
}

void write_safetensors_streamed(const std::string& path, const std::vector<TensorSpec>& specs,
                                const TensorValues& values, const std::map<std::string, std::string>& metadata) {
  const FileLayout layout = layout_of(specs, metadata);
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  try {
    FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) fail("cannot create {}: {}", tmp, std::strerror(errno));
    const uint64_t header_len = layout.header.size();
    write_all(fd.get(), reinterpret_cast<const uint8_t*>(&header_len), 8, 0, tmp);
    write_all(fd.get(), reinterpret_cast<const uint8_t*>(layout.header.data()), header_len, 8, tmp);
    for (size_t i = 0; i < specs.size(); ++i) {
      const at::Tensor stored = stored_value(specs[i], values(specs[i]));
      write_all(fd.get(), static_cast<const uint8_t*>(stored.data_ptr()), specs[i].nbytes(), layout.offsets[i], tmp);
    }
    if (::ftruncate(fd.get(), static_cast<off_t>(layout.size)) != 0)  // a trailing empty tensor leaves no bytes
      fail("cannot size {} to {} bytes: {}", tmp, layout.size, std::strerror(errno));
    if (::close(fd.release()) != 0) fail("cannot write {}: {}", tmp, std::strerror(errno));
  } catch (...) {
    std::filesystem::remove(tmp);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    fail("cannot rename {} to {}: {}", tmp, path, ec.message());
  }
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::vector<at::Tensor> values = cpu_contiguous(tensors);
  const std::vector<TensorSpec> specs = specs_of(values, tensors);
  size_t next = 0;  // asked for in the specs' order
  write_safetensors_streamed(
      path, specs, [&values, &next](const TensorSpec&) { return values[next++]; }, metadata);
}

}  // namespace ditrl::io
