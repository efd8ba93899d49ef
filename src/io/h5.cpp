#include <ditrl/dist/watchdog.hpp>
#include <ditrl/io/h5.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>

#include <sys/statvfs.h>

namespace ditrl::io::h5 {

namespace {

// HDF5 prints its error stack to stderr by default; we turn that off once
// and fold the stack into the exception text instead.
void silence_default_printing() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

// The outermost entries say what failed; the innermost ones, from the file
// drivers, carry the cause (errno and its text, or MPI-IO's error string),
// so those are kept whatever their depth.
herr_t collect_error(unsigned n, const H5E_error2_t* entry, void* data) {
  auto* text = static_cast<std::string*>(data);
  const std::string desc = entry->desc ? entry->desc : "?";
  const bool cause = desc.find("errno") != std::string::npos || desc.find("MPI error string") != std::string::npos;
  if (n >= 4 && !cause) return 0;
  if (!text->empty()) *text += "; ";
  *text += fmt::format("{}(): {}", entry->func_name ? entry->func_name : "?", desc);
  return 0;
}

// A full or read-only file system is the usual cause of a failed write, and
// HDF5's own words for it vary ("error looking up chunk address"): say so
// when the file's directory has no space left.
std::string space_note(const std::string& context) {
  const std::string file = context.substr(0, context.find(':'));
  const size_t slash = file.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : file.substr(0, std::max<size_t>(slash, 1));
  struct statvfs fs {};
  if (statvfs(dir.c_str(), &fs) != 0) return "";
  if (fs.f_bavail == 0) return fmt::format(" (the file system of {} is full: 0 bytes available)", dir);
  return "";
}

std::string error_stack() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "no HDF5 error detail" : text;
}

// The file drivers report a refused write as "errno = N, error message = ...".
bool stack_says_no_space(const std::string& stack) {
  for (const int error : {ENOSPC, EDQUOT})
    if (stack.find(fmt::format("errno = {},", error)) != std::string::npos) return true;
  return false;
}

[[noreturn]] void raise(const std::string& context, const std::string& what) {
  const std::string stack = error_stack();
  const std::string note = space_note(context);
  const std::string message = fmt::format("HDF5: {}: {}{} [{}]", context, what, note, stack);
  if (!note.empty() || stack_says_no_space(stack)) throw DiskFull(message);
  throw Error(message);
}

hid_t checked_id(hid_t id, const std::string& context, const std::string& what) {
  if (id < 0) raise(context, what);
  return id;
}

void checked(herr_t status, const std::string& context, const std::string& what) {
  if (status < 0) raise(context, what);
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '/'))
    if (!part.empty()) parts.push_back(part);
  return parts;
}

Handle link_create_intermediate() {
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.id(), 1);
  return lcpl;
}

Handle custom_float16(size_t exponent_bits, size_t mantissa_bits, size_t bias) {
  Handle type(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
  // Field layout must shrink before the size does.
  H5Tset_fields(type.id(), 15, mantissa_bits, exponent_bits, 0, mantissa_bits);
  H5Tset_precision(type.id(), 16);
  H5Tset_size(type.id(), 2);
  H5Tset_ebias(type.id(), bias);
  return type;
}

at::Tensor contiguous_cpu(const at::Tensor& t) {
  return t.device().is_cpu() ? t.contiguous() : t.cpu().contiguous();
}

std::vector<hsize_t> dims_of(const at::Tensor& t) {
  std::vector<hsize_t> dims;
  for (int64_t d : t.sizes()) dims.push_back(static_cast<hsize_t>(d));
  return dims;
}

}  // namespace

// ---------------------------------------------------------------- handles

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    close_ = other.close_;
    collective_close_ = other.collective_close_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

Handle::~Handle() {
  if (collective_close_ && std::uncaught_exceptions() > 0) return;
  reset();
}

void Handle::reset() {
  if (id_ >= 0 && close_) {
    dist::WaitScope waiting("io", "H5Fclose", collective_close_);
    close_(id_);
  }
  id_ = H5I_INVALID_HID;
}

PropList PropList::file_access(MPI_Comm comm, const FileOptions& options) {
  silence_default_printing();
  PropList fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (comm != MPI_COMM_NULL)
    checked(H5Pset_fapl_mpio(fapl.id(), comm, MPI_INFO_NULL), "file access", "H5Pset_fapl_mpio");
  if (options.many_objects) {
    checked(H5Pset_libver_bounds(fapl.id(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), "file access",
            "H5Pset_libver_bounds");
    if (comm != MPI_COMM_NULL)
      checked(H5Pset_coll_metadata_write(fapl.id(), true), "file access", "H5Pset_coll_metadata_write");
  }
  if (options.data_alignment > 0)
    checked(H5Pset_alignment(fapl.id(), hsize_t{64} << 10, static_cast<hsize_t>(options.data_alignment)), "file access",
            "H5Pset_alignment");
  return fapl;
}

PropList PropList::transfer(bool collective) {
  PropList dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  if (collective) checked(H5Pset_dxpl_mpio(dxpl.id(), H5FD_MPIO_COLLECTIVE), "transfer", "H5Pset_dxpl_mpio");
  return dxpl;
}

Dataspace Dataspace::simple(const std::vector<hsize_t>& dims, const std::vector<hsize_t>& max_dims) {
  if (dims.empty()) return scalar();
  const hsize_t* max = max_dims.empty() ? nullptr : max_dims.data();
  return Dataspace(
      checked_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max), "dataspace", "H5Screate_simple"),
      H5Sclose);
}

Dataspace Dataspace::scalar() {
  return Dataspace(H5Screate(H5S_SCALAR), H5Sclose);
}

std::vector<hsize_t> Dataspace::dims() const {
  const int rank = H5Sget_simple_extent_ndims(id());
  std::vector<hsize_t> dims(std::max(rank, 0));
  if (rank > 0) H5Sget_simple_extent_dims(id(), dims.data(), nullptr);
  return dims;
}

void Dataspace::select_hyperslab(const std::vector<hsize_t>& offset, const std::vector<hsize_t>& count) {
  checked(H5Sselect_hyperslab(id(), H5S_SELECT_SET, offset.data(), nullptr, count.data(), nullptr), "dataspace",
          "H5Sselect_hyperslab");
}

void Dataspace::select_none() {
  checked(H5Sselect_none(id()), "dataspace", "H5Sselect_none");
}

// ---------------------------------------------------------------- dtypes

namespace {

// HDF5 type for a torch dtype (bf16 and fp16 as 16-bit custom floats).
Handle datatype_for(c10::ScalarType dtype) {
  silence_default_printing();
  switch (dtype) {
    case at::kFloat:
      return Handle(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    case at::kDouble:
      return Handle(H5Tcopy(H5T_IEEE_F64LE), H5Tclose);
    case at::kLong:
      return Handle(H5Tcopy(H5T_STD_I64LE), H5Tclose);
    case at::kInt:
      return Handle(H5Tcopy(H5T_STD_I32LE), H5Tclose);
    case at::kShort:
      return Handle(H5Tcopy(H5T_STD_I16LE), H5Tclose);
    case at::kChar:
      return Handle(H5Tcopy(H5T_STD_I8LE), H5Tclose);
    case at::kByte:
      return Handle(H5Tcopy(H5T_STD_U8LE), H5Tclose);
    case at::kBool:
      return Handle(H5Tcopy(H5T_STD_U8LE), H5Tclose);
    case at::kHalf:
      return custom_float16(5, 10, 15);
    case at::kBFloat16:
      return custom_float16(8, 7, 127);
    default:
      throw Error(fmt::format("HDF5: no storage type for torch dtype {}", c10::toString(dtype)));
  }
}

// torch dtype of a stored HDF5 type; throws for types ditrl does not use.
c10::ScalarType scalar_type_of(hid_t type, const std::string& context) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 4) return at::kFloat;
    if (size == 8) return at::kDouble;
    if (size == 2) {
      size_t spos, epos, esize, mpos, msize;
      H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
      if (esize == 8 && msize == 7) return at::kBFloat16;
      if (esize == 5 && msize == 10) return at::kHalf;
    }
  } else if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (is_signed && size == 8) return at::kLong;
    if (is_signed && size == 4) return at::kInt;
    if (is_signed && size == 2) return at::kShort;
    if (is_signed && size == 1) return at::kChar;
    if (!is_signed && size == 1) return at::kByte;
  }
  throw Error(
      fmt::format("HDF5: {}: unsupported stored type (class {}, {} bytes)", context, static_cast<int>(cls), size));
}

}  // namespace

const char* dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "fp32";
    case at::kDouble:
      return "fp64";
    case at::kHalf:
      return "fp16";
    case at::kBFloat16:
      return "bf16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kByte:
      return "uint8";
    default:
      return c10::toString(dtype);
  }
}

// ---------------------------------------------------------------- objects

std::string Object::context() const {
  return file_ + ":" + path_;
}

std::string Object::child_path(const std::string& name) const {
  if (!name.empty() && name[0] == '/') return name;
  return path_ == "/" ? "/" + name : path_ + "/" + name;
}

bool Object::has_attr(const std::string& name) const {
  const htri_t exists = H5Aexists(id(), name.c_str());
  if (exists < 0) raise(context(), "H5Aexists(" + name + ")");
  return exists > 0;
}

namespace {

Handle open_attr(const Object& object, const std::string& name) {
  if (!object.has_attr(name)) throw Error(fmt::format("HDF5: {}: no attribute '{}'", object.context(), name));
  return Handle(checked_id(H5Aopen(object.id(), name.c_str(), H5P_DEFAULT), object.context(), "H5Aopen(" + name + ")"),
                H5Aclose);
}

// Replaces attribute `name` with `data` (nullptr: created, nothing written).
// In a parallel file this is collective metadata, and parallel HDF5 may
// communicate anywhere in it (a variable-length string write barriers), up to
// the attribute's close: all of it runs under the watchdog.
void write_attr(Object& object, const std::string& name, hid_t file_type, hid_t mem_type, const Dataspace& space,
                const void* data) {
  dist::WaitScope waiting("io", "H5Awrite(" + name + ") " + object.context(), object.parallel());
  if (object.has_attr(name)) checked(H5Adelete(object.id(), name.c_str()), object.context(), "H5Adelete");
  Handle attr(checked_id(H5Acreate2(object.id(), name.c_str(), file_type, space.id(), H5P_DEFAULT, H5P_DEFAULT),
                         object.context(), "H5Acreate2(" + name + ")"),
              H5Aclose);
  if (data) checked(H5Awrite(attr.id(), mem_type, data), object.context(), "H5Awrite(" + name + ")");
}

}  // namespace

void Object::set_attr(const std::string& name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.id(), H5T_VARIABLE);
  H5Tset_cset(type.id(), H5T_CSET_UTF8);
  const char* text = value.c_str();
  write_attr(*this, name, type.id(), type.id(), Dataspace::scalar(), &text);
}

void Object::set_attr(const std::string& name, int64_t value) {
  write_attr(*this, name, H5T_STD_I64LE, H5T_NATIVE_INT64, Dataspace::scalar(), &value);
}

void Object::set_attr(const std::string& name, double value) {
  write_attr(*this, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, Dataspace::scalar(), &value);
}

void Object::set_attr(const std::string& name, const std::vector<int64_t>& value) {
  write_attr(*this, name, H5T_STD_I64LE, H5T_NATIVE_INT64, Dataspace::simple({static_cast<hsize_t>(value.size())}),
             value.empty() ? nullptr : value.data());
}

std::string Object::string_attr(const std::string& name) const {
  Handle attr = open_attr(*this, name);
  Handle type(H5Aget_type(attr.id()), H5Tclose);
  if (H5Tget_class(type.id()) != H5T_STRING)
    throw Error(fmt::format("HDF5: {}: attribute '{}' is not a string", context(), name));
  if (H5Tis_variable_str(type.id()) > 0) {
    char* text = nullptr;
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.id(), H5T_VARIABLE);
    H5Tset_cset(mem.id(), H5Tget_cset(type.id()));
    checked(H5Aread(attr.id(), mem.id(), &text), context(), "H5Aread");
    std::string value = text ? text : "";
    Dataspace space(H5Aget_space(attr.id()), H5Sclose);
    H5Dvlen_reclaim(mem.id(), space.id(), H5P_DEFAULT, &text);
    return value;
  }
  const size_t size = H5Tget_size(type.id());
  std::string value(size, '\0');
  checked(H5Aread(attr.id(), type.id(), value.data()), context(), "H5Aread");
  value.resize(std::strlen(value.c_str()));
  return value;
}

int64_t Object::int_attr(const std::string& name) const {
  Handle attr = open_attr(*this, name);
  int64_t value = 0;
  checked(H5Aread(attr.id(), H5T_NATIVE_INT64, &value), context(), "H5Aread(" + name + ")");
  return value;
}

// ---------------------------------------------------------------- datasets

std::vector<hsize_t> Dataset::shape() const {
  Dataspace space(checked_id(H5Dget_space(id()), context(), "H5Dget_space"), H5Sclose);
  return space.dims();
}

c10::ScalarType Dataset::dtype() const {
  Handle type(checked_id(H5Dget_type(id()), context(), "H5Dget_type"), H5Tclose);
  return scalar_type_of(type.id(), context());
}

// A dataset with a zero extent holds no element: its shape, fixed at
// creation, is all there is. Writes and reads of it must not reach MPI-IO,
// where a collective transfer of nothing fails (every rank sees the same
// shape, so every rank skips alike).
namespace {
bool holds_nothing(const std::vector<hsize_t>& dims) {
  return std::find(dims.begin(), dims.end(), hsize_t{0}) != dims.end();
}
}  // namespace

void Dataset::write(const at::Tensor& tensor) {
  const at::Tensor data = contiguous_cpu(tensor);
  const std::vector<hsize_t> shape_now = shape();
  if (shape_now != dims_of(data))
    throw Error(fmt::format("HDF5: {}: writing a tensor of shape {} into a dataset of another shape", context(),
                            fmt::join(data.sizes(), "x")));
  if (holds_nothing(shape_now)) return;
  Handle type = datatype_for(data.scalar_type());
  Dataspace file_space(H5Dget_space(id()), H5Sclose);
  Dataspace mem_space = Dataspace::simple(dims_of(data));
  if (parallel()) {
    int rank = 0;
    MPI_Comm_rank(comm(), &rank);
    if (rank != 0) {
      file_space.select_none();
      mem_space.select_none();
    }
  }
  PropList dxpl = PropList::transfer(parallel());
  dist::WaitScope waiting("io", "H5Dwrite " + context(), parallel());
  checked(H5Dwrite(id(), type.id(), mem_space.id(), file_space.id(), dxpl.id(), data.data_ptr()), context(),
          "H5Dwrite");
}

at::Tensor Dataset::read() const {
  std::vector<int64_t> sizes;
  for (hsize_t d : shape()) sizes.push_back(static_cast<int64_t>(d));
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(dtype()));
  if (out.numel() == 0) return out;
  Handle type = datatype_for(out.scalar_type());
  checked(H5Dread(id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data_ptr()), context(), "H5Dread");
  return out;
}

void Dataset::write_rows(int64_t offset, const at::Tensor& rows, bool collective) {
  const at::Tensor data = contiguous_cpu(rows);
  std::vector<hsize_t> dims = shape();
  if (dims.empty() || data.dim() != static_cast<int64_t>(dims.size()))
    throw Error(
        fmt::format("HDF5: {}: row block of rank {} for a dataset of rank {}", context(), data.dim(), dims.size()));
  for (size_t d = 1; d < dims.size(); ++d)
    if (static_cast<int64_t>(dims[d]) != data.size(static_cast<int64_t>(d)))
      throw Error(fmt::format("HDF5: {}: row block shape {} does not match the dataset's trailing dims", context(),
                              fmt::join(data.sizes(), "x")));
  const hsize_t count = static_cast<hsize_t>(data.size(0));
  if (offset < 0 || static_cast<hsize_t>(offset) + count > dims[0])
    throw Error(fmt::format("HDF5: {}: rows [{}, {}) outside [0, {})", context(), offset, offset + count, dims[0]));
  if (holds_nothing(dims)) return;

  Handle type = datatype_for(data.scalar_type());
  Dataspace file_space(H5Dget_space(id()), H5Sclose);
  std::vector<hsize_t> mem_dims = dims;
  mem_dims[0] = std::max<hsize_t>(count, 1);
  Dataspace mem_space = Dataspace::simple(mem_dims);
  if (count == 0) {
    file_space.select_none();
    mem_space.select_none();
  } else {
    std::vector<hsize_t> start(dims.size(), 0), block = dims;
    start[0] = static_cast<hsize_t>(offset);
    block[0] = count;
    file_space.select_hyperslab(start, block);
  }
  PropList dxpl = PropList::transfer(parallel() && collective);
  dist::WaitScope waiting("io", "H5Dwrite(rows) " + context(), parallel() && collective);
  checked(H5Dwrite(id(), type.id(), mem_space.id(), file_space.id(), dxpl.id(), data.data_ptr()), context(),
          "H5Dwrite(rows)");
}

at::Tensor Dataset::read_rows(int64_t offset, int64_t count, bool collective) const {
  std::vector<hsize_t> dims = shape();
  if (dims.empty() || offset < 0 || count < 0 || static_cast<hsize_t>(offset + count) > dims[0])
    throw Error(fmt::format("HDF5: {}: rows [{}, {}) outside the dataset", context(), offset, offset + count));
  std::vector<int64_t> sizes;
  for (hsize_t d : dims) sizes.push_back(static_cast<int64_t>(d));
  sizes[0] = count;
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(dtype()));
  if (holds_nothing(dims)) return out;
  Handle type = datatype_for(out.scalar_type());
  Dataspace file_space(H5Dget_space(id()), H5Sclose);
  std::vector<hsize_t> mem_dims = dims;
  mem_dims[0] = std::max<hsize_t>(count, 1);
  Dataspace mem_space = Dataspace::simple(mem_dims);
  if (count == 0) {
    file_space.select_none();
    mem_space.select_none();
  } else {
    std::vector<hsize_t> start(dims.size(), 0), block = dims;
    start[0] = static_cast<hsize_t>(offset);
    block[0] = static_cast<hsize_t>(count);
    file_space.select_hyperslab(start, block);
  }
  PropList dxpl = PropList::transfer(parallel() && collective);
  dist::WaitScope waiting("io", "H5Dread(rows) " + context(), parallel() && collective);
  checked(H5Dread(id(), type.id(), mem_space.id(), file_space.id(), dxpl.id(), out.data_ptr()), context(),
          "H5Dread(rows)");
  return out;
}

namespace {

// Selects the row-major element range [begin, end) of an N-D space as a union
// of at most 2N-1 boxes: a partial leading block, whole middle blocks, a
// partial trailing block, recursively.
void select_flat_range(Dataspace& space, const std::vector<hsize_t>& dims, hsize_t begin, hsize_t end) {
  bool first = true;
  std::vector<hsize_t> offset(dims.size(), 0), count(dims.size(), 1);
  std::function<void(size_t, hsize_t, hsize_t)> boxes = [&](size_t axis, hsize_t b, hsize_t e) {
    if (b >= e) return;
    hsize_t inner = 1;
    for (size_t d = axis + 1; d < dims.size(); ++d) inner *= dims[d];
    auto add_box = [&](hsize_t lead_begin, hsize_t lead_count) {
      offset[axis] = lead_begin;
      count[axis] = lead_count;
      for (size_t d = axis + 1; d < dims.size(); ++d) offset[d] = 0, count[d] = dims[d];
      checked(H5Sselect_hyperslab(space.id(), first ? H5S_SELECT_SET : H5S_SELECT_OR, offset.data(), nullptr,
                                  count.data(), nullptr),
              "dataspace", "H5Sselect_hyperslab(flat range)");
      first = false;
    };
    const hsize_t lead_b = b / inner, lead_e = e / inner;
    if (b % inner == 0 && e % inner == 0) return add_box(lead_b, lead_e - lead_b);
    if (lead_b == lead_e) {  // inside one block of this axis
      offset[axis] = lead_b, count[axis] = 1;
      return boxes(axis + 1, b % inner, e % inner);
    }
    hsize_t middle_b = lead_b;
    if (b % inner != 0) {
      offset[axis] = lead_b, count[axis] = 1;
      boxes(axis + 1, b % inner, inner);
      middle_b = lead_b + 1;
    }
    if (lead_e > middle_b) add_box(middle_b, lead_e - middle_b);
    if (e % inner != 0) {
      offset[axis] = lead_e, count[axis] = 1;
      boxes(axis + 1, 0, e % inner);
    }
  };
  if (dims.empty()) return;  // scalars have no ranges to select
  boxes(0, begin, end);
}

}  // namespace

void Dataset::write_flat_range(int64_t flat_begin, const at::Tensor& values) {
  const at::Tensor data = contiguous_cpu(values).flatten();
  const std::vector<hsize_t> dims = shape();
  hsize_t total = 1;
  for (hsize_t d : dims) total *= d;
  const hsize_t n = static_cast<hsize_t>(data.numel());
  if (flat_begin < 0 || static_cast<hsize_t>(flat_begin) + n > total)
    throw Error(
        fmt::format("HDF5: {}: flat range [{}, {}) outside [0, {})", context(), flat_begin, flat_begin + n, total));
  Handle type = datatype_for(data.scalar_type());
  Dataspace file_space(H5Dget_space(id()), H5Sclose);
  Dataspace mem_space = Dataspace::simple({std::max<hsize_t>(n, 1)});
  if (n == 0) {
    file_space.select_none();
    mem_space.select_none();
  } else if (!dims.empty()) {
    select_flat_range(file_space, dims, static_cast<hsize_t>(flat_begin), static_cast<hsize_t>(flat_begin) + n);
  }
  PropList dxpl = PropList::transfer(parallel());
  dist::WaitScope waiting("io", "H5Dwrite(flat range) " + context(), parallel());
  checked(H5Dwrite(id(), type.id(), mem_space.id(), file_space.id(), dxpl.id(), data.data_ptr()), context(),
          "H5Dwrite(flat range)");
}

int64_t Dataset::file_offset() const {
  const haddr_t address = H5Dget_offset(id());
  if (address == HADDR_UNDEF)
    throw Error(fmt::format("HDF5: {}: not a contiguous dataset with allocated storage", context()));
  return static_cast<int64_t>(address);
}

at::Tensor Dataset::read_flat_range(int64_t flat_begin, int64_t count, bool collective) const {
  const std::vector<hsize_t> dims = shape();
  hsize_t total = 1;
  for (hsize_t d : dims) total *= d;
  if (flat_begin < 0 || count < 0 || static_cast<hsize_t>(flat_begin + count) > total)
    throw Error(
        fmt::format("HDF5: {}: flat range [{}, {}) outside [0, {})", context(), flat_begin, flat_begin + count, total));
  at::Tensor out = at::empty({count}, at::TensorOptions().dtype(dtype()));
  Handle type = datatype_for(out.scalar_type());
  Dataspace file_space(H5Dget_space(id()), H5Sclose);
  Dataspace mem_space = Dataspace::simple({std::max<hsize_t>(static_cast<hsize_t>(count), 1)});
  if (count == 0) {
    file_space.select_none();
    mem_space.select_none();
  } else if (!dims.empty()) {
    select_flat_range(file_space, dims, static_cast<hsize_t>(flat_begin), static_cast<hsize_t>(flat_begin + count));
  }
  PropList dxpl = PropList::transfer(parallel() && collective);
  dist::WaitScope waiting("io", "H5Dread(flat range) " + context(), parallel() && collective);
  checked(H5Dread(id(), type.id(), mem_space.id(), file_space.id(), dxpl.id(), out.data_ptr()), context(),
          "H5Dread(flat range)");
  return out;
}

void Dataset::extend(hsize_t rows) {
  std::vector<hsize_t> dims = shape();
  if (dims.empty()) throw Error(fmt::format("HDF5: {}: cannot extend a scalar dataset", context()));
  dims[0] = rows;
  dist::WaitScope waiting("io", "H5Dset_extent " + context(), parallel());
  checked(H5Dset_extent(id(), dims.data()), context(), "H5Dset_extent");
}

// ---------------------------------------------------------------- groups

bool Group::exists(const std::string& path) const {
  std::string prefix = path.size() && path[0] == '/' ? "/" : "";
  for (const std::string& part : split_path(path)) {
    prefix += (prefix.empty() || prefix == "/" ? "" : "/") + part;
    const htri_t link = H5Lexists(id(), prefix.c_str(), H5P_DEFAULT);
    if (link <= 0) return false;
  }
  return H5Oexists_by_name(id(), path.c_str(), H5P_DEFAULT) > 0;
}

Group Group::create_group(const std::string& path) {
  dist::WaitScope waiting("io", "H5Gcreate2(" + path + ") " + context(), parallel());
  Handle lcpl = link_create_intermediate();
  const hid_t g = H5Gcreate2(id(), path.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT);
  return Group(checked_id(g, context(), "H5Gcreate2(" + path + ")"), H5Gclose, file_name(), child_path(path), comm());
}

Group Group::open_group(const std::string& path) const {
  if (!exists(path)) throw Error(fmt::format("HDF5: {}: no group '{}'", context(), path));
  const hid_t g = H5Gopen2(id(), path.c_str(), H5P_DEFAULT);
  return Group(checked_id(g, context(), "H5Gopen2(" + path + ")"), H5Gclose, file_name(), child_path(path), comm());
}

Group Group::require_group(const std::string& path) {
  return exists(path) ? open_group(path) : create_group(path);
}

Dataset Group::create_dataset(const std::string& path, c10::ScalarType dtype, const std::vector<hsize_t>& dims,
                              const DatasetOptions& options) {
  dist::WaitScope waiting("io", "H5Dcreate2(" + path + ") " + context(), parallel());
  Handle type = datatype_for(dtype);
  Dataspace space = Dataspace::simple(dims, options.max_dims);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  // No creation/modification times in the object headers: two runs of a
  // deterministic job then write byte-identical files.
  checked(H5Pset_obj_track_times(dcpl.id(), false), context(), "H5Pset_obj_track_times");
  if (!options.chunk.empty()) {
    checked(H5Pset_chunk(dcpl.id(), static_cast<int>(options.chunk.size()), options.chunk.data()), context(),
            "H5Pset_chunk");
    if (options.fletcher32) checked(H5Pset_fletcher32(dcpl.id()), context(), "H5Pset_fletcher32");
  }
  if (options.preallocate) {
    checked(H5Pset_alloc_time(dcpl.id(), H5D_ALLOC_TIME_EARLY), context(), "H5Pset_alloc_time");
    checked(H5Pset_fill_time(dcpl.id(), H5D_FILL_TIME_NEVER), context(), "H5Pset_fill_time");
  }
  Handle lcpl = link_create_intermediate();
  const hid_t d = H5Dcreate2(id(), path.c_str(), type.id(), space.id(), lcpl.id(), dcpl.id(), H5P_DEFAULT);
  return Dataset(checked_id(d, context(), "H5Dcreate2(" + path + ")"), H5Dclose, file_name(), child_path(path), comm());
}

Dataset Group::open_dataset(const std::string& path) const {
  if (!exists(path)) throw Error(fmt::format("HDF5: {}: no dataset '{}'", context(), path));
  const hid_t d = H5Dopen2(id(), path.c_str(), H5P_DEFAULT);
  return Dataset(checked_id(d, context(), "H5Dopen2(" + path + ")"), H5Dclose, file_name(), child_path(path), comm());
}

namespace {
herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> Group::children() const {
  std::vector<std::string> names;
  checked(H5Literate(id(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_name, &names), context(), "H5Literate");
  std::sort(names.begin(), names.end());
  return names;
}

namespace {
Handle utf8_vlen_string() {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.id(), H5T_VARIABLE);
  H5Tset_cset(type.id(), H5T_CSET_UTF8);
  return type;
}
}  // namespace

void Group::write_strings(const std::string& path, const std::vector<std::string>& values) {
  dist::WaitScope waiting("io", "H5Dwrite(" + path + ") " + context(), parallel());
  Handle type = utf8_vlen_string();
  Dataspace space = Dataspace::simple({static_cast<hsize_t>(values.size())});
  Handle lcpl = link_create_intermediate();
  Handle dataset(checked_id(H5Dcreate2(id(), path.c_str(), type.id(), space.id(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT),
                            context(), "H5Dcreate2(" + path + ")"),
                 H5Dclose);
  std::vector<const char*> pointers;
  for (const std::string& v : values) pointers.push_back(v.c_str());
  if (!values.empty())
    checked(H5Dwrite(dataset.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()), context(),
            "H5Dwrite(" + path + ")");
}

std::vector<std::string> Group::read_strings(const std::string& path) const {
  Dataset dataset = open_dataset(path);
  Handle stored(H5Dget_type(dataset.id()), H5Tclose);
  if (H5Tget_class(stored.id()) != H5T_STRING || H5Tis_variable_str(stored.id()) <= 0)
    throw Error(fmt::format("HDF5: {}: expected a dataset of variable-length strings", dataset.context()));
  const std::vector<hsize_t> dims = dataset.shape();
  if (dims.size() != 1) throw Error(fmt::format("HDF5: {}: expected a 1-D string dataset", dataset.context()));
  std::vector<char*> pointers(dims[0], nullptr);
  Handle type = utf8_vlen_string();
  std::vector<std::string> values;
  if (pointers.empty()) return values;
  checked(H5Dread(dataset.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()), dataset.context(),
          "H5Dread(strings)");
  for (char* p : pointers) values.emplace_back(p ? p : "");
  Dataspace space(H5Dget_space(dataset.id()), H5Sclose);
  H5Dvlen_reclaim(type.id(), space.id(), H5P_DEFAULT, pointers.data());
  return values;
}

// ---------------------------------------------------------------- files

File File::create(const std::string& path, MPI_Comm comm, const FileOptions& options) {
  PropList fapl = PropList::file_access(comm, options);
  hid_t f = H5I_INVALID_HID;
  {
    dist::WaitScope waiting("io", "H5Fcreate " + path, comm != MPI_COMM_NULL);
    f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id());
  }
  File file(checked_id(f, path, "cannot create file"), H5Fclose, path, "/", comm);
  file.mark_collective();
  return file;
}

File File::open(const std::string& path, Mode mode, MPI_Comm comm) {
  PropList fapl = PropList::file_access(comm);
  const unsigned flags = mode == Mode::ReadOnly ? H5F_ACC_RDONLY : H5F_ACC_RDWR;
  hid_t f = H5I_INVALID_HID;
  {
    dist::WaitScope waiting("io", "H5Fopen " + path, comm != MPI_COMM_NULL);
    f = H5Fopen(path.c_str(), flags, fapl.id());
  }
  File file(checked_id(f, path, "cannot open file"), H5Fclose, path, "/", comm);
  file.mark_collective();
  return file;
}

File File::open_image(const std::string& name, const std::string& bytes) {
  silence_default_printing();
  PropList fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  checked(H5Pset_fapl_core(fapl.id(), std::max<size_t>(bytes.size(), 1), /*backing_store=*/false), "file access",
          "H5Pset_fapl_core");
  // HDF5 copies the image, so `bytes` need not outlive the file.
  checked(H5Pset_file_image(fapl.id(), const_cast<char*>(bytes.data()), bytes.size()), "file access",
          "H5Pset_file_image");
  // The core driver refuses an image under the name of a file that exists.
  const std::string label = name + " (a copy in memory)";
  const hid_t f = H5Fopen(label.c_str(), H5F_ACC_RDONLY, fapl.id());
  return File(checked_id(f, name, "cannot open the copy in memory"), H5Fclose, label, "/", MPI_COMM_NULL);
}

void File::mark_collective() {
  int ranks = 1;
  if (parallel()) MPI_Comm_size(comm(), &ranks);
  set_collective_close(ranks > 1);
}

void File::close() {
  if (!valid()) return;
  const hid_t f = id();
  release();
  herr_t status = 0;
  {
    dist::WaitScope waiting("io", "H5Fclose " + file_name(), collective_close());
    status = H5Fclose(f);
  }
  checked(status, file_name(), "closing (writing its metadata) failed");
}

void File::flush() {
  dist::WaitScope waiting("io", "H5Fflush " + file_name(), parallel());
  checked(H5Fflush(id(), H5F_SCOPE_GLOBAL), context(), "H5Fflush");
}

// ---------------------------------------------------------------- helpers

void write_rows_collective(Group& group, const std::string& path, int64_t global_rows, const at::Tensor& rows,
                           int64_t row_offset) {
  if (rows.dim() != 2) throw Error(fmt::format("HDF5: {}/{}: expected a 2-D row block", group.context(), path));
  Dataset dataset = group.exists(path)
                        ? group.open_dataset(path)
                        : group.create_dataset(path, rows.scalar_type(),
                                               {static_cast<hsize_t>(global_rows), static_cast<hsize_t>(rows.size(1))});
  dataset.write_rows(row_offset, rows, /*collective=*/true);
}

Series Series::open_or_create(Group& group, const std::string& path) {
  if (group.exists(path)) return Series(group.open_dataset(path));
  DatasetOptions options;
  options.chunk = {256};
  options.max_dims = {H5S_UNLIMITED};
  return Series(group.create_dataset(path, at::kDouble, {0}, options));
}

void Series::append(double value) {
  set(size(), value);
}

void Series::set(int64_t row, double value) {
  dataset_.extend(static_cast<hsize_t>(row + 1));
  dataset_.write_rows(row, at::full({1}, value, at::kDouble), /*collective=*/false);
}

int64_t Series::size() const {
  return static_cast<int64_t>(dataset_.shape().at(0));
}

std::vector<double> Series::read() const {
  const at::Tensor values = dataset_.read();
  return std::vector<double>(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
}

}  // namespace ditrl::io::h5
